package engine

import (
	"fmt"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tunwall/tunwall/stack"
)

// heldWriter holds its first write until released: a terminal the user's
// shell reads late, which keeps the refusals' writer busy with one record
// while the others wait in the queue.
type heldWriter struct {
	writes  atomic.Int32
	entered chan struct{} // closed when the first write is held
	release chan struct{}
}

func (w *heldWriter) Write(p []byte) (int, error) {
	if w.writes.Add(1) == 1 {
		close(w.entered)
		<-w.release
	}
	return len(p), nil
}

// TestRefusedFlowsQueuedAtTheEndAreAllRecorded: flows the stack refused
// just before tunwall stops are still waiting to be written when the
// session closes; each must be in the audit log before it closes, not lost
// with the goroutine writing them.
func TestRefusedFlowsQueuedAtTheEndAreAllRecorded(t *testing.T) {
	w := &heldWriter{entered: make(chan struct{}), release: make(chan struct{})}
	r := newRig(t, allowTLS, func(c *Config) { c.Denials = w })
	const n = 100
	for i := range n {
		f := stack.Flow{
			Proto: stack.TCP,
			Src:   netip.AddrPortFrom(netip.MustParseAddr("10.77.0.5"), uint16(40000+i)),
			Dst:   netip.MustParseAddrPort("192.0.2.80:80"),
		}
		r.e.Refused(f, fmt.Errorf("stack: too many TCP flows (%d, --max-tcp-flows)", n))
	}
	select {
	case <-w.entered:
	case <-time.After(5 * time.Second):
		close(w.release)
		t.Fatal("the refusals' writer never wrote")
	}
	// One record is being written (held), the others are queued: the
	// session closing now calls Close, which must not return before
	// every one of them is in the log.
	flushed := make(chan struct{})
	go func() {
		r.e.Close()
		close(flushed)
	}()
	select {
	case <-flushed:
		close(w.release)
		t.Fatal("Close returned while a refused flow's record was still being written")
	case <-time.After(100 * time.Millisecond):
	}
	close(w.release)
	select {
	case <-flushed:
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not return once the writer was released")
	}
	got := 0
	for _, rec := range r.rec.All() {
		if rec.Rule == "limit" {
			got++
		}
	}
	if got != n {
		t.Fatalf("%d of %d refused flows recorded when Close returned", got, n)
	}
	if d := r.e.RefusedUnrecorded(); d != 0 {
		t.Fatalf("%d refused flows counted as unrecorded, want 0 (the queue holds %d)", d, refusedQueue)
	}
}

// A UDP denial's record is written off the stack's goroutine: a denial
// racing the session's end must still be in the log when Close returns,
// not counted lost.
func TestAUDPDenialRacingTheEndIsRecordedBeforeCloseReturns(t *testing.T) {
	w := &heldWriter{entered: make(chan struct{}), release: make(chan struct{})}
	r := newRig(t, allowTLS, func(c *Config) { c.Denials = w })
	f := stack.Flow{Proto: stack.UDP, Src: netip.MustParseAddrPort("10.77.0.5:40000"), Dst: netip.MustParseAddrPort("192.0.2.80:5353")}
	if _, ok := r.e.UDP(f); ok {
		t.Fatal("a UDP flow no rule allows was accepted")
	}
	select {
	case <-w.entered:
	case <-time.After(5 * time.Second):
		close(w.release)
		t.Fatal("the denial was never written")
	}
	closed := make(chan struct{})
	go func() {
		r.e.Close()
		close(closed)
	}()
	select {
	case <-closed:
		close(w.release)
		t.Fatal("Close returned while a UDP denial's record was still being written")
	case <-time.After(100 * time.Millisecond):
	}
	close(w.release)
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not return once the writer was released")
	}
	if n := len(r.rec.All()); n != 1 {
		t.Fatalf("%d records when Close returned, want the denial's", n)
	}
}
