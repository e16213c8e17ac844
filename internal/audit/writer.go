package audit

import (
	"bytes"
	"cmp"
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

// ErrSizeCap is wrapped by the errors of Admit and Commit once the run's log
// has reached Options.MaxSize: callers deny new work for the rest of the run.
var ErrSizeCap = errors.New("audit: size cap reached")

// ErrRateLimited is wrapped by the errors of Admit and Commit while lines
// arrive faster than Options.MaxRate allows: callers deny new work until the
// budget recovers.
var ErrRateLimited = errors.New("audit: rate bound reached")

// Defaults of Options.
const (
	DefaultMaxSize    = 1 << 30 // bytes of one run's lines
	DefaultMaxRate    = 10000   // lines per second, sustained
	DefaultFoldWindow = time.Second
	DefaultFoldKeys   = 4096
	// DefaultDenyRate is the denial lines a second Options.DenyRate allows
	// by default: a sandbox that floods tunwall with denied names, however
	// many and under however many domains, writes at most this many
	// denial lines a second after a burst of BurstSeconds of them, plus
	// one count line a second per kind and verdict.
	DefaultDenyRate = 20
	// MaxSamples is how many names a record folded by domain lists, and
	// MaxSampleLen how many bytes of each (a longer one is cut, with "...").
	MaxSamples   = 3
	MaxSampleLen = 64
	// NameInReason stands for the name (or, for a flow to a raw address,
	// the address) in the reason of a record folded by domain, e.g. "no
	// rule allows <name>": the names are in its samples.
	NameInReason = "<name>"
	// maxFoldDomains bounds the domains denials are folded by at a time
	// (or Options.FoldKeys if less); beyond it they are counted per kind
	// and verdict, like distinct records beyond FoldKeys.
	maxFoldDomains = 1024
	// BurstSeconds is the rate bound's burst, in seconds of MaxRate.
	BurstSeconds = 10
	// FlushDelay bounds how long a line taken from the queue waits in memory
	// before it is written to the file, even while more keep coming.
	FlushDelay = 100 * time.Millisecond
)

// Header is what the first line of a run records about it.
type Header struct {
	Run          string            // run id; "" means Open picks one with NewRunID
	Phase        string            // policy phase; also the default phase of every record
	Version      string            // tunwall's version
	Policy       string            // policy file path, "" if none
	PolicySHA256 string            // hex SHA-256 of the policy file's bytes, "" if none
	Argv         []string          // the command line tunwall was started with
	Config       map[string]string // every knob in effect, flags and defaults alike
	// Labels are the run's labels (NewLabels), also written on every
	// record that has none of its own.
	Labels Labels
	// Stream and Seq are set by Open for a run written to a Stream
	// (Options.Stream): the stream's id and the run's place among its
	// runs, 1 for the first. Open ignores what the caller puts there; a
	// run in a file has neither.
	Stream string
	Seq    int
}

// Options configures Open. Open copies it; later changes have no effect.
type Options struct {
	// Path is the file to append to. It is created 0600 if missing, and its
	// missing parent directories 0700. An existing file is appended to: the
	// new run starts with its own header after whatever the file holds, and
	// that header's prev is the SHA-256 of the file's last line, so that the
	// runs of a file form one chain.
	Path string
	// Stream, if not nil, is where the run goes in place of a file (Path
	// must then be ""): an output shared with other runs, such as a node
	// agent's standard output (NewStream says how). The run's header
	// chains to 64 zeros and carries the stream's id and the run's seq;
	// nothing is fsynced (SyncEvery has no effect); Commit returns once the
	// line was handed to the stream's writer. Open one Writer per run on
	// the same Stream, from any goroutines.
	Stream *Stream
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

	// MaxSize caps the bytes of this run's lines, header included; 0 means
	// DefaultMaxSize. When the run's lines reach MaxSize less a reserve
	// (16 KiB, or a quarter of MaxSize if less), the Writer writes a limit
	// record and from then on: Admit and the Commit of a start record fail
	// with ErrSizeCap; repeatable records are only counted, and written as
	// one record per kind and verdict at Close; flow records (of flows that
	// started before) are still written, one line each; then the trailer.
	MaxSize int64
	// MaxRate bounds the lines written per second, sustained, after a burst
	// of BurstSeconds*MaxRate lines; 0 means DefaultMaxRate. Repeatable
	// records (DNS queries, denied flows) are written one by one only while
	// more than half the burst is left; past that they are counted in folded
	// records. A start record needs one line of budget: while there is none,
	// Admit and its Commit fail with ErrRateLimited, and the Writer writes a
	// limit record the first time.
	MaxRate int
	// FoldWindow is how long repeats of a repeatable record are counted
	// before they are written as one record (with count and until); the
	// first occurrence is written at once. 0 means DefaultFoldWindow.
	FoldWindow time.Duration
	// FoldKeys bounds the distinct repeatable records tracked at a time; 0
	// means DefaultFoldKeys. Beyond it, allowed DNS queries are counted per
	// kind and verdict only, in RuleOverflow records, one per FoldWindow;
	// denials are folded by domain (DenyRate).
	FoldKeys int
	// DenyRate bounds the lines a second, sustained, of denials (denied DNS
	// queries, flows and HTTP requests), written one by one or as folds,
	// after a burst of BurstSeconds*DenyRate lines; 0 means DefaultDenyRate.
	// A new denial is written one by one only while more than half that
	// burst is left (and the rate bound allows it, as for any repeatable
	// record); past that, and beyond FoldKeys, denials are folded by
	// registrable domain (Domain), rule and reason: one record per domain
	// and FoldWindow with Count, Until and up to MaxSamples of the names
	// (Record.Samples). A fold, of repeats or by domain, that finds no line
	// of the budget left when its window ends is counted per kind and
	// verdict in a RuleOverflow record (the largest folds are written
	// first). At most min(FoldKeys, 1024) domains are tracked at a time;
	// beyond that denials are counted the same way.
	DenyRate int
	// Domain returns the registrable domain (eTLD+1) of a host name, which
	// denials past DenyRate are folded by: golang.org/x/net/publicsuffix's
	// EffectiveTLDPlusOne, say (the package imports nothing outside the
	// standard library, so the caller passes it). nil means RegistrableDomain's
	// approximation, the last two labels. It is called from the writer
	// goroutine and must not block.
	Domain func(name string) string
	// OnLimit, if not nil, is called once per bound, the first time it is
	// reached, with an error wrapping ErrSizeCap or ErrRateLimited. It is
	// called from Open or the writer goroutine and must not call Close or
	// block for long.
	OnLimit func(error)

	// clock and tick, for the package's tests: the time the Writer goes by
	// (time.Now if nil) and what wakes it to end fold windows and fsync
	// (a ticker if nil).
	clock func() time.Time
	tick  <-chan time.Time
}

// Summary describes a closed run.
type Summary struct {
	// Count is the number of lines of the run written before the trailer,
	// header included: the trailer's count. After a failed write (a full
	// disk) the trailer still goes in the room kept for it, chained to the
	// last whole line, with lost; if even that fails, there is no trailer
	// and Count is the number of lines fully written.
	Count int
	// Lost counts records that are not in the file: those that could not be
	// written, those with a kind other than flow, start or dns, start records
	// refused by a bound that were passed to Write (not Commit), and those
	// passed to Write after Close (a later Close call reports them too).
	Lost int
	// Last is the hex SHA-256 of the trailer line, or of the last line fully
	// written if there is no trailer. Keep it elsewhere to pin the log.
	Last string
}

// Writer appends one run to an audit log. Write, Commit and Admit are safe
// for concurrent use; one goroutine owned by the Writer folds, encodes,
// writes and fsyncs. Close must be called to stop it.
//
// The file holds whole lines only: each write(2) carries whole lines, the
// file's space is allocated ahead of them (fallocate, keeping its size)
// with room for the trailer kept beyond, so a full disk is found before a
// line is torn; a write that still comes up short is cut back to the last
// whole line. After a failed write nothing more is written but the
// trailer, which counts the records lost.
type Writer struct {
	path   string
	stream *Stream // Options.Stream; nil for a file
	run    string
	phase  string
	labels Labels

	q          chan item
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

	bucket  bucket      // the rate bound, shared with Admit
	capped  atomic.Bool // the size cap was reached
	rateHit atomic.Bool // Admit or Commit refused new work for the rate
	capErr  error       // wraps ErrSizeCap; set by Open
	rateErr error       // wraps ErrRateLimited; set by Open

	// Owned by runWriter after Open returns.
	f          *os.File
	onError    func(error)
	onLimit    func(error)
	syncEvery  time.Duration
	foldWindow time.Duration
	foldKeys   int
	maxSize    int64
	capAt      int64 // run bytes at which the cap is reached
	c          *chain
	pending    []pendingLine     // the lines in c.buf, in order
	bufSince   time.Time         // when the oldest line in c.buf was encoded
	waiters    int               // lines in pending with a Commit waiting
	written    int               // lines of this run fully in the file
	lastDone   [sha256.Size]byte // hash of the last line fully in the file
	failed     bool              // a write or fsync failed: no more records are written
	whole      bool              // the file ends with a whole line of ours, at size: after a failed write, the trailer may still go in
	size       int64             // the file's size, up to the end of the last whole line written
	prealloc   bool              // the file system preallocates (fallocate); false: no reserve is kept
	allocEnd   int64             // the file's space is allocated up to here, beyond size (prealloc)
	tailRoom   int64             // bytes kept allocated beyond size for the trailer (prealloc)
	unsynced   bool              // bytes written since the last fsync
	lastSync   time.Time         // when the file was last fsynced
	rateNoted  bool              // the rate limit record was written
	folds      map[foldKey]*fold // repeatable records in their fold window
	overflow   map[aggKey]*agg   // counted because folds was full or over the rate
	afterCap   map[aggKey]*agg   // counted because the size cap was reached

	// The denial budget and folding by domain (fold.go); the clock.
	deny       bucket                    // the denial budget (Options.DenyRate); writer goroutine only
	domains    map[domainKey]*domainFold // denials folded by domain, in their window
	domainFn   func(string) string       // Options.Domain
	maxDomains int
	now        func() time.Time // Options.clock: time.Now but in tests
	tick       <-chan time.Time // Options.tick, or nil

	sum Summary // set by runWriter before done is closed
}

// item is one record on its way to the writer goroutine; done, if not nil,
// is Commit's channel.
type item struct {
	r    Record
	done chan error
}

// pendingLine is an encoded line not yet written.
type pendingLine struct {
	hash [sha256.Size]byte
	done chan error // Commit's, or nil
	n    int        // records the line stands for: a fold or count line's Count, else 1
}

// maxWriterHosts bounds the per-host totals a Writer keeps, so that a sandbox
// querying endless random names cannot grow tunwall's memory; the rest are
// counted under OtherHosts.
const maxWriterHosts = 4096

// flushSize is how many encoded bytes runWriter holds before writing them even
// while more records are queued.
const flushSize = 64 << 10

// streamChunk bounds the bytes of one write to a Stream (but for a single
// longer line).
const streamChunk = 64 << 10

// allocChunk is how far beyond what it writes a Writer preallocates the
// file, so that it calls fallocate about once per allocChunk bytes.
const allocChunk = 256 << 10

// fallocate(2) modes (linux/falloc.h), which package syscall does not name.
const (
	fallocKeepSize  = 0x1
	fallocPunchHole = 0x2
)

// minTailRoom is the least room kept allocated for the trailer.
const minTailRoom = 4 << 10

// NewRunID returns "tw-" followed by 16 lowercase hex digits (64 bits) from
// crypto/rand, e.g. "tw-3f9a0c2b7d1e4a55".
func NewRunID() string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never returns an error (it crashes instead)
	return "tw-" + hex.EncodeToString(b[:])
}

