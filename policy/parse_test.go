package policy

import (
	"errors"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

const specExample = `version: 1
phases:
  setup:
    allow:
      - host: pypi.org
      - host: "*.pythonhosted.org"
        ports: [443]
  exec:
    allow:
      - host: github.com
        ports: [443, 80, "8000-8100"]
      - cidr: 192.0.2.0/24
        ports: [5432]
        proto: tcp
dns:
  upstream: 192.0.2.53:53
`

func TestParseAcceptsTheSpecExample(t *testing.T) {
	p, err := Parse("agent.yaml", []byte(specExample))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	if got, want := p.Phases(), []string{"setup", "exec"}; !reflect.DeepEqual(got, want) {
		t.Errorf("Phases() = %v, want %v", got, want)
	}
	if got, want := p.DNSUpstream(), netip.MustParseAddrPort("192.0.2.53:53"); got != want {
		t.Errorf("DNSUpstream() = %v, want %v", got, want)
	}
	want := map[string][]Rule{
		"setup": {
			{Host: "pypi.org", Ports: []PortRange{{443, 443}}, Proto: TCP, Source: "agent.yaml:5"},
			{Host: "*.pythonhosted.org", Ports: []PortRange{{443, 443}}, Proto: TCP, Source: "agent.yaml:6"},
		},
		"exec": {
			{Host: "github.com", Ports: []PortRange{{80, 80}, {443, 443}, {8000, 8100}}, Proto: TCP, Source: "agent.yaml:10"},
			{CIDR: netip.MustParsePrefix("192.0.2.0/24"), Ports: []PortRange{{5432, 5432}}, Proto: TCP, Source: "agent.yaml:12"},
		},
	}
	for phase, rules := range want {
		if got := p.Rules(phase); !reflect.DeepEqual(got, rules) {
			t.Errorf("Rules(%q) =\n %+v\nwant\n %+v", phase, got, rules)
		}
	}
	if got := p.Rules("nope"); got != nil {
		t.Errorf("Rules of an unknown phase = %v, want nil", got)
	}
	strs := []string{}
	for _, r := range p.Rules("exec") {
		strs = append(strs, r.String())
	}
	if got, want := strings.Join(strs, " "), "github.com:80,443,8000-8100/tcp 192.0.2.0/24:5432/tcp"; got != want {
		t.Errorf("rule strings = %q, want %q", got, want)
	}
}

func TestParseValues(t *testing.T) {
	tests := []struct {
		name string
		rule string // one rule, indented as an item of allow
		dns  string // dns section body, or ""
		want Rule
		up   netip.AddrPort
	}{
		{
			name: "a rule without ports gets port 443 and tcp",
			rule: "- host: example.test",
			want: Rule{Host: "example.test", Ports: []PortRange{{443, 443}}, Proto: TCP},
		},
		{
			name: "host names are lower-cased and lose their trailing dot",
			rule: "- host: WWW.Example.TEST.",
			want: Rule{Host: "www.example.test", Ports: []PortRange{{443, 443}}, Proto: TCP},
		},
		{
			name: "an internationalized name is stored as punycode",
			rule: "- host: bücher.example",
			want: Rule{Host: "xn--bcher-kva.example", Ports: []PortRange{{443, 443}}, Proto: TCP},
		},
		{
			name: "a star port means every port",
			rule: "- host: example.test\n        ports: [\"*\"]\n        proto: UDP",
			want: Rule{Host: "example.test", Ports: []PortRange{{1, 65535}}, Proto: UDP},
		},
		{
			name: "overlapping and adjacent ports are merged and sorted",
			rule: "- host: example.test\n        ports: [8080, 81, 80, 8000-8100, 82]",
			want: Rule{Host: "example.test", Ports: []PortRange{{80, 82}, {8000, 8100}}, Proto: TCP},
		},
		{
			name: "a bare IPv4 address means /32",
			rule: "- cidr: 192.0.2.7",
			want: Rule{CIDR: netip.MustParsePrefix("192.0.2.7/32"), Ports: []PortRange{{443, 443}}, Proto: TCP},
		},
		{
			name: "a bare IPv6 address means /128",
			rule: "- cidr: 2001:db8::7",
			want: Rule{CIDR: netip.MustParsePrefix("2001:db8::7/128"), Ports: []PortRange{{443, 443}}, Proto: TCP},
		},
		{
			name: "a prefix with host bits is masked",
			rule: "- cidr: 198.51.100.77/24",
			want: Rule{CIDR: netip.MustParsePrefix("198.51.100.0/24"), Ports: []PortRange{{443, 443}}, Proto: TCP},
		},
		{
			name: "an IPv4-mapped prefix is stored as IPv4",
			rule: "- cidr: \"::ffff:203.0.113.0/120\"",
			want: Rule{CIDR: netip.MustParsePrefix("203.0.113.0/24"), Ports: []PortRange{{443, 443}}, Proto: TCP},
		},
		{
			name: "dns upstream without a port uses 53",
			rule: "- host: example.test",
			dns:  "upstream: 192.0.2.53",
			want: Rule{Host: "example.test", Ports: []PortRange{{443, 443}}, Proto: TCP},
			up:   netip.MustParseAddrPort("192.0.2.53:53"),
		},
		{
			name: "dns upstream takes a bracketed IPv6 address with a port",
			rule: "- host: example.test",
			dns:  "upstream: \"[2001:db8::53]:5353\"",
			want: Rule{Host: "example.test", Ports: []PortRange{{443, 443}}, Proto: TCP},
			up:   netip.MustParseAddrPort("[2001:db8::53]:5353"),
		},
		{
			name: "dns upstream takes a bare IPv6 address",
			rule: "- host: example.test",
			dns:  "upstream: 2001:db8::53",
			want: Rule{Host: "example.test", Ports: []PortRange{{443, 443}}, Proto: TCP},
			up:   netip.MustParseAddrPort("[2001:db8::53]:53"),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src := "version: 1\nphases:\n  exec:\n    allow:\n      " + tt.rule + "\n"
			if tt.dns != "" {
				src += "dns:\n  " + tt.dns + "\n"
			}
			p, err := Parse("t.yaml", []byte(src))
			if err != nil {
				t.Fatalf("Parse: %v\n%s", err, src)
			}
			got := p.Rules("exec")
			tt.want.Source = "t.yaml:5"
			if len(got) != 1 || !reflect.DeepEqual(got[0], tt.want) {
				t.Errorf("rules = %+v, want [%+v]", got, tt.want)
			}
			if p.DNSUpstream() != tt.up {
				t.Errorf("DNSUpstream() = %v, want %v", p.DNSUpstream(), tt.up)
			}
		})
	}
}

