package flow

import (
	"net/netip"
	"strings"
	"testing"
)

// TestWhatEachNameRuleAccepts pins both rules side by side: where they
// agree, and each place they differ on purpose.
func TestWhatEachNameRuleAccepts(t *testing.T) {
	label63 := strings.Repeat("a", 63)
	name253 := strings.Join([]string{label63, label63, label63, strings.Repeat("b", 61)}, ".")
	tests := []struct {
		name      string
		in        string
		host      bool // Hostname: an SNI, an HTTP Host, a SOCKS name, a rule's name
		query     bool // QueryName: a normalized DNS query name
		hostTrail bool // ValidHostname, which takes one trailing dot off first
	}{
		{"a plain name", "www.example.com", true, true, true},
		{"a single label", "localhost", true, true, true},
		{"digits and inner hyphens", "a-1.b2-c.example", true, true, true},
		{"an all-digit inner label", "123.example.com", true, true, true},
		{"an A-label", "xn--bcher-kva.example", true, true, true},
		{"a 63-byte label", label63 + ".com", true, true, true},
		{"a 253-byte name", name253, true, true, true},
		{"a trailing dot (taken off only by ValidHostname)", "example.com.", false, false, true},
		{"mixed case (a query name must be normalized first)", "WWW.Example.COM", true, false, true},
		{"an underscore label (_dmarc, SRV names)", "_dmarc.example.com", false, true, false},
		{"a label starting with a hyphen", "-a.example", false, true, false},
		{"a label ending with a hyphen", "a-.example", false, true, false},
		{"a reverse-lookup name (its last label is not all digits)", "4.3.2.1.in-addr.arpa", true, true, true},
		{"an IPv4 literal (all-digit last label)", "192.0.2.1", false, true, false},
		{"an all-digit single label", "1234", false, true, false},
		{"the empty name", "", false, false, false},
		{"a lone dot", ".", false, false, false},
		{"two trailing dots", "example.com..", false, false, false},
		{"a leading dot", ".example.com", false, false, false},
		{"an empty label", "a..b", false, false, false},
		{"a 64-byte label", label63 + "a.com", false, false, false},
		{"a 254-byte name", name253 + "b", false, false, false},
		{"an escaped dot, as miekg/dns presents one", `a\.b.example`, false, false, false},
		{"an escaped byte", `a\000.example`, false, false, false},
		{"a space", "exa mple.com", false, false, false},
		{"a NUL", "example.com\x00.evil", false, false, false},
		{"a port", "example.com:443", false, false, false},
		{"an IPv6 literal", "2001:db8::1", false, false, false},
		{"a U-label (IDNs arrive as A-labels)", "bücher.example", false, false, false},
		{"a wildcard", "*.example.com", false, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := CheckName(tt.in, Hostname) == ""; got != tt.host {
				t.Errorf("CheckName(%q, Hostname) = %q", tt.in, CheckName(tt.in, Hostname))
			}
			if got := CheckName(tt.in, QueryName) == ""; got != tt.query {
				t.Errorf("CheckName(%q, QueryName) = %q", tt.in, CheckName(tt.in, QueryName))
			}
			if got := ValidHostname([]byte(tt.in)); got != tt.hostTrail {
				t.Errorf("ValidHostname(%q) = %v", tt.in, got)
			}
		})
	}
	if n := testing.AllocsPerRun(100, func() { ValidHostname([]byte(name253)) }); n != 0 {
		t.Errorf("ValidHostname allocs = %v, want 0", n)
	}
	if n := testing.AllocsPerRun(100, func() { CheckName(name253, QueryName) }); n != 0 {
		t.Errorf("CheckName allocs = %v, want 0", n)
	}
}

// validByLabels is the rules written the plain way, to compare with.
func validByLabels(s string, rule NameRule) bool {
	if len(s) == 0 || len(s) > MaxNameLen {
		return false
	}
	labels := strings.Split(s, ".")
	for i, l := range labels {
		if len(l) == 0 || len(l) > MaxLabelLen {
			return false
		}
		digits := true
		for _, c := range []byte(l) {
			switch {
			case c >= '0' && c <= '9':
			case c >= 'a' && c <= 'z', c == '-':
				digits = false
			case c >= 'A' && c <= 'Z' && rule == Hostname:
				digits = false
			case c == '_' && rule == QueryName:
				digits = false
			default:
				return false
			}
		}
		if rule == Hostname {
			if l[0] == '-' || l[len(l)-1] == '-' {
				return false
			}
			if i == len(labels)-1 && digits {
				return false
			}
		}
	}
	return true
}

func FuzzCheckName(f *testing.F) {
	for _, s := range []string{"www.example.com", "_dmarc.x", "a-.b", "192.0.2.1", "A.b", `a\.b`, "a..b", "xn--bcher-kva.example", "4.3.2.1.in-addr.arpa", "x.", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		host, query := CheckName(s, Hostname) == "", CheckName(s, QueryName) == ""
		if host != validByLabels(s, Hostname) || query != validByLabels(s, QueryName) {
			t.Fatalf("%q: Hostname %v, QueryName %v; by labels %v, %v", s, host, query, validByLabels(s, Hostname), validByLabels(s, QueryName))
		}
		if host {
			if _, err := netip.ParseAddr(s); err == nil {
				t.Fatalf("the address %q is a Hostname", s)
			}
			if lower := strings.ToLower(s); CheckName(lower, QueryName) != "" {
				t.Fatalf("the Hostname %q is not a QueryName once lower-cased", s)
			}
		}
		if CheckName([]byte(s), Hostname) == "" != host {
			t.Fatalf("%q: string and []byte disagree", s)
		}
	})
}
