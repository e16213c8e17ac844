package audit

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// ErrClosed is what Err returns after Close when no write ever failed: a
// flow decided after the log closed would go unaudited, so callers deny it.
var ErrClosed = errors.New("audit: writer closed")

// Header is what the first line of a run records about it.
type Header struct {
	Run          string            // run id; "" means Open picks one with NewRunID
	Phase        string            // policy phase; also the default phase of every record
	Version      string            // tunwall's version
	Policy       string            // policy file path, "" if none
	PolicySHA256 string            // hex SHA-256 of the policy file's bytes, "" if none
	Argv         []string          // the command line tunwall was started with
	Config       map[string]string // every knob in effect, flags and defaults alike
}

// Options configures Open. Open copies it; later changes have no effect.
type Options struct {
	// Path is the file to append to. It is created 0600 if missing, and its
	// missing parent directories 0700. An existing file is appended to: the
	// new run starts with its own header after whatever the file holds.
	Path string
	// Header is written synchronously by Open.
	Header Header
	// Queue is the length of the bounded queue between Write and the file;
	// 0 means 4096. Write blocks while it is full (back-pressure, never drops).
	Queue int
	// SyncEvery is how often written lines are fsynced; 0 means 1s. Close
	// always fsyncs.
	SyncEvery time.Duration
	// OnError, if not nil, is called once, from the writer goroutine, with the
	// first write or fsync error. It must not call Close or block for long.
	OnError func(error)
}

// Summary describes a closed run.
type Summary struct {
	// Count is the number of lines of the run written before the trailer,
	// header included: the trailer's count. If writing failed, there is no
	// trailer and Count is the number of lines fully written.
	Count int
	// Lost counts records that are not in the file: those that could not be
	// written, those with a kind other than flow or dns, and those passed to
	// Write after Close (a later Close call reports them too).
	Lost int
	// Last is the hex SHA-256 of the trailer line, or of the last line fully
	// written if writing failed. Keep it elsewhere to pin the log.
	Last string
}

// Writer appends one run to an audit log. Write is safe for concurrent use;
// one goroutine owned by the Writer encodes, writes and fsyncs. Close must be
// called to stop it.
type Writer struct {
	path  string
	run   string
	phase string

	q          chan Record
	mu         sync.RWMutex // held shared by Write while it sends, exclusively by Close to close q
	closed     bool         // guarded by mu
	closedFlag atomic.Bool  // closed, for Err without the lock
	closeOnce  sync.Once
	done       chan struct{} // closed when runWriter returns

	lost     atomic.Int64 // records not in the file
	errMu    sync.Mutex
	firstErr error // first write, fsync or close error

	tallyMu sync.Mutex
	tally   tally // guarded by tallyMu; capped at maxWriterHosts hosts

	// Owned by runWriter after Open returns.
	f         *os.File
	onError   func(error)
	syncEvery time.Duration
	c         *chain
	pending   [][sha256.Size]byte // hashes of the lines in c.buf, in order
	written   int                 // lines of this run fully in the file
	lastDone  [sha256.Size]byte   // hash of the last line fully in the file
	failed    bool                // a write failed: nothing more is written
	unsynced  bool                // bytes written since the last fsync

	sum Summary // set by runWriter before done is closed
}

// maxWriterHosts bounds the per-host totals a Writer keeps, so that a sandbox
// querying endless random names cannot grow tunwall's memory; the rest are
// counted under OtherHosts.
const maxWriterHosts = 4096

// flushSize is how many encoded bytes runWriter holds before writing them even
// while more records are queued.
const flushSize = 64 << 10

// NewRunID returns "tw-" followed by 16 lowercase hex digits (64 bits) from
// crypto/rand, e.g. "tw-3f9a0c2b7d1e4a55".
func NewRunID() string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never returns an error (it crashes instead)
	return "tw-" + hex.EncodeToString(b[:])
}

