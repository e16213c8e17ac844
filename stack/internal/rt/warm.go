package rt

import (
	"runtime"
	"sync"
	"time"
)

// WarmPool keeps a few goroutines, whose stacks have grown to what a flow
// needs, waiting for the next flow's work. A new goroutine starts with a
// small stack, and a flow's handshake and relay run deep in gVisor: each
// flow's goroutines grew theirs by copying, two or three times, for every
// connection (5.8% of tunwall's CPU at 1,500 connections a second, in a
// CPU profile of `make bench`). Handing the work to a waiting goroutine
// costs a channel send, and wakes a goroutine as starting one would.
//
// The pool is bounded (at most max(16, 4*GOMAXPROCS) goroutines wait,
// each for at most warmIdle), so a burst leaves nothing behind for long; a
// goroutine that finds no room when its work is done just ends.
type WarmPool struct {
	work chan func()
	max  int
	idle time.Duration

	mu      sync.Mutex
	waiting int
	stopped bool
	stop    chan struct{}
	wg      sync.WaitGroup // the goroutines waiting
}

// warmIdle is how long a goroutine waits for work before it ends.
const warmIdle = 5 * time.Second

// NewWarmPool returns an empty pool.
func NewWarmPool() *WarmPool {
	return &WarmPool{
		work: make(chan func()),
		max:  max(16, 4*runtime.GOMAXPROCS(0)),
		idle: warmIdle,
		stop: make(chan struct{}),
	}
}

// HandOff gives fn to a waiting goroutine, and reports whether one took it.
func (p *WarmPool) HandOff(fn func()) bool {
	select {
	case p.work <- fn:
		return true
	default:
		return false
	}
}

// Run runs fn on a waiting goroutine, or on a new one.
func (p *WarmPool) Run(fn func()) {
	if !p.HandOff(fn) {
		go p.Serve(fn)
	}
}

// Serve runs fn on the calling goroutine, then keeps it waiting for more
// work while the pool has room.
func (p *WarmPool) Serve(fn func()) {
	var t *time.Timer
	for fn != nil {
		fn()
		fn = p.wait(&t)
	}
	if t != nil {
		t.Stop()
	}
}

// wait waits for work as one of the pool's goroutines, and returns nil
// when the pool is full or stopped, or no work came within p.idle. *t is
// the goroutine's timer, made on its first wait.
func (p *WarmPool) wait(t **time.Timer) func() {
	p.mu.Lock()
	if p.stopped || p.waiting >= p.max {
		p.mu.Unlock()
		return nil
	}
	p.waiting++
	p.wg.Add(1)
	p.mu.Unlock()
	defer p.wg.Done()

	if *t == nil {
		*t = time.NewTimer(p.idle)
	} else {
		(*t).Reset(p.idle)
	}
	var fn func()
	select {
	case fn = <-p.work:
	case <-(*t).C:
	case <-p.stop:
	}
	p.mu.Lock()
	p.waiting--
	p.mu.Unlock()
	return fn
}

// Close ends the waiting goroutines and waits for them; work handed off
// after it runs on goroutines that then end.
func (p *WarmPool) Close() {
	p.mu.Lock()
	if !p.stopped {
		p.stopped = true
		close(p.stop)
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// Waiting is the number of goroutines waiting for work.
func (p *WarmPool) Waiting() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.waiting
}
