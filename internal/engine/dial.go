package engine

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/tunwall/tunwall/policy"
	"github.com/tunwall/tunwall/stack"
)

// guardError is a dial the rebinding guard refused.
type guardError struct{ v verdict }

func (e *guardError) Error() string { return e.v.reason }

func toPolicy(p stack.Proto) policy.Proto {
	if p == stack.UDP {
		return policy.UDP
	}
	return policy.TCP
}

func network(p stack.Proto) string {
	if p == stack.UDP {
		return "udp"
	}
	return "tcp"
}

// dialName connects to an allowed name's real address: resolved now, each
// address checked by the rebinding guard, the sandbox's address family
// tried first. Through an upstream proxy too, tunwall resolves and checks,
// and the proxy is sent the checked address, never the name: a proxy that
// resolved the name again could be handed another answer (DNS rebinding).
func (e *Engine) dialName(ctx context.Context, fr *flowRecord, host string, port uint16) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, e.cfg.DialTimeout)
	defer cancel()
	addrs, err := e.cfg.Resolver.Resolve(ctx, host)
	if err != nil {
		return nil, fmt.Errorf("resolve %s: %w", host, err)
	}
	var ok []netip.Addr
	var refused []string
	var first *verdict
	for _, a := range addrs {
		g := e.cfg.Rules.CheckDial(a, port, toPolicy(fr.f.Proto))
		if !g.Allowed() {
			refused = append(refused, g.Reason)
			if first == nil {
				v := fromDecision(g)
				first = &v
			}
			continue
		}
		ok = append(ok, a)
	}
	if len(ok) == 0 {
		if first == nil {
			return nil, fmt.Errorf("%s has no addresses", host)
		}
		v := *first
		v.reason = fmt.Sprintf("%s resolves only to addresses that are never dialled: %s", host, strings.Join(refused, "; "))
		return nil, &guardError{v: v}
	}
	// The sandbox's family first, then the other.
	want4 := fr.f.Dst.Addr().Is4()
	ordered := make([]netip.Addr, 0, len(ok))
	for _, a := range ok {
		if a.Is4() == want4 {
			ordered = append(ordered, a)
		}
	}
	for _, a := range ok {
		if a.Is4() != want4 {
			ordered = append(ordered, a)
		}
	}
	var errs []error
	for _, a := range ordered {
		ap := netip.AddrPortFrom(a, port)
		c, err := e.dialChecked(ctx, fr.f.Proto, ap)
		if err == nil {
			fr.dial, fr.dialAt = ap, time.Now()
			return c, nil
		}
		errs = append(errs, err)
		if ctx.Err() != nil {
			break
		}
	}
	return nil, errors.Join(errs...)
}

// dialIP connects to a raw address a cidr rule allowed.
func (e *Engine) dialIP(ctx context.Context, fr *flowRecord, ap netip.AddrPort) (net.Conn, error) {
	if g := e.cfg.Rules.CheckDial(ap.Addr(), ap.Port(), toPolicy(fr.f.Proto)); !g.Allowed() {
		return nil, &guardError{v: fromDecision(g)}
	}
	ctx, cancel := context.WithTimeout(ctx, e.cfg.DialTimeout)
	defer cancel()
	c, err := e.dialChecked(ctx, fr.f.Proto, ap)
	if err == nil {
		fr.dial, fr.dialAt = ap, time.Now()
	}
	return c, err
}

// dialChecked connects to an address the guard has passed: directly, or
// through the upstream proxy, which is sent the address itself.
func (e *Engine) dialChecked(ctx context.Context, p stack.Proto, ap netip.AddrPort) (net.Conn, error) {
	if e.cfg.Upstream != nil {
		if p == stack.UDP {
			return e.cfg.Upstream.DialUDP(ctx, ap.String())
		}
		return e.cfg.Upstream.DialContext(ctx, "tcp", ap.String())
	}
	return e.cfg.Dial(ctx, network(p), ap.String())
}

// dialTarget dials host by name, or ap when there is no name.
func (e *Engine) dialTarget(ctx context.Context, fr *flowRecord, host string, ap netip.AddrPort) (net.Conn, error) {
	if host != "" {
		return e.dialName(ctx, fr, host, ap.Port())
	}
	return e.dialIP(ctx, fr, ap)
}
