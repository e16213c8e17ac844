package engine

import (
	"context"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/tunwall/tunwall/policy"
	"github.com/tunwall/tunwall/stack"
)

// OpenFlow is a flow open now, as Engine.OpenFlows lists it.
type OpenFlow struct {
	Proto    string
	Src, Dst netip.AddrPort // Dst: what the sandbox asked for
	Host     string         // the flow's name, when known
	Dial     netip.AddrPort // where tunwall connected; zero until then
	PID      int            // the process behind it, once found; 0 unknown
	Comm     string
	Start    time.Time
	// BytesOut and BytesIn are what its relay moved so far, from and to
	// the sandbox.
	BytesOut, BytesIn int64
}

type openKey struct {
	proto    string
	src, dst netip.AddrPort
	start    time.Time
}

// openFlows is the engine's registry of the flows open now: an allowed
// flow enters once its start record is in the audit log (admit, rules.go)
// and leaves when its flow record is written. It holds no more than the
// flows the stack admits at once (its flow limits), and only copies of
// what the flow's goroutine has set (under mu), so listing it races with
// no flow. It is also where a change of the policy finds the flows to cut
// (Engine.SetRules).
type openFlows struct {
	mu sync.Mutex
	m  map[openKey]*openEntry
}

type openEntry struct {
	f     OpenFlow
	proto stack.Proto
	owner *ownerLookup
	prog  *stack.Progress
	// rs is the policy the flow is allowed under: the one it was decided
	// by, or a later one that allows it too.
	rs *policy.RuleSet
	// cut ends the flow's context; revoked is why, once it did.
	cut     context.CancelCauseFunc
	revoked string
}

func keyOf(fr *flowRecord) openKey {
	return openKey{fr.f.Proto.String(), fr.f.Src, fr.f.Dst, fr.start}
}

// dialled notes where an open flow was connected.
func (o *openFlows) dialled(fr *flowRecord, ap netip.AddrPort) {
	o.mu.Lock()
	if e := o.m[keyOf(fr)]; e != nil {
		e.f.Dial = ap
	}
	o.mu.Unlock()
}

// remove takes fr out of the registry and releases its context. It
// returns why a change of the policy cut it, or "" if none did.
func (o *openFlows) remove(fr *flowRecord) string {
	if fr.ctx == nil {
		return "" // never admitted
	}
	o.mu.Lock()
	x := o.m[keyOf(fr)]
	delete(o.m, keyOf(fr))
	o.mu.Unlock()
	if x == nil {
		return ""
	}
	x.cut(nil)
	return x.revoked
}

// OpenFlows lists the allowed flows open now, oldest first (with audit
// off, none: a flow is registered with its start record).
func (e *Engine) OpenFlows() []OpenFlow {
	e.open.mu.Lock()
	out := make([]OpenFlow, 0, len(e.open.m))
	owners := make([]*ownerLookup, 0, len(e.open.m))
	for _, x := range e.open.m {
		f := x.f
		f.BytesOut, f.BytesIn = x.prog.Out(), x.prog.In()
		out = append(out, f)
		owners = append(owners, x.owner)
	}
	e.open.mu.Unlock()
	for i, l := range owners {
		if o, ok := l.known(); ok {
			out[i].PID, out[i].Comm = o.PID, o.Comm
		}
	}
	slices.SortFunc(out, func(a, b OpenFlow) int { return a.Start.Compare(b.Start) })
	return out
}