// Open opens or creates o.Path, writes and fsyncs the run's header, and
// starts the writer goroutine. It fails if the header cannot be written, if
// the file's last line is longer than a log line can be (it is then no audit
// log), or if another Writer (in any process) holds the file open. With
// o.Stream in place of a path, it writes the header to the stream instead
// (see Stream), and fails if the stream has failed.
func Open(o Options) (*Writer, error) {
	if o.Path == "" && o.Stream == nil {
		return nil, errors.New("audit: Options.Path is empty")
	}
	switch {
	case o.Queue < 0:
		return nil, fmt.Errorf("audit: Options.Queue %d is negative", o.Queue)
	case o.SyncEvery < 0:
		return nil, fmt.Errorf("audit: Options.SyncEvery %v is negative", o.SyncEvery)
	case o.MaxSize < 0:
		return nil, fmt.Errorf("audit: Options.MaxSize %d is negative", o.MaxSize)
	case o.MaxRate < 0:
		return nil, fmt.Errorf("audit: Options.MaxRate %d is negative", o.MaxRate)
	case o.FoldWindow < 0:
		return nil, fmt.Errorf("audit: Options.FoldWindow %v is negative", o.FoldWindow)
	case o.FoldKeys < 0:
		return nil, fmt.Errorf("audit: Options.FoldKeys %d is negative", o.FoldKeys)
	case o.DenyRate < 0:
		return nil, fmt.Errorf("audit: Options.DenyRate %d is negative", o.DenyRate)
	}
	queue := cmp.Or(o.Queue, 4096)
	syncEvery := cmp.Or(o.SyncEvery, time.Second)
	maxSize := cmp.Or(o.MaxSize, DefaultMaxSize)
	rate := cmp.Or(o.MaxRate, DefaultMaxRate)
	denyRate := float64(cmp.Or(o.DenyRate, DefaultDenyRate))
	clock := o.clock
	if clock == nil {
		clock = time.Now
	}
	domainFn := o.Domain
	if domainFn == nil {
		domainFn = RegistrableDomain
	}
	h := o.Header
	h.Argv = slices.Clone(h.Argv)
	h.Config = maps.Clone(h.Config)
	if h.Run == "" {
		h.Run = NewRunID()
	}

	var f *os.File
	var prev [sha256.Size]byte
	if o.Stream != nil {
		if o.Path != "" {
			return nil, fmt.Errorf("audit: a run goes to a file (Path %q) or to a stream, not both", o.Path)
		}
	} else {
		var err error
		if f, prev, err = openLog(o.Path); err != nil {
			return nil, err
		}
	}
	// From here on every os error is an *os.PathError naming the file.
	now := clock()
	burst := float64(rate) * BurstSeconds
	w := &Writer{
		path:       o.Path,
		stream:     o.Stream,
		run:        h.Run,
		phase:      h.Phase,
		labels:     h.Labels,
		q:          make(chan item, queue),
		done:       make(chan struct{}),
		bucket:     bucket{rate: float64(rate), burst: burst, tokens: burst, at: now},
		deny:       bucket{rate: denyRate, burst: denyRate * BurstSeconds, tokens: denyRate * BurstSeconds, at: now},
		now:        clock,
		capErr:     fmt.Errorf("%w: the log of run %s reached its cap of %d bytes", ErrSizeCap, h.Run, maxSize),
		rateErr:    fmt.Errorf("%w: more than %d lines a second after a burst of %d", ErrRateLimited, rate, int(burst)),
		f:          f,
		onError:    o.OnError,
		onLimit:    o.OnLimit,
		syncEvery:  syncEvery,
		foldWindow: cmp.Or(o.FoldWindow, DefaultFoldWindow),
		foldKeys:   cmp.Or(o.FoldKeys, DefaultFoldKeys),
		maxSize:    maxSize,
		capAt:      maxSize - min(16<<10, maxSize/4),
		c:          newChain(),
		lastSync:   now,
		folds:      map[foldKey]*fold{},
		domains:    map[domainKey]*domainFold{},
		domainFn:   domainFn,
		maxDomains: min(cmp.Or(o.FoldKeys, DefaultFoldKeys), maxFoldDomains),
		tick:       o.tick,
		overflow:   map[aggKey]*agg{},
		afterCap:   map[aggKey]*agg{},
	}
	w.tally.maxHosts = maxWriterHosts
	if o.Stream != nil {
		// The header goes out under the stream's lock, numbered.
		var hh [sha256.Size]byte
		err := o.Stream.begin(func(id string, seq int) ([]byte, error) {
			h.Stream, h.Seq = id, seq
			var err error
			hh, err = w.c.header(now, h, prev)
			return w.c.buf.Bytes(), err
		})
		if err != nil {
			return nil, fmt.Errorf("audit: write header: %w", err)
		}
		w.c.buf.Reset()
		w.written, w.lastDone, w.whole = 1, hh, true
		w.checkCap(now)
		w.flush()
		go w.runWriter()
		return w, nil
	}
	h.Stream, h.Seq = "", 0
	if st, err := f.Stat(); err == nil && st.Mode().IsRegular() {
		w.size, w.prealloc = st.Size(), true
	}
	// Room for a trailer as long as any this run can write.
	w.tailRoom = max(minTailRoom, int64(2*(len(h.Run)+len(h.Phase))+1024))
	hh, err := w.c.header(now, h, prev)
	if err == nil {
		err = w.reserve(w.c.buf.Len())
	}
	if err == nil {
		var k int
		k, err = w.writeLines(w.c.buf.Bytes())
		if err == nil && k != 1 {
			err = io.ErrShortWrite
		}
	}
	if err == nil {
		err = f.Sync()
	}
	if err != nil {
		w.release()
		f.Close()
		return nil, fmt.Errorf("audit: write header: %w", err)
	}
	w.c.buf.Reset()
	w.written, w.lastDone, w.whole = 1, hh, true
	w.checkCap(now) // a header over the cap: capped from the start
	w.flush()
	go w.runWriter()
	return w, nil
}

