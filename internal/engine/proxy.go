package engine

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/tunwall/tunwall/internal/audit"
	"github.com/tunwall/tunwall/policy"
	"github.com/tunwall/tunwall/stack"
)

// The engine's decision API for proxy front ends (internal/socksserver):
// the TUN path hands the engine flows through stack.Handler, a proxy hands
// it the requests its clients make, by name or by address, through Connect
// and OpenUDP. Either way the engine decides, records, dials the checked
// address and relays; the front end only speaks its protocol.

// ErrDenied is wrapped by the error of Connect and OpenUDP when the flow
// was not allowed: by the policy, the rebinding guard, the audit log's
// state or bounds, or tunwall shutting down. The flow has been recorded
// as denied.
var ErrDenied = errors.New("denied")

// ProxyRequest is a flow a proxy's client asked for: by name (Host) or by
// address (IP).
type ProxyRequest struct {
	// Client and Local are the ends of the client's connection to the
	// proxy; the process behind a loopback Client is looked up.
	Client, Local netip.AddrPort
	// Host is the name the client asked for, normalized
	// (policy.NormalizeHost); "" when it asked for IP. A name is resolved
	// only once the policy allows it.
	Host string
	IP   netip.Addr
	Port uint16
}

// proxyFlow starts a flow record for a proxy's request and decides it.
func (e *Engine) proxyFlow(proto stack.Proto, r ProxyRequest) (*flowRecord, verdict) {
	fr := &flowRecord{f: stack.Flow{Proto: proto, Src: r.Client}, start: time.Now(), rs: e.rules()}
	if r.Host == "" {
		fr.f.Dst = netip.AddrPortFrom(r.IP, r.Port)
	} else {
		// The record's dst carries the port; there is no address yet.
		fr.f.Dst = netip.AddrPortFrom(netip.Addr{}, r.Port)
		fr.Host, fr.HostFrom = r.Host, audit.HostFromSOCKS
	}
	if r.Client.Addr().IsLoopback() {
		fr.owner = e.lookupOwner(proto.String(), r.Client, r.Local)
	} else {
		fr.owner = e.lookupOwner(proto.String(), netip.AddrPort{}, netip.AddrPort{})
	}
	if v, ok := e.auditHealthy(); !ok {
		return fr, v
	}
	if r.Host != "" {
		return fr, e.decideName(fr.rs, r.Host, r.Port, proto)
	}
	v := e.decideIP(fr.rs, r.IP, r.Port, proto)
	if !v.Allowed() && v.Rule == policy.RuleDefaultDeny && e.rules().HasHostRuleForPort(r.Port, proto) {
		// The client resolved the name itself and sent the address: no
		// host rule can apply to it, and the usual reason would not say so.
		v.Reason += sendTheName
	}
	return fr, v
}

// sendTheName ends the reason of a denied address a proxy's client sent
// where host rules cover the port.
const sendTheName = "; the client sent an address, not a name: send the name (socks5h:// in a proxy URL, curl --socks5-hostname) so that the policy's host rules apply"

// Connect serves a proxy's TCP request: it decides r, records it, dials
// the checked address and calls accept with the upstream connection's
// local address; accept answers the client and returns its connection,
// which Connect relays to the upstream until either end is done, then
// writes the flow's record. It returns nil once the flow was relayed and
// recorded. When the flow does not open, accept is never called, the flow
// is recorded, and the error says why: it wraps ErrDenied for a denial, or
// else is the dial's error (a refusal wraps syscall.ECONNREFUSED, through
// an --upstream proxy too). When accept fails, the upstream connection is
// closed, the flow recorded, and accept's error returned.
func (e *Engine) Connect(ctx context.Context, r ProxyRequest, accept func(bound net.Addr) (net.Conn, error)) error {
	fr, v := e.proxyFlow(stack.TCP, r)
	v = e.holdFlow(ctx, fr, r.Port, v) // --ask (ask.go)
	if !v.Allowed() {
		// The client exits as soon as it has the refusal: find it first.
		fr.owner.waitFor(dnsAttributionWait)
		e.deny(fr, v)
		return fmt.Errorf("%w: %s", ErrDenied, v.Reason)
	}
	fr.v = v
	ctx, ok := e.opened(ctx, fr)
	if !ok {
		return fmt.Errorf("%w: %s", ErrDenied, fr.v.Reason)
	}
	up, err := e.dialTarget(ctx, fr, r.Host, netip.AddrPortFrom(r.IP, r.Port))
	if err != nil {
		e.dialFailed(fr, err)
		var ge *guardError
		if errors.As(err, &ge) {
			return fmt.Errorf("%w: %w", ErrDenied, err)
		}
		return err
	}
	// A proxy client's socket lives only as long as its exchange, which
	// may be over a millisecond after the reply: find its owner first (the
	// lookup ran during the dial, so this rarely waits).
	fr.owner.waitFor(dnsAttributionWait)
	c, err := accept(up.LocalAddr())
	if err != nil {
		up.Close()
		fr.v.Reason += "; client went away"
		e.writeFlow(fr)
		return err
	}
	e.relay(ctx, fr, c, up)
	return nil
}

// OpenUDP serves one destination of a proxy's UDP association: it decides
// r, records its start and dials the checked address. The returned
// connection counts the bytes either way; its Close ends the flow and
// writes its record (once). The caller ends it after UDPIdle without
// traffic. The errors are those of Connect.
func (e *Engine) OpenUDP(ctx context.Context, r ProxyRequest) (net.Conn, error) {
	fr, v := e.proxyFlow(stack.UDP, r)
	if !v.Allowed() {
		e.deny(fr, v)
		return nil, fmt.Errorf("%w: %s", ErrDenied, v.Reason)
	}
	fr.v = v
	ctx, ok := e.opened(ctx, fr)
	if !ok {
		return nil, fmt.Errorf("%w: %s", ErrDenied, fr.v.Reason)
	}
	up, err := e.dialTarget(ctx, fr, r.Host, netip.AddrPortFrom(r.IP, r.Port))
	if err != nil {
		e.dialFailed(fr, err)
		var ge *guardError
		if errors.As(err, &ge) {
			return nil, fmt.Errorf("%w: %w", ErrDenied, err)
		}
		return nil, err
	}
	// Revoked (a change of the policy denies it), the flow's upstream is
	// closed: the front end's next read or write fails, and it ends the
	// flow. (The context is released too when the flow is recorded.)
	context.AfterFunc(ctx, func() { up.Close() })
	return &recordedConn{Conn: up, e: e, fr: fr}, nil
}

// UDPIdle is how long a UDP flow may go without traffic either way before
// it is ended (Config.UDPIdle).
func (e *Engine) UDPIdle() time.Duration { return e.cfg.UDPIdle }

// recordedConn is an OpenUDP flow's upstream connection: it counts the
// bytes and writes the flow's record when closed.
type recordedConn struct {
	net.Conn
	e    *Engine
	mu   sync.Mutex
	fr   *flowRecord
	once sync.Once
}

func (c *recordedConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.mu.Lock()
	c.fr.BytesIn += int64(n)
	c.mu.Unlock()
	return n, err
}

func (c *recordedConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	if err == nil {
		c.mu.Lock()
		c.fr.BytesOut += int64(n)
		c.mu.Unlock()
	}
	return n, err
}

func (c *recordedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.mu.Lock()
		fr := *c.fr
		c.mu.Unlock()
		c.e.writeFlow(&fr)
	})
	return err
}
