package policy

import (
	"net/netip"
	"reflect"
	"strings"
	"testing"
)

func TestParseAllow(t *testing.T) {
	p := netip.MustParsePrefix
	tests := []struct {
		name string
		in   string
		want Rule // Source is filled in by the test
	}{
		{"a bare host defaults to port 443 over tcp", "pypi.org",
			Rule{Host: "pypi.org", Ports: []PortRange{{443, 443}}, Proto: TCP}},
		{"a host takes a port", "pypi.org:80",
			Rule{Host: "pypi.org", Ports: []PortRange{{80, 80}}, Proto: TCP}},
		{"a host is normalized and takes a port and udp", "PyPI.org.:53/udp",
			Rule{Host: "pypi.org", Ports: []PortRange{{53, 53}}, Proto: UDP}},
		{"an explicit tcp suffix is accepted", "example.test/tcp",
			Rule{Host: "example.test", Ports: []PortRange{{443, 443}}, Proto: TCP}},
		{"a wildcard defaults to port 443", "*.pythonhosted.org",
			Rule{Host: "*.pythonhosted.org", Ports: []PortRange{{443, 443}}, Proto: TCP}},
		{"a wildcard takes a port and udp", "*.pythonhosted.org:443/udp",
			Rule{Host: "*.pythonhosted.org", Ports: []PortRange{{443, 443}}, Proto: UDP}},
		{"a star port means every port", "example.test:*",
			Rule{Host: "example.test", Ports: []PortRange{{1, 65535}}, Proto: TCP}},
		{"a port range is accepted", "example.test:8000-8100",
			Rule{Host: "example.test", Ports: []PortRange{{8000, 8100}}, Proto: TCP}},
		{"a port list is accepted and sorted", "example.test:443,80",
			Rule{Host: "example.test", Ports: []PortRange{{80, 80}, {443, 443}}, Proto: TCP}},
		{"an internationalized host becomes punycode", "bücher.example:443",
			Rule{Host: "xn--bcher-kva.example", Ports: []PortRange{{443, 443}}, Proto: TCP}},
		{"a bare IPv4 address is a /32 cidr rule", "192.0.2.1",
			Rule{CIDR: p("192.0.2.1/32"), Ports: []PortRange{{443, 443}}, Proto: TCP}},
		{"an IPv4 address takes a port", "192.0.2.1:5432",
			Rule{CIDR: p("192.0.2.1/32"), Ports: []PortRange{{5432, 5432}}, Proto: TCP}},
		{"an IPv4 prefix takes a port and udp", "192.0.2.0/24:5432/udp",
			Rule{CIDR: p("192.0.2.0/24"), Ports: []PortRange{{5432, 5432}}, Proto: UDP}},
		{"an IPv4 prefix without a port defaults to 443", "192.0.2.0/24",
			Rule{CIDR: p("192.0.2.0/24"), Ports: []PortRange{{443, 443}}, Proto: TCP}},
		{"a bare IPv6 address is a /128 rule without a port", "2001:db8::1",
			Rule{CIDR: p("2001:db8::1/128"), Ports: []PortRange{{443, 443}}, Proto: TCP}},
		{"a bare IPv6 prefix is a rule without a port", "2001:db8::/32",
			Rule{CIDR: p("2001:db8::/32"), Ports: []PortRange{{443, 443}}, Proto: TCP}},
		{"a bracketed IPv6 address takes a port", "[2001:db8::1]:8443",
			Rule{CIDR: p("2001:db8::1/128"), Ports: []PortRange{{8443, 8443}}, Proto: TCP}},
		{"a bracketed IPv6 prefix takes a port and udp", "[2001:db8::/64]:53/udp",
			Rule{CIDR: p("2001:db8::/64"), Ports: []PortRange{{53, 53}}, Proto: UDP}},
		{"a bracketed IPv6 address needs no port", "[2001:db8::1]/udp",
			Rule{CIDR: p("2001:db8::1/128"), Ports: []PortRange{{443, 443}}, Proto: UDP}},
		{"an IPv4-mapped address becomes IPv4", "[::ffff:192.0.2.1]:80",
			Rule{CIDR: p("192.0.2.1/32"), Ports: []PortRange{{80, 80}}, Proto: TCP}},
		{"a prefix with host bits is masked", "198.51.100.9/24:80",
			Rule{CIDR: p("198.51.100.0/24"), Ports: []PortRange{{80, 80}}, Proto: TCP}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseAllow(tt.in)
			if err != nil {
				t.Fatalf("ParseAllow(%q): %v", tt.in, err)
			}
			tt.want.Source = "--allow " + tt.in
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("ParseAllow(%q) = %+v, want %+v", tt.in, got, tt.want)
			}
			back, err := ParseAllow(got.String())
			if err != nil {
				t.Fatalf("ParseAllow(String() = %q): %v", got.String(), err)
			}
			back.Source = got.Source
			if !reflect.DeepEqual(back, got) {
				t.Errorf("round trip through %q = %+v, want %+v", got.String(), back, got)
			}
		})
	}
}

