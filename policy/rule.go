package policy

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// Rule allows flows to one host name, wildcard or address prefix, on some
// ports, over one protocol.
type Rule struct {
	Host   string       // normalized ASCII lower-case, no trailing dot; "*.suffix" for wildcards; "" for cidr rules
	CIDR   netip.Prefix // valid only for cidr rules (masked; IPv4-mapped prefixes are stored as IPv4)
	Ports  []PortRange  // sorted, merged; never empty
	Proto  Proto        // TCP or UDP; AnyProto in a deny rule that names none
	Source string       // where the rule came from: "agent.yaml:12" or "--allow pypi.org:443"

	// The HTTP layer (host rules only; see HTTPFor and DecideRequest). A
	// rule with HTTP or Inject has its flows terminated by tunwall.

	// HTTP restricts the requests on the rule's flows; nil restricts
	// nothing.
	HTTP []HTTPRule
	// Inject lists the secrets put into requests to the rule's host.
	Inject []Injection
	// CA is a PEM file of the roots the host's server is verified against
	// instead of the host's own roots; "" means the host's roots.
	CA string
}

// String returns the short human form of the rule, such as
// "*.pythonhosted.org:443/tcp", "192.0.2.0/24:5432/tcp",
// "[2001:db8::/32]:443/tcp", "github.com:80,443,8000-8100/tcp" or
// "example.test:*/udp". A single-port or "*" form parses back with
// ParseAllow.
func (r Rule) String() string {
	var b strings.Builder
	switch {
	case r.Host != "":
		b.WriteString(r.Host)
	case r.CIDR.Addr().Is6():
		b.WriteByte('[')
		b.WriteString(r.CIDR.String())
		b.WriteByte(']')
	default:
		b.WriteString(r.CIDR.String())
	}
	b.WriteByte(':')
	b.WriteString(portsString(r.Ports))
	b.WriteByte('/')
	if r.Proto == AnyProto {
		b.WriteString("tcp+udp") // a deny rule without proto
	} else {
		b.WriteString(r.Proto.String())
	}
	return b.String()
}

// isHost reports whether r is a host rule (as opposed to a cidr rule).
func (r Rule) isHost() bool { return r.Host != "" }

// allows reports whether r covers port and proto.
func (r Rule) allows(port uint16, proto Proto) bool {
	return r.Proto == proto && portsContain(r.Ports, port)
}

// denies reports whether r, a deny rule, covers port and proto.
func (r Rule) denies(port uint16, proto Proto) bool {
	return (r.Proto == AnyProto || r.Proto == proto) && portsContain(r.Ports, port)
}

// normalized returns a deep copy of r in canonical form (host normalized,
// prefix masked and unmapped, ports sorted and merged), or an error if r
// cannot be a rule. Rules from Parse and ParseAllow are already canonical.
func (r Rule) normalized() (Rule, error) {
	out := r
	switch {
	case r.Host != "" && r.CIDR.IsValid():
		return Rule{}, errors.New("rule has both host and cidr")
	case r.Host != "":
		h, err := NormalizeHost(r.Host)
		if err != nil {
			return Rule{}, err
		}
		out.Host = h
	case r.CIDR.IsValid():
		out.CIDR = canonPrefix(r.CIDR)
	default:
		return Rule{}, errors.New("rule needs host or cidr")
	}
	if len(r.Ports) == 0 {
		return Rule{}, errors.New("rule has no ports")
	}
	for _, p := range r.Ports {
		if p.Lo == 0 || p.Lo > p.Hi {
			return Rule{}, fmt.Errorf("bad port range %d-%d", p.Lo, p.Hi)
		}
	}
	out.Ports = normalizePorts(r.Ports)
	if r.Proto != TCP && r.Proto != UDP {
		return Rule{}, fmt.Errorf("bad proto %s", r.Proto)
	}
	if r.terminates() || r.CA != "" {
		if r.Host == "" || r.Proto != TCP {
			return Rule{}, errors.New("http, inject and ca need a host rule over tcp")
		}
		for _, h := range r.HTTP {
			for _, p := range h.Paths {
				if err := checkPattern(p); err != nil {
					return Rule{}, err
				}
			}
			if len(h.Methods) == 0 || len(h.Paths) == 0 {
				return Rule{}, errors.New("an http entry needs methods and paths")
			}
		}
	}
	h := out.clone()
	out.HTTP, out.Inject = h.HTTP, h.Inject
	return out, nil
}

