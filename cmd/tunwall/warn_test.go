package main

import (
	"strings"
	"testing"

	"github.com/tunwall/tunwall/policy"
)

func TestWarningsForRulesAllowingTooMuch(t *testing.T) {
	for _, c := range []struct {
		allow string
		warn  string
	}{
		{"*.com", "which is a public suffix"},
		{"*.co.uk", "which is a public suffix"},
		{"*.github.io", "which is a public suffix"},
		{"*.test", "which is a top-level domain"},
		{"0.0.0.0/0:443", "every IPv4 address"},
		{"[::/0]:*", "every IPv6 address"},
		{"*.example.com", ""},
		{"*.pythonhosted.org", ""},
		{"com", ""},
		{"192.0.2.0/24", ""},
	} {
		r, err := policy.ParseAllow(c.allow)
		if err != nil {
			t.Fatalf("%s: %v", c.allow, err)
		}
		got := ruleWarning(r)
		if (c.warn == "") != (got == "") || !strings.Contains(got, c.warn) {
			t.Errorf("Warning(%s) = %q, want %q", c.allow, got, c.warn)
		}
	}
}

func TestAWarningForAnInjectRuleThatAllowsAPlainHTTPPort(t *testing.T) {
	p, err := policy.Parse("p.yaml", []byte(`version: 1
secrets:
  T: {env: T}
phases:
  exec:
    allow:
      - {host: plain.test, ports: [80, 443], inject: [T]}
      - {host: range.test, ports: ["8000-8100"], inject: [{secret: T, header: X-Key}]}
      - {host: tls.test, ports: [443, 8443], inject: [T]}
      - {host: noinject.test, ports: [80], http: [{methods: [GET], paths: ["/**"]}]}
`))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"plain.test":    "plain.test injects T and allows port 80, where requests are plain HTTP: tunwall injects secrets only over TLS it verified",
		"range.test":    "allows port 8000, 8008, 8080",
		"tls.test":      "",
		"noinject.test": "",
	}
	for _, r := range p.Rules("exec") {
		got := ruleWarning(r)
		if w := want[r.Host]; (w == "") != (got == "") || !strings.Contains(got, w) {
			t.Errorf("%s: warning %q, want %q", r.Host, got, w)
		}
	}
}
