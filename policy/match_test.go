package policy

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
)

const matchPolicy = `version: 1
phases:
  exec:
    allow:
      - host: pypi.org
      - host: "*.pythonhosted.org"
      - host: github.com
        ports: [443, 80, "8000-8100"]
      - host: bücher.example
      - host: example.test
        ports: ["*"]
        proto: udp
      - host: r3---sn-abc.googlevideo.com
      - cidr: 192.0.2.0/24
        ports: [5432]
      - cidr: 2001:db8::/32
        ports: ["*"]
        proto: udp
`

func mustRuleSet(t testing.TB, src string, extra []Rule, g Guard) *RuleSet {
	t.Helper()
	p, err := Parse("agent.yaml", []byte(src))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	rs, err := Select(p, "", extra, g)
	if err != nil {
		t.Fatalf("Select: %v", err)
	}
	return rs
}

func TestDecideName(t *testing.T) {
	rs := mustRuleSet(t, matchPolicy, nil, Guard{})
	tests := []struct {
		name   string
		host   string
		port   uint16
		proto  Proto
		allow  bool
		rule   string // exact Decision.Rule
		reason string // substring of Decision.Reason
	}{
		{"an exact name on its port is allowed", "pypi.org", 443, TCP, true, "pypi.org:443/tcp (agent.yaml:5)", "allowed by rule"},
		{"an exact name matches in any case", "PyPI.ORG", 443, TCP, true, "pypi.org:443/tcp (agent.yaml:5)", "allowed by rule"},
		{"an exact name matches with a trailing dot", "pypi.org.", 443, TCP, true, "pypi.org:443/tcp (agent.yaml:5)", "allowed by rule"},
		{"an exact name on another port is denied with the rule named", "pypi.org", 22, TCP, false, "default-deny", "port 22 not in rule pypi.org:443/tcp"},
		{"an exact name over another proto is denied with the rule named", "pypi.org", 443, UDP, false, "default-deny", "udp not in rule pypi.org:443/tcp"},
		{"a subdomain of an exact name is denied", "www.pypi.org", 443, TCP, false, "default-deny", "no rule allows it"},
		{"a name with an exact name as suffix is denied", "evilpypi.org", 443, TCP, false, "default-deny", "no rule allows it"},
		{"port 0 is never allowed", "pypi.org", 0, TCP, false, "default-deny", "port 0 not in rule"},
		{"a wildcard allows a direct subdomain", "files.pythonhosted.org", 443, TCP, true, "*.pythonhosted.org:443/tcp (agent.yaml:6)", "allowed by rule"},
		{"a wildcard allows a deep subdomain", "a.b.c.files.pythonhosted.org", 443, TCP, true, "*.pythonhosted.org:443/tcp (agent.yaml:6)", ""},
		{"a wildcard matches in any case with a trailing dot", "FILES.PythonHosted.Org.", 443, TCP, true, "*.pythonhosted.org:443/tcp (agent.yaml:6)", ""},
		{"a wildcard never allows its apex", "pythonhosted.org", 443, TCP, false, "default-deny", "no rule allows it"},
		{"a wildcard never allows a look-alike", "evilpythonhosted.org", 443, TCP, false, "default-deny", "no rule allows it"},
		{"a wildcard never allows a name that only contains it", "pythonhosted.org.evil.test", 443, TCP, false, "default-deny", "no rule allows it"},
		{"a wildcard checks the port", "files.pythonhosted.org", 80, TCP, false, "default-deny", "port 80 not in rule *.pythonhosted.org:443/tcp"},
		{"a listed port is allowed", "github.com", 80, TCP, true, "github.com:80,443,8000-8100/tcp (agent.yaml:7)", ""},
		{"the low end of a range is allowed", "github.com", 8000, TCP, true, "github.com:80,443,8000-8100/tcp (agent.yaml:7)", ""},
		{"the middle of a range is allowed", "github.com", 8050, TCP, true, "github.com:80,443,8000-8100/tcp (agent.yaml:7)", ""},
		{"the high end of a range is allowed", "github.com", 8100, TCP, true, "github.com:80,443,8000-8100/tcp (agent.yaml:7)", ""},
		{"just past a range is denied", "github.com", 8101, TCP, false, "default-deny", "port 8101 not in rule github.com:80,443,8000-8100/tcp"},
		{"just before a range is denied", "github.com", 7999, TCP, false, "default-deny", "port 7999 not in rule"},
		{"an IDN rule matches its Unicode name", "bücher.example", 443, TCP, true, "xn--bcher-kva.example:443/tcp (agent.yaml:9)", ""},
		{"an IDN rule matches its upper-case Unicode name", "BÜCHER.example.", 443, TCP, true, "xn--bcher-kva.example:443/tcp (agent.yaml:9)", ""},
		{"an IDN rule matches its punycode name", "xn--bcher-kva.example", 443, TCP, true, "xn--bcher-kva.example:443/tcp (agent.yaml:9)", ""},
		{"an IDN rule does not match the ASCII look-alike", "bucher.example", 443, TCP, false, "default-deny", "no rule allows it"},
		{"a star-port udp rule allows any port over udp", "example.test", 65535, UDP, true, "example.test:*/udp (agent.yaml:10)", ""},
		{"a star-port udp rule allows port 1 over udp", "example.test", 1, UDP, true, "example.test:*/udp (agent.yaml:10)", ""},
		{"a udp rule denies tcp", "example.test", 443, TCP, false, "default-deny", "tcp not in rule example.test:*/udp"},
		{"a name with double hyphens matches", "r3---sn-abc.googlevideo.com", 443, TCP, true, "r3---sn-abc.googlevideo.com:443/tcp (agent.yaml:13)", ""},
		{"an IP literal is not a host name even when a cidr rule covers it", "192.0.2.1", 5432, TCP, false, "default-deny", "invalid host name"},
		{"an empty name is invalid", "", 443, TCP, false, "default-deny", "invalid host name"},
		{"a name with an empty label is invalid", "pypi..org", 443, TCP, false, "default-deny", "invalid host name: empty label"},
		{"a name with two trailing dots is invalid", "pypi.org..", 443, TCP, false, "default-deny", "invalid host name"},
		{"a name with an underscore is invalid", "a_b.pythonhosted.org", 443, TCP, false, "default-deny", "invalid host name"},
		{"a wildcard query is invalid", "*.pythonhosted.org", 443, TCP, false, "default-deny", "invalid host name"},
		{"a name with a NUL byte is invalid", "x\x00.pythonhosted.org", 443, TCP, false, "default-deny", "invalid host name"},
		{"a name longer than 253 bytes is invalid", strings.Repeat("a.", 130) + "pythonhosted.org", 443, TCP, false, "default-deny", "longer than 253"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := rs.DecideName(tt.host, tt.port, tt.proto)
			if d.Allowed() != tt.allow || d.Rule != tt.rule || !strings.Contains(d.Reason, tt.reason) {
				t.Errorf("DecideName(%q, %d, %s) = %+v\nwant allow=%v rule=%q reason containing %q", tt.host, tt.port, tt.proto, d, tt.allow, tt.rule, tt.reason)
			}
			if (d.Verdict == Allow) != d.Allowed() {
				t.Errorf("Allowed() disagrees with Verdict %v", d.Verdict)
			}
		})
	}
}

