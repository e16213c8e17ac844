package engine

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"syscall"
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
func (e *Engine) TCP(ctx context.Context, req stack.TCPRequest) {
	f := req.Flow()
	if f.Dst.Port() == 53 {
		e.serveDNSTCP(ctx, req)
		return
	}
	fr := &flowRecord{f: f, start: time.Now(), req: req, rs: e.rules()}
	accept := req.Accept
	fr.owner = e.lookupTCPOwner(f.Src, f.Dst)
	if v, ok := e.auditHealthy(); !ok {
		e.deny(fr, v)
		return
	}
	dst := f.Dst.Addr()
	port := f.Dst.Port()
	if name, ok := e.cfg.Pool.Acquire(dst); ok {
		// The slot stays this name's while the flow lives (fake-pool reuse),
		// which for a relayed flow is past the end of this call.
		fr.hold = &slotHold{release: func() { e.cfg.Pool.Release(dst) }}
		defer fr.hold.done()
		fr.Host, fr.HostFrom = name, audit.HostFromDNS
		e.tcpToName(ctx, fr, accept)
		return
	}
	if e.cfg.Pool.Contains(dst) {
		e.deny(fr, verdict{Rule: "default-deny", Reason: "no name was handed out for this address (stale or guessed fake IP)"})
		return
	}
	// A raw IP: only a cidr rule allows it as such.
	v := e.decideIP(fr.rs, dst, port, policy.TCP)
	if v.Allowed() {
		fr.v = v
		e.dialFirst(ctx, fr, "", accept, func(ctx context.Context) (net.Conn, error) {
			return e.dialIP(ctx, fr, netip.AddrPortFrom(dst, port))
		})
		return
	}
	// Worth reading the name the client sends? Only if some host rule
	// could allow this port; otherwise deny at once (RST).
	if !e.cfg.Learn && !e.rules().HasHostRuleForPort(port, policy.TCP) {
		e.deny(fr, v)
		return
	}
	fr.owner.beforeAccept()
	c, err := accept()
	if err != nil {
		return
	}
	ic := e.inspectReq(fr, c, "", v.Rule, port, func(name, from string) (verdict, bool) {
		fr.Host, fr.HostFrom = name, from
		nv := e.decideName(fr.rs, name, port, policy.TCP)
		if !nv.Allowed() {
			nv.Reason = fmt.Sprintf("name %s (%s): %s", name, from, nv.Reason)
			return nv, false
		}
		fr.v = nv
		fr.v.Reason = fmt.Sprintf("%s; raw IP %s ignored, dialled by name", nv.Reason, dst)
		return nv, true
	})
	ic.why = "raw IP " + dst.String() + " (no cidr rule allows it): "
	if err := ic.first(); err != nil {
		if denied, _ := ic.result(); denied == nil {
			ic.reset()
			ic.setDenied(verdict{Rule: v.Rule, Reason: "the client sent no complete ClientHello or request head (" + err.Error() + ")"})
		}
		e.inspected(fr, ic)
		return
	}
	fr.SNI, fr.HTTPHost = ic.in.SNI(), ic.in.HTTPHost()
	ctx, ok := e.opened(ctx, fr)
	if !ok {
		ic.reset()
		return
	}
	up, err := e.dialPinned(ctx, fr, ic.in.Name(), netip.AddrPortFrom(dst, port)) // pin.go
	if err != nil {
		ic.reset()
		e.dialFailed(fr, err)
		return
	}
	e.relay(ctx, fr, ic, up)
}

// tcpToName handles a connection to a fake IP: the name is known before the
// handshake, so the upstream is dialled first. What the client sends is
// checked against that name as it is relayed (inspectConn).
func (e *Engine) tcpToName(ctx context.Context, fr *flowRecord, accept func() (net.Conn, error)) {
	port := fr.f.Dst.Port()
	v := e.decideName(fr.rs, fr.Host, port, policy.TCP)
	v = e.holdFlow(ctx, fr, port, v) // --ask (ask.go)
	if !v.Allowed() {
		e.deny(fr, v)
		return
	}
	fr.v = v
	e.dialFirst(ctx, fr, fr.Host, accept, func(ctx context.Context) (net.Conn, error) {
		return e.dialName(ctx, fr, fr.Host, port)
	})
}

// dialFirst handles an allowed flow whose destination is known before the
// sandbox's handshake completes: it takes a dial slot (host "" for a raw
// IP), records the flow as opened, dials while the sandbox waits, and only
// then completes the handshake and relays. A refused or failed dial is
// recorded and the stack resets the sandbox's connection.
func (e *Engine) dialFirst(ctx context.Context, fr *flowRecord, host string, accept func() (net.Conn, error), dial func(context.Context) (net.Conn, error)) {
	release, ok := e.admitDial(fr, host)
	if !ok {
		return
	}
	ctx, ok = e.opened(ctx, fr)
	if !ok {
		release()
		return
	}
	dctx, done := e.whileSandboxWaits(ctx, fr)
	up, err := dial(dctx)
	err = done(err)
	release()
	if c, ok := e.acceptDialled(fr, up, err, accept); ok {
		e.relay(ctx, fr, c, up)
	}
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
	fr.owner.beforeAccept()
	c, err := accept()
	if err != nil {
		up.Close()
		fr.v.Reason = "sandbox went away during the handshake"
		e.writeFlow(fr)
		return nil, false
	}
	return c, true
}

