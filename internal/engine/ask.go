package engine

import (
	"context"
	"net/netip"
	"strings"
	"time"

	"github.com/tunwall/tunwall/internal/approve"
	"github.com/tunwall/tunwall/policy"
)

// Asker holds, for a decision from outside, what only the default rule
// denies (tunwall --ask; *approve.Queue). The engine consults it for
// nothing else: not a deny rule's denial, the guard's, a placeholder's or
// a fronting check's, not in learn mode, not with default: public.
type Asker interface {
	// Granted returns the standing approval of host on port/proto in
	// phase, if any, at once.
	Granted(phase, host string, port uint16, proto string) (policy.Decision, bool)
	// Ask holds r until a decision or ctx is done; pending is true when
	// there was none by then.
	Ask(ctx context.Context, r approve.Request) (_ policy.Decision, pending bool)
	// SetPhase says the phase in effect changed: what is pending for
	// another phase is denied (its approval would allow nothing now).
	SetPhase(phase string)
}

// askPhase tells the Asker the phase of rs, the rules now in effect.
func (e *Engine) askPhase(rs *policy.RuleSet) {
	if e.cfg.Ask != nil {
		e.cfg.Ask.SetPhase(rs.Phase())
	}
}

// askHold bounds how long a DNS answer is held for a decision: shorter
// than a stub resolver's wait for one answer (glibc, Go: 5 s; musl sends
// again after 2.5 s), so that the client gets SERVFAIL, not a timeout,
// and asks again; its next query finds the decision made meanwhile.
const askHold = 2 * time.Second

// flowHold bounds how long a new TCP flow to a name (its handshake, held:
// tunwall dials first) waits for a decision before it is reset; the
// request stays pending for the client's next attempt. A client's connect
// waits longer than this (Linux: over a minute of SYN retries).
const flowHold = 10 * time.Second

// holdFlow asks about the TCP flow fr to its name on port when v, its
// decision, is a denial by the default rule alone, holding it for at most
// flowHold; it returns the decision to apply. A raw-IP flow is not held
// (its name, if any, comes with its first bytes, after the handshake).
func (e *Engine) holdFlow(ctx context.Context, fr *flowRecord, port uint16, v verdict) verdict {
	host, ok := askableName(fr.Host)
	if !ok || !e.askable(fr.rs, v) {
		return v
	}
	r := approve.Request{Phase: fr.rs.Phase(), Proto: approve.ProtoTCP, Host: host, Port: port}
	fr.owner.waitFor(handshakeAttributionWait)
	if o, ok := fr.owner.known(); ok {
		r.PID, r.Comm, r.Exe = o.PID, o.Comm, o.Exe
	}
	ctx, cancel := context.WithTimeout(ctx, flowHold)
	defer cancel()
	d, pending := e.cfg.Ask.Ask(ctx, r)
	d.Phase = fr.rs.Phase()
	if pending {
		d.Reason = "reset: " + d.Reason + " (" + v.Reason + ")"
	}
	return d
}

// askableName is host as a request names it (lower case, punycode), if
// it is a plain host name: nothing else (a query for an underscore name, a
// SOCKS request's malformed name, a wildcard) is held; it is denied at
// once.
func askableName(host string) (string, bool) {
	n, err := policy.NormalizeHost(host)
	if err != nil || strings.HasPrefix(n, "*.") {
		return "", false
	}
	return n, true
}

// askable reports whether d, decided under rs, is a denial by the
// default rule alone.
func (e *Engine) askable(rs *policy.RuleSet, d verdict) bool {
	return e.cfg.Ask != nil && !e.cfg.Learn && !d.Allowed() && d.Rule == policy.RuleDefaultDeny && !d.Explicit && !rs.Open()
}

// granted is d, decided under rs, or a standing approval of
// host:port/proto in rs's phase when d is a denial by the default rule
// alone. (Approvals are per phase: a switch to another phase revokes the
// flows they allowed, as it does those its rules no longer allow.)
func (e *Engine) granted(rs *policy.RuleSet, d verdict, host string, port uint16, proto policy.Proto) verdict {
	name, ok := askableName(host)
	if !ok || !e.askable(rs, d) {
		return d
	}
	if g, ok := e.cfg.Ask.Granted(rs.Phase(), name, port, proto.String()); ok {
		return g
	}
	return d
}

// holdQuery is the DNS server's Hold: a name denied by the default rule
// alone is asked about, its answer held for at most askHold.
func (e *Engine) holdQuery(ctx context.Context, src netip.AddrPort, qname string, d verdict) (verdict, bool) {
	rs := e.rules()
	name, ok := askableName(qname)
	if !ok || !e.askable(rs, d) {
		return d, false
	}
	r := approve.Request{Phase: rs.Phase(), Proto: approve.ProtoDNS, Host: name}
	e.omu.Lock()
	l := e.owners[src]
	e.omu.Unlock()
	l.waitFor(dnsAttributionWait)
	if o, ok := l.known(); ok {
		r.PID, r.Comm, r.Exe = o.PID, o.Comm, o.Exe
	}
	ctx, cancel := context.WithTimeout(ctx, askHold)
	defer cancel()
	v, pending := e.cfg.Ask.Ask(ctx, r)
	v.Phase = rs.Phase()
	return v, pending
}
