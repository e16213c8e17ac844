package rt

import (
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fakePump is a flow's pump: step moves, and says whether the flow is over
// and whether it has more to move.
type fakePump struct {
	step     func(limit int) (over, more bool)
	finished atomic.Bool
}

func (f *fakePump) Pump(limit int) bool {
	over, more := f.step(limit)
	if over {
		f.finished.Store(true)
		return false
	}
	return more
}

// waitRunnersGone waits until r's goroutines have given up (after their
// last pump returns), bounded.
func waitRunnersGone(t *testing.T, r *Runner) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; runtime.Gosched() {
		r.mu.Lock()
		n := r.running
		r.mu.Unlock()
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d runners still running after 10s", n)
		}
	}
}

// A burst of ready flows runs on at most max goroutines, and every pump
// runs.
func TestPumpRunnerBoundsTheGoroutinesOfABurst(t *testing.T) {
	const flows, limit = 200, 4
	r := NewRunner(limit, nil)
	var inside, most atomic.Int32
	var ran sync.WaitGroup
	release := make(chan struct{})
	ps := make([]*fakePump, flows)
	for i := range ps {
		p := &fakePump{}
		p.step = func(int) (bool, bool) {
			n := inside.Add(1)
			for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
			}
			<-release // as long as the test likes: the others must wait
			inside.Add(-1)
			ran.Done()
			return true, false
		}
		ps[i] = p
	}
	ran.Add(flows)
	for _, p := range ps {
		r.Start(p)
	}
	close(release)
	ran.Wait()
	waitRunnersGone(t, r)
	if m := most.Load(); m > limit {
		t.Errorf("%d pumps ran at once, want at most %d", m, limit)
	}
	for i, p := range ps {
		if !p.finished.Load() {
			t.Errorf("pump %d did not finish", i)
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.head != len(r.queue) {
		t.Errorf("after the burst: %d queued", len(r.queue)-r.head)
	}
}

// A flow that always has more to move shares the runner with the flows
// queued behind it.
func TestPumpRunnerGivesEveryFlowATurn(t *testing.T) {
	r := NewRunner(1, nil)
	var busyTurns atomic.Int32
	quietRan := make(chan int32, 1)
	busy, quiet := &fakePump{}, &fakePump{}
	queued := make(chan struct{}) // the quiet flow waits behind the busy one
	busy.step = func(limit int) (bool, bool) {
		<-queued
		if limit <= 0 {
			t.Error("a runner pump had no move limit")
			return true, false
		}
		// Bounded, so that a runner that never lets go fails the test
		// instead of hanging it.
		return busyTurns.Add(1) >= 1000, true
	}
	quiet.step = func(int) (bool, bool) {
		quietRan <- busyTurns.Load()
		return true, false
	}
	r.Start(busy)
	r.Start(quiet)
	close(queued)
	select {
	case n := <-quietRan:
		if n > 2 {
			t.Errorf("the queued flow ran after %d turns of the busy one, want its turn after the first", n)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the queued flow never ran")
	}
	waitRunnersGone(t, r)
}

// Busy flows taking turns for a long time keep the queue as long as the
// flows that wait, not as long as the turns taken.
func TestPumpRunnerQueueDoesNotGrowWithTurns(t *testing.T) {
	const flows, turns = 8, 20000
	r := NewRunner(1, nil)
	queued := make(chan struct{})
	var most atomic.Int64
	for range flows {
		p := &fakePump{}
		n := 0
		p.step = func(int) (bool, bool) {
			<-queued
			r.mu.Lock()
			most.Store(max(most.Load(), int64(cap(r.queue))))
			r.mu.Unlock()
			n++
			return n >= turns, true
		}
		r.Start(p)
	}
	close(queued)
	waitRunnersGone(t, r)
	if m := most.Load(); m > 256 {
		t.Errorf("the queue grew to %d slots for %d flows taking %d turns each", m, flows, turns)
	}
}
