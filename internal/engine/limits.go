package engine

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/tunwall/tunwall/internal/procattr"
	"github.com/tunwall/tunwall/stack"
)

// relayEnded writes the record of a relayed TCP flow.
func (e *Engine) relayEnded(fr *flowRecord, res stack.RelayResult) {
	fr.out += res.Out
	fr.in += res.In
	if res.Err != nil {
		if errors.Is(res.Err, stack.ErrIdle) {
			fr.v.reason += "; closed after " + e.cfg.TCPIdle.String() + " idle"
		} else if !errors.Is(res.Err, context.Canceled) {
			e.log.Debug("relay ended", "flow", fr.f.String(), "err", res.Err)
		}
	}
	e.writeFlow(fr)
}

// refusedQueue bounds the records of flows the stack refused at its limits
// that wait to be written: a flood of refusals costs at most this many
// records and one goroutine, and never blocks the packet path.
const refusedQueue = 1024

// refusals records flows the stack refused at a limit.
type refusals struct {
	q       chan *flowRecord
	running atomic.Bool
	dropped atomic.Uint64 // not recorded one by one: the queue was full
}

// Refused implements stack.Handler: a flow refused at one of the stack's
// limits (flows, sessions, handshakes) is denied like any other, with rule
// "limit". It runs on the packet path: the record is queued, and written by
// a goroutine that lives while the queue is not empty.
func (e *Engine) Refused(f stack.Flow, err error) {
	fr := &flowRecord{
		f:     f,
		start: time.Now(),
		v:     verdict{rule: "limit", reason: err.Error() + ": new flows are denied"},
		// The flood this answers is no time for attribution.
		owner: doneLookup(procattr.Owner{Note: "not looked up: refused at a limit"}),
	}
	select {
	case e.refused.q <- fr:
	default:
		e.refused.dropped.Add(1)
		return
	}
	if e.refused.running.CompareAndSwap(false, true) {
		go e.writeRefused()
	}
}

func (e *Engine) writeRefused() {
	for {
		select {
		case fr := <-e.refused.q:
			e.deny(fr, fr.v)
			continue
		default:
		}
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

func doneLookup(o procattr.Owner) *ownerLookup {
	l := &ownerLookup{done: make(chan struct{}), owner: o}
	close(l.done)
	return l
}