// Open opens or creates o.Path, writes and fsyncs the run's header, and
// starts the writer goroutine. It fails if the header cannot be written, or
// if another Writer (in any process) holds the file open.
func Open(o Options) (*Writer, error) {
	if o.Path == "" {
		return nil, errors.New("audit: Options.Path is empty")
	}
	if o.Queue < 0 {
		return nil, fmt.Errorf("audit: Options.Queue %d is negative", o.Queue)
	}
	if o.SyncEvery < 0 {
		return nil, fmt.Errorf("audit: Options.SyncEvery %v is negative", o.SyncEvery)
	}
	queue := o.Queue
	if queue == 0 {
		queue = 4096
	}
	syncEvery := o.SyncEvery
	if syncEvery == 0 {
		syncEvery = time.Second
	}
	h := o.Header
	h.Argv = slices.Clone(h.Argv)
	h.Config = maps.Clone(h.Config)
	if h.Run == "" {
		h.Run = NewRunID()
	}

	f, err := openLog(o.Path)
	if err != nil {
		return nil, err
	}
	// From here on every os error is an *os.PathError naming the file.
	w := &Writer{
		path:      o.Path,
		run:       h.Run,
		phase:     h.Phase,
		q:         make(chan Record, queue),
		done:      make(chan struct{}),
		f:         f,
		onError:   o.OnError,
		syncEvery: syncEvery,
		c:         newChain(),
	}
	w.tally.maxHosts = maxWriterHosts
	hh, err := w.c.header(time.Now(), h)
	if err == nil {
		_, err = f.Write(w.c.buf.Bytes())
	}
	if err == nil {
		err = f.Sync()
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("audit: write header: %w", err)
	}
	w.c.buf.Reset()
	w.written, w.lastDone = 1, hh
	go w.runWriter()
	return w, nil
}

// openLog opens path for appending, creating it and its directories, takes
// an exclusive flock on it, and makes sure what it holds ends with a newline.
func openLog(path string) (f *os.File, err error) {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("audit: create log directory: %w", err)
	}
	created := true
	f, err = os.OpenFile(path, os.O_RDWR|os.O_APPEND|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, os.ErrExist) {
		created = false
		f, err = os.OpenFile(path, os.O_RDWR|os.O_APPEND, 0)
	}
	if err != nil {
		return nil, fmt.Errorf("audit: %w", err)
	}
	defer func() {
		if err != nil {
			f.Close()
		}
	}()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("audit: %s is in use by another writer: %w", path, err)
		}
		return nil, fmt.Errorf("audit: lock %s: %w", path, err)
	}
	if created {
		// Make the new directory entry durable along with the header.
		d, err := os.Open(dir)
		if err != nil {
			return nil, fmt.Errorf("audit: %w", err)
		}
		err = d.Sync()
		d.Close()
		if err != nil {
			return nil, fmt.Errorf("audit: %w", err)
		}
		return f, nil
	}
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("audit: %w", err)
	}
	if st.Mode().IsRegular() && st.Size() > 0 {
		var b [1]byte
		if _, err := f.ReadAt(b[:], st.Size()-1); err != nil && err != io.EOF {
			return nil, fmt.Errorf("audit: %w", err)
		}
		if b[0] != '\n' {
			// A torn last line: end it, so our header starts a line of its own.
			if _, err := f.Write([]byte{'\n'}); err != nil {
				return nil, fmt.Errorf("audit: %w", err)
			}
		}
	}
	return f, nil
}

// Path returns the log file's path.
func (w *Writer) Path() string { return w.path }

// Run returns the run id written in the header.
func (w *Writer) Run() string { return w.run }

// Write queues r for the log. It sets r.TS to now if zero, r.Run to the run
// id, and r.Phase to the header's phase if empty. It blocks while the queue
// is full. A record passed after Close, or with a Kind other than KindFlow or
// KindDNS, is counted as lost. Write never fails: check Err.
func (w *Writer) Write(r Record) {
	if r.TS.IsZero() {
		r.TS = time.Now()
	}
	w.mu.RLock()
	if w.closed {
		w.mu.RUnlock()
		w.lost.Add(1)
		return
	}
	w.q <- r
	w.mu.RUnlock()
}

// Err returns the first write, fsync or close error; ErrClosed after a
// successful Close; and nil while the log is healthy. Callers deny new flows
// while it is not nil.
func (w *Writer) Err() error {
	w.errMu.Lock()
	err := w.firstErr
	w.errMu.Unlock()
	if err == nil && w.closedFlag.Load() {
		return ErrClosed
	}
	return err
}

