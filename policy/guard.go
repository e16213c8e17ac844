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
// An address that embeds IPv4 is also judged by the embedded address (see
// embeddings): IPv4-mapped ::ffff:0:0/96 (unmapped first), IPv4-compatible
// ::/96, SIIT ::ffff:0:0:0/96, NAT64 64:ff9b::/96 and the local-use
// 64:ff9b:1::/48, 6to4 2002::/16, and Teredo 2001::/32 (its server address
// and its obfuscated client address). Those of these ranges that are not
// globally reachable (all but NAT64 64:ff9b::/96 and 6to4) are guarded whole
// as well, whatever they embed.
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
	// public marks a globally reachable block inside a guarded one (an
	// anycast service in 192.0.0.0/24 or 2001::/23): the narrowest entry
	// decides, so these addresses are ordinary.
	public bool
}

func guarded(p, why string) guardEntry { return guardEntry{netip.MustParsePrefix(p), why, false} }
func public(p, why string) guardEntry  { return guardEntry{netip.MustParsePrefix(p), why, true} }

// guardTable is the built-in never-dial set. Where ranges nest, the
// narrowest match gives the reason and the range a rule must stay inside.
//
// Source: the IANA IPv4 and IPv6 Special-Purpose Address Registries
// (https://www.iana.org/assignments/iana-ipv4-special-registry, updated
// 2024; https://www.iana.org/assignments/iana-ipv6-special-registry, updated
// 2025-10-09), read in 2026. Every block whose "Globally Reachable" is False
// is guarded, with these exceptions and additions:
//   - the documentation blocks (192.0.2.0/24, 198.51.100.0/24,
//     203.0.113.0/24, 2001:db8::/32, 3fff::/20) are ordinary addresses here,
//     so that tests can use them (ARCHITECTURE.md);
//   - IPv4-mapped ::ffff:0:0/96 is judged by the address it maps;
//   - Teredo 2001::/32 ("N/A" in the registry) is guarded whole;
//   - not in those registries but guarded: multicast (224.0.0.0/4,
//     ff00::/8), IPv4-compatible ::/96 and site-local fec0::/10 (both
//     deprecated), SIIT ::ffff:0:0:0/96 (RFC 2765), and cloud metadata.
//
// Globally reachable (True) blocks need no entry unless they sit inside a
// guarded block; those that do are listed as public. The other True or N/A
// blocks are ordinary: 192.31.196.0/24 and 192.175.48.0/24 (AS112),
// 192.52.193.0/24 (AMT), 192.88.99.0/24 (deprecated 6to4 relay anycast),
// 64:ff9b::/96 (NAT64, judged by what it embeds), 2002::/16 (6to4, likewise),
// 2620:4f:8000::/48 (AS112).
var guardTable = [...]guardEntry{
	// Cloud metadata services. Most sit inside link-local or shared space,
	// but listing them on their own means only a rule naming the exact
	// address unlocks them.
	guarded("169.254.169.254/32", "cloud metadata"), // AWS, GCP, Azure IMDS, OCI, DigitalOcean, OpenStack
	guarded("169.254.170.2/32", "cloud metadata"),   // AWS ECS task metadata and credentials
	guarded("169.254.170.23/32", "cloud metadata"),  // AWS EKS Pod Identity agent
	guarded("168.63.129.16/32", "cloud metadata"),   // Azure wireserver (public space: not covered below)
	guarded("100.100.100.200/32", "cloud metadata"), // Alibaba Cloud (also inside 100.64.0.0/10)
	guarded("fd00:ec2::254/128", "cloud metadata"),  // AWS IMDS over IPv6 (also inside fc00::/7)
	guarded("fd00:ec2::23/128", "cloud metadata"),   // AWS EKS Pod Identity agent over IPv6

	// IPv4 special-purpose registry.
	guarded("0.0.0.0/32", "unspecified"),
	guarded("0.0.0.0/8", "this network (0.0.0.0/8)"),
	guarded("10.0.0.0/8", "RFC 1918 private"),
	guarded("100.64.0.0/10", "shared address space (RFC 6598)"),
	guarded("127.0.0.0/8", "loopback"),
	guarded("169.254.0.0/16", "link-local"),
	guarded("172.16.0.0/12", "RFC 1918 private"),
	guarded("192.0.0.0/24", "IETF protocol assignments (192.0.0.0/24)"),
	guarded("192.0.0.0/29", "IPv4 service continuity prefix (RFC 7335)"),
	guarded("192.0.0.8/32", "IPv4 dummy address (RFC 7600)"),
	public("192.0.0.9/32", "PCP anycast (RFC 7723)"),
	public("192.0.0.10/32", "TURN anycast (RFC 8155)"),
	guarded("192.0.0.170/31", "NAT64/DNS64 discovery (RFC 8880)"),
	guarded("192.168.0.0/16", "RFC 1918 private"),
	guarded("198.18.0.0/15", "benchmarking (RFC 2544)"),
	guarded("240.0.0.0/4", "reserved (240.0.0.0/4)"),
	guarded("255.255.255.255/32", "broadcast"),
	guarded("224.0.0.0/4", "multicast"),

	// IPv6 special-purpose registry.
	guarded("::/128", "unspecified"),
	guarded("::1/128", "loopback"),
	guarded("::/96", "IPv4-compatible (deprecated ::/96)"),
	guarded("::ffff:0:0:0/96", "SIIT IPv4-translated (::ffff:0:0:0/96)"),
	guarded("64:ff9b:1::/48", "local-use NAT64 (64:ff9b:1::/48, RFC 8215)"),
	guarded("100::/64", "discard-only (100::/64, RFC 6666)"),
	guarded("100:0:0:1::/64", "dummy prefix (100:0:0:1::/64, RFC 9780)"),
	guarded("2001::/23", "IETF protocol assignments (2001::/23)"),
	guarded("2001::/32", "Teredo (2001::/32)"),
	public("2001:1::1/128", "PCP anycast (RFC 7723)"),
	public("2001:1::2/128", "TURN anycast (RFC 8155)"),
	public("2001:1::3/128", "DNS-SD SRP anycast (RFC 9665)"),
	guarded("2001:2::/48", "benchmarking (2001:2::/48)"),
	public("2001:3::/32", "AMT (RFC 7450)"),
	public("2001:4:112::/48", "AS112-v6 (RFC 7535)"),
	guarded("2001:10::/28", "deprecated ORCHID (2001:10::/28)"),
	public("2001:20::/28", "ORCHIDv2 (RFC 7343)"),
	public("2001:30::/28", "DRIP entity tags (RFC 9374)"),
	guarded("5f00::/16", "SRv6 SIDs (5f00::/16, RFC 9602)"),
	guarded("fc00::/7", "unique local (fc00::/7)"),
	guarded("fe80::/10", "link-local"),
	guarded("fec0::/10", "site-local (deprecated fec0::/10)"),
	guarded("ff00::/8", "multicast"),
}

