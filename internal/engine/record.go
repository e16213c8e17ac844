package engine

import (
	"context"
	"errors"
	"net"
	"syscall"
	"time"

	"github.com/tunwall/tunwall/dnsintercept"
	"github.com/tunwall/tunwall/flow"
	"github.com/tunwall/tunwall/internal/audit"
	"github.com/tunwall/tunwall/internal/socks5"
	"github.com/tunwall/tunwall/policy"
	"github.com/tunwall/tunwall/stack"
)

// flowRecord is what the engine knows about a flow as it goes. What its
// record says and nothing else derives is kept in the embedded
// audit.Record (Host, HostFrom, Dial, DialFailed, SNI, HTTPHost, BytesOut,
// BytesIn: fields declared once, in the audit package); the rest is derived
// when the record is built, from the flow, its start and its verdict.
type flowRecord struct {
	audit.Record
	f            stack.Flow
	start        time.Time
	v            verdict
	dialAt       time.Time // when the dial to Dial completed
	dialErr      error     // why the upstream dial failed, if it did
	owner        *ownerLookup
	reset        bool      // the relay ended with a reset of either end
	certRejected bool      // the client refused the run's certificate (a terminated flow)
	hold         *slotHold // the fake-pool slot the flow holds, if any
	// req is the stack's request of a TCP flow from the sandbox: its dial
	// and its relay. nil for UDP and for flows of the SOCKS5 front end.
	req stack.TCPRequest
	// rs is the policy in effect when the flow came: every decision about
	// it uses rs, and the open-flow registry checks it against the policy
	// in effect when it is admitted (rules.go).
	rs *policy.RuleSet
	// ctx is the flow's own context once it is admitted as open: a
	// change of the policy that denies it ends it with errRevoked; prog
	// counts what its relay moved so far (OpenFlows).
	ctx  context.Context
	prog *stack.Progress
}

// record builds the flow's record of kind as far as it is known now. Its
// start record and its flow record share ts, proto, src and dst.
func (fr *flowRecord) record(kind string) audit.Record {
	r := fr.Record
	r.TS, r.Kind = fr.start, kind
	r.Proto, r.Src, r.Dst, r.Port = fr.f.Proto.String(), fr.f.Src, fr.f.Dst, fr.f.Dst.Port()
	r.Verdict, r.Rule, r.Reason = audit.VerdictDeny, fr.v.Rule, fr.v.Reason
	if fr.v.Allowed() {
		r.Verdict = audit.VerdictAllow
	}
	if r.HostFrom == "" {
		r.HostFrom = audit.HostFromNone
	}
	if r.Rule == "" {
		r.Rule = "default-deny"
	}
	r.Phase = fr.v.Phase
	return r
}

func (e *Engine) writeFlow(fr *flowRecord) {
	revoked := e.open.remove(fr)
	if e.cfg.Audit == nil {
		return
	}
	r := fr.record(audit.KindFlow)
	if fr.v.Allowed() {
		r.Outcome = outcome(fr.dialErr, e.cfg.Upstream != nil)
		if revoked != "" {
			r.Outcome = audit.OutcomeRevoked
			r.Reason += "; revoked: " + revoked
		}
		if fr.reset && r.Outcome == audit.OutcomeOK {
			r.Outcome = audit.OutcomeReset
		}
		if fr.certRejected && r.Outcome == audit.OutcomeOK {
			r.Outcome = audit.OutcomeCertRejected
		}
	}
	r.DurationMS = float64(time.Since(fr.start).Microseconds()) / 1000
	setOwner(&r, fr.owner.wait())
	e.cfg.Audit.Write(r)
}

// startWait bounds how long an allowed flow waits for its start record to
// reach the file before it is denied.
const startWait = 5 * time.Second

// opened records that an allowed flow opens: its start record, with the
// process behind it if already known (the flow record always has it), must
// reach the file before the flow is dialled, so that a flow still open when
// tunwall is killed leaves a trace. If the log refuses it (a bound was
// reached) or does not take it in time, the flow is denied and recorded so,
// and opened reports false: the caller then drops the flow without a byte.
// So it is, too, if the policy changed since the flow was decided and the
// new one denies it. Otherwise the flow is in the open-flow registry, and
// opened returns the context its dial and relay use: a change of the
// policy that denies the flow ends it.
func (e *Engine) opened(ctx context.Context, fr *flowRecord) (context.Context, bool) {
	if e.cfg.Audit == nil {
		return e.admitOpen(ctx, fr)
	}
	r := fr.record(audit.KindStart)
	if o, ok := fr.owner.known(); ok {
		setOwner(&r, o)
	} else {
		r.Owner = "pending"
	}
	t := time.NewTimer(startWait)
	defer t.Stop()
	var err error
	select {
	case err = <-e.cfg.Audit.Commit(r):
	case <-t.C:
		err = errors.New("the audit log did not take the flow's start record within " + startWait.String())
	case <-ctx.Done():
		e.deny(fr, verdict{Rule: "tunwall", Reason: "tunwall is shutting down"})
		return ctx, false
	}
	if err == nil {
		return e.admitOpen(ctx, fr)
	}
	e.deny(fr, boundVerdict(err))
	return ctx, false
}

