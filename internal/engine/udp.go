package engine

import (
	"context"
	"net"
	"sync"
	"time"

	"github.com/tunwall/tunwall/dnsintercept"
	"github.com/tunwall/tunwall/internal/audit"
	"github.com/tunwall/tunwall/policy"
	"github.com/tunwall/tunwall/stack"
)

// UDP implements stack.Handler. It runs on the packet path, so it only
// decides; dialing, relaying and recording happen in serve.
func (e *Engine) UDP(f stack.Flow) (func(ctx context.Context, s stack.UDPSession), bool) {
	if f.Dst.Port() == 53 {
		// A bounded number of sessions (dnsintercept.Limits): past it, the
		// session idle longest makes room, or, if all are busy, ICMP
		// unreachable at once (counted in DNSStats).
		ss, ok := e.dns.Admit("udp")
		if !ok {
			return nil, false
		}
		return func(ctx context.Context, s stack.UDPSession) {
			l := e.trackOwner("udp", f)
			defer e.untrackOwner(f, l)
			// A resolver's socket lives only until it has its answer, so
			// find its owner first (a few ms at most) or it will be gone.
			e.waitOwner(ss, l)
			ss.Serve(ctx, s.Conn(), f.Src, f.Dst)
		}, true
	}
	fr := &flowRecord{f: f, start: time.Now(), rs: e.rules()}
	denyAsync := func(v verdict) (func(context.Context, stack.UDPSession), bool) {
		fr.owner = e.lookupOwner("udp", f.Src, f.Dst)
		// Its record is written off the stack's goroutine (the owner
		// lookup may wait); Close waits for it.
		e.bg.Add(1)
		go func() {
			defer e.bg.Done()
			e.deny(fr, v)
		}()
		return nil, false
	}
	if v, ok := e.auditHealthy(); !ok {
		return denyAsync(v)
	}
	dst, port := f.Dst.Addr(), f.Dst.Port()
	var v verdict
	if name, ok := e.cfg.Pool.Name(dst); ok {
		fr.Host, fr.HostFrom = name, audit.HostFromDNS
		v = e.decideName(fr.rs, name, port, policy.UDP)
	} else if e.cfg.Pool.Contains(dst) {
		return denyAsync(verdict{Rule: "default-deny", Reason: "no name was handed out for this address (stale or guessed fake IP)"})
	} else {
		v = e.decideIP(fr.rs, dst, port, policy.UDP)
	}
	if !v.Allowed() {
		if port == 443 {
			v.Reason += " (QUIC is off unless a udp rule allows it; clients fall back to TCP)"
		}
		return denyAsync(v)
	}
	fr.v = v
	return func(ctx context.Context, s stack.UDPSession) {
		fr.owner = e.lookupOwner("udp", f.Src, f.Dst)
		release := func() {}
		if fr.Host != "" {
			// Hold the fake address's slot while the session lives, so
			// the pool does not give it to another name meanwhile.
			if name, ok := e.cfg.Pool.Acquire(dst); !ok || name != fr.Host {
				if ok {
					e.cfg.Pool.Release(dst)
				}
				e.deny(fr, verdict{Rule: "default-deny", Reason: "the fake address was handed to another name meanwhile"})
				return
			}
			release = func() { e.cfg.Pool.Release(dst) }
		}
		ctx, ok := e.opened(ctx, fr)
		if !ok {
			release()
			return
		}
		up, err := e.dialTarget(ctx, fr, fr.Host, f.Dst)
		if err != nil {
			release()
			e.dialFailed(fr, err)
			return
		}
		// The session outlives serve: the relay holds no goroutine while it
		// waits, and releases the slot when it ends.
		s.Relay(ctx, up, stack.RelayOptions{Idle: e.cfg.UDPIdle, Progress: fr.prog}, func(res stack.RelayResult) {
			fr.BytesOut, fr.BytesIn = res.Out, res.In
			e.writeFlow(fr)
			release()
		})
	}, true
}

// serveDNSTCP answers DNS over TCP to any address on port 53.
func (e *Engine) serveDNSTCP(ctx context.Context, req stack.TCPRequest) {
	f := req.Flow()
	// A bounded number of conns (dnsintercept.Limits): past it, the conn
	// idle longest makes room, or, if all are busy, RST at once.
	ss, ok := e.dns.Admit("tcp")
	if !ok {
		return
	}
	sb, err := req.Accept()
	if err != nil {
		ss.Release()
		return
	}
	c := &dnsTCPConn{Conn: sb, ss: ss, reset: req.Reset}
	defer c.Close()
	l := e.trackOwner("tcp", f)
	defer e.untrackOwner(f, l)
	e.waitOwner(ss, l)
	ss.Serve(ctx, c, f.Src, f.Dst)
}

// dnsTCPConn is a DNS-over-TCP connection whose Close resets it when its
// session was ended to make room for another: an idle connection, nothing
// pending, so a reset loses nothing and leaves no endpoint lingering in
// the stack (FIN-WAIT, TIME-WAIT) for a flood of connects to pile up.
type dnsTCPConn struct {
	net.Conn
	ss    *dnsintercept.Session
	reset func() // the request's Reset
	once  sync.Once
}

func (c *dnsTCPConn) Close() error {
	c.once.Do(func() {
		if c.ss.Evicted() {
			c.reset()
			return
		}
		c.Conn.Close()
	})
	return nil
}

// waitOwner waits, before a DNS session is served, for its owner to be
// found (at most dnsAttributionWait). Meanwhile the session cannot be
// closed to make room for another. The wait is short: it runs the lookup
// itself (see trackOwner), well under a millisecond also for a process
// started just now (the resolver looks at the newest processes first), or
// is answered "unknown: overloaded" at once when the resolver's queue is
// full (a flood of sessions).
func (e *Engine) waitOwner(ss *dnsintercept.Session, l *ownerLookup) {
	if release, ok := ss.Hold(); ok {
		l.waitFor(dnsAttributionWait)
		release()
	}
}
