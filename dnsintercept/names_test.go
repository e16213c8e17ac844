package dnsintercept

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/miekg/dns"
)

func TestNormalizeName(t *testing.T) {
	tests := []struct{ name, in, want string }{
		{"lower-case names are unchanged", "example.com", "example.com"},
		{"upper-case ASCII is lowered", "ExAmPlE.COM", "example.com"},
		{"one trailing dot is removed", "example.com.", "example.com"},
		{"the root becomes empty", ".", ""},
		{"escapes are kept as written", `A\.B.example.`, `a\.b.example`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := normalizeName(tt.in); got != tt.want {
				t.Errorf("normalizeName(%q) = %q, want %q", tt.in, got, tt.want)
			}
		})
	}
}

func TestValidHostname(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want bool
	}{
		{"a plain name is valid", "www.example.com", true},
		{"underscore labels are valid", "_dmarc.example.com", true},
		{"a single label is valid", "localhost", true},
		{"digits and hyphens are valid", "1-2.example", true},
		{"the empty name is invalid", "", false},
		{"an escaped dot is invalid", `a\.b.example`, false},
		{"an escaped byte is invalid", `a\000.example`, false},
		{"an empty label is invalid", "a..example", false},
		{"a leading dot is invalid", ".example", false},
		{"a trailing dot is invalid after normalization", "example.", false},
		{"a wildcard label is invalid", "*.example", false},
		{"upper case is invalid after normalization", "Example", false},
		{"a 63-byte label is valid", strings.Repeat("a", 63) + ".example", true},
		{"a 64-byte label is invalid", strings.Repeat("a", 64) + ".example", false},
		{"a 254-byte name is invalid", strings.Repeat("a.", 126) + "ab", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := validHostname(tt.in); got != tt.want {
				t.Errorf("validHostname(%q) = %v, want %v", tt.in, got, tt.want)
			}
		})
	}
}

func TestParseReverse(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want string // "" means not an address
	}{
		{"an IPv4 reverse name parses", "1.0.18.198.in-addr.arpa", "198.18.0.1"},
		{"an IPv6 reverse name parses", "1.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.d.6.c.6.1.6.7.7.e.6.5.7.4.7.d.f.ip6.arpa", "fd74:756e:7761:6c6d::1"},
		{"a partial IPv4 name is not an address", "18.198.in-addr.arpa", ""},
		{"five IPv4 labels are not an address", "1.1.0.18.198.in-addr.arpa", ""},
		{"an octet above 255 is rejected", "256.0.18.198.in-addr.arpa", ""},
		{"a leading zero is rejected", "01.0.18.198.in-addr.arpa", ""},
		{"an empty label is rejected", ".0.18.198.in-addr.arpa", ""},
		{"a partial IPv6 name is not an address", "d.6.c.6.1.6.7.7.e.6.5.7.4.7.d.f.ip6.arpa", ""},
		{"a two-letter nibble is rejected", "10.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.d.6.c.6.1.6.7.7.e.6.5.7.4.7.d.ip6.arpa", ""},
		{"a non-hex nibble is rejected", "g.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.d.6.c.6.1.6.7.7.e.6.5.7.4.7.d.f.ip6.arpa", ""},
		{"a forward name is not a reverse name", "example.com", ""},
		{"the zone apex is not an address", "in-addr.arpa", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := parseReverse(tt.in)
			if tt.want == "" {
				if ok {
					t.Errorf("parseReverse(%q) = %v, want no address", tt.in, got)
				}
				return
			}
			if !ok || got != netip.MustParseAddr(tt.want) {
				t.Errorf("parseReverse(%q) = %v, %v; want %s", tt.in, got, ok, tt.want)
			}
		})
	}
}

// FuzzParseReverse checks that parseReverse never panics and that whatever it
// accepts is exactly the canonical reverse name of the address it returns.
func FuzzParseReverse(f *testing.F) {
	f.Add("1.0.18.198.in-addr.arpa")
	f.Add("1.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.d.6.c.6.1.6.7.7.e.6.5.7.4.7.d.f.ip6.arpa")
	f.Add("0.0.0.0.in-addr.arpa")
	f.Add("x.ip6.arpa")
	f.Fuzz(func(t *testing.T, s string) {
		ip, ok := parseReverse(s)
		if !ok {
			return
		}
		want := reverseName(ip)
		if !ip.Is4In6() { // miekg writes those under in-addr.arpa
			if m, err := dns.ReverseAddr(ip.String()); err != nil || normalizeName(m) != want {
				t.Fatalf("reverseName(%v) = %q, miekg says %q (%v)", ip, want, m, err)
			}
		}
		if want != s {
			t.Fatalf("parseReverse(%q) = %v, whose reverse name is %q", s, ip, want)
		}
	})
}

// reverseName is the canonical reverse-lookup name of ip, without the
// trailing dot; IPv4-mapped addresses get their ip6.arpa form.
func reverseName(ip netip.Addr) string {
	var b strings.Builder
	if ip.Is4() {
		a := ip.As4()
		for i := 3; i >= 0; i-- {
			fmt.Fprintf(&b, "%d.", a[i])
		}
		return b.String() + "in-addr.arpa"
	}
	a := ip.As16()
	for i := 15; i >= 0; i-- {
		fmt.Fprintf(&b, "%x.%x.", a[i]&0xf, a[i]>>4)
	}
	return b.String() + "ip6.arpa"
}
