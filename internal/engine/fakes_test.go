package engine

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/tunwall/tunwall/dnsintercept"
	"github.com/tunwall/tunwall/internal/engine/enginetest"
	"github.com/tunwall/tunwall/internal/leaktest"
	"github.com/tunwall/tunwall/internal/procattr"
	"github.com/tunwall/tunwall/policy"
	"github.com/tunwall/tunwall/stack"
)

// The engine's unit tests run Engine.TCP, Engine.UDP and the DNS path with
// the fakes of what the engine calls (ports.go) from enginetest: the
// sandbox's side of a flow and the upstream's are the two ends of
// net.Pipes, names resolve from a map, dials are recorded, and records are
// kept in memory. The policy, the rebinding guard, the fake-IP pool, the
// name checks (inspectConn) and the relay are the real ones. Nothing touches the network or
// needs root.

// waitFor bounds every wait in these tests.
const waitFor = enginetest.Wait

var sandbox4 = netip.MustParseAddrPort("10.0.2.100:40000")

// enginetest's fakes are what they stand in for.
var (
	_ Resolver   = (*enginetest.Resolver)(nil)
	_ Recorder   = (*enginetest.Recorder)(nil)
	_ Attributor = enginetest.Attr{}
)

// syncBuffer is a bytes.Buffer safe for the engine's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// rig is one Engine with fakes around it.
type rig struct {
	e       *Engine
	rules   *policy.RuleSet
	pool    *dnsintercept.Pool
	res     *enginetest.Resolver
	dial    *enginetest.Dialer
	rec     *enginetest.Recorder
	denials *syncBuffer
}

// newRig builds an Engine for a one-phase policy whose allow list is
// allowYAML; mod, if not nil, changes its Config before New.
func newRig(t *testing.T, allowYAML string, mod func(*Config)) *rig {
	t.Helper()
	leaktest.Check(t)
	rs, pool := enginetest.Policy(t, allowYAML)
	r := &rig{
		rules:   rs,
		pool:    pool,
		res:     enginetest.NewResolver(),
		dial:    enginetest.NewDialer(),
		rec:     enginetest.NewRecorder(),
		denials: &syncBuffer{},
	}
	cfg := Config{
		Rules:        rs,
		Pool:         pool,
		Resolver:     r.res,
		Dial:         r.dial.Dial,
		Audit:        r.rec,
		Attr:         enginetest.Attr{Owner: procattr.Owner{PID: 4242, Comm: "curl", Exe: "/usr/bin/curl"}},
		Denials:      r.denials,
		SniffTimeout: 2 * time.Second,
		DialTimeout:  2 * time.Second,
	}
	if mod != nil {
		mod(&cfg)
	}
	var err error
	if r.e, err = New(cfg); err != nil {
		t.Fatal(err)
	}
	return r
}

// resolves makes name resolve to addrs.
func (r *rig) resolves(name string, addrs ...string) { r.res.Add(name, addrs...) }

// fake returns the fake IPv4 address tunwall's DNS would hand out for name.
func (r *rig) fake(t *testing.T, name string) netip.Addr {
	t.Helper()
	v4, _, err := r.pool.Assign(name)
	if err != nil {
		t.Fatal(err)
	}
	return v4
}

// tcpRun is one Engine.TCP call: client is the sandbox's end of the flow,
// valid once accepted is closed.
type tcpRun struct {
	client   net.Conn
	accepted chan struct{}
	done     chan struct{}
}

// tcp runs Engine.TCP for a flow from the sandbox to dst; accept hands the
// engine one end of a net.Pipe, the test keeps the other.
func (r *rig) tcp(t *testing.T, dst netip.AddrPort) *tcpRun {
	t.Helper()
	client, sandbox := net.Pipe()
	run := &tcpRun{client: client, accepted: make(chan struct{}), done: make(chan struct{})}
	req := &fakeRequest{t: t, f: stack.Flow{Proto: stack.TCP, Src: sandbox4, Dst: dst}, sandbox: sandbox, dial: r.dial.Dial, accepted: run.accepted}
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		defer close(run.done)
		r.e.TCP(ctx, req)
		req.wait() // a relay started goes on after TCP returns, as a flow of the stack's
	}()
	t.Cleanup(func() {
		cancel()
		client.Close()
		sandbox.Close()
		select {
		case <-run.done:
		case <-time.After(waitFor):
			t.Error("Engine.TCP did not return")
		}
	})
	return run
}

