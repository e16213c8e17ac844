package policy

import (
	"net/netip"
	"strings"
	"testing"
)

const twoPhases = `version: 1
phases:
  setup:
    allow:
      - host: pypi.org
  exec:
    allow:
      - host: github.com
`

const onePhase = `version: 1
phases:
  build:
    allow:
      - host: proxy.golang.org
`

func TestSelect(t *testing.T) {
	two, err := Parse("two.yaml", []byte(twoPhases))
	if err != nil {
		t.Fatal(err)
	}
	one, err := Parse("one.yaml", []byte(onePhase))
	if err != nil {
		t.Fatal(err)
	}
	allow, err := ParseAllow("example.test:80")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name      string
		p         *Policy
		phase     string
		extra     []Rule
		g         Guard
		wantErr   string   // substring; "" means success
		wantPhase string   // on success
		wantRules []string // Rule.String() of Rules(), on success
	}{
		{name: "no policy and no phase gives only the --allow rules", extra: []Rule{allow},
			wantRules: []string{"example.test:80/tcp"}},
		{name: "no policy and no rules gives an empty rule set", wantRules: []string{}},
		{name: "a phase without a policy labels the --allow rules", phase: "exec", extra: []Rule{allow},
			wantPhase: "exec", wantRules: []string{"example.test:80/tcp"}},
		{name: "a bad phase name without a policy is an error", phase: "a b", wantErr: `bad phase name "a b"`},
		{name: "a single-phase policy needs no phase", p: one, extra: []Rule{allow},
			wantPhase: "build", wantRules: []string{"proxy.golang.org:443/tcp", "example.test:80/tcp"}},
		{name: "a single-phase policy accepts its own phase", p: one, phase: "build",
			wantPhase: "build", wantRules: []string{"proxy.golang.org:443/tcp"}},
		{name: "a two-phase policy needs a phase and names both", p: two, wantErr: "two.yaml has phases setup, exec; choose one with --phase"},
		{name: "a two-phase policy selects the named phase", p: two, phase: "exec",
			wantPhase: "exec", wantRules: []string{"github.com:443/tcp"}},
		{name: "an unknown phase is an error naming the phases", p: two, phase: "deploy", wantErr: `unknown phase "deploy" (two.yaml has phases setup, exec)`},
		{name: "phase names are case-sensitive", p: two, phase: "Exec", wantErr: `unknown phase "Exec"`},
		{name: "a hand-built extra rule is normalized", p: one, extra: []Rule{{Host: "Example.TEST.", Ports: []PortRange{{443, 443}, {80, 80}}, Proto: UDP, Source: "test"}},
			wantPhase: "build", wantRules: []string{"proxy.golang.org:443/tcp", "example.test:80,443/udp"}},
		{name: "an extra rule without host or cidr is an error", extra: []Rule{{Ports: []PortRange{{443, 443}}, Proto: TCP, Source: "test"}},
			wantErr: "rule needs host or cidr"},
		{name: "an extra rule with both host and cidr is an error", extra: []Rule{{Host: "a.example", CIDR: netip.MustParsePrefix("192.0.2.0/24"), Ports: []PortRange{{443, 443}}, Proto: TCP}},
			wantErr: "both host and cidr"},
		{name: "an extra rule without ports is an error", extra: []Rule{{Host: "a.example", Proto: TCP}},
			wantErr: "no ports"},
		{name: "an extra rule with port 0 is an error", extra: []Rule{{Host: "a.example", Ports: []PortRange{{0, 10}}, Proto: TCP}},
			wantErr: "bad port range 0-10"},
		{name: "an extra rule without a proto is an error", extra: []Rule{{Host: "a.example", Ports: []PortRange{{443, 443}}}},
			wantErr: "bad proto"},
		{name: "an extra rule with a bad host is an error", extra: []Rule{{Host: "a_b", Ports: []PortRange{{443, 443}}, Proto: TCP}},
			wantErr: "not a valid name"},
		{name: "an invalid guard prefix is an error", g: Guard{Extra: []netip.Prefix{{}}}, wantErr: "guard: invalid prefix"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rs, err := Select(tt.p, tt.phase, tt.extra, tt.g)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Select error = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Select: %v", err)
			}
			if rs.Phase() != tt.wantPhase {
				t.Errorf("Phase() = %q, want %q", rs.Phase(), tt.wantPhase)
			}
			got := []string{}
			for _, r := range rs.Rules() {
				got = append(got, r.String())
			}
			if strings.Join(got, " ") != strings.Join(tt.wantRules, " ") {
				t.Errorf("Rules() = %v, want %v", got, tt.wantRules)
			}
		})
	}
}

func TestSelectCopiesItsInput(t *testing.T) {
	r, err := ParseAllow("example.test:80")
	if err != nil {
		t.Fatal(err)
	}
	extra := []Rule{r}
	rs, err := Select(nil, "", extra, Guard{})
	if err != nil {
		t.Fatal(err)
	}
	extra[0].Ports[0] = PortRange{1, 65535}
	extra[0].Host = "evil.test"
	if d := rs.DecideName("example.test", 22, TCP); d.Allowed() {
		t.Errorf("changing the caller's rule after Select widened the rule set: %+v", d)
	}
	got := rs.Rules()
	got[0].Ports[0] = PortRange{22, 22}
	if d := rs.DecideName("example.test", 22, TCP); d.Allowed() {
		t.Errorf("changing Rules() widened the rule set: %+v", d)
	}
}
