package engine

import (
	"net/netip"
	"time"

	"github.com/tunwall/tunwall/dnsintercept"
	"github.com/tunwall/tunwall/internal/audit"
	"github.com/tunwall/tunwall/stack"
)

// flowRecord is what the engine knows about a flow as it goes.
type flowRecord struct {
	f        stack.Flow
	start    time.Time
	host     string
	hostFrom string
	v        verdict
	dial     netip.AddrPort
	owner    *ownerLookup
	out, in  int64
}

func (e *Engine) writeFlow(fr *flowRecord) {
	if e.cfg.Audit == nil {
		return
	}
	r := audit.Record{
		TS:       fr.start,
		Kind:     audit.KindFlow,
		Proto:    fr.f.Proto.String(),
		Src:      fr.f.Src,
		Dst:      fr.f.Dst,
		Host:     fr.host,
		HostFrom: fr.hostFrom,
		Port:     fr.f.Dst.Port(),
		Verdict:  audit.VerdictDeny,
		Rule:     fr.v.rule,
		Reason:   fr.v.reason,
		BytesOut: fr.out,
		BytesIn:  fr.in,
		Dial:     fr.dial,
	}
	if fr.v.allow {
		r.Verdict = audit.VerdictAllow
	}
	if r.HostFrom == "" {
		r.HostFrom = audit.HostFromNone
	}
	if r.Rule == "" {
		r.Rule = "default-deny"
	}
	r.DurationMS = float64(time.Since(fr.start).Microseconds()) / 1000
	setOwner(&r, fr.owner.wait())
	e.cfg.Audit.Write(r)
}

// deny records and prints a denied flow.
func (e *Engine) deny(fr *flowRecord, v verdict) {
	fr.v = v
	fr.v.allow = false
	what := target(fr.host, fr.f.Dst.Addr(), fr.f.Dst.Port())
	e.denials.printf("tunwall: denied %s %s: %s", what, fr.f.Proto, v.reason)
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
		Rule:     ev.Verdict.Rule,
		Reason:   ev.Verdict.Reason,
		Qname:    ev.QName,
		Qtype:    ev.QType,
		Rcode:    ev.RCode,
	}
	consulted := ev.Verdict != (dnsintercept.Verdict{})
	switch {
	case ev.Verdict.Allow:
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
	if e.cfg.Audit != nil {
		e.cfg.Audit.Write(r)
	}
}
