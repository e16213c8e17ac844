package engine

import (
	"context"
	"net"
	"net/netip"
	"slices"
	"strings"

	"github.com/tunwall/tunwall/policy"
)

// dialPinned dials a raw-IP TCP flow whose client sent an allowed name
// (TLS SNI or HTTP Host). The client chose the address itself: `curl
// --resolve NAME:PORT:IP`, or its own hosts file. When that address is one
// of the name's real addresses (the hosts file tunwall reads, or DNS) and
// the rebinding guard passes it, it is dialled as the client pinned it;
// otherwise the name is dialled as usual (dialName), never an address the
// name does not have. dst is the flow's destination.
func (e *Engine) dialPinned(ctx context.Context, fr *flowRecord, name string, dst netip.AddrPort) (net.Conn, error) {
	if pin, ok := e.pinnedAddr(ctx, name, dst); ok {
		fr.v.Reason = pinReason(fr.v.Reason, dst.Addr(), name)
		return e.dialIP(ctx, fr, pin)
	}
	return e.dialName(ctx, fr, name, dst.Port())
}

// pinnedAddr reports whether dst's address is one of name's addresses that
// the guard lets tunwall dial.
func (e *Engine) pinnedAddr(ctx context.Context, name string, dst netip.AddrPort) (netip.AddrPort, bool) {
	ip := dst.Addr().Unmap()
	rctx, cancel := context.WithTimeout(ctx, e.cfg.DialTimeout)
	defer cancel()
	addrs, err := e.cfg.Resolver.Resolve(rctx, name) // cached: dialName would ask the same
	if err != nil || !slices.Contains(addrs, ip) {
		return netip.AddrPort{}, false
	}
	if g := e.rules().CheckDial(ip, dst.Port(), policy.TCP); !g.Allowed() {
		return netip.AddrPort{}, false // dialName refuses it too, and says why
	}
	return netip.AddrPortFrom(ip, dst.Port()), true
}

// pinReason rewrites the reason tcp.go gave a raw-IP flow ("...; raw IP X
// ignored, dialled by name") to say the client's address was kept.
func pinReason(reason string, ip netip.Addr, name string) string {
	base, _, _ := strings.Cut(reason, "; raw IP ")
	return base + "; raw IP " + ip.String() + " is one of " + name + "'s addresses: dialled as the client pinned it"
}