func TestNameAllowed(t *testing.T) {
	rs := mustRuleSet(t, matchPolicy, nil, Guard{})
	tests := []struct {
		name  string
		host  string
		allow bool
		rule  string
	}{
		{"a name with a tcp rule is answered", "pypi.org", true, "pypi.org:443/tcp (agent.yaml:5)"},
		{"a name with only a udp rule is answered", "Example.Test.", true, "example.test:*/udp (agent.yaml:10)"},
		{"a wildcard subdomain is answered", "files.pythonhosted.org", true, "*.pythonhosted.org:443/tcp (agent.yaml:6)"},
		{"a wildcard apex is not answered", "pythonhosted.org", false, "default-deny"},
		{"an unknown name is not answered", "evil.test", false, "default-deny"},
		{"a name covered only by a cidr rule is not answered", "192.0.2.1", false, "default-deny"},
		{"a service-discovery name under a wildcard is answered", "_grpc_config.files.pythonhosted.org", true, "*.pythonhosted.org:443/tcp (agent.yaml:6)"},
		{"an SRV name under a wildcard is answered", "_http._tcp.CDN.pythonhosted.org.", true, "*.pythonhosted.org:443/tcp (agent.yaml:6)"},
		{"a service-discovery name of an exact rule is not answered", "_grpc_config.pypi.org", false, "default-deny"},
		{"a query name with any other byte is not answered", "a!b.files.pythonhosted.org", false, "default-deny"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := rs.NameAllowed(tt.host)
			if d.Allowed() != tt.allow || d.Rule != tt.rule {
				t.Errorf("NameAllowed(%q) = %+v, want allow=%v rule=%q", tt.host, d, tt.allow, tt.rule)
			}
		})
	}
}

