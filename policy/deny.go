package policy

import (
	"net/netip"
	"strings"
)

// Deny rules and the open default.
//
// A phase's deny rules have the forms of its allow rules (host, *.suffix,
// cidr; ports; proto) and win over any allow rule, the --allow flags'
// included: a flow, DNS query, dial or request a deny rule matches is
// denied, with the deny rule as its Decision.Rule and Explicit set. A deny
// rule without ports denies every port, without proto both protocols.
//
// A phase with "default: public" allows, instead of denying, TCP flows no
// allow rule allows to any name and to any public address (the guard
// still refuses every guarded address at dial time). It does not apply to
// a name that a rule with http or inject matches: that host's requests are
// checked, so only its rules' own ports are open; nor to UDP, whose
// payload (QUIC included) carries names tunwall does not read.

// denyName returns the lowest-index deny rule matching the canonical name
// on port/proto, or -1.
func (rs *RuleSet) denyName(name []byte, port uint16, proto Proto) int {
	return rs.denyFirst(name, port, proto, false)
}

// denyFirst is denyName, or with anyFlow, the lowest-index deny rule
// matching the name at all.
func (rs *RuleSet) denyFirst(name []byte, port uint16, proto Proto, anyFlow bool) int {
	if len(rs.denyExact) == 0 && len(rs.denyWild) == 0 {
		return -1
	}
	best := -1
	pick := func(idx []int) {
		for _, i := range idx {
			if (best < 0 || i < best) && (anyFlow || rs.deny[i].denies(port, proto)) {
				best = i
			}
		}
	}
	pick(rs.denyExact[string(name)])
	for i := 0; i < len(name); i++ {
		if name[i] == '.' {
			pick(rs.denyWild[string(name[i+1:])])
		}
	}
	return best
}

// deniesName reports whether some deny rule matching the canonical name
// covers port/proto.
func (rs *RuleSet) deniesName(name []byte, port uint16, proto Proto) bool {
	return rs.denyName(name, port, proto) >= 0
}

// denyAddr returns the lowest-index deny cidr rule containing a (unmapped,
// no zone) on port/proto, or -1.
func (rs *RuleSet) denyAddr(a netip.Addr, port uint16, proto Proto) int {
	for _, i := range rs.denyCIDRs {
		if rs.deny[i].CIDR.Contains(a) && rs.deny[i].denies(port, proto) {
			return i
		}
	}
	return -1
}

// denied is the decision of deny rule d on a flow that allow rule over (-1
// if none) would have allowed.
func (rs *RuleSet) denied(d, over int) Decision {
	reason := reasonDenyRule + " (deny rules win over any allow"
	if over >= 0 {
		reason += ": it wins over rule " + rs.labels[over]
	}
	reason += ")"
	return Decision{Verdict: Deny, Rule: rs.denyLabels[d], Reason: reason, Explicit: true}
}

// terminating returns the lowest-index allow rule with http or inject that
// matches the canonical name (any port), or -1: the open default does not
// apply to such a name.
func (rs *RuleSet) terminating(name []byte) int {
	best := -1
	pick := func(idx []int) {
		for _, i := range idx {
			if (best < 0 || i < best) && rs.rules[i].terminates() {
				best = i
			}
		}
	}
	pick(rs.exact[string(name)])
	for i := 0; i < len(name); i++ {
		if name[i] == '.' {
			pick(rs.wild[string(name[i+1:])])
		}
	}
	return best
}

// openFor reports whether the open default applies to TCP flows to the
// canonical name, and if not because of a rule, which one.
func (rs *RuleSet) openFor(name []byte) (bool, int) {
	if !rs.open {
		return false, -1
	}
	if t := rs.terminating(name); t >= 0 {
		return false, t
	}
	return true, -1
}

// someFlowAllowed reports whether any flow (some port and protocol) to the
// canonical name would be allowed: an allow rule matching it, or the open
// default over TCP, on a port no deny rule matching it covers. DNS answers
// exactly those names.
func (rs *RuleSet) someFlowAllowed(name []byte) bool {
	for _, proto := range [...]Proto{TCP, UDP} {
		if ok, _ := rs.openFor(name); ok && proto == TCP && rs.somePortFree(name, PortRange{1, 65535}, proto) {
			return true
		}
		free := false
		each := func(idx []int) {
			for _, i := range idx {
				if free || rs.rules[i].Proto != proto {
					continue
				}
				for _, pr := range rs.rules[i].Ports {
					if rs.somePortFree(name, pr, proto) {
						free = true
						return
					}
				}
			}
		}
		each(rs.exact[string(name)])
		for i := 0; i < len(name) && !free; i++ {
			if name[i] == '.' {
				each(rs.wild[string(name[i+1:])])
			}
		}
		if free {
			return true
		}
	}
	return false
}

