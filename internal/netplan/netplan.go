// Package netplan declares the addresses tunwall uses inside every sandbox
// (README "Addresses"): the sandbox's side of the TUN, the virtual resolver
// its resolv.conf names, and the fake-address pools DNS answers come from.
// It is the one place they are written down; tun, dnsintercept, the session
// and the tests read them from here.
//
// It imports nothing but net/netip, so every package may import it (tun and
// dnsintercept, which import nothing else of tunwall, included).
package netplan

import "net/netip"

// Plan is one sandbox's address plan.
type Plan struct {
	// Addr4 and Addr6 are the sandbox's side of the TUN (its only
	// addresses besides lo's); the stack accepts packets from them only.
	Addr4, Addr6 netip.Prefix
	// Resolver4 and Resolver6 are the virtual resolver the sandbox's
	// resolv.conf names. Queries to any address on port 53 are answered
	// anyway; these are the addresses a resolver library is pointed at.
	Resolver4, Resolver6 netip.Addr
	// Fake4 and Fake6 are the fake-address pools: each allowed name gets
	// one address of each, and a flow to it is a flow to that name.
	Fake4, Fake6 netip.Prefix
	// Reserved is how many addresses at the start of each pool are kept
	// for tunwall's own infrastructure (the virtual resolver, the
	// sandbox's IPv4 address) and never handed to a name.
	Reserved int
	// Ours6 covers the sandbox's own IPv6 /64 and the fake pool's: no flow
	// may be dialled there, whatever a rule says (the guard adds it, with
	// Fake4, to its built-in ranges).
	Ours6 netip.Prefix
}

// Default is the plan every sandbox gets. 198.18.0.0/15 is reserved for
// benchmarking (RFC 2544) and not routed on the Internet; the IPv6
// addresses are ULA (fd00::/8) whose next bytes spell "tunwall" (the
// sandbox's /64) and "tunwalm" (the fake pool's /64) in ASCII.
var Default = Plan{
	Addr4:     netip.MustParsePrefix("198.18.0.2/32"),
	Addr6:     netip.MustParsePrefix("fd74:756e:7761:6c6c::2/128"),
	Resolver4: netip.MustParseAddr("198.18.0.1"),
	Resolver6: netip.MustParseAddr("fd74:756e:7761:6c6c::1"),
	Fake4:     netip.MustParsePrefix("198.18.0.0/15"),
	Fake6:     netip.MustParsePrefix("fd74:756e:7761:6c6d::/64"),
	Reserved:  Reserved,
	Ours6:     netip.MustParsePrefix("fd74:756e:7761:6c6c::/63"),
}

// Reserved is Default.Reserved, as a constant (dnsintercept.DefaultReserved).
const Reserved = 256

// Guarded lists the ranges of p that no flow may be dialled to, whatever a
// rule says: the IPv4 fake pool (which holds the sandbox's IPv4 address and
// the resolver too) and Ours6.
func (p Plan) Guarded() []netip.Prefix {
	return []netip.Prefix{p.Fake4, p.Ours6}
}
