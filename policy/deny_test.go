package policy

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
)

const denyPolicy = `version: 1
phases:
  exec:
    allow:
      - host: "*.github.com"
        ports: [443, 22]
      - host: github.com
        ports: [443]
      - host: "*.cdn.test"
        ports: ["*"]
        proto: udp
      - cidr: 192.0.2.0/24
        ports: ["*"]
      - host: api.creds.test
        inject: [TOKEN]
    deny:
      - host: gist.github.com
      - host: "*.evil.github.com"
        ports: [443]
      - host: ssh.github.com
        ports: [22]
        proto: tcp
      - host: "*.cdn.test"
        ports: ["1-1000"]
        proto: udp
      - cidr: 192.0.2.66
      - host: api.creds.test
`

func TestDenyRulesWinOverAllowRules(t *testing.T) {
	rs := mustRuleSet(t, denyPolicy, []Rule{{Host: "gist.github.com", Ports: []PortRange{{443, 443}}, Proto: TCP, Source: "--allow gist.github.com"}}, Guard{})
	tests := []struct {
		name   string
		host   string
		port   uint16
		proto  Proto
		allow  bool
		rule   string // exact Decision.Rule
		reason string // substring of Decision.Reason
	}{
		{"an exact deny beats a wildcard allow", "gist.github.com", 443, TCP, false,
			"deny gist.github.com:*/tcp+udp (agent.yaml:17)", "a deny rule matches it (deny rules win over any allow: it wins over rule *.github.com:22,443/tcp (agent.yaml:5))"},
		{"an exact deny beats an --allow flag for the same name", "GIST.github.com.", 443, TCP, false,
			"deny gist.github.com:*/tcp+udp (agent.yaml:17)", "deny rules win"},
		{"a deny without ports denies every port", "gist.github.com", 22, TCP, false,
			"deny gist.github.com:*/tcp+udp (agent.yaml:17)", "a deny rule matches"},
		{"a deny without proto denies udp too", "gist.github.com", 53, UDP, false,
			"deny gist.github.com:*/tcp+udp (agent.yaml:17)", "a deny rule matches"},
		{"the allowed sibling of a denied name is allowed", "api.github.com", 443, TCP, true,
			"*.github.com:22,443/tcp (agent.yaml:5)", "allowed by rule"},
		{"a wildcard deny beats a wildcard allow below it", "x.evil.github.com", 443, TCP, false,
			"deny *.evil.github.com:443/tcp+udp (agent.yaml:18)", "deny rules win"},
		{"a wildcard deny never matches its apex", "evil.github.com", 443, TCP, true,
			"*.github.com:22,443/tcp (agent.yaml:5)", "allowed by rule"},
		{"a wildcard deny on a port leaves the other ports", "x.evil.github.com", 22, TCP, true,
			"*.github.com:22,443/tcp (agent.yaml:5)", "allowed by rule"},
		{"a deny on a port and proto denies that port", "ssh.github.com", 22, TCP, false,
			"deny ssh.github.com:22/tcp (agent.yaml:20)", "deny rules win"},
		{"a deny on a port leaves the other ports", "ssh.github.com", 443, TCP, true,
			"*.github.com:22,443/tcp (agent.yaml:5)", "allowed by rule"},
		{"a udp deny on a port range denies inside it", "a.cdn.test", 1000, UDP, false,
			"deny *.cdn.test:1-1000/udp (agent.yaml:23)", "deny rules win"},
		{"a udp deny on a port range leaves the ports past it", "a.cdn.test", 1001, UDP, true,
			"*.cdn.test:*/udp (agent.yaml:9)", "allowed by rule"},
		{"a denied name nothing allows names the deny rule", "gist.github.com", 443, TCP, false,
			"deny gist.github.com:*/tcp+udp (agent.yaml:17)", "a deny rule matches"},
		{"a deny beats an allow with inject", "api.creds.test", 443, TCP, false,
			"deny api.creds.test:*/tcp+udp (agent.yaml:27)", "deny rules win"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := rs.DecideName(tt.host, tt.port, tt.proto)
			if d.Allowed() != tt.allow || d.Rule != tt.rule || !strings.Contains(d.Reason, tt.reason) {
				t.Fatalf("DecideName(%q, %d, %s) = %+v\nwant allow=%v rule %q reason containing %q", tt.host, tt.port, tt.proto, d, tt.allow, tt.rule, tt.reason)
			}
			if d.Explicit != (!tt.allow) {
				t.Errorf("Explicit = %v, want %v (a deny rule decided)", d.Explicit, !tt.allow)
			}
		})
	}
}

