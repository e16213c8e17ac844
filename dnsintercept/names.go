package dnsintercept

import (
	"net/netip"
	"strings"

	"github.com/tunwall/tunwall/flow"
)

// normalizeName lower-cases the ASCII letters of a presentation-format name
// and removes one trailing dot. It allocates only when s has upper-case
// letters.
func normalizeName(s string) string {
	s = strings.TrimSuffix(s, ".")
	for i := 0; i < len(s); i++ {
		if c := s[i]; 'A' <= c && c <= 'Z' {
			b := []byte(s)
			for j := i; j < len(b); j++ {
				if c := b[j]; 'A' <= c && c <= 'Z' {
					b[j] = c + ('a' - 'A')
				}
			}
			return string(b)
		}
	}
	return s
}

// validHostname reports whether a normalized name is a DNS query name
// tunwall looks at: flow.CheckName's QueryName rule (labels of [a-z0-9-_],
// 1 to 63 bytes, at most 253 in all; its doc says why it is wider than a
// hostname, and why nothing else is let through).
//
// Anything else is answered NXDOMAIN without asking the Filter: miekg/dns
// presents a label holding a dot or other special byte as an escape
// ("a\.b.example"), and a policy that matches names as strings would take
// that for a subdomain of b.example although it is a label of "example".
func validHostname(s string) bool {
	return flow.CheckName(s, flow.QueryName) == ""
}

// parseReverse parses a normalized reverse-lookup name: four decimal labels
// under in-addr.arpa or 32 hexadecimal nibble labels under ip6.arpa. Partial
// names (a /16's zone, say) are not addresses and report false.
func parseReverse(name string) (netip.Addr, bool) {
	if rest, ok := strings.CutSuffix(name, ".in-addr.arpa"); ok {
		var a [4]byte
		for i := 3; i >= 0; i-- {
			label := rest
			if i > 0 {
				var found bool
				label, rest, found = strings.Cut(rest, ".")
				if !found {
					return netip.Addr{}, false
				}
			} else if strings.Contains(rest, ".") {
				return netip.Addr{}, false
			}
			n, ok := parseOctet(label)
			if !ok {
				return netip.Addr{}, false
			}
			a[i] = n
		}
		return netip.AddrFrom4(a), true
	}
	if rest, ok := strings.CutSuffix(name, ".ip6.arpa"); ok {
		// 32 nibbles separated by 31 dots, least significant first.
		if len(rest) != 63 {
			return netip.Addr{}, false
		}
		var a [16]byte
		for i := 0; i < 32; i++ {
			if i > 0 && rest[2*i-1] != '.' {
				return netip.Addr{}, false
			}
			v, ok := hexNibble(rest[2*i])
			if !ok {
				return netip.Addr{}, false
			}
			pos := 31 - i // nibble index from the most significant end
			if pos%2 == 0 {
				a[pos/2] |= v << 4
			} else {
				a[pos/2] |= v
			}
		}
		return netip.AddrFrom16(a), true
	}
	return netip.Addr{}, false
}

// parseOctet parses a decimal 0..255 without sign or leading zeros.
func parseOctet(s string) (byte, bool) {
	if len(s) == 0 || len(s) > 3 || (len(s) > 1 && s[0] == '0') {
		return 0, false
	}
	n := 0
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, false
		}
		n = n*10 + int(s[i]-'0')
	}
	if n > 255 {
		return 0, false
	}
	return byte(n), true
}

func hexNibble(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	}
	return 0, false
}