// Close drains the queue, writes the trailer, fsyncs and closes the file.
// It returns the first error the Writer met, if any. It is idempotent: later
// calls return the same Summary (with Lost updated) and error.
func (w *Writer) Close() (Summary, error) {
	w.closeOnce.Do(func() {
		w.mu.Lock()
		w.closed = true
		w.closedFlag.Store(true)
		close(w.q)
		w.mu.Unlock()
		<-w.done
	})
	s := w.sum
	s.Lost = int(w.lost.Load())
	w.errMu.Lock()
	defer w.errMu.Unlock()
	return s, w.firstErr
}

// Totals returns running totals over the records the writer has taken from
// its queue (after Close: every record Write accepted), including records
// lost to a write error. Hosts beyond the first 4096 are summed into
// Totals.OtherHosts.
func (w *Writer) Totals() Totals {
	w.tallyMu.Lock()
	t := w.tally.totals()
	w.tallyMu.Unlock()
	t.Lost = int(w.lost.Load())
	return t
}

// runWriter is the only goroutine that touches the file after Open.
func (w *Writer) runWriter() {
	defer close(w.done)
	tick := time.NewTicker(w.syncEvery)
	defer tick.Stop()
	for {
		select {
		case r, ok := <-w.q:
			if !ok {
				w.finish()
				return
			}
			w.add(&r)
			if len(w.q) == 0 || w.c.buf.Len() >= flushSize {
				w.flush()
			}
		case <-tick.C:
			w.flush()
			w.sync()
		}
	}
}

func (w *Writer) add(r *Record) {
	if r.Kind != KindFlow && r.Kind != KindDNS {
		w.lost.Add(1)
		return
	}
	r.Run = w.run
	if r.Phase == "" {
		r.Phase = w.phase
	}
	w.tallyMu.Lock()
	w.tally.add(r)
	w.tallyMu.Unlock()
	if w.failed {
		w.lost.Add(1)
		return
	}
	h, err := w.c.record(r)
	if err != nil {
		w.lost.Add(1)
		return
	}
	w.pending = append(w.pending, h)
}

// flush writes the encoded lines. On a short write it counts the lines that
// made it whole, and the rest as lost.
func (w *Writer) flush() {
	b := w.c.buf.Bytes()
	if len(b) == 0 || w.failed {
		return
	}
	n, err := w.f.Write(b)
	if n > 0 {
		w.unsynced = true
	}
	if k := bytes.Count(b[:n], []byte{'\n'}); k > 0 {
		w.written += k
		w.lastDone = w.pending[k-1]
	}
	if err != nil {
		w.lost.Add(int64(len(w.pending) - bytes.Count(b[:n], []byte{'\n'})))
		w.fail(fmt.Errorf("audit: %w", err))
	}
	w.c.buf.Reset()
	w.pending = w.pending[:0]
}

func (w *Writer) sync() {
	if !w.unsynced || w.failed {
		return
	}
	w.unsynced = false
	if err := w.f.Sync(); err != nil {
		w.fail(fmt.Errorf("audit: %w", err))
	}
}

// fail records the first error, stops all further writing and tells OnError.
func (w *Writer) fail(err error) {
	if w.failed {
		return
	}
	w.failed = true
	w.errMu.Lock()
	w.firstErr = err
	w.errMu.Unlock()
	if w.onError != nil {
		w.onError(err)
	}
}

// finish runs once the queue is closed and drained.
func (w *Writer) finish() {
	w.flush()
	count, trailerIn := w.written, false
	var th [sha256.Size]byte
	if !w.failed {
		var err error
		th, err = w.c.trailer(time.Now(), w.run, w.phase, int(w.lost.Load()))
		if err != nil {
			w.fail(err)
		} else {
			w.pending = append(w.pending, th)
			w.flush()
			trailerIn = w.written == count+1
			if !trailerIn {
				w.lost.Add(-1) // flush counted the trailer, which is no record, as lost
			}
			w.unsynced = true // Close always fsyncs
			w.sync()
		}
	}
	if trailerIn {
		w.sum = Summary{Count: count, Last: hex.EncodeToString(th[:])}
	} else {
		w.sum = Summary{Count: w.written, Last: hex.EncodeToString(w.lastDone[:])}
	}
	if err := w.f.Close(); err != nil {
		w.fail(fmt.Errorf("audit: %w", err))
	}
}