func TestDNSAnswersANameUnlessDenyRulesCoverEveryFlowToIt(t *testing.T) {
	rs := mustRuleSet(t, denyPolicy, nil, Guard{})
	for _, tt := range []struct {
		name, host string
		allow      bool
		rule       string
	}{
		{"a name denied on every port and proto gets no answer", "gist.github.com", false, "deny gist.github.com:*/tcp+udp (agent.yaml:17)"},
		{"a name denied on one of its allowed ports is answered", "ssh.github.com", true, "*.github.com:22,443/tcp (agent.yaml:5)"},
		{"a name denied on one of two allowed ports is answered", "x.evil.github.com", true, "*.github.com:22,443/tcp (agent.yaml:5)"},
		{"a name denied on part of an allowed range is answered", "a.cdn.test", true, "*.cdn.test:*/udp (agent.yaml:9)"},
		{"an allowed name no deny matches is answered", "api.github.com", true, "*.github.com:22,443/tcp (agent.yaml:5)"},
		{"a name nothing allows gets no answer", "other.test", false, RuleDefaultDeny},
		{"a denied host with inject gets no answer", "api.creds.test", false, "deny api.creds.test:*/tcp+udp (agent.yaml:27)"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			d := rs.NameAllowed(tt.host)
			if d.Allowed() != tt.allow || d.Rule != tt.rule {
				t.Fatalf("NameAllowed(%q) = %+v, want allow=%v rule %q", tt.host, d, tt.allow, tt.rule)
			}
		})
	}
}

func TestDenyCIDRRulesWinOverAllowAndHoldAtDialTime(t *testing.T) {
	rs := mustRuleSet(t, denyPolicy, nil, Guard{})
	evil := netip.MustParseAddr("192.0.2.66")
	for _, tt := range []struct {
		name  string
		d     Decision
		allow bool
		rule  string
	}{
		{"a denied address inside an allowed cidr is denied", rs.DecideIP(evil, 443, TCP), false, "deny 192.0.2.66/32:*/tcp+udp (agent.yaml:26)"},
		{"a denied address is denied as IPv4-mapped too", rs.DecideIP(netip.MustParseAddr("::ffff:192.0.2.66"), 80, UDP), false, "deny 192.0.2.66/32:*/tcp+udp (agent.yaml:26)"},
		{"its neighbour in the allowed cidr is allowed", rs.DecideIP(netip.MustParseAddr("192.0.2.65"), 443, TCP), true, "192.0.2.0/24:*/tcp (agent.yaml:12)"},
		{"an allowed name resolving to a denied address is never dialled", rs.CheckDial(evil, 443, TCP), false, "deny 192.0.2.66/32:*/tcp+udp (agent.yaml:26)"},
		{"an allowed name resolving elsewhere is dialled", rs.CheckDial(netip.MustParseAddr("198.51.100.7"), 443, TCP), true, RuleGuard},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if tt.d.Allowed() != tt.allow || tt.d.Rule != tt.rule {
				t.Fatalf("got %+v, want allow=%v rule %q", tt.d, tt.allow, tt.rule)
			}
			if !tt.allow && (!tt.d.Explicit || !strings.Contains(tt.d.Reason, "is in a denied range")) {
				t.Errorf("reason %q (explicit %v) does not say a deny rule denied the range", tt.d.Reason, tt.d.Explicit)
			}
		})
	}
}

func TestADenyRuleRefusesRequestsToItsHost(t *testing.T) {
	rs := mustRuleSet(t, denyPolicy, nil, Guard{})
	d := rs.DecideRequest("api.creds.test", 443, "GET", "/")
	if d.Allowed() || d.Rule != "deny api.creds.test:*/tcp+udp (agent.yaml:27)" {
		t.Fatalf("DecideRequest = %+v, want the deny rule", d)
	}
}

