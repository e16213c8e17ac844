package engine

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tunwall/tunwall/stack"
)

// refusedQueue bounds the records of flows the stack refused at its limits
// that wait to be written: a flood of refusals costs at most this many
// records and one goroutine, and never blocks the packet path.
const refusedQueue = 1024

// refusals records flows the stack refused at a limit.
type refusals struct {
	q       chan *flowRecord
	running atomic.Bool
	dropped atomic.Uint64 // not recorded one by one: the queue was full
	writers sync.WaitGroup
}

// Refused implements stack.Handler: a flow refused at one of the stack's
// limits (flows, sessions, handshakes) is denied like any other, with rule
// "limit". It runs on the packet path: the record is queued, and written by
// a goroutine that lives while the queue is not empty.
func (e *Engine) Refused(f stack.Flow, err error) {
	fr := &flowRecord{
		f:     f,
		start: time.Now(),
		v:     verdict{Rule: "limit", Reason: err.Error() + refusedWhat(err)},
		// The flood this answers is no time for attribution: owner nil.
	}
	select {
	case e.refused.q <- fr:
	default:
		e.refused.dropped.Add(1)
		return
	}
	if e.refused.running.CompareAndSwap(false, true) {
		e.refused.writers.Go(e.writeRefused)
	}
}

func (e *Engine) writeRefused() {
	for {
		e.drainRefused()
		e.refused.running.Store(false)
		// A record queued after the last receive but before the store
		// found running still true: look once more.
		if len(e.refused.q) == 0 || !e.refused.running.CompareAndSwap(false, true) {
			return
		}
	}
}

// RefusedUnrecorded is how many refused flows were not recorded one by one
// because too many were waiting to be written.
func (e *Engine) RefusedUnrecorded() uint64 { return e.refused.dropped.Load() }

// slotHold releases the fake-pool slot of a flow once, when the flow ends:
// when Engine.TCP returns, unless a relay that outlives it took the hold
// (keep), then when the relay ends.
type slotHold struct {
	release func()
	kept    bool // set on Engine.TCP's goroutine only
	once    sync.Once
}

// done releases the slot unless a relay kept it.
func (h *slotHold) done() {
	if h != nil && !h.kept {
		h.once.Do(h.release)
	}
}

// keep hands the slot to a relay: the returned func releases it.
func (h *slotHold) keep() func() {
	if h == nil {
		return func() {}
	}
	h.kept = true
	return func() { h.once.Do(h.release) }
}

// drainRefused writes the queued records until the queue is empty.
func (e *Engine) drainRefused() {
	for {
		select {
		case fr := <-e.refused.q:
			e.deny(fr, fr.v)
		default:
			return
		}
	}
}

// refusedWhat ends the reason of a flow refused at a limit: what else is
// refused while it holds.
func refusedWhat(err error) string {
	if errors.Is(err, stack.ErrTooManyToOneDest) {
		return ": new flows to it are denied; other destinations keep theirs"
	}
	return ": new flows are denied"
}