// openLog opens path for appending, creating it and its directories, takes
// an exclusive flock on it, makes sure what it holds ends with a newline,
// and returns the SHA-256 of its last line (zeroHash if it is empty or not a
// regular file), which the new run's header chains to.
func openLog(path string) (f *os.File, prev [sha256.Size]byte, err error) {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, prev, fmt.Errorf("audit: create log directory: %w", err)
	}
	created := true
	f, err = os.OpenFile(path, os.O_RDWR|os.O_APPEND|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, os.ErrExist) {
		created = false
		f, err = os.OpenFile(path, os.O_RDWR|os.O_APPEND, 0)
	}
	if err != nil {
		return nil, prev, fmt.Errorf("audit: %w", err)
	}
	defer func() {
		if err != nil {
			f.Close()
		}
	}()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, prev, fmt.Errorf("audit: %s is in use by another writer: %w", path, err)
		}
		return nil, prev, fmt.Errorf("audit: lock %s: %w", path, err)
	}
	if created {
		// Make the new directory entry durable along with the header.
		d, err := os.Open(dir)
		if err != nil {
			return nil, prev, fmt.Errorf("audit: %w", err)
		}
		err = d.Sync()
		d.Close()
		if err != nil {
			return nil, prev, fmt.Errorf("audit: %w", err)
		}
		return f, prev, nil
	}
	st, err := f.Stat()
	if err != nil {
		return nil, prev, fmt.Errorf("audit: %w", err)
	}
	if !st.Mode().IsRegular() || st.Size() == 0 {
		return f, prev, nil
	}
	prev, torn, err := lastLineHash(f, st.Size())
	if err != nil {
		return nil, prev, fmt.Errorf("audit: %s: %w", path, err)
	}
	if torn {
		// A torn last line, as a crash mid-write leaves it: end it, so our
		// header starts a line of its own (and chains to the torn line).
		if _, err := f.Write([]byte{'\n'}); err != nil {
			return nil, prev, fmt.Errorf("audit: %w", err)
		}
	}
	return f, prev, nil
}

