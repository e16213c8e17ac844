package policy

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/tunwall/tunwall/flow"
)

// Decision is the outcome of one check: the verdict, the rule that decided
// it and a short human reason, ready for the audit record. It is flow's,
// the one decision type the DNS server, the engine and the audit share.
type Decision = flow.Decision

// Values of Decision.Rule when no rule decided.
const (
	RuleDefaultDeny = "default-deny"
	RuleGuard       = "guard"
	// RuleDefaultPublic is the rule of a flow no allow rule allows that a
	// phase's "default: public" allowed.
	RuleDefaultPublic = "default: public"
)

const (
	reasonAllowed   = "allowed by rule"
	reasonNoRule    = "no rule allows it"
	reasonNotGuard  = "not a guarded address"
	reasonNeverDial = "never dialled unless a cidr rule names it"
	reasonPublic    = "no allow rule names it; default: public allows public destinations over tcp (the guard checks every address at dial time)"
	reasonDenyRule  = "a deny rule matches it"
)

// RuleSet is the compiled rule set for one run: one phase of a policy plus
// the --allow rules, and the guard. It is immutable and safe for concurrent
// use; the Decide methods do not allocate on the allow path.
type RuleSet struct {
	phase  string
	rules  []Rule
	labels []string         // labels[i] is the Decision.Rule text of rules[i]
	exact  map[string][]int // canonical name -> indices of exact host rules
	wild   map[string][]int // suffix (after "*.") -> indices of wildcard rules
	cidrs  []int            // indices of cidr rules, ascending
	hostPR [3][]PortRange   // per proto: merged ports of all host rules
	extra  []netip.Prefix   // Guard.Extra, canonical

	// Deny rules (the phase's), which win over any allow rule, indexed as
	// the allow rules are.
	deny       []Rule
	denyLabels []string
	denyExact  map[string][]int
	denyWild   map[string][]int
	denyCIDRs  []int
	// open is the phase's default: public: TCP to any public destination
	// no allow rule names is allowed.
	open bool
}

// Select builds the rule set for one run from one phase of p plus extra (the
// --allow rules, appended after the phase's rules). p may be nil, meaning
// only extra. phase may be "" when p is nil or has exactly one phase; with
// more phases, "" is an error that names them, as is an unknown phase or a
// phase given without a policy. Rules in extra are validated and
// canonicalized; g.Extra prefixes must be valid.
func Select(p *Policy, phase string, extra []Rule, g Guard) (*RuleSet, error) {
	var base, deny []Rule
	open := false
	switch {
	case p == nil || len(p.phases) == 0:
		// Only --allow rules: the phase, if any, just labels the run.
		if phase != "" && !validPhaseName(phase) {
			return nil, fmt.Errorf("policy: bad phase name %q (1-64 of A-Z a-z 0-9 . _ -)", phase)
		}
	case phase == "":
		if len(p.phases) > 1 {
			return nil, fmt.Errorf("policy: %s has phases %s; choose one with --phase",
				p.file, strings.Join(p.Phases(), ", "))
		}
		ph := &p.phases[0]
		phase, base, deny, open = ph.name, ph.rules, ph.deny, ph.open
	default:
		found := false
		for _, ph := range p.phases {
			if ph.name == phase {
				base, deny, open, found = ph.rules, ph.deny, ph.open, true
				break
			}
		}
		if !found {
			return nil, fmt.Errorf("policy: unknown phase %q (%s has phases %s)",
				phase, p.file, strings.Join(p.Phases(), ", "))
		}
	}
	ext, err := canonGuard(g)
	if err != nil {
		return nil, fmt.Errorf("policy: %w", err)
	}
	rs := &RuleSet{
		phase: phase,
		rules: make([]Rule, 0, len(base)+len(extra)),
		exact: make(map[string][]int),
		wild:  make(map[string][]int),
		extra: ext,
		open:  open,
	}
	if len(deny) > 0 {
		rs.denyExact, rs.denyWild = make(map[string][]int), make(map[string][]int)
	}
	for i, r := range deny {
		rs.deny = append(rs.deny, r.clone())
		rs.denyLabels = append(rs.denyLabels, "deny "+r.String()+" ("+r.Source+")")
		switch {
		case strings.HasPrefix(r.Host, "*."):
			rs.denyWild[r.Host[2:]] = append(rs.denyWild[r.Host[2:]], i)
		case r.Host != "":
			rs.denyExact[r.Host] = append(rs.denyExact[r.Host], i)
		default:
			rs.denyCIDRs = append(rs.denyCIDRs, i)
		}
	}
	for _, r := range base {
		rs.rules = append(rs.rules, r.clone())
	}
	for i, r := range extra {
		n, err := r.normalized()
		if err != nil {
			return nil, fmt.Errorf("policy: extra rule %d (%q from %s): %w", i, r.String(), r.Source, err)
		}
		rs.rules = append(rs.rules, n)
	}
	rs.labels = make([]string, len(rs.rules))
	for i, r := range rs.rules {
		src := r.Source
		if src == "" {
			src = "unknown source"
		}
		rs.labels[i] = r.String() + " (" + src + ")"
		switch {
		case strings.HasPrefix(r.Host, "*."):
			rs.wild[r.Host[2:]] = append(rs.wild[r.Host[2:]], i)
		case r.Host != "":
			rs.exact[r.Host] = append(rs.exact[r.Host], i)
		default:
			rs.cidrs = append(rs.cidrs, i)
		}
		if r.isHost() {
			rs.hostPR[r.Proto] = normalizePorts(append(rs.hostPR[r.Proto], r.Ports...))
		}
	}
	return rs, nil
}