// A flow never goes to a name with an underscore label, whatever DNS
// answered for it: DecideName takes host names only.
func TestDecideNameRefusesQueryNamesThatAreNoHostNames(t *testing.T) {
	rs := mustRuleSet(t, matchPolicy, nil, Guard{})
	for _, h := range []string{"_grpc_config.files.pythonhosted.org", "_http._tcp.cdn.pythonhosted.org"} {
		if d := rs.DecideName(h, 443, TCP); d.Allowed() || !strings.Contains(d.Reason, "invalid host name") {
			t.Errorf("DecideName(%q) = %+v, want denied as an invalid host name", h, d)
		}
	}
}

func TestHasHostRuleForPort(t *testing.T) {
	rs := mustRuleSet(t, matchPolicy, nil, Guard{})
	tests := []struct {
		name  string
		port  uint16
		proto Proto
		want  bool
	}{
		{"port 443 over tcp has host rules", 443, TCP, true},
		{"a port inside a host rule's range counts", 8050, TCP, true},
		{"port 22 over tcp has none", 22, TCP, false},
		{"a port only a cidr rule covers does not count", 5432, TCP, false},
		{"any udp port counts because of a star rule", 53, UDP, true},
		{"port 0 never counts", 0, UDP, false},
		{"an unknown proto never counts", 443, Proto(9), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := rs.HasHostRuleForPort(tt.port, tt.proto); got != tt.want {
				t.Errorf("HasHostRuleForPort(%d, %s) = %v, want %v", tt.port, tt.proto, got, tt.want)
			}
		})
	}
}

func TestDecideIP(t *testing.T) {
	rs := mustRuleSet(t, matchPolicy, nil, Guard{})
	tests := []struct {
		name   string
		ip     string
		port   uint16
		proto  Proto
		allow  bool
		rule   string
		reason string
	}{
		{"an address inside a cidr rule on its port is allowed", "192.0.2.10", 5432, TCP, true, "192.0.2.0/24:5432/tcp (agent.yaml:14)", "allowed by rule"},
		{"an IPv4-mapped address matches the IPv4 rule", "::ffff:192.0.2.10", 5432, TCP, true, "192.0.2.0/24:5432/tcp (agent.yaml:14)", "allowed by rule"},
		{"an address inside a cidr rule on another port is denied", "192.0.2.10", 443, TCP, false, "default-deny", "port 443 not in rule 192.0.2.0/24:5432/tcp"},
		{"an address inside a cidr rule over another proto is denied", "192.0.2.10", 5432, UDP, false, "default-deny", "udp not in rule 192.0.2.0/24:5432/tcp"},
		{"an address outside every rule is denied", "198.51.100.1", 5432, TCP, false, "default-deny", "no rule allows it"},
		{"an IPv6 address in a udp star rule is allowed", "2001:db8::1", 53, UDP, true, "[2001:db8::/32]:*/udp (agent.yaml:16)", ""},
		{"host rules never allow raw addresses", "203.0.113.5", 443, TCP, false, "default-deny", "no rule allows it"},
		{"loopback is denied by the guard", "127.0.0.1", 5432, TCP, false, "guard", "127.0.0.1 is loopback (never dialled unless a cidr rule names it)"},
		{"a private address is denied by the guard", "10.1.2.3", 443, TCP, false, "guard", "10.1.2.3 is RFC 1918 private"},
		{"the metadata address is denied by the guard", "169.254.169.254", 80, TCP, false, "guard", "cloud metadata"},
		{"an invalid address is denied", "", 443, TCP, false, "default-deny", "invalid address"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var ip netip.Addr
			if tt.ip != "" {
				ip = netip.MustParseAddr(tt.ip)
			}
			d := rs.DecideIP(ip, tt.port, tt.proto)
			if d.Allowed() != tt.allow || d.Rule != tt.rule || !strings.Contains(d.Reason, tt.reason) {
				t.Errorf("DecideIP(%s, %d, %s) = %+v\nwant allow=%v rule=%q reason containing %q", tt.ip, tt.port, tt.proto, d, tt.allow, tt.rule, tt.reason)
			}
		})
	}
}