// lastLineHash returns the SHA-256 of the last line of f (size bytes), not
// counting its newline, and whether that newline is missing.
func lastLineHash(f *os.File, size int64) (h [sha256.Size]byte, torn bool, err error) {
	var b [1]byte
	if _, err := f.ReadAt(b[:], size-1); err != nil {
		return h, false, err
	}
	end := size
	if b[0] == '\n' {
		end--
	} else {
		torn = true
	}
	// Look back for the newline before the last line, at most maxLine bytes.
	start := end
	buf := make([]byte, 64<<10)
	for start > 0 {
		n := int64(len(buf))
		if start < n {
			n = start
		}
		chunk := buf[:n]
		if _, err := f.ReadAt(chunk, start-n); err != nil && err != io.EOF {
			return h, false, err
		}
		if i := bytes.LastIndexByte(chunk, '\n'); i >= 0 {
			start = start - n + int64(i) + 1
			break
		}
		start -= n
		if end-start > maxLine {
			return h, false, fmt.Errorf("its last line is longer than %d bytes: not an audit log", maxLine)
		}
	}
	if end-start > maxLine {
		return h, false, fmt.Errorf("its last line is longer than %d bytes: not an audit log", maxLine)
	}
	line := make([]byte, end-start)
	if _, err := f.ReadAt(line, start); err != nil && err != io.EOF {
		return h, false, err
	}
	return sha256.Sum256(line), torn, nil
}