// Phase returns the selected phase ("" when there is no policy file).
func (rs *RuleSet) Phase() string { return rs.phase }

// Open reports whether the phase's default is public (default: public).
func (rs *RuleSet) Open() bool { return rs.open }

// DenyRules returns a copy of the phase's deny rules, in file order.
func (rs *RuleSet) DenyRules() []Rule {
	out := make([]Rule, len(rs.deny))
	for i, r := range rs.deny {
		out[i] = r.clone()
	}
	return out
}

// Rules returns a copy of the allow rules in decision order: the phase's,
// then extra.
func (rs *RuleSet) Rules() []Rule {
	out := make([]Rule, len(rs.rules))
	for i, r := range rs.rules {
		out[i] = r.clone()
	}
	return out
}

// nameMatch accumulates host-rule matches for one canonical name.
type nameMatch struct {
	best      int // lowest-index rule matching name, port and proto
	wrongPort int // lowest-index rule matching name and proto only
	wrongProt int // lowest-index rule matching the name only
	anyName   int // lowest-index rule matching the name
}

func (m *nameMatch) add(rs *RuleSet, idx []int, port uint16, proto Proto) {
	for _, i := range idx {
		r := &rs.rules[i]
		lower := func(cur int) bool { return cur < 0 || i < cur }
		if lower(m.anyName) {
			m.anyName = i
		}
		switch {
		case r.Proto != proto:
			if lower(m.wrongProt) {
				m.wrongProt = i
			}
		case !portsContain(r.Ports, port):
			if lower(m.wrongPort) {
				m.wrongPort = i
			}
		default:
			if lower(m.best) {
				m.best = i
			}
		}
	}
}

// matchName runs every host rule that matches the canonical name.
func (rs *RuleSet) matchName(name []byte, port uint16, proto Proto) nameMatch {
	m := nameMatch{-1, -1, -1, -1}
	m.add(rs, rs.exact[string(name)], port, proto)
	if len(rs.wild) > 0 {
		for i := 0; i < len(name); i++ {
			if name[i] == '.' {
				m.add(rs, rs.wild[string(name[i+1:])], port, proto)
			}
		}
	}
	return m
}

