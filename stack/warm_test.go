package stack

import (
	"bytes"
	"context"
	"net"
	"net/netip"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"
)

// goid is the calling goroutine's id, from its stack trace's header.
func goid() uint64 {
	b := make([]byte, 64)
	b = b[:runtime.Stack(b, false)]
	b = bytes.TrimPrefix(b, []byte("goroutine "))
	n, _ := strconv.ParseUint(string(b[:bytes.IndexByte(b, ' ')]), 10, 64)
	return n
}

// waitWaiting waits until n of p's goroutines wait for work, bounded.
func waitWaiting(t *testing.T, p *warmPool, n int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; runtime.Gosched() {
		p.mu.Lock()
		got := p.waiting
		p.mu.Unlock()
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines wait for work after 10s, want %d", got, n)
		}
	}
}

// waitParked waits until goroutine id is parked in a select (the pool's
// wait for work), bounded. The pool counts a goroutine as waiting just
// before it parks; until it has, a hand-off finds no receiver.
func waitParked(t *testing.T, id uint64) {
	t.Helper()
	prefix := []byte("goroutine " + strconv.FormatUint(id, 10) + " [select")
	buf := make([]byte, 1<<20)
	for deadline := time.Now().Add(10 * time.Second); ; runtime.Gosched() {
		n := runtime.Stack(buf, true)
		if n == len(buf) { // the dump did not fit: take it whole next time
			buf = make([]byte, 2*len(buf))
			continue
		}
		for g := range bytes.SplitSeq(buf[:n], []byte("\n\n")) {
			if bytes.HasPrefix(g, prefix) {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("goroutine %d is not parked in a select after 10s", id)
		}
	}
}

// waitGroupWithin fails the test if wg does not reach zero in time.
func waitGroupWithin(t *testing.T, wg *sync.WaitGroup, d time.Duration) {
	t.Helper()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(d):
		t.Fatalf("goroutines still waiting after %v", d)
	}
}

// Work handed to the pool runs on a goroutine that ran work before (its
// stack already grown), not on a new one.
func TestWarmPoolRunsWorkOnAGoroutineThatRanBefore(t *testing.T) {
	p := newWarmPool()
	defer p.close()
	ids := make(chan uint64, 1)
	p.run(func() { ids <- goid() })
	first := <-ids
	waitWaiting(t, p, 1)
	waitParked(t, first)
	for i := range 20 {
		p.run(func() { ids <- goid() })
		if got := <-ids; got != first {
			t.Fatalf("work %d ran on goroutine %d, want the waiting goroutine %d", i, got, first)
		}
		waitWaiting(t, p, 1)
		waitParked(t, first)
	}
}

// A burst leaves at most max goroutines waiting; the others end when their
// work is done, and the waiting ones end after the idle time.
func TestWarmPoolKeepsAtMostMaxWaitingAndNoneForLong(t *testing.T) {
	p := newWarmPool()
	p.idle = 50 * time.Millisecond
	defer p.close()
	burst := 3 * p.max
	release := make(chan struct{})
	var started, ended sync.WaitGroup
	started.Add(burst)
	ended.Add(burst)
	for range burst {
		p.run(func() { started.Done(); <-release; ended.Done() })
	}
	started.Wait()
	close(release)
	ended.Wait()
	p.mu.Lock()
	most := p.waiting
	p.mu.Unlock()
	if most > p.max {
		t.Fatalf("%d goroutines wait after a burst of %d, want at most %d", most, burst, p.max)
	}
	waitWaiting(t, p, 0) // the idle time passes
	waitGroupWithin(t, &p.wg, 10*time.Second)
}

// close ends the waiting goroutines at once; work run after it still runs,
// and its goroutine does not stay.
func TestWarmPoolCloseEndsTheWaitingGoroutines(t *testing.T) {
	p := newWarmPool()
	p.idle = time.Hour
	ran := make(chan struct{}, 2)
	p.run(func() { ran <- struct{}{} })
	<-ran
	waitWaiting(t, p, 1)
	p.close()
	waitWaiting(t, p, 0)
	p.run(func() { ran <- struct{}{} })
	<-ran
	waitWaiting(t, p, 0)
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.stopped {
		t.Fatal("the pool is not stopped after close")
	}
}

// goidHandler records the goroutine each TCP flow's handler runs on.
type goidHandler struct {
	*fakeHandler
	ids chan uint64
}

func (h goidHandler) TCP(ctx context.Context, f Flow, accept func() (net.Conn, error)) {
	h.ids <- goid()
	h.fakeHandler.TCP(ctx, f, accept)
}

// A TCP flow's handler runs on the goroutine of a flow before it, whose
// stack has grown to what a flow needs.
func TestTCPFlowsRunOnTheGoroutinesOfFlowsBefore(t *testing.T) {
	h := goidHandler{newFakeHandler(), make(chan uint64, 1)}
	s, p := newTestStack(t, h, nil)
	waitWaiting(t, s.warm, 0)
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
		waitWaiting(t, s.warm, 1)
		waitParked(t, first)
	}
}
