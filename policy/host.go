package policy

import (
	"fmt"
	"net/netip"
	"strings"

	"golang.org/x/net/idna"

	"github.com/tunwall/tunwall/flow"
)

const maxNameLen = flow.MaxNameLen // RFC 1035 2.3.4, without the trailing dot

// nameBuf holds a canonical name while matching; sized so that a name that is
// too long is detected rather than truncated.
type nameBuf [maxNameLen + 2]byte

// NormalizeHost returns the canonical form of a rule or query host name:
// ASCII lower case, one trailing dot removed, internationalized labels in
// punycode (UTS #46 lookup mapping, as idna.Lookup.ToASCII), then checked
// with flow.CheckName's Hostname rule (the one validator tunwall has): each
// label 1..63 bytes of letters, digits and hyphens, at most 253 bytes in all. "*.suffix"
// is kept as a wildcard; '*' anywhere else is an error, as are IP literals
// (those belong in cidr rules) and names whose last label is all digits.
func NormalizeHost(s string) (string, error) {
	name, wild := s, false
	if rest, ok := strings.CutPrefix(name, "*."); ok {
		name, wild = rest, true
	}
	name = strings.TrimSuffix(name, ".")
	if !wild && strings.HasPrefix(name, ".") && len(name) > 1 {
		return "", fmt.Errorf("host %q is not a valid name: a leading dot is not a wildcard; write \"*%s\" for its subdomains, and %q as well for the name itself", s, name, strings.TrimLeft(name, "."))
	}
	if name == "" {
		if wild {
			return "", fmt.Errorf("host %q is not a valid name: nothing follows \"*.\"", s)
		}
		return "", fmt.Errorf("host %q is not a valid name: empty", s)
	}
	if strings.Contains(name, "*") {
		return "", fmt.Errorf("host %q is not a valid name: a wildcard is allowed only as the whole first label \"*.\"", s)
	}
	if isIPLiteral(name) {
		return "", fmt.Errorf("host %q is an IP address; use a cidr rule for addresses", s)
	}
	ascii, err := toASCII(name)
	if err != nil {
		return "", fmt.Errorf("host %q is not a valid name: %w", s, err)
	}
	if wild {
		if maxNameLen-len(ascii) < 2 {
			return "", fmt.Errorf("host %q is not a valid name: longer than %d bytes", s, maxNameLen)
		}
		return "*." + ascii, nil
	}
	return ascii, nil
}

// isIPLiteral reports whether s is an IP address, with or without brackets,
// zone or prefix length.
func isIPLiteral(s string) bool {
	s = strings.TrimSuffix(strings.TrimPrefix(s, "["), "]")
	if _, err := netip.ParseAddr(s); err == nil {
		return true
	}
	_, err := netip.ParsePrefix(s)
	return err == nil
}

// toASCII converts a name without wildcard or trailing dot to canonical ASCII.
// Pure-ASCII names are lower-cased and checked here rather than by idna,
// because UTS #46 CheckHyphens rejects real DNS names such as
// "r3---sn-abc.googlevideo.com"; labels beginning "xn--" are still validated
// as punycode.
func toASCII(name string) (string, error) {
	ascii := true
	for i := 0; i < len(name); i++ {
		if name[i] >= 0x80 {
			ascii = false
			break
		}
	}
	if ascii {
		name = strings.ToLower(name)
	} else {
		mapped, err := idna.Lookup.ToASCII(name)
		if err != nil {
			return "", fmt.Errorf("not a valid internationalized name (%w)", err)
		}
		name = mapped
	}
	if msg := flow.CheckName(name, flow.Hostname); msg != "" {
		return "", fmt.Errorf("%s", msg)
	}
	for label := range strings.SplitSeq(name, ".") {
		if !strings.HasPrefix(label, "xn--") {
			continue
		}
		if back, err := idna.Lookup.ToASCII(label); err != nil || back != label {
			return "", fmt.Errorf("label %q is not valid punycode", label)
		}
	}
	return name, nil
}

// canonName writes the canonical form of a query name into buf and returns
// its length, or a reason the name is invalid. ASCII names are handled
// without allocating; others go through NormalizeHost.
func canonName(buf *nameBuf, host string, rule flow.NameRule) (int, string) {
	if len(host) > 0 && host[len(host)-1] == '.' {
		host = host[:len(host)-1]
	}
	if len(host) > maxNameLen {
		return 0, "longer than 253 bytes"
	}
	for i := 0; i < len(host); i++ {
		c := host[i]
		if c >= 0x80 {
			h, err := NormalizeHost(host)
			if err != nil || strings.HasPrefix(h, "*.") {
				return 0, "not a valid host name"
			}
			return copy(buf[:], h), ""
		}
		if c >= 'A' && c <= 'Z' {
			c += 'a' - 'A'
		}
		buf[i] = c
	}
	n := len(host)
	if msg := flow.CheckName(buf[:n], rule); msg != "" {
		return 0, msg
	}
	return n, ""
}