const publicPolicy = `version: 1
phases:
  browse:
    default: public
    allow:
      - host: api.creds.test
        inject: [TOKEN]
      - cidr: 10.0.0.0/8
        ports: [5432]
    deny:
      - host: "*.tracker.test"
      - cidr: 198.51.100.0/24
        ports: [25]
`

func TestDefaultPublicAllowsPublicTCPAndKeepsTheGuardAndDenyRules(t *testing.T) {
	rs := mustRuleSet(t, publicPolicy, nil, Guard{Extra: []netip.Prefix{netip.MustParsePrefix("203.0.113.9/32")}})
	if !rs.Open() {
		t.Fatal("Open() = false for default: public")
	}
	for _, tt := range []struct {
		name   string
		d      Decision
		allow  bool
		rule   string
		reason string
	}{
		{"any name over tcp is allowed", rs.DecideName("example.test", 8080, TCP), true, RuleDefaultPublic, "default: public"},
		{"a denied name stays denied", rs.DecideName("a.tracker.test", 443, TCP), false, "deny *.tracker.test:*/tcp+udp (agent.yaml:11)", "a deny rule matches"},
		{"udp is not opened", rs.DecideName("example.test", 443, UDP), false, RuleDefaultDeny, "no rule allows it"},
		{"a host with inject keeps only its rules' ports", rs.DecideName("api.creds.test", 80, TCP), false, RuleDefaultDeny, "default: public does not apply"},
		{"a host with inject on its rule's port is allowed by the rule", rs.DecideName("api.creds.test", 443, TCP), true, "api.creds.test:443/tcp (agent.yaml:6)", "allowed by rule"},
		{"a public address over tcp is allowed", rs.DecideIP(netip.MustParseAddr("192.0.2.10"), 22, TCP), true, RuleDefaultPublic, "default: public"},
		{"a public IPv6 address over tcp is allowed", rs.DecideIP(netip.MustParseAddr("2001:db8::10"), 443, TCP), true, RuleDefaultPublic, "default: public"},
		{"a public address over udp is not", rs.DecideIP(netip.MustParseAddr("192.0.2.10"), 443, UDP), false, RuleDefaultDeny, "no rule allows it"},
		{"loopback stays guarded", rs.DecideIP(netip.MustParseAddr("127.0.0.1"), 443, TCP), false, RuleGuard, "loopback"},
		{"the metadata address stays guarded", rs.DecideIP(netip.MustParseAddr("169.254.169.254"), 80, TCP), false, RuleGuard, "169.254.169.254"},
		{"RFC 1918 stays guarded", rs.DecideIP(netip.MustParseAddr("192.168.1.1"), 443, TCP), false, RuleGuard, "never dialled"},
		{"ULA stays guarded", rs.DecideIP(netip.MustParseAddr("fd00::1"), 443, TCP), false, RuleGuard, "never dialled"},
		{"CGNAT stays guarded", rs.DecideIP(netip.MustParseAddr("100.64.0.1"), 443, TCP), false, RuleGuard, "never dialled"},
		{"the host's own addresses stay guarded", rs.DecideIP(netip.MustParseAddr("203.0.113.9"), 443, TCP), false, RuleGuard, "never dialled"},
		{"a cidr rule naming a guarded range still opens it", rs.DecideIP(netip.MustParseAddr("10.1.2.3"), 5432, TCP), true, "10.0.0.0/8:5432/tcp (agent.yaml:8)", "explicitly"},
		{"but not on other ports", rs.DecideIP(netip.MustParseAddr("10.1.2.3"), 443, TCP), false, RuleGuard, "never dialled"},
		{"a deny cidr on a port wins over the open default", rs.DecideIP(netip.MustParseAddr("198.51.100.7"), 25, TCP), false, "deny 198.51.100.0/24:25/tcp+udp (agent.yaml:12)", "denied range"},
		{"the dial of a name to a guarded address is refused", rs.CheckDial(netip.MustParseAddr("10.0.0.5"), 443, TCP), false, RuleGuard, "never dialled"},
		{"the dial of a name to a public address passes", rs.CheckDial(netip.MustParseAddr("198.51.100.7"), 443, TCP), true, RuleGuard, "not a guarded address"},
		{"the dial to a denied range is refused", rs.CheckDial(netip.MustParseAddr("198.51.100.7"), 25, TCP), false, "deny 198.51.100.0/24:25/tcp+udp (agent.yaml:12)", "denied range"},
		{"DNS answers any name", rs.NameAllowed("example.test"), true, RuleDefaultPublic, "default: public"},
		{"DNS refuses a denied name", rs.NameAllowed("x.tracker.test"), false, "deny *.tracker.test:*/tcp+udp (agent.yaml:11)", "a deny rule matches"},
		{"DNS answers a host with inject by its rule", rs.NameAllowed("api.creds.test"), true, "api.creds.test:443/tcp (agent.yaml:6)", "allowed by rule"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if tt.d.Allowed() != tt.allow || tt.d.Rule != tt.rule || !strings.Contains(tt.d.Reason, tt.reason) {
				t.Fatalf("got %+v\nwant allow=%v rule %q reason containing %q", tt.d, tt.allow, tt.rule, tt.reason)
			}
		})
	}
	if !rs.HasHostRuleForPort(2222, TCP) || rs.HasHostRuleForPort(2222, UDP) {
		t.Error("with default: public, a sniffed name may allow any tcp port (and no udp port no rule names)")
	}
}

