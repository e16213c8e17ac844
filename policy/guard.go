package policy

import (
	"fmt"
	"net/netip"
)

// Guard describes the addresses tunwall never dials unless a cidr rule names
// them explicitly, even when an allowed name resolves there (the DNS
// rebinding guard). The built-in set is fixed (see guardTable); Extra adds
// the caller's own: the host's addresses, the fake-IP pools and so on.
//
// An address that embeds IPv4 (IPv4-mapped ::ffff:0:0/96, NAT64
// 64:ff9b::/96, 6to4 2002::/16) is judged by the embedded address.
//
// A cidr rule names a guarded address explicitly when its prefix contains the
// address and lies inside the narrowest guarded range that contains it. So
// "10.0.0.0/8" or "10.1.2.3" unlock 10.1.2.3, but "0.0.0.0/0" never unlocks
// loopback, and "169.254.0.0/16" does not unlock the metadata address
// 169.254.169.254, which only "169.254.169.254/32" does.
//
// The zero Guard holds just the built-in set.
type Guard struct {
	Extra []netip.Prefix // host's own addresses, the fake-IP pools, etc., supplied by the caller
}

type guardEntry struct {
	prefix netip.Prefix
	why    string
}

// guardTable is the built-in never-dial set. Where ranges nest, the
// narrowest match gives the reason and the range a rule must stay inside.
var guardTable = [...]guardEntry{
	// Cloud metadata services. Most sit inside link-local or shared space,
	// but listing them on their own means only a rule naming the exact
	// address unlocks them.
	{netip.MustParsePrefix("169.254.169.254/32"), "cloud metadata"}, // AWS, GCP, Azure IMDS, OCI, DigitalOcean, OpenStack
	{netip.MustParsePrefix("169.254.170.2/32"), "cloud metadata"},   // AWS ECS task metadata and credentials
	{netip.MustParsePrefix("169.254.170.23/32"), "cloud metadata"},  // AWS EKS Pod Identity agent
	{netip.MustParsePrefix("168.63.129.16/32"), "cloud metadata"},   // Azure wireserver (public space: not covered below)
	{netip.MustParsePrefix("100.100.100.200/32"), "cloud metadata"}, // Alibaba Cloud (also inside 100.64.0.0/10)
	{netip.MustParsePrefix("fd00:ec2::254/128"), "cloud metadata"},  // AWS IMDS over IPv6 (also inside fc00::/7)
	{netip.MustParsePrefix("fd00:ec2::23/128"), "cloud metadata"},   // AWS EKS Pod Identity agent over IPv6

	// IPv4.
	{netip.MustParsePrefix("0.0.0.0/32"), "unspecified"},
	{netip.MustParsePrefix("0.0.0.0/8"), "this network (0.0.0.0/8)"},
	{netip.MustParsePrefix("127.0.0.0/8"), "loopback"},
	{netip.MustParsePrefix("10.0.0.0/8"), "RFC 1918 private"},
	{netip.MustParsePrefix("172.16.0.0/12"), "RFC 1918 private"},
	{netip.MustParsePrefix("192.168.0.0/16"), "RFC 1918 private"},
	{netip.MustParsePrefix("169.254.0.0/16"), "link-local"},
	{netip.MustParsePrefix("100.64.0.0/10"), "shared address space (RFC 6598)"},
	{netip.MustParsePrefix("224.0.0.0/4"), "multicast"},
	{netip.MustParsePrefix("255.255.255.255/32"), "broadcast"},
	{netip.MustParsePrefix("240.0.0.0/4"), "reserved (240.0.0.0/4)"},

	// IPv6.
	{netip.MustParsePrefix("::/128"), "unspecified"},
	{netip.MustParsePrefix("::1/128"), "loopback"},
	{netip.MustParsePrefix("::/96"), "IPv4-compatible (deprecated ::/96)"},
	{netip.MustParsePrefix("fc00::/7"), "unique local (fc00::/7)"},
	{netip.MustParsePrefix("fe80::/10"), "link-local"},
	{netip.MustParsePrefix("fec0::/10"), "site-local (deprecated fec0::/10)"},
	{netip.MustParsePrefix("ff00::/8"), "multicast"},
}

