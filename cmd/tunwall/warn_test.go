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
