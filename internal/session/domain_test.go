package session

import "testing"

func TestRegistrableDomainUsesThePublicSuffixList(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"a.b.example.co.uk", "example.co.uk"},
		{"X.Example.COM.", "example.com"},
		{"evil.github.io", "evil.github.io"}, // github.io is a (private) public suffix
		{"github.io", "github.io"},
		{"com", "com"},
		{"r0123.d07-flood.test", "d07-flood.test"}, // unlisted TLD: the default rule "*"
		{"a..evil.test", "evil.test"},              // the list cannot parse it: the approximation
		{"192.0.2.1", "192.0.2.1"},
	} {
		if got := registrableDomain(c.in); got != c.want {
			t.Errorf("registrableDomain(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}