// Path returns the log file's path ("" for a run on a Stream).
func (w *Writer) Path() string { return w.path }

// Run returns the run id written in the header.
func (w *Writer) Run() string { return w.run }

// Write queues r for the log. It sets r.TS to now if zero, r.Run to the run
// id, and r.Phase to the header's phase if empty. It blocks while the queue
// is full. A record passed after Close, or with a Kind other than KindFlow,
// KindStart, KindDNS, KindHTTP or KindApproval, is counted as lost. Write never fails: check Err.
func (w *Writer) Write(r Record) {
	w.send(r, nil)
}

// Commit queues r like Write and returns a channel that receives one value:
// nil once r's line is in the file (written, not yet fsynced) or, for a
// repeatable record, counted; otherwise why it never will be. A start record
// is refused, and not written, once the size cap is reached (ErrSizeCap) or
// while the rate bound leaves no line for it (ErrRateLimited): the caller
// must then not let the flow carry data, and records its denial instead.
func (w *Writer) Commit(r Record) <-chan error {
	done := make(chan error, 1)
	w.send(r, done)
	return done
}

func (w *Writer) send(r Record, done chan error) {
	if r.TS.IsZero() {
		r.TS = time.Now()
	}
	w.mu.RLock()
	if w.closed {
		w.mu.RUnlock()
		w.lost.Add(1)
		if done != nil {
			done <- ErrClosed
		}
		return
	}
	w.q <- item{r: r, done: done}
	w.mu.RUnlock()
}

