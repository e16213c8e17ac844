package audit

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
)

// Stream is one output shared by the runs of many Writers: the standard
// output of a node agent serving many sandboxes (`tunwall node
// --audit-stdout`), read by the cluster's log shipper. Give it to Open as
// Options.Stream, once per run.
//
// Each run keeps its own chain on a stream: its header's prev is 64 zeros
// and its lines chain to each other only, so that the lines of the runs
// can interleave in any order and a reader tells the chains apart by their
// run id (VerifyStream). Every header also carries the stream's id and the
// run's place among the stream's runs (Header.Stream, Header.Seq): a
// header is written with its seq under the stream's lock, so a stream's
// headers appear in seq order, and a whole run removed from a capture
// leaves a gap that VerifyStream reports.
//
// A Writer hands the stream whole lines only, at most 64 KiB of them at a
// time (or one longer line), and the stream writes each batch with one call to
// the underlying Write under one mutex: the lines of two runs never mix
// inside a line, and a slow output blocks the Writers' goroutines (their
// queues fill and Write blocks: back-pressure, never a drop). A Write of
// the underlying writer that fails or comes up short leaves the output
// with a torn line, after which no line of any run would read right: the
// stream fails for good, every Writer on it reports the error through Err
// and Admit (callers deny new flows: fail closed), and nothing more is
// written to it. Nothing is fsynced: what the output keeps is the
// reader's business (a pipe, a container log).
type Stream struct {
	id string
	mu sync.Mutex
	w  io.Writer
	// Guarded by mu.
	seq  int   // runs opened on the stream
	err  error // the first write error; nothing is written after it
	open int   // runs open on the stream
}

// ErrStreamFailed is wrapped by the errors of every Writer on a Stream once
// a write to it failed or came up short.
var ErrStreamFailed = errors.New("audit: stream failed")

// NewStream returns a Stream writing to w, with a new id ("ts-" and 16 hex
// digits) that its runs' headers carry. w is written by one goroutine at a
// time.
func NewStream(w io.Writer) *Stream {
	return &Stream{id: "ts-" + strings.TrimPrefix(NewRunID(), "tw-"), w: w}
}

// ID returns the id the stream's headers carry.
func (s *Stream) ID() string { return s.id }

// Err returns the error that failed the stream, wrapping ErrStreamFailed,
// or nil while it is healthy.
func (s *Stream) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// Open returns how many runs are open on the stream (opened by Open, not
// yet closed).
func (s *Stream) Open() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.open
}

// begin numbers a new run and writes its header, which encode returns for
// the run's seq, under the stream's lock: a stream's headers appear in
// seq order.
func (s *Stream) begin(encode func(id string, seq int) ([]byte, error)) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return s.err
	}
	b, err := encode(s.id, s.seq+1)
	if err != nil {
		return err
	}
	s.seq++
	if _, err := s.writeLocked(b); err != nil {
		return err
	}
	s.open++
	return nil
}

// end notes that a run opened by begin closed.
func (s *Stream) end() {
	s.mu.Lock()
	s.open--
	s.mu.Unlock()
}

// write writes b, whole lines, with one Write call and returns how many
// bytes of it are out. A failed or short write fails the stream.
func (s *Stream) write(b []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.writeLocked(b)
}

func (s *Stream) writeLocked(b []byte) (int, error) {
	if s.err != nil {
		return 0, s.err
	}
	if len(b) == 0 {
		return 0, nil
	}
	if b[len(b)-1] != '\n' || bytes.Count(b, []byte{'\n'}) == 0 {
		// The Writer's own bug if ever: refuse rather than tear a line.
		return 0, fmt.Errorf("audit: stream write of %d bytes does not end a line", len(b))
	}
	n, err := s.w.Write(b)
	if err == nil && n < len(b) {
		err = io.ErrShortWrite
	}
	if err != nil {
		s.err = fmt.Errorf("%w: %s: wrote %d of %d bytes: %w", ErrStreamFailed, s.id, n, len(b), err)
		return n, s.err
	}
	return n, nil
}
