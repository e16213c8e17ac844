// Package flow is the vocabulary every package shares about a flow, each
// word declared once: its transport protocol (Proto) and the decision on
// it (Decision, whose Verdict is Allow or Deny). The policy makes
// decisions, the stack names a flow's protocol, the DNS server is handed
// decisions (dnsintercept.Filter), the engine applies them and the audit
// log records them, all in these types. It is the lowest of tunwall's
// packages: it imports only the standard library, so that the pure policy,
// the stack (which decides nothing) and dnsintercept (which must not
// import the policy) may all import it.
package flow

import (
	"fmt"
	"strconv"
	"strings"
)

// Proto is the transport protocol of a flow or rule.
type Proto uint8

// The protocols. The zero Proto is not a protocol; no rule matches it.
const (
	TCP Proto = 1
	UDP Proto = 2
)

// String returns "tcp" or "udp" ("proto(N)" for anything else), the names
// the policy file and the audit log use.
func (p Proto) String() string {
	switch p {
	case TCP:
		return "tcp"
	case UDP:
		return "udp"
	}
	return "proto(" + strconv.Itoa(int(p)) + ")"
}

// ParseProto parses "tcp" or "udp", case-insensitively.
func ParseProto(s string) (Proto, error) {
	switch strings.ToLower(s) {
	case "tcp":
		return TCP, nil
	case "udp":
		return UDP, nil
	}
	return 0, fmt.Errorf("unknown proto %q (want tcp or udp)", s)
}

// Verdict is the outcome of a decision. The zero Verdict is Deny.
type Verdict uint8

// The two verdicts.
const (
	Deny  Verdict = 0
	Allow Verdict = 1
)

// String returns "deny" or "allow" ("verdict(N)" for anything else).
func (v Verdict) String() string {
	switch v {
	case Deny:
		return "deny"
	case Allow:
		return "allow"
	}
	return "verdict(" + strconv.Itoa(int(v)) + ")"
}

// Decision is the outcome of one check: the verdict, the rule that decided
// it and a short human reason, ready for the audit record. The zero
// Decision is a denial that names no rule: "not decided".
type Decision struct {
	Verdict Verdict
	Rule    string // Rule.String() + " (" + Source + ")" of the matching rule, or "default-deny", or "guard" when the guard decided
	Reason  string // short human reason, such as "allowed by rule" or "port 22 not in rule pypi.org:443/tcp"
	// Explicit marks a denial by a deny rule of the policy: an explicit
	// deny, which nothing that relaxes the default (learn mode, an
	// approval) may turn into an allow.
	Explicit bool
	// Phase is the policy phase of the rules that decided ("" when no
	// rules did: a bound, a check of tunwall's own). The policy in effect
	// may change while tunwall runs (a phase switch, a reload), so a
	// decision says which it came from.
	Phase string
}

// Allowed reports whether the verdict is Allow.
func (d Decision) Allowed() bool { return d.Verdict == Allow }