// guardTable4 and guardTable6 are guardTable split by family, so a lookup
// scans only entries that can contain the address.
var guardTable4, guardTable6 = splitByFamily(guardTable[:])

func splitByFamily(t []guardEntry) (v4, v6 []guardEntry) {
	for _, e := range t {
		if e.prefix.Addr().Is4() {
			v4 = append(v4, e)
		} else {
			v6 = append(v6, e)
		}
	}
	return v4, v6
}

const extraReason = "this host / tunwall pool"

// embedding is an IPv6 range whose addresses carry an IPv4 address at a
// fixed byte offset. IPv4-mapped addresses are unmapped before any check,
// so they need no entry here.
type embedding struct {
	prefix netip.Prefix
	off    int    // byte offset of the IPv4 address
	xor    bool   // the IPv4 address is stored inverted (Teredo's client)
	what   string // what the IPv4 address is, for reasons; "" for plain
}

var embeddings = [...]embedding{
	{netip.MustParsePrefix("64:ff9b::/96"), 12, false, ""},    // RFC 6052 well-known NAT64 prefix
	{netip.MustParsePrefix("64:ff9b:1::/48"), 12, false, ""},  // RFC 8215 local use, in its common /96 form
	{netip.MustParsePrefix("2002::/16"), 2, false, ""},        // 6to4, RFC 3056
	{netip.MustParsePrefix("::ffff:0:0:0/96"), 12, false, ""}, // SIIT, RFC 2765
	{netip.MustParsePrefix("::/96"), 12, false, ""},           // IPv4-compatible, RFC 4291 (deprecated)
	{netip.MustParsePrefix("2001::/32"), 4, false, "the Teredo server"},
	{netip.MustParsePrefix("2001::/32"), 12, true, "the Teredo client"}, // RFC 4380: stored XOR 0xffffffff
}