func TestParseAllowErrors(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want string
	}{
		{"an empty value is rejected", "", "empty value"},
		{"white space is rejected", "pypi.org :443", "white space"},
		{"an empty port is rejected", "pypi.org:", `bad port ""`},
		{"a port above 65535 is rejected", "pypi.org:70000", "port 70000 out of range 1-65535"},
		{"port 0 is rejected", "pypi.org:0", "port 0 out of range 1-65535"},
		{"an unknown proto is named as one", "pypi.org:443/icmp", `unknown protocol "icmp" after '/': want /tcp (the default) or /udp`},
		{"an unknown proto without a port is not a bad cidr", "allowed.test/icmp", `unknown protocol "icmp"`},
		{"a URL says which form is wanted", "https://allowed.test", "a URL is not a rule: want HOST[:PORT] (e.g. allowed.test, port 443 by default)"},
		{"a URL with a path and port", "https://user@allowed.test:8443/x", "(e.g. allowed.test:8443,"},
		{"two ports say which form is wanted", "allowed.test:443:80", `more than one ':' in "allowed.test:443:80": want HOST:PORT`},
		{"an IPv6 address and port without brackets is ambiguous", "2001:db8::10:443", "ambiguous: \"2001:db8::10:443\" could be an IPv6 address or one with port 443; write [2001:db8::10]:443"},
		{"an IPv6 address and port without brackets is ambiguous for udp too", "2001:db8::10:53/udp", "write [2001:db8::10]:53"},
		{"a leading dot says how to write a wildcard", ".example.com", `write "*.example.com" for its subdomains, and "example.com" as well`},
		{"a bare wildcard is rejected", "*.", `host "*." is not a valid name`},
		{"a wildcard inside a label is rejected", "*foo.com", "wildcard is allowed only"},
		{"an unclosed bracket is rejected", "[2001:db8::1", "missing ']'"},
		{"junk after a bracket is rejected", "[2001:db8::1]x", `unexpected "x" after ']'`},
		{"brackets around IPv4 are rejected", "[192.0.2.1]:443", "brackets are for IPv6"},
		{"a prefix longer than 32 bits is rejected", "192.0.2.0/33", "bad cidr"},
		{"a zoned address is rejected", "fe80::1%eth0", "zones are not allowed"},
		{"an underscore is rejected", "a_b.example", "not a valid name"},
		{"a missing host is rejected", ":443", "missing host or address"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := ParseAllow(tt.in)
			if err == nil {
				t.Fatalf("ParseAllow(%q) = %v, want error containing %q", tt.in, r, tt.want)
			}
			if !strings.Contains(err.Error(), tt.want) || !strings.HasPrefix(err.Error(), "--allow ") {
				t.Errorf("ParseAllow(%q) error = %q, want it to start with --allow and contain %q", tt.in, err, tt.want)
			}
		})
	}
}