// clone returns a copy of r that shares no memory with it.
func (r Rule) clone() Rule {
	r.Ports = slices.Clone(r.Ports)
	if r.HTTP != nil {
		h := make([]HTTPRule, len(r.HTTP))
		for i, e := range r.HTTP {
			h[i] = HTTPRule{Methods: slices.Clone(e.Methods), Paths: slices.Clone(e.Paths)}
		}
		r.HTTP = h
	}
	r.Inject = slices.Clone(r.Inject)
	return r
}

// canonPrefix masks p and turns an IPv4-mapped IPv6 prefix (::ffff:a.b.c.d/96+n)
// into the IPv4 prefix a.b.c.d/n.
func canonPrefix(p netip.Prefix) netip.Prefix {
	a := p.Addr().WithZone("")
	if a.Is4In6() && p.Bits() >= 96 {
		return netip.PrefixFrom(a.Unmap(), p.Bits()-96).Masked()
	}
	return netip.PrefixFrom(a, p.Bits()).Masked()
}

// parseCIDR parses a prefix or a bare address (meaning /32 or /128).
func parseCIDR(s string) (netip.Prefix, error) {
	if strings.Contains(s, "%") {
		return netip.Prefix{}, fmt.Errorf("bad cidr %q: zones are not allowed", s)
	}
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return netip.Prefix{}, fmt.Errorf("bad cidr %q", s)
		}
		return canonPrefix(p), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("bad cidr %q", s)
	}
	return canonPrefix(netip.PrefixFrom(a, a.BitLen())), nil
}

// ParseAllow parses one --allow flag value into a rule:
//
//	HOST[:PORT][/udp]          pypi.org, pypi.org:443, example.test:*/udp
//	*.SUFFIX[:PORT][/udp]      *.pythonhosted.org
//	IP[:PORT][/udp]            192.0.2.1:5432
//	CIDR[:PORT][/udp]          192.0.2.0/24:5432
//	[IPv6][:PORT][/udp]        [2001:db8::1]:443
//	[IPv6/64][:PORT][/udp]     [2001:db8::/64]:53/udp
//
// A bare IPv6 address or prefix (no brackets) never has a port. PORT is a
// number, "lo-hi" or "*", or a comma-separated list of those (so that every
// Rule.String parses back); it defaults to 443, as in the file. "/tcp" is
// accepted too. The rule's Source is "--allow " + s.
func ParseAllow(s string) (Rule, error) {
	r, err := parseAllow(s)
	if err != nil {
		return Rule{}, fmt.Errorf("--allow %q: %w", s, err)
	}
	r.Source = "--allow " + s
	return r, nil
}

// isUnbracketedIPv6Port reports whether s, an IPv6 address without
// brackets, reads as well as an address followed by :PORT (2001:db8::10:443).
func isUnbracketedIPv6Port(s string) bool {
	a, err := netip.ParseAddr(s)
	if err != nil || !a.Is6() {
		return false
	}
	i := strings.LastIndexByte(s, ':')
	port := s[i+1:]
	if port == "" || strings.Trim(port, "0123456789") != "" {
		return false
	}
	b, err := netip.ParseAddr(s[:i])
	return err == nil && b.Is6()
}

// hostOfURL is the host (and port) of a URL, for a message.
func hostOfURL(s string) string {
	_, rest, _ := strings.Cut(s, "://")
	if i := strings.IndexAny(rest, "/?#"); i >= 0 {
		rest = rest[:i]
	}
	if i := strings.LastIndexByte(rest, '@'); i >= 0 {
		rest = rest[i+1:]
	}
	if rest == "" {
		return "HOST"
	}
	return rest
}