// DecideName decides whether a flow to host (a DNS name, as asked or
// sniffed) on port/proto may start. Only host rules apply. The name is
// compared case-insensitively, without its trailing dot, and in punycode.
func (rs *RuleSet) DecideName(host string, port uint16, proto Proto) Decision {
	var buf nameBuf
	n, bad := canonName(&buf, host, flow.Hostname)
	if bad != "" {
		return Decision{Verdict: Deny, Rule: RuleDefaultDeny, Reason: "invalid host name: " + bad}
	}
	m := rs.matchName(buf[:n], port, proto)
	if d := rs.denyName(buf[:n], port, proto); d >= 0 {
		return rs.denied(d, m.best)
	}
	if m.best >= 0 {
		return Decision{Verdict: Allow, Rule: rs.labels[m.best], Reason: reasonAllowed}
	}
	if rs.open && proto == TCP {
		ok, t := rs.openFor(buf[:n])
		if ok {
			return Decision{Verdict: Allow, Rule: RuleDefaultPublic, Reason: reasonPublic}
		}
		return Decision{Verdict: Deny, Rule: RuleDefaultDeny, Reason: "default: public does not apply to a host whose requests are checked (rule " + rs.labels[t] + " has http or inject): only its rules' ports are allowed"}
	}
	switch {
	case m.wrongPort >= 0:
		return Decision{Verdict: Deny, Rule: RuleDefaultDeny, Reason: "port " + strconv.Itoa(int(port)) + " not in rule " + rs.rules[m.wrongPort].String()}
	case m.wrongProt >= 0:
		return Decision{Verdict: Deny, Rule: RuleDefaultDeny, Reason: proto.String() + " not in rule " + rs.rules[m.wrongProt].String()}
	}
	return rs.noRule()
}

// noRule is the denial of a flow no rule matches at all.
func (rs *RuleSet) noRule() Decision {
	if rs.open {
		return Decision{Verdict: Deny, Rule: RuleDefaultDeny, Reason: reasonNoRule + " (default: public opens tcp only)"}
	}
	return Decision{Verdict: Deny, Rule: RuleDefaultDeny, Reason: reasonNoRule}
}

// NameAllowed reports whether any host rule, for any port and protocol,
// matches host. DNS uses it to decide whether to answer a query at all, so
// host is a query name (flow.QueryName): underscore labels (_grpc_config,
// _http._tcp) are names a wildcard rule covers; no rule names one exactly,
// since rules are host names. A flow to such a name is still decided by
// DecideName, which refuses it.
func (rs *RuleSet) NameAllowed(host string) Decision {
	var buf nameBuf
	n, bad := canonName(&buf, host, flow.QueryName)
	if bad != "" {
		return Decision{Verdict: Deny, Rule: RuleDefaultDeny, Reason: "invalid host name: " + bad}
	}
	m := rs.matchName(buf[:n], 0, 0)
	if len(rs.deny) == 0 && !rs.open {
		if m.anyName >= 0 {
			return Decision{Verdict: Allow, Rule: rs.labels[m.anyName], Reason: reasonAllowed}
		}
		return Decision{Verdict: Deny, Rule: RuleDefaultDeny, Reason: reasonNoRule}
	}
	if rs.someFlowAllowed(buf[:n]) {
		if m.anyName >= 0 {
			return Decision{Verdict: Allow, Rule: rs.labels[m.anyName], Reason: reasonAllowed}
		}
		return Decision{Verdict: Allow, Rule: RuleDefaultPublic, Reason: reasonPublic}
	}
	// Denied: by a deny rule if one matches the name at all.
	if d := rs.denyFirst(buf[:n], 0, 0, true); d >= 0 {
		return rs.denied(d, m.anyName)
	}
	return Decision{Verdict: Deny, Rule: RuleDefaultDeny, Reason: reasonNoRule}
}

// HasHostRuleForPort reports whether any host rule covers port/proto, that
// is, whether a raw-IP flow there could be allowed by a sniffed name (with
// default: public, any TCP port could).
func (rs *RuleSet) HasHostRuleForPort(port uint16, proto Proto) bool {
	if rs.open && proto == TCP {
		return true
	}
	if int(proto) >= len(rs.hostPR) {
		return false
	}
	return portsContain(rs.hostPR[proto], port)
}

