package policy

import (
	"net/netip"
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