func parseAllow(s string) (Rule, error) {
	if s == "" {
		return Rule{}, errors.New("empty value")
	}
	if strings.TrimSpace(s) != s || strings.ContainsAny(s, " \t\r\n") {
		return Rule{}, errors.New("contains white space")
	}
	if scheme, _, ok := strings.Cut(s, "://"); ok {
		return Rule{}, fmt.Errorf("a URL is not a rule: want HOST[:PORT] (e.g. %s, port 443 by default), not %s://", hostOfURL(s), scheme)
	}
	var r Rule
	rest, proto, err := cutProto(s)
	if err != nil {
		return Rule{}, err
	}
	r.Proto = proto
	target, port, hasPort, err := splitTarget(rest)
	if err != nil {
		return Rule{}, err
	}
	if target == "" {
		return Rule{}, errors.New("missing host or address")
	}
	r.Ports = defaultPorts()
	if hasPort {
		if r.Ports, err = parsePortList(port); err != nil {
			return Rule{}, err
		}
	}
	if isIPLiteral(target) || strings.HasPrefix(rest, "[") || strings.ContainsAny(target, "/:") ||
		strings.Trim(target, "0123456789.") == "" {
		// An address, or something meant as one: report it as a bad cidr.
		p, err := parseCIDR(target)
		if err != nil {
			return Rule{}, err
		}
		r.CIDR = p
		return r, nil
	}
	h, err := NormalizeHost(target)
	if err != nil {
		return Rule{}, err
	}
	r.Host = h
	return r, nil
}

// cutProto cuts a /PROTO suffix off s and returns its protocol (TCP
// when there is none). A '/' followed by letters that name no protocol
// is an error; anything else after a '/' (a prefix length) stays in rest.
func cutProto(s string) (rest string, proto Proto, err error) {
	rest, proto = s, TCP
	if i := strings.LastIndexByte(rest, '/'); i >= 0 {
		if p, err := ParseProto(rest[i+1:]); err == nil {
			proto = p
			rest = rest[:i]
		} else if suffix := rest[i+1:]; suffix != "" && strings.Trim(strings.ToLower(suffix), "abcdefghijklmnopqrstuvwxyz") == "" {
			// Not a prefix length: a protocol tunwall does not have.
			return "", 0, fmt.Errorf("unknown protocol %q after '/': want /tcp (the default) or /udp (ICMP is never allowed)", suffix)
		}
	}
	return rest, proto, nil
}

// splitTarget splits rest (a rule without its /PROTO) into its host or
// address and its port list: [ADDR]:PORT, [ADDR], ADDR (an IP literal
// keeps its colons) or HOST:PORT. An unbracketed IPv6 address that may
// end in a port is refused as ambiguous.
func splitTarget(rest string) (target, port string, hasPort bool, err error) {
	if isUnbracketedIPv6Port(rest) {
		i := strings.LastIndexByte(rest, ':')
		return "", "", false, fmt.Errorf("ambiguous: %q could be an IPv6 address or one with port %s; write [%s]:%s for the port, or [%s] for the address alone", rest, rest[i+1:], rest[:i], rest[i+1:], rest)
	}
	switch {
	case strings.HasPrefix(rest, "["):
		end := strings.IndexByte(rest, ']')
		if end < 0 {
			return "", "", false, errors.New("missing ']'")
		}
		target = rest[1:end]
		switch after := rest[end+1:]; {
		case after == "":
		case after[0] == ':':
			port, hasPort = after[1:], true
		default:
			return "", "", false, fmt.Errorf("unexpected %q after ']' (want :PORT or /udp)", after)
		}
		if !strings.Contains(target, ":") {
			return "", "", false, fmt.Errorf("brackets are for IPv6 addresses, not %q", target)
		}
	case isIPLiteral(rest):
		target = rest
	default:
		target = rest
		if i := strings.LastIndexByte(rest, ':'); i >= 0 {
			target, port, hasPort = rest[:i], rest[i+1:], true
		}
		if strings.Contains(target, ":") && !isIPLiteral(target) {
			return "", "", false, fmt.Errorf("more than one ':' in %q: want HOST:PORT, where PORT is a number, a list such as 80,443 or a range such as 8000-8100 (an IPv6 address goes in brackets: [ADDR]:PORT)", rest)
		}
	}
	return target, port, hasPort, nil
}

// parsePortList parses a comma-separated list of ports and ranges into
// normalized ranges.
func parsePortList(list string) ([]PortRange, error) {
	var ports []PortRange
	for item := range strings.SplitSeq(list, ",") {
		pr, err := parsePortSpec(item)
		if err != nil {
			return nil, err
		}
		ports = append(ports, pr)
	}
	return normalizePorts(ports), nil
}
