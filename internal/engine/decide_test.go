package engine

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/tunwall/tunwall/policy"
)

// TestDecideInLearnModeAllowsAllButTheGuard pins the pure decision the
// engine and `policy explain` share: enforce mode is the rule set's own,
// learn mode allows what enforce would deny (saying so), but never an
// address the guard forbids.
func TestDecideInLearnModeAllowsAllButTheGuard(t *testing.T) {
	p, err := policy.Parse("t.yaml", []byte("version: 1\nphases:\n  x:\n    allow:\n      - host: allowed.test\n"))
	if err != nil {
		t.Fatal(err)
	}
	rs, err := policy.Select(p, "", nil, policy.Guard{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name      string
		d         policy.Decision
		allow     bool
		rule, why string
	}{
		{"allowed name, enforce", DecideName(rs, false, "allowed.test", 443, policy.TCP), true, "allowed.test", ""},
		{"allowed name, learn", DecideName(rs, true, "allowed.test", 443, policy.TCP), true, "allowed.test", ""},
		{"other name, enforce", DecideName(rs, false, "other.test", 443, policy.TCP), false, policy.RuleDefaultDeny, ""},
		{"other name, learn", DecideName(rs, true, "other.test", 443, policy.TCP), true, RuleLearn, "learn mode; enforce would deny: "},
		{"public address, learn", DecideIP(rs, true, netip.MustParseAddr("192.0.2.1"), 22, policy.TCP), true, RuleLearn, "learn mode; enforce would deny: "},
		{"loopback, learn", DecideIP(rs, true, netip.MustParseAddr("127.0.0.1"), 22, policy.TCP), false, policy.RuleGuard, ""},
		{"metadata, enforce", DecideIP(rs, false, netip.MustParseAddr("169.254.169.254"), 80, policy.TCP), false, "", ""},
	} {
		if c.d.Allowed() != c.allow || !strings.HasPrefix(c.d.Rule, c.rule) || !strings.HasPrefix(c.d.Reason, c.why) {
			t.Errorf("%s: got %+v, want allow=%v rule %q... reason %q...", c.name, c.d, c.allow, c.rule, c.why)
		}
	}
	if d := DecideQuery(rs, true, "other.test"); !d.Allowed() || d.Rule != RuleLearn {
		t.Errorf("DecideQuery in learn mode: %+v; want a learn allow that enforce would deny", d)
	}
	if d := DecideQuery(rs, false, "other.test"); d.Allowed() {
		t.Errorf("DecideQuery of a name no rule allows: %+v", d)
	}
	if d := DecideQuery(rs, false, "allowed.test"); !d.Allowed() {
		t.Errorf("DecideQuery of an allowed name: %+v", d)
	}
}

// TestLearnModeNeverOverridesADenyRule: what a deny rule denies stays
// denied in learn mode (by name, by address, in DNS), so a learnt policy
// (policy suggest, from allowed records) never proposes it.
func TestLearnModeNeverOverridesADenyRule(t *testing.T) {
	p, err := policy.Parse("t.yaml", []byte("version: 1\nphases:\n  x:\n    allow:\n      - host: \"*.allowed.test\"\n    deny:\n      - host: gist.allowed.test\n      - cidr: 192.0.2.66\n"))
	if err != nil {
		t.Fatal(err)
	}
	rs, err := policy.Select(p, "", nil, policy.Guard{})
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []policy.Decision{
		DecideName(rs, true, "gist.allowed.test", 443, policy.TCP),
		DecideName(rs, true, "gist.allowed.test", 53, policy.UDP),
		DecideIP(rs, true, netip.MustParseAddr("192.0.2.66"), 22, policy.TCP),
		DecideQuery(rs, true, "gist.allowed.test"),
	} {
		if d.Allowed() || !d.Explicit || !strings.HasPrefix(d.Rule, "deny ") {
			t.Errorf("learn mode: %+v, want the deny rule's denial", d)
		}
	}
	if d := DecideName(rs, true, "other.test", 443, policy.TCP); !d.Allowed() || d.Rule != RuleLearn {
		t.Errorf("learn mode, a name only the default denies: %+v, want a learn allow", d)
	}
}