func TestRuleString(t *testing.T) {
	tests := []struct {
		name string
		rule Rule
		want string
	}{
		{"a wildcard rule shows its suffix", Rule{Host: "*.pythonhosted.org", Ports: []PortRange{{443, 443}}, Proto: TCP}, "*.pythonhosted.org:443/tcp"},
		{"a cidr rule shows its prefix", Rule{CIDR: netip.MustParsePrefix("192.0.2.0/24"), Ports: []PortRange{{5432, 5432}}, Proto: TCP}, "192.0.2.0/24:5432/tcp"},
		{"an IPv6 cidr rule is bracketed", Rule{CIDR: netip.MustParsePrefix("2001:db8::/32"), Ports: []PortRange{{443, 443}}, Proto: UDP}, "[2001:db8::/32]:443/udp"},
		{"several ports and ranges are listed", Rule{Host: "github.com", Ports: []PortRange{{80, 80}, {443, 443}, {8000, 8100}}, Proto: TCP}, "github.com:80,443,8000-8100/tcp"},
		{"every port shows as a star", Rule{Host: "example.test", Ports: []PortRange{{1, 65535}}, Proto: UDP}, "example.test:*/udp"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.rule.String(); got != tt.want {
				t.Errorf("String() = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestProtoAndVerdictStrings(t *testing.T) {
	tests := []struct {
		name      string
		got, want string
	}{
		{"tcp prints as tcp", TCP.String(), "tcp"},
		{"udp prints as udp", UDP.String(), "udp"},
		{"an unknown proto prints its number", Proto(9).String(), "proto(9)"},
		{"deny prints as deny", Deny.String(), "deny"},
		{"allow prints as allow", Allow.String(), "allow"},
		{"an unknown verdict prints its number", Verdict(7).String(), "verdict(7)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.got != tt.want {
				t.Errorf("got %q, want %q", tt.got, tt.want)
			}
		})
	}
	for _, s := range []string{"tcp", "TCP", "udp", "Udp"} {
		if p, err := ParseProto(s); err != nil || !strings.EqualFold(p.String(), s) {
			t.Errorf("ParseProto(%q) = %v, %v", s, p, err)
		}
	}
	if _, err := ParseProto("icmp"); err == nil {
		t.Error("ParseProto(icmp) succeeded")
	}
}

func TestNormalizeHost(t *testing.T) {
	tests := []struct {
		name, in, want, err string
	}{
		{"case and the trailing dot are dropped", "PyPI.Org.", "pypi.org", ""},
		{"an internationalized name becomes punycode", "Bücher.Example", "xn--bcher-kva.example", ""},
		{"a punycode name stays as it is", "XN--BCHER-KVA.example", "xn--bcher-kva.example", ""},
		{"full-width letters are mapped as browsers do", "ｅｘａｍｐｌｅ.test", "example.test", ""},
		{"a wildcard keeps its star", "*.Files.Example.", "*.files.example", ""},
		{"double hyphens in the third and fourth place are real DNS names", "r3---sn-abc.googlevideo.com", "r3---sn-abc.googlevideo.com", ""},
		{"invalid punycode is rejected", "xn--zz.example", "", "not valid punycode"},
		{"a label starting with a hyphen is rejected", "-a.example", "", "starts or ends with '-'"},
		{"an empty label is rejected", "a..example", "", "empty label"},
		{"two trailing dots are rejected", "example.test..", "", "empty label"},
		{"an empty name is rejected", "", "", "empty"},
		{"an IPv4 literal is rejected", "192.0.2.1", "", "use a cidr rule"},
		{"an IPv6 literal is rejected", "2001:db8::1", "", "use a cidr rule"},
		{"a double wildcard is rejected", "*.*.example", "", "wildcard is allowed only"},
		{"a space is rejected", "a b.example", "", "not a valid"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := NormalizeHost(tt.in)
			switch {
			case tt.err == "" && (err != nil || got != tt.want):
				t.Errorf("NormalizeHost(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
			case tt.err != "" && (err == nil || !strings.Contains(err.Error(), tt.err)):
				t.Errorf("NormalizeHost(%q) = %q, %v; want error containing %q", tt.in, got, err, tt.err)
			}
		})
	}
}