// Guarded reports whether ip is in the never-dial set and why: "loopback",
// "RFC 1918 private", "link-local", "cloud metadata", "shared address space
// (RFC 6598)", "unique local (fc00::/7)", "unspecified", "multicast",
// "broadcast", "Teredo (2001::/32)", "this host / tunwall pool" (for Extra),
// and so on. An invalid ip is guarded ("invalid address").
func (g Guard) Guarded(ip netip.Addr) (bool, string) {
	_, why, ok := guardMatch(g.Extra, ip)
	return ok, why
}

// guardMatch returns the narrowest guarded range containing ip, expressed in
// ip's own family (for an embedding address, the image of the IPv4 range
// inside the embedding address), and its reason. ip is unmapped first.
func guardMatch(extra []netip.Prefix, ip netip.Addr) (netip.Prefix, string, bool) {
	if !ip.IsValid() {
		return netip.Prefix{}, "invalid address", true
	}
	a := ip.WithZone("").Unmap()
	best, why, ok := directMatch(extra, a)
	if !a.Is6() {
		return best, why, ok
	}
	for _, emb := range embeddings {
		if !emb.prefix.Contains(a) {
			continue
		}
		b := a.As16()
		v := [4]byte(b[emb.off : emb.off+4])
		if emb.xor {
			for i := range v {
				v[i] ^= 0xff
			}
		}
		v4 := netip.AddrFrom4(v)
		p4, why4, ok4 := directMatch(extra, v4)
		if !ok4 {
			continue
		}
		img := embedPrefix(a, emb.off, emb.xor, p4)
		if !ok || img.Bits() > best.Bits() {
			if emb.what != "" {
				why = fmt.Sprintf("%s (%s, %s, embedded in %s)", why4, v4, emb.what, emb.prefix)
			} else {
				why = fmt.Sprintf("%s (%s embedded in %s)", why4, v4, emb.prefix)
			}
			best, ok = img, true
		}
	}
	return best, why, ok
}

// directMatch finds the narrowest table or Extra entry that contains a and
// reports it if it is guarded. At equal length Extra wins (its reason is
// the more specific one), then a guarded entry over a public one.
func directMatch(extra []netip.Prefix, a netip.Addr) (netip.Prefix, string, bool) {
	var best netip.Prefix
	var why string
	found, pub := false, false
	for _, p := range extra {
		if p = canonPrefix(p); p.Contains(a) && (!found || p.Bits() > best.Bits()) {
			best, why, found = p, extraReason, true
		}
	}
	table := guardTable6
	if a.Is4() {
		table = guardTable4
	}
	for i := range table {
		e := &table[i]
		if e.prefix.Contains(a) && (!found || e.prefix.Bits() > best.Bits() || (e.prefix.Bits() == best.Bits() && pub && !e.public)) {
			best, why, found, pub = e.prefix, e.why, true, e.public
		}
	}
	if !found || pub {
		return netip.Prefix{}, "", false
	}
	return best, why, true
}

// embedPrefix maps an IPv4 prefix to the IPv6 prefix of the addresses that
// embed it at byte offset off (inverted when xor) and agree with a in every
// bit before it.
func embedPrefix(a netip.Addr, off int, xor bool, p4 netip.Prefix) netip.Prefix {
	b := a.As16()
	v := p4.Masked().Addr().As4()
	for i := range v {
		if xor {
			v[i] ^= 0xff
		}
	}
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
