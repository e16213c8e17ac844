package engine

import (
	"net/netip"

	"github.com/tunwall/tunwall/internal/audit"
	"github.com/tunwall/tunwall/policy"
)

// RuleLearn is the rule of a flow or query learn mode allowed that enforce
// would deny (the audit log's summaries count these as "would-deny").
const RuleLearn = audit.RuleLearn

// DecideName and DecideIP are the decision the engine gives a new flow
// before any byte of it moves: to the name host (from the fake address the
// sandbox connected to, a sniffed name on a raw-IP flow, or a SOCKS
// request), or to the address ip, on port over proto. A name is decided by
// the rule set's DecideName, an address by its DecideIP (which applies the
// guard). In learn mode whatever enforce would deny is allowed, with rule
// RuleLearn and the denial's reason recorded, except an address the guard
// forbids (learn mode never dials it) and what a deny rule of the policy
// denies (an explicit deny: a learnt policy never proposes it).
//
// They are pure functions of their arguments. The engine's TCP, UDP and
// SOCKS paths decide through them (after refusing names that carry a
// secret's placeholder), and `tunwall policy explain` prints them, so the
// CLI cannot say something the engine would not do.
func DecideName(rs *policy.RuleSet, learn bool, host string, port uint16, proto policy.Proto) policy.Decision {
	return learned(learn, rs.DecideName(host, port, proto))
}

// DecideIP: see DecideName.
func DecideIP(rs *policy.RuleSet, learn bool, ip netip.Addr, port uint16, proto policy.Proto) policy.Decision {
	d := rs.DecideIP(ip, port, proto)
	if learn && !d.Allowed() {
		if g := rs.CheckDial(ip, port, proto); !g.Allowed() {
			return g
		}
	}
	return learned(learn, d)
}

// DecideQuery is the decision the engine's DNS server gives a query for
// qname (after the audit log's health and secrets' placeholders): fake
// answers when allowed, NXDOMAIN and nothing sent upstream when denied; in
// learn mode, answers for names enforce would deny (rule RuleLearn). Pure,
// like DecideName.
func DecideQuery(rs *policy.RuleSet, learn bool, qname string) policy.Decision {
	return learned(learn, rs.NameAllowed(qname))
}

// learned turns an enforce-mode decision into the learn-mode one: allowed,
// with the verdict it would have had recorded in the reason.
func learned(learn bool, d policy.Decision) policy.Decision {
	if !learn || d.Allowed() || d.Explicit {
		return d
	}
	return policy.Decision{Verdict: policy.Allow, Rule: RuleLearn, Reason: "learn mode; enforce would deny: " + d.Reason}
}