// somePortFree reports whether some port of pr is not covered, over proto,
// by the deny rules matching the canonical name. The first port of a free
// stretch is pr.Lo or one past the end of a deny range, so only those are
// tried.
func (rs *RuleSet) somePortFree(name []byte, pr PortRange, proto Proto) bool {
	if !rs.deniesName(name, pr.Lo, proto) {
		return true
	}
	free := false
	each := func(idx []int) {
		for _, i := range idx {
			for _, d := range rs.deny[i].Ports {
				if free || d.Hi == 65535 {
					continue
				}
				if p := d.Hi + 1; pr.Contains(p) && !rs.deniesName(name, p, proto) {
					free = true
				}
			}
		}
	}
	each(rs.denyExact[string(name)])
	for i := 0; i < len(name) && !free; i++ {
		if name[i] == '.' {
			each(rs.denyWild[string(name[i+1:])])
		}
	}
	return free
}

// RuleWarning is a rule that loads but probably does not do what its
// author meant: Source is the rule's ("agent.yaml:12"), Msg says why.
type RuleWarning struct {
	Source string
	Msg    string
}

// DenyWarnings returns, for `tunwall policy check`, each allow rule that a
// single deny rule covers entirely (it allows nothing), and, when the
// default is deny, each deny rule that overlaps no allow rule (the default
// already denies what it names). A deny cidr rule is kept quiet while the
// set has host rules: a name may resolve into its range.
func (rs *RuleSet) DenyWarnings() []RuleWarning {
	var out []RuleWarning
	for i := range rs.rules {
		a := &rs.rules[i]
		for j := range rs.deny {
			if d := &rs.deny[j]; d.covers(a) {
				out = append(out, RuleWarning{a.Source, "rule " + a.String() + " allows nothing: deny rule " + d.String() + " (" + d.Source + ") covers all of it"})
				break
			}
		}
	}
	if rs.open {
		return out
	}
	hostRules := len(rs.exact) > 0 || len(rs.wild) > 0
	for j := range rs.deny {
		d := &rs.deny[j]
		if !d.isHost() && hostRules {
			continue
		}
		overlaps := false
		for i := range rs.rules {
			if d.overlaps(&rs.rules[i]) {
				overlaps = true
				break
			}
		}
		if !overlaps {
			out = append(out, RuleWarning{d.Source, "deny rule " + d.String() + " overlaps no allow rule: the default already denies what it names (it does something only with default: public)"})
		}
	}
	return out
}

// covers reports whether d, a deny rule, denies every flow allow rule a
// allows.
func (d *Rule) covers(a *Rule) bool {
	if d.Proto != AnyProto && d.Proto != a.Proto {
		return false
	}
	for _, ap := range a.Ports {
		in := false
		for _, dp := range d.Ports { // merged: a range covered is inside one
			if dp.Lo <= ap.Lo && ap.Hi <= dp.Hi {
				in = true
				break
			}
		}
		if !in {
			return false
		}
	}
	switch {
	case d.isHost() && a.isHost():
		return hostCovers(d.Host, a.Host)
	case !d.isHost() && !a.isHost():
		return d.CIDR.Addr().Is4() == a.CIDR.Addr().Is4() && d.CIDR.Bits() <= a.CIDR.Bits() && d.CIDR.Contains(a.CIDR.Addr())
	}
	return false
}

// overlaps reports whether some flow is both denied by d and allowed by a
// (for cidr rules, some address in both ranges).
func (d *Rule) overlaps(a *Rule) bool {
	if d.Proto != AnyProto && d.Proto != a.Proto {
		return false
	}
	ports := false
	for _, ap := range a.Ports {
		for _, dp := range d.Ports {
			if ap.Lo <= dp.Hi && dp.Lo <= ap.Hi {
				ports = true
			}
		}
	}
	switch {
	case !ports:
		return false
	case d.isHost() && a.isHost():
		return hostCovers(d.Host, a.Host) || hostCovers(a.Host, d.Host)
	case !d.isHost() && !a.isHost():
		return d.CIDR.Overlaps(a.CIDR)
	}
	return false
}

// hostCovers reports whether host pattern p (a name or "*.suffix") matches
// every name pattern q matches.
func hostCovers(p, q string) bool {
	if p == q {
		return true
	}
	suffix, ok := strings.CutPrefix(p, "*.")
	if !ok {
		return false
	}
	if qs, ok := strings.CutPrefix(q, "*."); ok {
		return qs == suffix || strings.HasSuffix(qs, "."+suffix)
	}
	return strings.HasSuffix(q, "."+suffix)
}