// relay moves bytes until the flow ends, then writes its record. A flow
// with a name (fr.Host) is relayed through an inspectConn that checks every
// TLS SNI and HTTP Host the client sends against it; c may already be one.
func (e *Engine) relay(ctx context.Context, fr *flowRecord, c, up net.Conn) {
	if e.terminates(fr) {
		e.terminate(ctx, fr, c, up) // l7.go: hosts with http or inject rules
		return
	}
	ic, _ := c.(*inspectConn)
	if ic == nil && fr.Host != "" {
		ic = e.inspectReq(fr, c, fr.Host, fr.v.Rule, fr.f.Dst.Port(), nil)
	}
	if ic == nil && fr.v.Rule == policy.RuleDefaultPublic {
		ic = e.openInspect(fr, c) // open.go: a raw IP the open default allowed
	}
	// The stack's relay holds no goroutine while the flow waits
	// (TCPRequest.Relay): the record is written, and the flow's fake-pool
	// slot released, when it ends. A flow of the SOCKS5 front end has no
	// request: its conns are relayed on this goroutine.
	ended := fr.hold.keep()
	if ic == nil {
		done := func(res stack.RelayResult) {
			e.relayed(fr, res)
			e.writeFlow(fr)
			ended()
		}
		if fr.req != nil {
			fr.req.Relay(ctx, up, stack.RelayOptions{Idle: e.cfg.TCPIdle, Progress: fr.prog}, done)
		} else {
			stack.StartRelayTCP(ctx, c, up, e.cfg.TCPIdle, done)
		}
		return
	}
	// A deadline left from the checks before the dial goes: the relay reads
	// the inspectConn its own way, and it sets the deadline again whenever
	// it holds bytes.
	ic.setDeadline(time.Time{})
	u := &upConn{Conn: up}
	ic.up = u
	if ic.in.Upgrading() {
		u.arm() // the first request, read before the dial, asked to switch
	}
	done := func(res stack.RelayResult) {
		e.relayed(fr, res)
		e.inspected(fr, ic)
		ended()
	}
	if fr.req != nil {
		fr.req.Relay(ctx, up, stack.RelayOptions{Idle: e.cfg.TCPIdle, Client: ic, Tap: u.Tap, Progress: fr.prog}, done)
	} else {
		stack.StartRelayTCP(ctx, ic, u, e.cfg.TCPIdle, done)
	}
}

// relayed adds a finished relay's counts and how it ended to fr.
func (e *Engine) relayed(fr *flowRecord, res stack.RelayResult) {
	fr.BytesOut += res.Out
	fr.BytesIn += res.In
	if res.Err != nil {
		switch {
		case errors.Is(res.Err, stack.ErrIdle):
			fr.v.Reason += "; closed after " + e.cfg.TCPIdle.String() + " idle"
		case errors.Is(res.Err, stack.ErrUpstreamReset):
			fr.reset = true
			fr.v.Reason += "; the upstream reset the connection (the sandbox's was reset too)"
		case errors.Is(res.Err, stack.ErrSandboxReset):
			fr.reset = true
			fr.v.Reason += "; the sandbox reset the connection (the upstream's was reset too)"
		case errors.Is(res.Err, errRefused), errors.Is(res.Err, context.Canceled):
		default:
			e.log.Debug("relay ended", "flow", fr.f.String(), "err", res.Err)
		}
	}
}

// inspected writes the record of a flow an inspectConn checked: what it
// saw, and its denial if it refused the flow.
func (e *Engine) inspected(fr *flowRecord, ic *inspectConn) {
	ic.releaseHeld()
	denied, replied := ic.result()
	fr.BytesIn += replied
	fr.SNI, fr.HTTPHost = ic.in.SNI(), ic.in.HTTPHost()
	if denied != nil {
		e.deny(fr, *denied)
		return
	}
	if ic.note != "" {
		fr.v.Reason += "; " + ic.note
	}
	e.writeFlow(fr)
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
	fr.dialErr = err
	var ge *guardError
	if errors.As(err, &ge) {
		e.deny(fr, ge.v)
		return
	}
	why := failure(err)
	fr.v.Reason += "; " + why
	// No silent failure: an allowed flow that did not open is said, as
	// a denial is (folded and rate-limited alike).
	e.denials.printf("tunwall: failed %s %s: %s", target(fr.Host, fr.f.Dst.Addr(), fr.f.Dst.Port()), fr.f.Proto, why)
	e.writeFlow(fr)
}

// failure says in one line why an allowed flow's dial failed.
func failure(err error) string {
	var rs *resolveError
	msg := strings.ReplaceAll(err.Error(), "\n", "; ") // one line, of joined errors too
	switch {
	case errors.As(err, &rs):
		return rs.Error()
	case errors.Is(err, syscall.ECONNREFUSED):
		return "upstream unreachable: the server refused the connection (" + msg + ")"
	case errors.Is(err, context.DeadlineExceeded), isTimeout(err):
		return "upstream unreachable: the connection timed out (" + msg + ")"
	}
	return "upstream unreachable: " + msg
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
