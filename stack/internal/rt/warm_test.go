package rt

import (
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/tunwall/tunwall/internal/testenv"
)

// waitWaiting waits until n of p's goroutines wait for work, bounded.
func waitWaiting(t *testing.T, p *WarmPool, n int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; runtime.Gosched() {
		got := p.Waiting()
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines wait for work after 10s, want %d", got, n)
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
	p := NewWarmPool()
	defer p.Close()
	ids := make(chan uint64, 1)
	p.Run(func() { ids <- testenv.Goid() })
	first := <-ids
	waitWaiting(t, p, 1)
	testenv.WaitParked(t, first)
	for i := range 20 {
		p.Run(func() { ids <- testenv.Goid() })
		if got := <-ids; got != first {
			t.Fatalf("work %d ran on goroutine %d, want the waiting goroutine %d", i, got, first)
		}
		waitWaiting(t, p, 1)
		testenv.WaitParked(t, first)
	}
}

// A burst leaves at most max goroutines waiting; the others end when their
// work is done, and the waiting ones end after the idle time.
func TestWarmPoolKeepsAtMostMaxWaitingAndNoneForLong(t *testing.T) {
	p := NewWarmPool()
	p.idle = 50 * time.Millisecond
	defer p.Close()
	burst := 3 * p.max
	release := make(chan struct{})
	var started, ended sync.WaitGroup
	started.Add(burst)
	ended.Add(burst)
	for range burst {
		p.Run(func() { started.Done(); <-release; ended.Done() })
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
	p := NewWarmPool()
	p.idle = time.Hour
	ran := make(chan struct{}, 2)
	p.Run(func() { ran <- struct{}{} })
	<-ran
	waitWaiting(t, p, 1)
	p.Close()
	waitWaiting(t, p, 0)
	p.Run(func() { ran <- struct{}{} })
	<-ran
	waitWaiting(t, p, 0)
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.stopped {
		t.Fatal("the pool is not stopped after close")
	}
}