// Err returns the first write, fsync or close error; ErrClosed after a
// successful Close; and nil while the log is healthy. Callers deny new flows
// while it is not nil.
func (w *Writer) Err() error {
	w.errMu.Lock()
	err := w.firstErr
	w.errMu.Unlock()
	if err == nil && w.stream != nil {
		// Another run's failed write tore the shared output: fail closed
		// at once, not at this run's next write.
		err = w.stream.Err()
	}
	if err == nil && w.closedFlag.Load() {
		return ErrClosed
	}
	return err
}

// Admit reports whether new work (a flow, a DNS query) may start: nil, or
// an error wrapping ErrSizeCap or ErrRateLimited, or Err's error. Callers
// deny new work while it is not nil.
func (w *Writer) Admit() error {
	if err := w.Err(); err != nil {
		return err
	}
	if w.capped.Load() {
		return w.capErr
	}
	if !w.bucket.has(w.now()) {
		w.rateHit.Store(true)
		return w.rateErr
	}
	return nil
}

// Close drains the queue, writes what folding still holds and the trailer,
// fsyncs and closes the file. It returns the first error the Writer met, if
// any. It is idempotent: later calls return the same Summary (with Lost
// updated) and error.
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
// lost to a write error and records folded into others. Hosts beyond the
// first 4096 are summed into Totals.OtherHosts.
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
	tick := w.tick
	if tick == nil {
		t := time.NewTicker(min(w.syncEvery, max(w.foldWindow/4, 10*time.Millisecond)))
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case it, ok := <-w.q:
			if !ok {
				w.finish()
				return
			}
			now := w.now()
			w.take(&it, now)
			if !w.rateNoted && w.rateHit.Load() {
				w.noteRate(now)
			}
			if len(w.q) == 0 || w.waiters > 0 || w.c.buf.Len() >= flushSize ||
				(len(w.pending) > 0 && now.Sub(w.bufSince) >= FlushDelay) {
				w.flush()
			}
		case <-tick:
			now := w.now()
			if !w.rateNoted && w.rateHit.Load() {
				w.noteRate(now)
			}
			w.expire(now, false)
			w.flush()
			if now.Sub(w.lastSync) >= w.syncEvery {
				w.sync()
				w.lastSync = now
			}
		}
	}
}

// take handles one record from the queue.
func (w *Writer) take(it *item, now time.Time) {
	r := &it.r
	if r.Kind != KindFlow && r.Kind != KindDNS && r.Kind != KindStart && r.Kind != KindHTTP && r.Kind != KindPhase && r.Kind != KindApproval {
		w.lost.Add(1)
		answer(it.done, fmt.Errorf("audit: record kind %q cannot be written", r.Kind))
		return
	}
	r.Run = w.run
	if r.Labels == "" {
		r.Labels = w.labels
	}
	if r.Kind == KindPhase && r.Phase != "" {
		// From this record on, the records of the run are of its phase.
		w.phase = r.Phase
	}
	if r.Phase == "" {
		r.Phase = w.phase
	}
	w.tallyMu.Lock()
	w.tally.add(r)
	w.tallyMu.Unlock()
	if w.failed {
		w.lost.Add(1)
		answer(it.done, w.Err())
		return
	}
	switch {
	case r.Kind == KindStart:
		var refused error
		if w.capped.Load() {
			refused = w.capErr
		} else if !w.bucket.take(now, 0, false) {
			w.rateHit.Store(true)
			refused = w.rateErr
		}
		if refused != nil {
			if it.done == nil {
				w.lost.Add(1)
			}
			answer(it.done, refused)
			return
		}
		w.emit(r, it.done, now)
	case repeatable(r):
		w.fold(r, now)
		answer(it.done, nil)
	default:
		w.bucket.take(now, 0, true)
		w.emit(r, it.done, now)
	}
}

// answer tells a Commit how its record went.
func answer(done chan error, err error) {
	if done != nil {
		done <- err
	}
}

// emit encodes r as the next line. done is answered once the line is in the
// file.
func (w *Writer) emit(r *Record, done chan error, now time.Time) {
	// A fold or count line stands for Count records: lost, it loses them all.
	n := max(r.Count, 1)
	if w.failed {
		w.lost.Add(int64(n))
		answer(done, w.Err())
		return
	}
	h, err := w.c.record(r)
	if err != nil {
		w.lost.Add(int64(n))
		answer(done, err)
		return
	}
	if len(w.pending) == 0 {
		w.bufSince = now
	}
	w.pending = append(w.pending, pendingLine{hash: h, done: done, n: n})
	if done != nil {
		w.waiters++
	}
	w.checkCap(now)
}

