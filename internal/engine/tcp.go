package engine

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"time"

	"github.com/tunwall/tunwall/internal/audit"
	"github.com/tunwall/tunwall/policy"
	"github.com/tunwall/tunwall/stack"
)

// TCP implements stack.Handler. The sandbox's handshake completes only after
// the upstream connection does (dial first), except for connections to raw
// IPs that no cidr rule allows, which are accepted only to read the name the
// client sends (TLS SNI or HTTP Host) and are dialled by that name if it is
// allowed.
func (e *Engine) TCP(ctx context.Context, f stack.Flow, accept func() (net.Conn, error)) {
	if f.Dst.Port() == 53 {
		e.serveDNSTCP(ctx, f, accept)
		return
	}
	fr := &flowRecord{f: f, start: time.Now()}
	fr.owner = e.lookupOwner("tcp", f.Src, f.Dst)
	if v, ok := e.auditHealthy(); !ok {
		e.deny(fr, v)
		return
	}
	dst := f.Dst.Addr()
	port := f.Dst.Port()
	if name, ok := e.cfg.Pool.Name(dst); ok {
		fr.host, fr.hostFrom = name, audit.HostFromDNS
		e.tcpToName(ctx, fr, accept)
		return
	}
	if e.cfg.Pool.Contains(dst) {
		e.deny(fr, verdict{rule: "default-deny", reason: "no name was handed out for this address (stale or guessed fake IP)"})
		return
	}
	// A raw IP: only a cidr rule allows it as such.
	v := e.decideIP(dst, port, policy.TCP)
	if v.allow {
		fr.v = v
		up, err := e.dialIP(ctx, fr, netip.AddrPortFrom(dst, port))
		if c, ok := e.acceptDialled(fr, up, err, accept); ok {
			e.relay(ctx, fr, c, up, nil, nil)
		}
		return
	}
	// Worth reading the name the client sends? Only if some host rule
	// could allow this port; otherwise deny at once (RST).
	if !e.cfg.Learn && !e.cfg.Rules.HasHostRuleForPort(port, policy.TCP) {
		e.deny(fr, v)
		return
	}
	c, err := accept()
	if err != nil {
		return
	}
	sn := e.sniff(c, nil)
	if sn.host == "" {
		reason := "raw IP " + dst.String() + ": no cidr rule allows it, and the client sent no name (TLS SNI or HTTP Host) to judge by"
		if sn.kind == kindHTTP || sn.kind == kindTLS {
			reason = "raw IP " + dst.String() + ": no cidr rule allows it, and the client's name could not be read"
		}
		e.refuse(c, sn, fr, verdict{rule: v.rule, reason: reason})
		return
	}
	fr.host, fr.hostFrom = sn.host, sn.from
	nv := e.decideName(sn.host, port, policy.TCP)
	if !nv.allow {
		nv.reason = fmt.Sprintf("raw IP %s with name %s (%s): %s", dst, sn.host, sn.from, nv.reason)
		e.refuse(c, sn, fr, nv)
		return
	}
	fr.v = nv
	fr.v.reason = fmt.Sprintf("%s; raw IP %s ignored, dialled by name", nv.reason, dst)
	up, err := e.dialName(ctx, fr, sn.host, port)
	if err != nil {
		abort(c)
		e.dialFailed(fr, err)
		return
	}
	e.relay(ctx, fr, c, up, sn.buf, nil)
}

// tcpToName handles a connection to a fake IP: the name is known before the
// handshake, so the upstream is dialled first.
func (e *Engine) tcpToName(ctx context.Context, fr *flowRecord, accept func() (net.Conn, error)) {
	port := fr.f.Dst.Port()
	v := e.decideName(fr.host, port, policy.TCP)
	if !v.allow {
		e.deny(fr, v)
		return
	}
	fr.v = v
	up, err := e.dialName(ctx, fr, fr.host, port)
	c, ok := e.acceptDialled(fr, up, err, accept)
	if !ok {
		return
	}
	// Read what the client says first, unless the server speaks first.
	early := newPrefetch(up)
	sn := e.sniff(c, early.spoke)
	upFirst := early.stop()
	if sn.host != "" && sn.host != fr.host {
		sniffed := sn.host
		reason := fmt.Sprintf("%s name %s disagrees with %s, the name this address was handed out for (domain fronting)", sn.from, sniffed, fr.host)
		up.Close()
		e.refuse(c, sn, fr, verdict{rule: v.rule, reason: reason})
		return
	}
	e.relay(ctx, fr, c, up, sn.buf, upFirst)
}

// acceptDialled completes the sandbox's handshake once the upstream dial
// (up, err) succeeded. Otherwise, or if the sandbox went away meanwhile, it
// records the flow and reports false; the stack then resets the sandbox's
// connection.
func (e *Engine) acceptDialled(fr *flowRecord, up net.Conn, err error, accept func() (net.Conn, error)) (net.Conn, bool) {
	if err != nil {
		e.dialFailed(fr, err)
		return nil, false
	}
	c, err := accept()
	if err != nil {
		up.Close()
		fr.v.reason = "sandbox went away during the handshake"
		e.writeFlow(fr)
		return nil, false
	}
	return c, true
}

// relay moves bytes until the flow ends, then writes its record.
func (e *Engine) relay(ctx context.Context, fr *flowRecord, c, up net.Conn, toUp, toSandbox []byte) {
	if len(toUp) > 0 {
		n, err := up.Write(toUp)
		fr.out += int64(n)
		if err != nil {
			c.Close()
			up.Close()
			fr.v.reason += "; upstream write failed: " + err.Error()
			e.writeFlow(fr)
			return
		}
	}
	if len(toSandbox) > 0 {
		n, err := c.Write(toSandbox)
		fr.in += int64(n)
		if err != nil {
			c.Close()
			up.Close()
			e.writeFlow(fr)
			return
		}
	}
	// The relay holds no goroutine while the flow waits; its record is
	// written when it ends.
	stack.StartRelayTCP(ctx, c, up, e.cfg.TCPIdle, func(res stack.RelayResult) { e.relayEnded(fr, res) })
}

// refuse ends a connection whose handshake completed but which is denied on
// what the client sent: plain HTTP gets a 403 that says why, anything else
// an RST.
func (e *Engine) refuse(c net.Conn, sn sniffed, fr *flowRecord, v verdict) {
	if sn.kind == kindHTTP && sn.complete {
		body := "tunwall: denied: " + v.reason + "\n"
		resp := "HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\nContent-Length: " +
			strconv.Itoa(len(body)) + "\r\n\r\n" + body
		c.SetWriteDeadline(time.Now().Add(2 * time.Second))
		c.Write([]byte(resp))
		c.Close()
	} else {
		abort(c)
	}
	e.deny(fr, v)
}

// abort resets the sandbox's connection instead of closing it gracefully.
func abort(c net.Conn) {
	if a, ok := c.(interface{ Abort() }); ok {
		a.Abort()
		return
	}
	c.Close()
}

// dialFailed records an allowed flow whose upstream could not be reached.
// Returning to the stack without accepting resets the sandbox's connection,
// as a real refusal would.
func (e *Engine) dialFailed(fr *flowRecord, err error) {
	var ge *guardError
	if errors.As(err, &ge) {
		e.deny(fr, ge.v)
		return
	}
	fr.v.reason += "; upstream unreachable: " + err.Error()
	e.writeFlow(fr)
}