// DecideIP decides whether a flow to the raw address ip (no name known) on
// port/proto may start. Only cidr rules apply, and a guarded address (see
// Guard) is allowed only by a rule that names it explicitly.
func (rs *RuleSet) DecideIP(ip netip.Addr, port uint16, proto Proto) Decision {
	if !ip.IsValid() {
		return Decision{Verdict: Deny, Rule: RuleDefaultDeny, Reason: "invalid address"}
	}
	a := ip.WithZone("").Unmap()
	if d := rs.denyAddr(a, port, proto); d >= 0 {
		v := rs.denied(d, -1)
		v.Reason = a.String() + " is in a denied range: " + v.Reason
		return v
	}
	grange, why, guarded := guardMatch(rs.extra, a)
	best, broad, wrongPort, wrongProt := -1, -1, -1, -1
	for _, i := range rs.cidrs {
		r := &rs.rules[i]
		switch {
		case !r.CIDR.Contains(a):
		case r.Proto != proto:
			if wrongProt < 0 {
				wrongProt = i
			}
		case !portsContain(r.Ports, port):
			if wrongPort < 0 {
				wrongPort = i
			}
		case guarded && !within(r.CIDR, grange):
			broad = narrower(rs, broad, i)
		default:
			best = i
		}
		if best >= 0 {
			break
		}
	}
	switch {
	case best >= 0 && guarded:
		return Decision{Verdict: Allow, Rule: rs.labels[best], Reason: reasonAllowed + " naming " + ip.WithZone("").String() + " (" + why + ") explicitly"}
	case best >= 0:
		return Decision{Verdict: Allow, Rule: rs.labels[best], Reason: reasonAllowed}
	case guarded:
		return rs.guardDeny(ip, why, grange, broad)
	case rs.open && proto == TCP:
		return Decision{Verdict: Allow, Rule: RuleDefaultPublic, Reason: "no allow rule names " + a.String() + "; default: public allows public addresses over tcp"}
	case wrongPort >= 0:
		return Decision{Verdict: Deny, Rule: RuleDefaultDeny, Reason: "port " + strconv.Itoa(int(port)) + " not in rule " + rs.rules[wrongPort].String()}
	case wrongProt >= 0:
		return Decision{Verdict: Deny, Rule: RuleDefaultDeny, Reason: proto.String() + " not in rule " + rs.rules[wrongProt].String()}
	}
	return rs.noRule()
}

// narrower returns whichever of the cidr rules cur and i has the longer
// prefix (cur may be -1): the one to quote when a guarded address was matched
// only by rules that are too broad to unlock it.
func narrower(rs *RuleSet, cur, i int) int {
	if cur < 0 || rs.rules[i].CIDR.Bits() > rs.rules[cur].CIDR.Bits() {
		return i
	}
	return cur
}

func (rs *RuleSet) guardDeny(ip netip.Addr, why string, grange netip.Prefix, broad int) Decision {
	reason := ip.WithZone("").String() + " is " + why + " (" + reasonNeverDial + ")"
	if broad >= 0 {
		reason += "; rule " + rs.rules[broad].String() + " is broader than " + grange.String()
	}
	return Decision{Verdict: Deny, Rule: RuleGuard, Reason: reason}
}

// CheckDial is the rebinding guard, applied to the real address just before
// dialling a flow that was already allowed (by name or by address). It allows
// any address outside the guard set; a guarded address is allowed only if a
// cidr rule names it explicitly for port/proto. An address a deny cidr rule
// covers is never dialled.
func (rs *RuleSet) CheckDial(ip netip.Addr, port uint16, proto Proto) Decision {
	if !ip.IsValid() {
		return Decision{Verdict: Deny, Rule: RuleGuard, Reason: "invalid address"}
	}
	a := ip.WithZone("").Unmap()
	if d := rs.denyAddr(a, port, proto); d >= 0 {
		v := rs.denied(d, -1)
		v.Reason = a.String() + " is in a denied range: " + v.Reason
		return v
	}
	grange, why, guarded := guardMatch(rs.extra, a)
	if !guarded {
		return Decision{Verdict: Allow, Rule: RuleGuard, Reason: reasonNotGuard}
	}
	broad := -1
	for _, i := range rs.cidrs {
		r := &rs.rules[i]
		if !r.CIDR.Contains(a) || !r.allows(port, proto) {
			continue
		}
		if within(r.CIDR, grange) {
			return Decision{Verdict: Allow, Rule: rs.labels[i], Reason: reasonAllowed + " naming " + ip.WithZone("").String() + " (" + why + ") explicitly"}
		}
		broad = narrower(rs, broad, i)
	}
	return rs.guardDeny(ip, why, grange, broad)
}