func TestDefaultPublicDoesNotAllocateOnTheAllowPath(t *testing.T) {
	rs := mustRuleSet(t, publicPolicy, nil, Guard{})
	if n := testing.AllocsPerRun(100, func() { rs.DecideName("www.example.test", 443, TCP) }); n != 0 {
		t.Fatalf("DecideName allocs = %v, want 0", n)
	}
	rs = mustRuleSet(t, denyPolicy, nil, Guard{})
	if n := testing.AllocsPerRun(100, func() { rs.DecideName("api.github.com", 443, TCP) }); n != 0 {
		t.Fatalf("DecideName with deny rules allocs = %v, want 0", n)
	}
}

func TestDenyAndDefaultParseErrorsNameFileAndLine(t *testing.T) {
	head := "version: 1\nphases:\n  exec:\n"
	for _, tt := range []struct {
		name      string
		src       string
		line, col int
		msg       string
	}{
		{"a deny rule with http is refused", head + "    allow: [{host: a.test}]\n    deny:\n      - host: b.test\n        http: [{methods: [GET], paths: [\"/\"]}]\n",
			7, 9, "a deny rule takes no http"},
		{"a deny rule with inject is refused", head + "    allow: [{host: a.test}]\n    deny:\n      - host: b.test\n        inject: [TOKEN]\n",
			7, 9, "a deny rule takes no inject"},
		{"a deny rule with ca is refused", head + "    allow: [{host: a.test}]\n    deny:\n      - host: b.test\n        ca: /etc/ca.pem\n",
			7, 9, "a deny rule takes no ca"},
		{"a deny rule with a bad host is refused", head + "    allow: [{host: a.test}]\n    deny:\n      - host: \"b..test\"\n",
			6, 15, "b..test"},
		{"a deny rule with a bad cidr is refused", head + "    allow: [{host: a.test}]\n    deny:\n      - cidr: 192.0.2.0/33\n",
			6, 15, "bad cidr"},
		{"a deny rule with a bad port is refused", head + "    allow: [{host: a.test}]\n    deny:\n      - host: b.test\n        ports: [70000]\n",
			7, 17, "out of range"},
		{"a deny rule with a bad proto is refused", head + "    allow: [{host: a.test}]\n    deny:\n      - host: b.test\n        proto: icmp\n",
			7, 16, "unknown proto"},
		{"a deny rule with an unknown key is refused", head + "    allow: [{host: a.test}]\n    deny:\n      - host: b.test\n        why: tracking\n",
			7, 9, `unknown key "why" in rule`},
		{"deny must be a list", head + "    allow: [{host: a.test}]\n    deny: b.test\n",
			5, 11, "deny in phase \"exec\" must be a list of rules"},
		{"an empty deny list is refused", head + "    allow: [{host: a.test}]\n    deny: []\n",
			5, 11, "deny in phase \"exec\" is empty"},
		{"a bad default is refused", head + "    default: open\n    allow: [{host: a.test}]\n",
			4, 14, `default must be "deny" (the implicit default) or "public"`},
		{"a default that is not a string is refused", head + "    default: true\n",
			4, 14, "default must be a string"},
		{"deny rules alone allow nothing", head + "    deny:\n      - host: b.test\n",
			3, 3, `phase "exec" has no rules`},
		{"default deny alone allows nothing", head + "    default: deny\n",
			3, 3, `phase "exec" has no rules`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse("agent.yaml", []byte(tt.src))
			var pe *ParseError
			if !errors.As(err, &pe) {
				t.Fatalf("error = %v, want a *ParseError", err)
			}
			if pe.File != "agent.yaml" || pe.Line != tt.line || pe.Col != tt.col || !strings.Contains(pe.Msg, tt.msg) {
				t.Fatalf("error = %q (line %d col %d)\nwant agent.yaml:%d:%d containing %q", err, pe.Line, pe.Col, tt.line, tt.col, tt.msg)
			}
		})
	}
}

