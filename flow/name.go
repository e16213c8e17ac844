package flow

// NameRule is a syntax for names. There is one validator, CheckName, and
// two rules, because two kinds of names reach tunwall and they differ on
// purpose.
type NameRule uint8

const (
	// Hostname is the syntax of a name a flow goes to: what the policy's
	// rules name (after IDNA mapping to A-labels) and what a client sends
	// in a TLS SNI, an HTTP Host or a SOCKS5 request. Labels of letters,
	// digits and hyphens (LDH, RFC 952 and 1123), a hyphen neither first
	// nor last, 1 to 63 bytes; at most 253 bytes in all; and a last label
	// that is not all digits (RFC 1123 2.1), so that no IPv4 address,
	// however spelled ("1.2.3.4", "0x7f.1"), is ever taken for a name.
	// Letter case is ignored: names are compared case-insensitively. No
	// underscore: no host one connects to by name has one.
	Hostname NameRule = iota + 1
	// QueryName is the syntax of a DNS query name tunwall answers or
	// forwards, normalized (lower case, no trailing dot): labels of [a-z],
	// digits, '-' and '_', 1 to 63 bytes, at most 253 in all. Wider than
	// Hostname because DNS names are: underscore labels (_dmarc, the SRV
	// names _sip._tcp), hyphens at a label's edge and all-digit labels
	// (4.3.2.1.in-addr.arpa) are real queries; the policy still decides
	// each one, and a name no rule can name is denied. Narrower in one
	// way: an upper-case letter is refused, because a query name must be
	// normalized before it is checked (a caller that forgot fails
	// closed). Any other byte is refused: miekg/dns presents a label
	// holding a dot or another special byte as an escape ("a\.b.example"),
	// and a name compared as a string would take that for a subdomain of
	// b.example.
	QueryName
)

// Name lengths (RFC 1035 2.3.4), without the trailing dot.
const (
	MaxNameLen  = 253
	MaxLabelLen = 63
)

// CheckName reports why name is not a name under rule, or "" when it is.
// name has no trailing dot (strip one first; ValidHostname does). It does
// not allocate.
func CheckName[T string | []byte](name T, rule NameRule) string {
	if len(name) == 0 {
		return "empty name"
	}
	if len(name) > MaxNameLen {
		return "longer than 253 bytes"
	}
	start, digits := 0, true
	for i := 0; i <= len(name); i++ {
		if i < len(name) && name[i] != '.' {
			c := name[i]
			switch {
			case c >= '0' && c <= '9':
			case c >= 'a' && c <= 'z', c == '-':
				digits = false
			case c >= 'A' && c <= 'Z':
				if rule == QueryName {
					return "upper-case letter in a normalized name"
				}
				digits = false
			case c == '_' && rule == QueryName:
				digits = false
			default:
				if rule == QueryName {
					return "only letters, digits, '-', '_' and '.' are allowed"
				}
				return "only letters, digits, '-' and '.' are allowed"
			}
			continue
		}
		n := i - start
		switch {
		case n == 0:
			return "empty label"
		case n > MaxLabelLen:
			return "label longer than 63 bytes"
		case rule == Hostname && (name[start] == '-' || name[i-1] == '-'):
			return "label starts or ends with '-'"
		}
		if i == len(name) && digits && rule == Hostname {
			return "last label is all digits (use a cidr rule for IP addresses)"
		}
		start, digits = i+1, true
	}
	return ""
}

// ValidHostname reports whether name, less at most one trailing dot, is a
// Hostname: the check for a name a client sent (SNI, HTTP Host, SOCKS5).
// An IP literal is not a hostname (parse those with net/netip). It does not
// allocate.
func ValidHostname[T string | []byte](name T) bool {
	if len(name) > 0 && name[len(name)-1] == '.' {
		name = name[:len(name)-1]
	}
	return CheckName(name, Hostname) == ""
}
