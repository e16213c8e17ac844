package engine

import (
	"context"
	"net"
	"time"

	"github.com/tunwall/tunwall/internal/audit"
	"github.com/tunwall/tunwall/policy"
	"github.com/tunwall/tunwall/stack"
)

// UDP implements stack.Handler. It runs on the packet path, so it only
// decides; dialing, relaying and recording happen in serve.
func (e *Engine) UDP(f stack.Flow) (func(ctx context.Context, c net.Conn), bool) {
	if f.Dst.Port() == 53 {
		return func(ctx context.Context, c net.Conn) {
			l := e.trackOwner("udp", f)
			defer e.untrackOwner(f, l)
			// A resolver's socket lives only until it has its answer, so
			// find its owner first (a few ms at most) or it will be gone.
			l.waitFor(dnsAttributionWait)
			e.dns.ServeUDP(ctx, c, f.Src, f.Dst)
		}, true
	}
	fr := &flowRecord{f: f, start: time.Now()}
	denyAsync := func(v verdict) (func(context.Context, net.Conn), bool) {
		fr.owner = e.lookupOwner("udp", f.Src, f.Dst)
		go e.deny(fr, v)
		return nil, false
	}
	if v, ok := e.auditHealthy(); !ok {
		return denyAsync(v)
	}
	dst, port := f.Dst.Addr(), f.Dst.Port()
	var v verdict
	if name, ok := e.cfg.Pool.Name(dst); ok {
		fr.host, fr.hostFrom = name, audit.HostFromDNS
		v = e.decideName(name, port, policy.UDP)
	} else if e.cfg.Pool.Contains(dst) {
		return denyAsync(verdict{rule: "default-deny", reason: "no name was handed out for this address (stale or guessed fake IP)"})
	} else {
		v = e.decideIP(dst, port, policy.UDP)
	}
	if !v.allow {
		if port == 443 {
			v.reason += " (QUIC is off unless a udp rule allows it; clients fall back to TCP)"
		}
		return denyAsync(v)
	}
	fr.v = v
	return func(ctx context.Context, c net.Conn) {
		fr.owner = e.lookupOwner("udp", f.Src, f.Dst)
		up, err := e.dialTarget(ctx, fr, fr.host, f.Dst)
		if err != nil {
			e.dialFailed(fr, err)
			return
		}
		stack.StartRelayUDP(ctx, c, up, e.cfg.UDPIdle, func(res stack.RelayResult) {
			fr.out, fr.in = res.Out, res.In
			e.writeFlow(fr)
		})
	}, true
}

// serveDNSTCP answers DNS over TCP to any address on port 53.
func (e *Engine) serveDNSTCP(ctx context.Context, f stack.Flow, accept func() (net.Conn, error)) {
	c, err := accept()
	if err != nil {
		return
	}
	defer c.Close()
	l := e.trackOwner("tcp", f)
	defer e.untrackOwner(f, l)
	l.waitFor(dnsAttributionWait)
	e.dns.ServeTCP(ctx, c, f.Src, f.Dst)
}

// trackOwner starts finding the process behind a DNS session, so each query
// record can name it.
func (e *Engine) trackOwner(proto string, f stack.Flow) *ownerLookup {
	l := e.lookupOwner(proto, f.Src, f.Dst)
	e.omu.Lock()
	e.owners[f.Src] = l
	e.omu.Unlock()
	return l
}

func (e *Engine) untrackOwner(f stack.Flow, l *ownerLookup) {
	e.omu.Lock()
	if e.owners[f.Src] == l {
		delete(e.owners, f.Src)
	}
	e.omu.Unlock()
}