func TestDefaultPublicWithoutAllowRulesLoads(t *testing.T) {
	p, err := Parse("agent.yaml", []byte("version: 1\nphases:\n  browse:\n    default: public\n    deny:\n      - host: \"*.tracker.test\"\n"))
	if err != nil {
		t.Fatal(err)
	}
	if p.Default("browse") != DefaultPublic || len(p.Rules("browse")) != 0 || len(p.DenyRules("browse")) != 1 {
		t.Fatalf("Default %q, %d allow rules, %d deny rules", p.Default("browse"), len(p.Rules("browse")), len(p.DenyRules("browse")))
	}
	rs, err := Select(p, "", nil, Guard{})
	if err != nil {
		t.Fatal(err)
	}
	if d := rs.DecideName("www.example.test", 443, TCP); !d.Allowed() || d.Rule != RuleDefaultPublic {
		t.Fatalf("DecideName = %+v", d)
	}
	if got := rs.DenyRules(); len(got) != 1 || got[0].Host != "*.tracker.test" || got[0].Proto != AnyProto || len(got[0].Ports) != 1 || got[0].Ports[0] != (PortRange{1, 65535}) {
		t.Fatalf("DenyRules = %+v, want *.tracker.test on every port and proto", got)
	}
}

func TestDenyWarningsNameShadowedAllowsAndDenyRulesThatShadowNothing(t *testing.T) {
	rs := mustRuleSet(t, `version: 1
phases:
  exec:
    allow:
      - host: gist.github.com
      - host: "*.evil.github.com"
        ports: [443, 22]
      - host: api.github.com
      - cidr: 192.0.2.0/28
        ports: [5432]
    deny:
      - host: "*.github.com"
        ports: [443]
      - host: elsewhere.test
      - host: x.evil.github.com
        proto: udp
      - cidr: 192.0.2.0/24
`, nil, Guard{})
	var got []string
	for _, w := range rs.DenyWarnings() {
		got = append(got, w.Source+": "+w.Msg)
	}
	want := []string{
		"agent.yaml:5: rule gist.github.com:443/tcp allows nothing: deny rule *.github.com:443/tcp+udp (agent.yaml:12) covers all of it",
		"agent.yaml:8: rule api.github.com:443/tcp allows nothing: deny rule *.github.com:443/tcp+udp (agent.yaml:12) covers all of it",
		"agent.yaml:9: rule 192.0.2.0/28:5432/tcp allows nothing: deny rule 192.0.2.0/24:*/tcp+udp (agent.yaml:17) covers all of it",
		"agent.yaml:14: deny rule elsewhere.test:*/tcp+udp overlaps no allow rule: the default already denies what it names (it does something only with default: public)",
		"agent.yaml:15: deny rule x.evil.github.com:*/udp overlaps no allow rule: the default already denies what it names (it does something only with default: public)",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("DenyWarnings:\n got %q\nwant %q", got, want)
	}
	// With default: public, a deny rule always narrows something.
	open := mustRuleSet(t, "version: 1\nphases:\n  b:\n    default: public\n    deny:\n      - host: elsewhere.test\n", nil, Guard{})
	if w := open.DenyWarnings(); len(w) != 0 {
		t.Fatalf("DenyWarnings with default: public = %+v, want none", w)
	}
}