// checkCap writes the limit record once the run's lines reach the cap.
func (w *Writer) checkCap(now time.Time) {
	if w.capped.Load() || w.c.bytes < w.capAt {
		return
	}
	w.capped.Store(true)
	w.emit(&Record{
		TS: now, Run: w.run, Phase: w.phase, Labels: w.labels, Kind: KindLimit, Verdict: VerdictDeny, Rule: RuleMaxSize,
		Reason: fmt.Sprintf("this run's log reached its size cap of %d bytes: new flows and DNS queries are denied for the rest of the run; "+
			"from now on DNS queries and denials are only counted (written at the end), and flows already open still get their record", w.maxSize),
	}, nil, now)
	if w.onLimit != nil {
		w.onLimit(w.capErr)
	}
}

// noteRate writes the limit record of the rate bound, once.
func (w *Writer) noteRate(now time.Time) {
	w.rateNoted = true
	w.emit(&Record{
		TS: now, Run: w.run, Phase: w.phase, Labels: w.labels, Kind: KindLimit, Verdict: VerdictDeny, Rule: RuleMaxRate,
		Reason: fmt.Sprintf("lines arrive faster than %d a second (after a burst of %d): new flows and DNS queries are denied whenever they do, "+
			"and their denials are recorded with rule %s; this is written the first time only", int(w.bucket.rate), int(w.bucket.burst), RuleMaxRate),
	}, nil, now)
	if w.onLimit != nil {
		w.onLimit(w.rateErr)
	}
}

// flush writes the encoded lines, whole: on a full disk it writes those that
// fit in the room already allocated less the trailer's, and if a write comes
// up short it cuts the file back to the end of the last whole line. The
// lines not in the file are counted as lost, and the Writer fails.
func (w *Writer) flush() {
	b := w.c.buf.Bytes()
	if len(b) == 0 || w.failed {
		return
	}
	fit := len(b)
	full := w.reserve(len(b))
	if full != nil {
		// The disk is full: what is allocated still takes whole lines,
		// and keeps the trailer's room.
		fit = wholeWithin(b, w.allocEnd-w.size-w.tailRoom)
	}
	var k int
	var err error
	if fit > 0 {
		k, err = w.writeLines(b[:fit])
	}
	if err == nil && fit < len(b) {
		err = full
	}
	for _, p := range w.pending[:k] {
		w.answerLine(p, nil)
	}
	if k > 0 {
		w.written += k
		w.lastDone = w.pending[k-1].hash
	}
	if err != nil {
		err = fmt.Errorf("audit: %w", err)
		for _, p := range w.pending[k:] {
			w.lost.Add(int64(p.n))
			w.answerLine(p, err)
		}
		w.fail(err)
	}
	w.c.buf.Reset()
	w.pending = w.pending[:0]
}

// wholeWithin returns the length of the longest run of whole lines at the
// start of b that is at most room bytes long.
func wholeWithin(b []byte, room int64) int {
	if room <= 0 {
		return 0
	}
	if int64(len(b)) > room {
		b = b[:room]
	}
	return bytes.LastIndexByte(b, '\n') + 1
}

// writeLines writes b, whole lines, with one write(2), and returns how many
// of them are in the file. If the write comes up short, the file is cut
// back to the end of the last whole line; if that fails, whole is cleared
// and nothing more is written to the file.
func (w *Writer) writeLines(b []byte) (int, error) {
	if !w.whole && w.written > 0 {
		return 0, errors.New("the log ends in a torn line")
	}
	if w.stream != nil {
		// At most streamChunk bytes (or one longer line) per write, so that
		// a burst of one run holds the shared output only so long.
		lines := 0
		for len(b) > 0 {
			chunk := wholeWithin(b, streamChunk)
			if chunk == 0 {
				chunk = bytes.IndexByte(b, '\n') + 1
			}
			n, err := w.stream.write(b[:chunk])
			end := bytes.LastIndexByte(b[:n], '\n') + 1
			if end < n {
				w.whole = false // the stream has failed for every run
			}
			lines += bytes.Count(b[:end], []byte{'\n'})
			if err != nil {
				return lines, err
			}
			b = b[chunk:]
		}
		return lines, nil
	}
	n, err := w.f.Write(b)
	if n > 0 {
		w.unsynced = true
	}
	end := bytes.LastIndexByte(b[:n], '\n') + 1
	if end < n {
		// A torn line: cut it off, so that the file holds whole lines only.
		w.whole = false
		if st, serr := w.f.Stat(); serr == nil && st.Size() >= int64(n-end) {
			if w.f.Truncate(st.Size()-int64(n-end)) == nil {
				w.whole = true
			}
		}
	}
	w.size += int64(end)
	if err == nil && n < len(b) {
		err = io.ErrShortWrite
	}
	return bytes.Count(b[:end], []byte{'\n'}), err
}