func TestParseErrors(t *testing.T) {
	const head = "version: 1\nphases:\n  exec:\n    allow:\n" // rules start on line 5
	tests := []struct {
		name      string
		src       string
		line, col int
		msg       string // substring of Msg
	}{
		{"a misspelled rule key is named with the known keys", head + "      - host: pypi.org\n        prots: [443]\n",
			6, 9, `unknown key "prots" in rule (known: host, cidr, ports, proto, http, inject, ca)`},
		{"a prefix longer than 32 bits is a bad cidr", head + "      - cidr: 10.0.0.0/33\n",
			5, 15, `bad cidr "10.0.0.0/33"`},
		{"a cidr that is not an address is a bad cidr", head + "      - cidr: example.test\n",
			5, 15, `bad cidr "example.test"`},
		{"a zoned cidr is rejected", head + "      - cidr: fe80::1%eth0\n",
			5, 15, `zones are not allowed`},
		{"a port above 65535 is out of range", head + "      - host: pypi.org\n        ports: [443, 70000]\n",
			6, 22, "port 70000 out of range 1-65535"},
		{"port 0 is out of range", head + "      - host: pypi.org\n        ports: [0]\n",
			6, 17, "port 0 out of range 1-65535"},
		{"a quoted port above 65535 is out of range", head + "      - host: pypi.org\n        ports: [\"1-70000\"]\n",
			6, 17, "port 70000 out of range 1-65535"},
		{"a reversed port range is rejected", head + "      - host: pypi.org\n        ports: [9000-8000]\n",
			6, 17, `port range "9000-8000" is reversed`},
		{"a port word is rejected", head + "      - host: pypi.org\n        ports: [https]\n",
			6, 17, `bad port "https"`},
		{"a boolean port is a wrong type", head + "      - host: pypi.org\n        ports: [true]\n",
			6, 17, "port must be a number"},
		{"a scalar ports value is a wrong type", head + "      - host: pypi.org\n        ports: 443\n",
			6, 16, "ports must be a list such as [443], got the integer 443"},
		{"an empty ports list is rejected", head + "      - host: pypi.org\n        ports: []\n",
			6, 16, "ports is empty"},
		{"an empty allow list means the phase has no rules", head + "    \n",
			3, 3, `phase "exec" has no rules`},
		{"an explicit empty allow list means the phase has no rules", "version: 1\nphases:\n  exec:\n    allow: []\n",
			3, 3, `phase "exec" has no rules`},
		{"a null phase has no rules", "version: 1\nphases:\n  setup:\n",
			3, 3, `phase "setup" has no rules`},
		{"a phase without allow has no rules", "version: 1\nphases:\n  exec: {}\n",
			3, 3, `phase "exec" has no rules`},
		{"version 2 is rejected", "version: 2\nphases:\n  exec:\n    allow:\n      - host: pypi.org\n",
			1, 10, "version must be 1"},
		{"a quoted version is rejected", "version: \"1\"\nphases:\n  exec:\n    allow:\n      - host: pypi.org\n",
			1, 10, "version must be 1"},
		{"a missing version is reported", "phases:\n  exec:\n    allow:\n      - host: pypi.org\n",
			1, 1, `missing "version" (version must be 1)`},
		{"a rule with only ports needs host or cidr", head + "      - host: pypi.org\n      - ports: [443]\n",
			6, 9, "rule needs host or cidr"},
		{"a rule with both host and cidr is rejected", head + "      - host: pypi.org\n        cidr: 192.0.2.0/24\n",
			6, 9, "rule has both host and cidr"},
		{"a bare wildcard is not a valid name", head + "      - host: \"*.\"\n",
			5, 15, `host "*." is not a valid name`},
		{"a wildcard inside a label is rejected", head + "      - host: \"*foo.com\"\n",
			5, 15, `host "*foo.com" is not a valid name: a wildcard is allowed only as the whole first label`},
		{"a wildcard in a middle label is rejected", head + "      - host: \"a.*.com\"\n",
			5, 15, `host "a.*.com" is not a valid name: a wildcard is allowed only`},
		{"an IP address as host points to cidr", head + "      - host: 192.0.2.1\n",
			5, 15, `host "192.0.2.1" is an IP address; use a cidr rule`},
		{"an IPv6 address as host points to cidr", head + "      - host: \"[2001:db8::1]\"\n",
			5, 15, `is an IP address; use a cidr rule`},
		{"an underscore in a host is rejected", head + "      - host: a_b.example\n",
			5, 15, `host "a_b.example" is not a valid name`},
		{"a label of 64 bytes is too long", head + "      - host: " + strings.Repeat("a", 64) + ".example\n",
			5, 15, "label longer than 63 bytes"},
		{"a name of 254 bytes is too long", head + "      - host: " + strings.Repeat("abcdefghi.", 25) + "abcd\n",
			5, 15, "longer than 253 bytes"},
		{"an all-digit last label is rejected", head + "      - host: 1.2.3\n",
			5, 15, "last label is all digits"},
		{"an integer host is a wrong type", head + "      - host: 123\n",
			5, 15, "host must be a string, got the integer 123"},
		{"a null host is a wrong type", head + "      - host:\n",
			5, 14, "host must be a string, got nothing (null)"},
		{"an unknown proto is rejected", head + "      - host: pypi.org\n        proto: icmp\n",
			6, 16, `unknown proto "icmp" (want tcp or udp)`},
		{"a rule that is a bare string is a wrong type", head + "      - pypi.org\n",
			5, 9, `rule must be a mapping such as {host: example.com}, got the string "pypi.org"`},
		{"allow as a mapping is a wrong type", "version: 1\nphases:\n  exec:\n    allow:\n      host: pypi.org\n",
			5, 7, `allow in phase "exec" must be a list of rules, got a mapping`},
		{"phases as a list is a wrong type", "version: 1\nphases:\n  - exec\n",
			3, 3, "phases must be a mapping, got a list"},
		{"a top level list is a wrong type", "- version: 1\n",
			1, 1, "the top level must be a mapping, got a list"},
		{"a duplicate rule key is reported with the first line", head + "      - host: pypi.org\n        ports: [443]\n        host: example.test\n",
			7, 9, `duplicate key "host" in rule (first at line 5)`},
		{"a duplicate phase is reported", "version: 1\nphases:\n  exec:\n    allow:\n      - host: a.example\n  exec:\n    allow:\n      - host: b.example\n",
			6, 3, `duplicate key "exec" in phases (first at line 3)`},
		{"a duplicate top level key is reported", "version: 1\nversion: 1\n",
			2, 1, `duplicate key "version" at top level (first at line 1)`},
		{"an unknown top level key is reported", "version: 1\npolicy: x\n",
			2, 1, `unknown key "policy" at top level (known: version, phases, dns, secrets)`},
		{"an unknown phase key is reported", "version: 1\nphases:\n  exec:\n    block:\n      - host: pypi.org\n",
			4, 5, `unknown key "block" in phase "exec" (known: allow, deny, default)`},
		{"an unknown dns key is reported", head + "      - host: pypi.org\ndns:\n  server: 192.0.2.53\n",
			7, 3, `unknown key "server" in dns (known: upstream)`},
		{"a dns upstream name is rejected", head + "      - host: pypi.org\ndns:\n  upstream: resolver.example\n",
			7, 13, `bad dns upstream "resolver.example"`},
		{"a dns upstream port out of range is rejected", head + "      - host: pypi.org\ndns:\n  upstream: 192.0.2.53:99999\n",
			7, 13, "port 99999 out of range 1-65535"},
		{"an unbracketed IPv6 upstream with a port is rejected", head + "      - host: pypi.org\ndns:\n  upstream: 2001:db8::53:53:x\n",
			7, 13, "bad dns upstream"},
		{"an empty file is reported", "",
			1, 1, "empty file"},
		{"a file of comments is empty", "# nothing\n\n",
			1, 1, "empty file"},
		{"a null document is empty", "---\n",
			1, 1, "empty file"},
		{"missing phases is reported", "version: 1\n",
			1, 1, `missing "phases"`},
		{"an empty phases mapping is reported", "version: 1\nphases: {}\n",
			2, 9, "phases is empty"},
		{"a bad phase name is reported", "version: 1\nphases:\n  \"ex ec\":\n    allow:\n      - host: pypi.org\n",
			3, 3, `bad phase name "ex ec"`},
		{"an unclosed flow list is reported on the line it opens", head + "      - host: pypi.org\n        ports: [443\n",
			6, 1, "bad YAML: did not find expected ',' or ']'"},
		{"an unterminated quote is reported on the line it opens", head + "      - host: pypi.org\n        ports: \"443\n",
			6, 1, "bad YAML: found unexpected end of stream"},
		{"a misindented key is a YAML syntax error on its line", "version: 1\n  phases: x\n",
			2, 1, "bad YAML: mapping values are not allowed in this context"},
		{"an unknown YAML alias is reported where it is used", head + "      - host: pypi.org\n      - *rule\n",
			6, 1, "bad YAML: unknown anchor 'rule' referenced"},
		{"a tab in indentation is a YAML syntax error", "version: 1\nphases:\n\texec:\n",
			3, 1, "bad YAML: found character that cannot start any token"},
		{"a YAML alias is rejected", "version: 1\nphases:\n  setup:\n    allow: &a\n      - host: pypi.org\n  exec:\n    allow: *a\n",
			4, 12, "YAML anchors (&a) are not supported"},
		{"a second YAML document is rejected", head + "      - host: pypi.org\n---\nversion: 1\n",
			6, 1, "more than one YAML document"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := Parse("agent.yaml", []byte(tt.src))
			if err == nil {
				t.Fatalf("Parse succeeded with phases %v, want error %q", p.Phases(), tt.msg)
			}
			var pe *ParseError
			if !errors.As(err, &pe) {
				t.Fatalf("error %v is %T, want *ParseError", err, err)
			}
			if pe.File != "agent.yaml" || pe.Line != tt.line || pe.Col != tt.col || !strings.Contains(pe.Msg, tt.msg) {
				t.Errorf("error = %q (line %d col %d)\nwant agent.yaml:%d:%d containing %q", err, pe.Line, pe.Col, tt.line, tt.col, tt.msg)
			}
			if want := "agent.yaml:"; !strings.HasPrefix(err.Error(), want) {
				t.Errorf("Error() = %q, want prefix %q", err.Error(), want)
			}
		})
	}
}