// admitOpen enters fr into the open-flow registry, or, if the policy
// changed since fr was decided and the new one denies it, records it
// denied and reports false.
func (e *Engine) admitOpen(ctx context.Context, fr *flowRecord) (context.Context, bool) {
	fctx, v, ok := e.open.admit(e, ctx, fr)
	if !ok {
		v.Reason = "the policy in effect changed as the flow opened, and denies it: " + v.Reason
		e.deny(fr, v)
		return ctx, false
	}
	return fctx, true
}

// boundVerdict is the denial of new work the audit log cannot take.
func boundVerdict(err error) verdict {
	switch {
	case errors.Is(err, audit.ErrSizeCap):
		return verdict{Rule: audit.RuleMaxSize, Reason: err.Error() + ": new flows and DNS queries are denied for the rest of the run"}
	case errors.Is(err, audit.ErrRateLimited):
		return verdict{Rule: audit.RuleMaxRate, Reason: err.Error() + ": new flows and DNS queries are denied until the rate falls"}
	}
	return verdict{Rule: "audit", Reason: "the audit log cannot be written (" + err.Error() + "): new flows are denied"}
}

// outcome says how an allowed flow's dial went (audit.Outcome*), from its
// error; upstream is whether it went through an --upstream proxy.
func outcome(err error, upstream bool) string {
	if err == nil {
		return audit.OutcomeOK
	}
	var re *socks5.ReplyError
	var rc *dnsintercept.RcodeError
	var ne net.Error
	var rs *resolveError
	switch {
	case errors.As(err, &rs):
		return audit.OutcomeDNSFailed
	case errors.As(err, &re):
		switch re.Code {
		case socks5.ReplyConnectionRefused:
			return audit.OutcomeRefused
		case socks5.ReplyHostUnreachable, socks5.ReplyNetworkUnreachable:
			return audit.OutcomeUnreachable
		}
		return audit.OutcomeUpstreamProxyFailed
	case upstream:
		return audit.OutcomeUpstreamProxyFailed
	case errors.As(err, &rc), errors.Is(err, dnsintercept.ErrNoAddresses):
		return audit.OutcomeDNSFailed
	case errors.Is(err, syscall.ECONNREFUSED):
		return audit.OutcomeRefused
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return audit.OutcomeTimeout
	}
	return audit.OutcomeUnreachable
}

// deny records and prints a denied flow.
func (e *Engine) deny(fr *flowRecord, v verdict) {
	fr.v = v
	fr.v.Verdict = flow.Deny
	what := target(fr.Host, fr.f.Dst.Addr(), fr.f.Dst.Port())
	e.denials.printf("tunwall: denied %s %s: %s", what, fr.f.Proto, v.Reason)
	e.writeFlow(fr)
}

// onQuery writes the audit record of one DNS query.
func (e *Engine) onQuery(ev dnsintercept.QueryEvent) {
	r := audit.Record{
		TS:       time.Now(),
		Kind:     audit.KindDNS,
		Proto:    ev.Proto,
		Src:      ev.Src,
		Dst:      ev.Dst,
		Host:     ev.QName,
		HostFrom: audit.HostFromDNS,
		Port:     ev.Dst.Port(),
		Verdict:  audit.VerdictDeny,
		Rule:     ev.Decision.Rule,
		Reason:   ev.Decision.Reason,
		Qname:    ev.QName,
		Qtype:    ev.QType,
		Rcode:    ev.RCode,
	}
	consulted := ev.Decision != (policy.Decision{})
	switch {
	case ev.Decision.Allowed():
		r.Verdict = audit.VerdictAllow
	case !consulted && ev.RCode == "NOERROR":
		// Answered locally without asking the policy: a reverse lookup
		// of one of tunwall's own addresses.
		r.Verdict = audit.VerdictAllow
		r.Rule, r.Reason = "tunwall", "answered locally (reverse lookup of a tunwall address)"
	case !consulted:
		r.Rule, r.Reason = "tunwall", "answered "+ev.RCode+" without consulting the policy (malformed, unsupported or unassigned)"
	}
	if r.Rule == "" {
		r.Rule = "default-deny"
	}
	if r.Reason == "" {
		r.Reason = "query answered " + ev.RCode
	}
	e.omu.Lock()
	l := e.owners[ev.Src]
	e.omu.Unlock()
	setOwner(&r, l.wait())
	if r.Verdict == audit.VerdictDeny && ev.QName != "" {
		e.denials.printf("tunwall: denied DNS %s %s: %s", ev.QType, ev.QName, r.Reason)
	}
	if r.Verdict == audit.VerdictAllow && ev.UpstreamErr != nil {
		// No silent failure: an allowed query the upstream did not
		// answer is said, as a flow that did not open is.
		why := (&resolveError{host: ev.QName, err: ev.UpstreamErr}).why()
		r.Outcome = audit.OutcomeDNSFailed
		r.Reason += "; " + why
		e.denials.printf("tunwall: failed DNS %s %s: %s", ev.QType, ev.QName, why)
	}
	if e.cfg.Audit != nil {
		e.cfg.Audit.Write(r)
	}
}