// wasAccepted reports whether the handshake was completed (accept called).
func (run *tcpRun) wasAccepted() bool {
	select {
	case <-run.accepted:
		return true
	default:
		return false
	}
}

// returned waits for Engine.TCP to return.
func (run *tcpRun) returned(t *testing.T) {
	t.Helper()
	select {
	case <-run.done:
	case <-time.After(waitFor):
		t.Fatal("Engine.TCP did not return")
	}
}

// waitAccepted waits for the handshake to complete.
func (run *tcpRun) waitAccepted(t *testing.T) {
	t.Helper()
	select {
	case <-run.accepted:
	case <-run.done:
		if run.wasAccepted() {
			return // Engine.TCP handed the flow to the relay, and returned
		}
		t.Fatal("Engine.TCP returned without completing the handshake")
	case <-time.After(waitFor):
		t.Fatal("the handshake was not completed")
	}
}

// send writes b from the sandbox's end without blocking the test (a pipe
// write waits for its reader, which a denied flow never is).
func (run *tcpRun) send(b []byte) {
	go run.client.Write(b)
}

// ap is netip.AddrPortFrom with a string address.
func ap(addr string, port uint16) netip.AddrPort {
	return netip.AddrPortFrom(netip.MustParseAddr(addr), port)
}

func httpGet(host string) []byte {
	return []byte(fmt.Sprintf("GET / HTTP/1.1\r\nHost: %s\r\nUser-Agent: t\r\n\r\n", host))
}

// fakeRequest is a stack.TCPRequest over a net.Pipe: the engine's flows
// are driven as the stack drives them, without a stack. Its relay is
// package stack's goroutine relay, the sandbox's side read through the
// engine's filter and the upstream's shown to its tap.
type fakeRequest struct {
	t        *testing.T
	f        stack.Flow
	sandbox  net.Conn
	dial     func(ctx context.Context, network, addr string) (net.Conn, error)
	accepted chan struct{}

	mu    sync.Mutex
	taken bool
	relay sync.WaitGroup // the relay, until its done returned
}

// wait waits for the relay, if one started, to end.
func (q *fakeRequest) wait() { q.relay.Wait() }

func (q *fakeRequest) Flow() stack.Flow { return q.f }

func (q *fakeRequest) Dial(ctx context.Context, ap netip.AddrPort) (net.Conn, error) {
	return q.dial(ctx, "tcp", ap.String())
}

func (q *fakeRequest) Accept() (net.Conn, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.taken {
		q.t.Error("accept called twice")
		return nil, errors.New("accept called twice")
	}
	q.taken = true
	close(q.accepted)
	return q.sandbox, nil
}

func (q *fakeRequest) Reset() { q.sandbox.Close() }

func (q *fakeRequest) Relay(ctx context.Context, up net.Conn, o stack.RelayOptions, done func(stack.RelayResult)) {
	var sb net.Conn = q.sandbox
	if o.Client != nil {
		sb = filterConn{Conn: q.sandbox, f: o.Client}
	}
	if o.Tap != nil {
		up = tappedConn{Conn: up, tap: o.Tap}
	}
	q.relay.Add(1)
	go stack.StartRelayTCP(ctx, sb, up, o.Idle, func(res stack.RelayResult) {
		defer q.relay.Done()
		done(res)
	})
}

// filterConn reads the sandbox's side through a stack.ClientFilter.
type filterConn struct {
	net.Conn
	f stack.ClientFilter
}

func (c filterConn) Read(p []byte) (int, error) { return c.f.Read(p) }
func (c filterConn) CloseWrite() error          { return c.f.CloseWrite() }
func (c filterConn) Close() error               { return c.f.Close() }
func (c filterConn) Abort()                     { c.f.Abort() }

// tappedConn shows its reads to a stack.RelayOptions.Tap.
type tappedConn struct {
	net.Conn
	tap func([]byte, error) bool
}

func (c tappedConn) Read(p []byte) (int, error) {
	if !c.tap(nil, nil) {
		return 0, io.EOF
	}
	n, err := c.Conn.Read(p)
	if n > 0 && !c.tap(p[:n], nil) {
		return 0, io.EOF
	}
	if err == io.EOF {
		c.tap(nil, io.EOF)
	}
	return n, err
}