func TestParseFile(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "agent.yaml")
	if err := os.WriteFile(good, []byte(specExample), 0o600); err != nil {
		t.Fatal(err)
	}
	p, err := ParseFile(good)
	if err != nil {
		t.Fatalf("ParseFile: %v", err)
	}
	if got := p.Rules("setup")[0].Source; got != good+":5" {
		t.Errorf("Source = %q, want %q", got, good+":5")
	}

	_, err = ParseFile(filepath.Join(dir, "missing.yaml"))
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("ParseFile of a missing file = %v, want fs.ErrNotExist", err)
	}

	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("version: 3\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = ParseFile(bad)
	var pe *ParseError
	if !errors.As(err, &pe) || pe.File != bad || pe.Line != 1 {
		t.Errorf("ParseFile of a bad file = %v, want *ParseError at %s:1", err, bad)
	}
}

func TestPolicyRulesReturnsACopy(t *testing.T) {
	p, err := Parse("a.yaml", []byte(specExample))
	if err != nil {
		t.Fatal(err)
	}
	rs := p.Rules("exec")
	rs[0].Host = "evil.example"
	rs[0].Ports[0] = PortRange{1, 65535}
	if again := p.Rules("exec"); again[0].Host != "github.com" || again[0].Ports[0] != (PortRange{80, 80}) {
		t.Errorf("mutating Rules() changed the policy: %+v", again[0])
	}
}