func TestFirstMatchingRuleDecides(t *testing.T) {
	extra, err := ParseAllow("pypi.org:22")
	if err != nil {
		t.Fatal(err)
	}
	extra2, err := ParseAllow("pypi.org")
	if err != nil {
		t.Fatal(err)
	}
	rs := mustRuleSet(t, matchPolicy, []Rule{extra, extra2}, Guard{})
	tests := []struct {
		name string
		port uint16
		rule string
	}{
		{"the file rule comes before an identical --allow rule", 443, "pypi.org:443/tcp (agent.yaml:5)"},
		{"an --allow rule adds a port the file does not allow", 22, "pypi.org:22/tcp (--allow pypi.org:22)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if d := rs.DecideName("pypi.org", tt.port, TCP); !d.Allowed() || d.Rule != tt.rule {
				t.Errorf("DecideName(pypi.org, %d) = %+v, want allowed by %q", tt.port, d, tt.rule)
			}
		})
	}
}

func TestDecideNameDoesNotAllocateWhenAllowing(t *testing.T) {
	rs := benchRuleSet(t)
	for _, host := range []string{"host57.example.test", "a.b.wild57.example.test", "HOST3.Example.Test."} {
		if n := testing.AllocsPerRun(100, func() {
			if d := rs.DecideName(host, 443, TCP); !d.Allowed() {
				t.Fatalf("DecideName(%q) denied: %+v", host, d)
			}
		}); n != 0 {
			t.Errorf("DecideName(%q) allocs = %v, want 0", host, n)
		}
	}
	ip := netip.MustParseAddr("192.0.2.9")
	if n := testing.AllocsPerRun(100, func() { rs.DecideIP(ip, 5432, TCP); rs.CheckDial(ip, 443, TCP) }); n != 0 {
		t.Errorf("DecideIP+CheckDial allocs = %v, want 0", n)
	}
	if n := testing.AllocsPerRun(100, func() { rs.DecideName("nothing.example.test", 443, TCP) }); n != 0 {
		t.Errorf("DecideName on a default deny allocs = %v, want 0", n)
	}
}

// benchRuleSet has 200 host rules: 100 exact names and 100 wildcards, plus
// one cidr rule.
func benchRuleSet(t testing.TB) *RuleSet {
	var b strings.Builder
	b.WriteString("version: 1\nphases:\n  exec:\n    allow:\n")
	for i := range 100 {
		fmt.Fprintf(&b, "      - host: host%d.example.test\n        ports: [80, 443]\n", i)
		fmt.Fprintf(&b, "      - host: \"*.wild%d.example.test\"\n", i)
	}
	b.WriteString("      - cidr: 192.0.2.0/24\n        ports: [5432]\n")
	return mustRuleSet(t, b.String(), nil, Guard{})
}

func BenchmarkDecideName(b *testing.B) {
	rs := benchRuleSet(b)
	for _, bc := range []struct{ name, host string }{
		{"exact", "host99.example.test"},
		{"wildcard", "cdn.a.wild42.example.test"},
		{"miss", "nothing.anywhere.example.test"},
		{"idn", "bücher.example"},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				rs.DecideName(bc.host, 443, TCP)
			}
		})
	}
}
