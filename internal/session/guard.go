package session

import (
	"net"
	"net/netip"

	"github.com/tunwall/tunwall/internal/netplan"
	"github.com/tunwall/tunwall/policy"
)

// HostGuard is what the guard adds to its built-in ranges for a sandbox
// with address plan p (zero means DefaultPlan): the plan's own ranges
// (the fake pools, the sandbox's addresses) and this host's addresses.
// Give it to policy.Select as policy.Guard.Extra.
func HostGuard(p netplan.Plan) []netip.Prefix {
	if p == (netplan.Plan{}) {
		p = DefaultPlan
	}
	addrs, _ := net.InterfaceAddrs()
	return hostGuard(p, addrs)
}

func hostGuard(p netplan.Plan, addrs []net.Addr) []netip.Prefix {
	g := p.Guarded()
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(n.IP); ok {
				ip = ip.Unmap()
				// Loopback, private and link-local addresses are guarded
				// already, by ranges a cidr rule can name.
				if guarded, _ := (policy.Guard{}).Guarded(ip); guarded {
					continue
				}
				g = append(g, netip.PrefixFrom(ip, ip.BitLen()))
			}
		}
	}
	return g
}