const extraReason = "this host / tunwall pool"

// Prefixes whose addresses embed an IPv4 address at a fixed offset. IPv4-mapped
// addresses are unmapped before any check, so they need no entry here.
var (
	nat64Prefix = netip.MustParsePrefix("64:ff9b::/96") // RFC 6052 well-known prefix; IPv4 in bits 96..128
	sixToFour   = netip.MustParsePrefix("2002::/16")    // RFC 3056; IPv4 in bits 16..48
)

// Guarded reports whether ip is in the never-dial set and why: "loopback",
// "RFC 1918 private", "link-local", "cloud metadata", "shared address space
// (RFC 6598)", "unique local (fc00::/7)", "unspecified", "multicast",
// "broadcast", "this host / tunwall pool" (for Extra), and so on. An invalid
// ip is guarded ("invalid address").
func (g Guard) Guarded(ip netip.Addr) (bool, string) {
	_, why, ok := guardMatch(g.Extra, ip)
	return ok, why
}

// guardMatch returns the narrowest guarded range containing ip, expressed in
// ip's own family (for an embedding address, the image of the IPv4 range
// inside the embedding prefix), and its reason. ip is unmapped first.
func guardMatch(extra []netip.Prefix, ip netip.Addr) (netip.Prefix, string, bool) {
	if !ip.IsValid() {
		return netip.Prefix{}, "invalid address", true
	}
	a := ip.WithZone("").Unmap()
	best, why, ok := directMatch(extra, a)
	if a.Is6() {
		for _, emb := range [...]struct {
			prefix netip.Prefix
			off    int // byte offset of the IPv4 address
		}{{nat64Prefix, 12}, {sixToFour, 2}} {
			if !emb.prefix.Contains(a) {
				continue
			}
			b := a.As16()
			v4 := netip.AddrFrom4([4]byte(b[emb.off : emb.off+4]))
			p4, why4, ok4 := directMatch(extra, v4)
			if !ok4 {
				continue
			}
			img := embedPrefix(emb.prefix, emb.off, p4)
			if !ok || img.Bits() > best.Bits() {
				best, why, ok = img, fmt.Sprintf("%s (%s embedded in %s)", why4, v4, emb.prefix), true
			}
		}
	}
	return best, why, ok
}

// directMatch finds the longest guarded prefix that contains a.
func directMatch(extra []netip.Prefix, a netip.Addr) (netip.Prefix, string, bool) {
	var best netip.Prefix
	var why string
	ok := false
	consider := func(p netip.Prefix, reason string) {
		if p.Contains(a) && (!ok || p.Bits() > best.Bits()) {
			best, why, ok = p, reason, true
		}
	}
	for _, e := range guardTable {
		consider(e.prefix, e.why)
	}
	for _, p := range extra {
		consider(canonPrefix(p), extraReason)
	}
	return best, why, ok
}

// embedPrefix maps an IPv4 prefix to the IPv6 prefix of the addresses that
// embed it at byte offset off inside outer.
func embedPrefix(outer netip.Prefix, off int, p4 netip.Prefix) netip.Prefix {
	b := outer.Addr().As16()
	v := p4.Addr().As4()
	copy(b[off:off+4], v[:])
	return netip.PrefixFrom(netip.AddrFrom16(b), off*8+p4.Bits()).Masked()
}

// within reports whether inner lies entirely inside outer.
func within(inner, outer netip.Prefix) bool {
	return inner.Addr().BitLen() == outer.Addr().BitLen() &&
		inner.Bits() >= outer.Bits() && outer.Contains(inner.Addr())
}

// canonGuard validates and canonicalizes the caller's extra prefixes.
func canonGuard(g Guard) ([]netip.Prefix, error) {
	out := make([]netip.Prefix, 0, len(g.Extra))
	for _, p := range g.Extra {
		if !p.IsValid() {
			return nil, fmt.Errorf("guard: invalid prefix %v", p)
		}
		out = append(out, canonPrefix(p))
	}
	return out, nil
}
