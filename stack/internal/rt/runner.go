package rt

import (
	"runtime"
	"sync"
)

// Pump moves what is ready for one flow, without blocking, at most limit
// times; it reports whether it stopped at the limit with more to move (it
// is then queued again). A flow's pump is started at most once until it
// returns false.
type Pump interface {
	Pump(limit int) (more bool)
}

// Moves bounds the moves a pump makes on a runner goroutine before the
// pumps queued behind it get theirs: a flow that always has bytes to move
// shares the runners instead of keeping one.
const Moves = 16

// Runner runs the pumps that leave the goroutine that scheduled them on
// at most max goroutines at once; the others wait in a queue, in order, and
// run on the goroutines of the pumps before them, Moves at a time (a
// pump with more to move goes to the back). Pumps never block (they move
// what is ready and return), so a bounded number of goroutines loses
// nothing but the stacks a burst would otherwise pile up: when thousands of
// flows become ready together (a read deadline all of them share, a flood
// of first bytes), each got a goroutine of its own, and their stacks took
// 40 MiB at once. A flow is queued at most once (pumpCore's state admits
// one running pump per flow), so the queue is bounded by the flows.
// (A flow's end may wait for the audit queue; see MaxGoroutines.)
type Runner struct {
	max   int
	spawn func(func()) // starts a goroutine

	mu      sync.Mutex
	running int
	queue   []Pump // waiting pumps, queue[head:]
	head    int
}

// MaxGoroutines bounds the goroutines the pumps run on at once: a few
// per CPU, since a pump only computes and makes non-blocking syscalls, and
// room for the ones whose flow's end waits for the audit queue.
func MaxGoroutines() int { return max(64, 16*runtime.GOMAXPROCS(0)) }

// NewRunner returns a runner of at most max goroutines at once, which
// spawn starts (nil: a go statement).
func NewRunner(max int, spawn func(func())) *Runner {
	if spawn == nil {
		spawn = func(fn func()) { go fn() }
	}
	return &Runner{max: max, spawn: spawn}
}

// Start runs p on a new goroutine, or queues it when max run.
func (r *Runner) Start(p Pump) {
	r.mu.Lock()
	if r.running < r.max {
		r.running++
		r.mu.Unlock()
		r.spawn(func() { r.loop(p) })
		return
	}
	r.queue = append(r.queue, p)
	r.mu.Unlock()
}

// loop runs p, then the queued pumps, until none waits. A pump that has
// more to move after Moves goes to the back of the queue.
func (r *Runner) loop(p Pump) {
	for p != nil {
		if p.Pump(Moves) {
			r.mu.Lock()
			r.queue = append(r.queue, p)
			r.mu.Unlock()
		}
		p = r.next()
	}
}

// next takes the first queued pump, or gives the goroutine up (nil).
func (r *Runner) next() Pump {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.head == len(r.queue) {
		r.running--
		r.queue, r.head = r.queue[:0], 0
		if cap(r.queue) > 1024 {
			r.queue = nil // a burst's queue does not stay allocated
		}
		return nil
	}
	p := r.queue[r.head]
	r.queue[r.head] = nil
	r.head++
	if r.head >= 64 && 2*r.head >= len(r.queue) {
		// A queue that never empties (busy flows taking turns) moves its
		// waiting pumps to the front instead of growing at the back.
		n := copy(r.queue, r.queue[r.head:])
		clear(r.queue[n:])
		r.queue, r.head = r.queue[:n], 0
	}
	return p
}
