package engine

import (
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/tunwall/tunwall/stack"
)

// slowWriter takes a while over every write: a terminal, a pipe the user's
// shell reads late.
type slowWriter struct {
	mu sync.Mutex
	n  int
}

func (w *slowWriter) Write(p []byte) (int, error) {
	time.Sleep(2 * time.Millisecond)
	w.mu.Lock()
	w.n++
	w.mu.Unlock()
	return len(p), nil
}

// TestRefusedFlowsQueuedAtTheEndAreAllRecorded: flows the stack refused
// just before tunwall stops are still waiting to be written when the
// session closes; each must be in the audit log before it closes, not lost
// with the goroutine writing them.
func TestRefusedFlowsQueuedAtTheEndAreAllRecorded(t *testing.T) {
	r := newRig(t, allowTLS, func(c *Config) { c.Denials = &slowWriter{} })
	const n = 100
	for i := range n {
		f := stack.Flow{
			Proto: stack.TCP,
			Src:   netip.AddrPortFrom(netip.MustParseAddr("10.77.0.5"), uint16(40000+i)),
			Dst:   netip.MustParseAddrPort("192.0.2.80:80"),
		}
		r.e.Refused(f, fmt.Errorf("stack: too many TCP flows (%d, --max-tcp-flows)", n))
	}
	r.e.FlushRefused()
	got := 0
	for _, rec := range r.rec.All() {
		if rec.Rule == "limit" {
			got++
		}
	}
	if got != n {
		t.Fatalf("%d of %d refused flows recorded when FlushRefused returned", got, n)
	}
	if d := r.e.RefusedUnrecorded(); d != 0 {
		t.Fatalf("%d refused flows counted as unrecorded, want 0 (the queue holds %d)", d, refusedQueue)
	}
}
