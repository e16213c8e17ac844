package engine

import (
	"bytes"
	"context"
	"errors"
	"fmt"
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
	var once sync.Once
	accept := func() (net.Conn, error) {
		n := 0
		once.Do(func() { close(run.accepted); n = 1 })
		if n == 0 {
			t.Error("accept called twice")
			return nil, errors.New("accept called twice")
		}
		return sandbox, nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	f := stack.Flow{Proto: stack.TCP, Src: sandbox4, Dst: dst}
	go func() {
		defer close(run.done)
		r.e.TCP(ctx, f, accept)
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
