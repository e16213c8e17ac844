package stack

import (
	"context"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"github.com/tunwall/tunwall/internal/testenv"
	"github.com/tunwall/tunwall/stack/internal/rt"
)

// waitWarm waits until n of p's goroutines wait for work, bounded.
func waitWarm(t *testing.T, p *rt.WarmPool, n int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); p.Waiting() != n; runtime.Gosched() {
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines wait for work after 10s, want %d", p.Waiting(), n)
		}
	}
}

// goidHandler records the goroutine each TCP flow's handler runs on.
type goidHandler struct {
	*fakeHandler
	ids chan uint64
}

func (h goidHandler) TCP(ctx context.Context, r TCPRequest) {
	h.ids <- testenv.Goid()
	h.fakeHandler.TCP(ctx, r)
}

// A TCP flow's handler runs on the goroutine of a flow before it, whose
// stack has grown to what a flow needs.
func TestTCPFlowsRunOnTheGoroutinesOfFlowsBefore(t *testing.T) {
	h := goidHandler{newFakeHandler(), make(chan uint64, 1)}
	s, p := newTestStack(t, h, nil)
	waitWarm(t, s.warm, 0)
	var first uint64
	for i := range 5 {
		c := newTCPClient(p, netip.AddrPortFrom(netip.MustParseAddr("10.0.0.2"), uint16(40000+i)), netip.MustParseAddrPort("192.0.2.1:80"))
		c.syn()
		id := <-h.ids
		call := h.nextTCP(t)
		call.refuse()
		<-call.done
		if i == 0 {
			first = id
		} else if id != first {
			t.Fatalf("flow %d's handler ran on goroutine %d, want %d, where the flows before ran", i, id, first)
		}
		waitWarm(t, s.warm, 1)
		testenv.WaitParked(t, first)
	}
}
