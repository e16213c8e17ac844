package engine

import (
	"net/netip"
	"time"

	"github.com/tunwall/tunwall/internal/audit"
	"github.com/tunwall/tunwall/internal/procattr"
	"github.com/tunwall/tunwall/stack"
)

// ownerLookup is the attribution of one flow: a lookup queued with the
// resolver's worker when the flow starts (procattr.Resolver.Start never
// blocks and starts no goroutine), so attribution never delays a packet or a
// dial. The flow's record takes the answer when it is written.
type ownerLookup struct {
	p *procattr.Pending // nil: attribution off
}

// lookupOwner starts attributing the flow src→dst.
func (e *Engine) lookupOwner(proto string, src, dst netip.AddrPort) *ownerLookup {
	if e.cfg.Attr == nil {
		return &ownerLookup{}
	}
	return &ownerLookup{p: e.cfg.Attr.Start(proto, src, dst)}
}

// lookupTCPOwner starts attributing the TCP flow src→dst. Every path of
// Engine.TCP waits for the answer within moments (beforeAccept, or the
// record of a flow it denies), so the resolver need not wake its worker
// for a lookup alone in its queue (procattr.Resolver.StartWaited).
func (e *Engine) lookupTCPOwner(src, dst netip.AddrPort) *ownerLookup {
	if e.cfg.Attr == nil {
		return &ownerLookup{}
	}
	return &ownerLookup{p: e.cfg.Attr.StartWaited("tcp", src, dst)}
}

// dnsAttributionWait bounds how long a DNS answer waits for attribution.
const dnsAttributionWait = 50 * time.Millisecond

// recordAttributionWait bounds how long writing a record waits for a lookup
// that has not finished; after it the lookup is dropped and the record says
// "unknown: overloaded".
const recordAttributionWait = 50 * time.Millisecond

// handshakeAttributionWait bounds how long a TCP flow's handshake waits for
// its lookup (see beforeAccept).
const handshakeAttributionWait = 50 * time.Millisecond

// beforeAccept is called before the sandbox's handshake completes: until
// then the sandbox's socket is surely open (its connect is pending), so its
// owner can be found; once connected, a short-lived client may close it
// before a late lookup runs ("gone"). Usually the lookup finished while
// the upstream was dialled and this costs nothing; when the worker lags (a
// busy host), the flow's goroutine runs its own lookup (Pending.Wait), for
// at most handshakeAttributionWait.
func (l *ownerLookup) beforeAccept() {
	l.waitFor(handshakeAttributionWait)
}

// waitFor waits at most d for the lookup to finish.
func (l *ownerLookup) waitFor(d time.Duration) {
	if l != nil && l.p != nil {
		l.p.Wait(d)
	}
}

// known returns the answer if the lookup has finished, without waiting.
func (l *ownerLookup) known() (procattr.Owner, bool) {
	if l == nil {
		return procattr.Owner{}, false
	}
	return l.p.Owner() // a nil Pending (attribution off) answers at once
}

// wait returns the owner for a record: the answer, waiting at most
// recordAttributionWait for it; without one the lookup is dropped.
func (l *ownerLookup) wait() procattr.Owner {
	if l == nil {
		return procattr.Owner{Note: "unknown"}
	}
	if l.p == nil {
		return procattr.Owner{Note: "unknown: attribution off"}
	}
	return l.p.Finish(recordAttributionWait)
}

func setOwner(r *audit.Record, o procattr.Owner) {
	r.PID, r.Comm, r.Exe, r.Owner = o.PID, o.Comm, o.Exe, o.Note
}

// trackOwner starts finding the process behind a DNS session, so each query
// record can name it. The session waits for the answer at once
// (waitOwner), so, as a TCP flow's handshake does, it runs the lookup
// itself rather than wake the resolver's worker for it
// (procattr.Resolver.StartWaited).
func (e *Engine) trackOwner(proto string, f stack.Flow) *ownerLookup {
	l := &ownerLookup{}
	if e.cfg.Attr != nil {
		l.p = e.cfg.Attr.StartWaited(proto, f.Src, f.Dst)
	}
	e.omu.Lock()
	e.owners[f.Src] = l
	e.omu.Unlock()
	return l
}

// untrackOwner ends a DNS session's attribution: a lookup still running is
// dropped.
func (e *Engine) untrackOwner(f stack.Flow, l *ownerLookup) {
	e.omu.Lock()
	if e.owners[f.Src] == l {
		delete(e.owners, f.Src)
	}
	e.omu.Unlock()
	if l.p != nil {
		l.p.Finish(0)
	}
}
