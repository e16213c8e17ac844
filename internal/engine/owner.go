package engine

import (
	"net/netip"
	"time"

	"github.com/tunwall/tunwall/internal/audit"
	"github.com/tunwall/tunwall/internal/procattr"
	"github.com/tunwall/tunwall/stack"
)

// ownerLookup finds a flow's process concurrently with the dial, so
// attribution never delays the first byte. wait returns the result, giving
// up after a short bound.
type ownerLookup struct {
	done  chan struct{}
	owner procattr.Owner
}

func (e *Engine) lookupOwner(proto string, src, dst netip.AddrPort) *ownerLookup {
	l := &ownerLookup{done: make(chan struct{})}
	if e.cfg.Attr == nil {
		l.owner.Note = "unknown: attribution off"
		close(l.done)
		return l
	}
	go func() {
		l.owner = e.cfg.Attr.Lookup(proto, src, dst)
		close(l.done)
	}()
	return l
}

// dnsAttributionWait bounds how long a DNS answer waits for attribution.
const dnsAttributionWait = 50 * time.Millisecond

// waitFor waits at most d for the lookup to finish.
func (l *ownerLookup) waitFor(d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-l.done:
	case <-t.C:
	}
}

func (l *ownerLookup) wait() procattr.Owner {
	if l == nil {
		return procattr.Owner{Note: "unknown"}
	}
	select {
	case <-l.done:
		return l.owner
	case <-time.After(200 * time.Millisecond):
		return procattr.Owner{Note: "unknown: attribution timed out"}
	}
}

func setOwner(r *audit.Record, o procattr.Owner) {
	r.PID, r.Comm, r.Exe, r.Owner = o.PID, o.Comm, o.Exe, o.Note
}

// trackOwner starts finding the process behind a DNS session, so each query
// record can name it.
func (e *Engine) trackOwner(proto string, f stack.Flow) *ownerLookup {
	l := e.lookupOwner(proto, f.Src, f.Dst)
	e.omu.Lock()
	e.owners[f.Src] = l
	e.omu.Unlock()
	return l
}

func (e *Engine) untrackOwner(f stack.Flow, l *ownerLookup) {
	e.omu.Lock()
	if e.owners[f.Src] == l {
		delete(e.owners, f.Src)
	}
	e.omu.Unlock()
}