// reserve makes sure the file's space is allocated for n more bytes and the
// trailer's room after them (fallocate, keeping the file's size), so that a
// full disk is found before a write and the trailer still fits. It returns
// an error only when the disk is full; a file system that cannot
// preallocate goes without the reserve.
func (w *Writer) reserve(n int) error {
	if !w.prealloc {
		return nil
	}
	need := w.size + int64(n) + w.tailRoom
	if need <= w.allocEnd {
		return nil
	}
	var err error
	for _, extra := range []int64{allocChunk, 0} {
		err = syscall.Fallocate(int(w.f.Fd()), fallocKeepSize, w.size, need+extra-w.size)
		if err == nil {
			w.allocEnd = need + extra
			return nil
		}
		if !errors.Is(err, syscall.ENOSPC) && !errors.Is(err, syscall.EDQUOT) && !errors.Is(err, syscall.EFBIG) {
			w.prealloc = false // EOPNOTSUPP and the like: no reserve here
			return nil
		}
	}
	return &os.PathError{Op: "fallocate", Path: w.path, Err: err}
}

// release gives back what reserve allocated beyond the file's end.
func (w *Writer) release() {
	if !w.prealloc || w.allocEnd == 0 {
		return
	}
	if st, err := w.f.Stat(); err == nil {
		w.f.Truncate(st.Size()) // frees blocks past the end (ext4, tmpfs)
		syscall.Fallocate(int(w.f.Fd()), fallocPunchHole|fallocKeepSize, st.Size(), w.allocEnd-st.Size())
	}
	w.allocEnd = 0
}

func (w *Writer) answerLine(p pendingLine, err error) {
	if p.done != nil {
		p.done <- err
		w.waiters--
	}
}

func (w *Writer) sync() {
	if !w.unsynced || w.failed || w.f == nil {
		return
	}
	w.unsynced = false
	if err := w.f.Sync(); err != nil {
		w.whole = false // what the file holds is unknown: no trailer
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

// trailer writes the trailer, chained to the last line in the file (which
// after a failed write is not the last line encoded), into the room kept
// for it, and fsyncs. It reports whether the trailer is in the file.
func (w *Writer) trailer(now time.Time) (th [sha256.Size]byte, in bool, err error) {
	w.c.buf.Reset()
	w.c.last, w.c.lines = w.lastDone, w.written
	if th, err = w.c.trailer(now, w.run, w.phase, int(w.lost.Load()), w.labels); err != nil {
		return th, false, err
	}
	defer w.c.buf.Reset()
	if err := w.reserve(w.c.buf.Len()); err != nil && int64(w.c.buf.Len()) > w.allocEnd-w.size {
		return th, false, err // no room for it (a trailer longer than the room kept)
	}
	k, err := w.writeLines(w.c.buf.Bytes())
	if k != 1 {
		return th, false, err
	}
	if w.f == nil {
		return th, true, nil
	}
	return th, true, w.f.Sync()
}

// finish runs once the queue is closed and drained.
func (w *Writer) finish() {
	now := w.now()
	if !w.rateNoted && w.rateHit.Load() {
		w.noteRate(now)
	}
	w.expire(now, true)
	w.flush()
	count, trailerIn := w.written, false
	var th [sha256.Size]byte
	if w.whole {
		// Also after a failed write (a full disk): the file still ends
		// with a whole line of ours, and the trailer's room was kept. The
		// trailer chains to that line and counts what was lost.
		var err error
		th, trailerIn, err = w.trailer(now)
		if err != nil {
			w.fail(fmt.Errorf("audit: %w", err))
		}
	}
	w.release()
	if trailerIn {
		w.sum = Summary{Count: count, Last: hex.EncodeToString(th[:])}
	} else {
		w.sum = Summary{Count: w.written, Last: hex.EncodeToString(w.lastDone[:])}
	}
	if w.stream != nil {
		w.stream.end()
		return
	}
	if err := w.f.Close(); err != nil {
		w.fail(fmt.Errorf("audit: %w", err))
	}
}
