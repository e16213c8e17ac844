package engine

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/tunwall/tunwall/dnsintercept"
	"github.com/tunwall/tunwall/internal/audit"
	"github.com/tunwall/tunwall/internal/leaktest"
	"github.com/tunwall/tunwall/internal/procattr"
	"github.com/tunwall/tunwall/policy"
	"github.com/tunwall/tunwall/stack"
)

// The engine's unit tests run Engine.TCP, Engine.UDP and the DNS path with
// fakes of what the engine calls (ports.go): the sandbox's side of a flow
// and the upstream's are the two ends of net.Pipes, names resolve from a
// map, dials are recorded, and records are kept in memory. The policy, the
// rebinding guard, the fake-IP pool, the gate and the relay are the real
// ones. Nothing touches the network or needs root.

// waitFor bounds every wait in these tests.
const waitFor = 5 * time.Second

var (
	testPool4 = netip.MustParsePrefix("198.18.0.0/24")
	testPool6 = netip.MustParsePrefix("fd74:756e:7761:6c6d::/120")
	sandbox4  = netip.MustParseAddrPort("10.0.2.100:40000")
)

// fakeResolver resolves names from a map; a name not in it is NXDOMAIN.
type fakeResolver struct {
	mu    sync.Mutex
	addrs map[string][]netip.Addr
	asked []string
}

func (r *fakeResolver) Resolve(_ context.Context, name string) ([]netip.Addr, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.asked = append(r.asked, name)
	a, ok := r.addrs[name]
	if !ok {
		return nil, &dnsintercept.RcodeError{Name: name, Rcode: dns.RcodeNameError}
	}
	return a, nil
}

func (r *fakeResolver) Search() []string { return nil }

func (r *fakeResolver) Query(context.Context, string, uint16) (*dns.Msg, error) {
	return nil, errors.New("the fake resolver forwards nothing")
}

// pipeDialer records dials and connects each to a fresh net.Pipe whose
// other end the test takes from servers; refuse makes every dial fail as a
// refused connection does.
type pipeDialer struct {
	mu      sync.Mutex
	dials   []string // "tcp 192.0.2.10:443"
	refuse  bool
	before  func() // runs at each dial, before it connects
	servers chan net.Conn
}

func (d *pipeDialer) Dial(_ context.Context, network, addr string) (net.Conn, error) {
	d.mu.Lock()
	d.dials = append(d.dials, network+" "+addr)
	refuse, before := d.refuse, d.before
	d.mu.Unlock()
	if before != nil {
		before()
	}
	if refuse {
		return nil, &net.OpError{Op: "dial", Net: network, Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	}
	up, srv := net.Pipe()
	d.servers <- srv
	return addrConn{up, network}, nil
}

// addrConn is a net.Pipe end with the local address of a socket of its
// network (a SOCKS reply carries it).
type addrConn struct {
	net.Conn
	network string
}

func (c addrConn) LocalAddr() net.Addr {
	if strings.HasPrefix(c.network, "udp") {
		return &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 40001}
	}
	return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 40001}
}

func (d *pipeDialer) dialled() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.dials...)
}

// server returns the upstream end of the next dial.
func (d *pipeDialer) server(t *testing.T) net.Conn {
	t.Helper()
	select {
	case c := <-d.servers:
		t.Cleanup(func() { c.Close() })
		return c
	case <-time.After(waitFor):
		t.Fatal("nothing was dialled")
		return nil
	}
}

// fakeRecorder keeps records; admit and commit, when set, are the errors
// Admit and Commit give.
type fakeRecorder struct {
	mu      sync.Mutex
	recs    []audit.Record
	admit   error
	commit  error
	changed chan struct{} // closed and replaced at every record
}

func newRecorder() *fakeRecorder { return &fakeRecorder{changed: make(chan struct{})} }

func (r *fakeRecorder) Admit() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.admit
}

func (r *fakeRecorder) Write(rec audit.Record) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recs = append(r.recs, rec)
	close(r.changed)
	r.changed = make(chan struct{})
}

func (r *fakeRecorder) Commit(rec audit.Record) <-chan error {
	done := make(chan error, 1)
	r.mu.Lock()
	err := r.commit
	r.mu.Unlock()
	if err == nil {
		r.Write(rec)
	}
	done <- err
	return done
}

func (r *fakeRecorder) all() []audit.Record {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]audit.Record(nil), r.recs...)
}

// wait returns the first record of kind, waiting for it at most waitFor.
func (r *fakeRecorder) wait(t *testing.T, kind string) audit.Record {
	t.Helper()
	deadline := time.After(waitFor)
	for {
		r.mu.Lock()
		for _, rec := range r.recs {
			if rec.Kind == kind {
				r.mu.Unlock()
				return rec
			}
		}
		ch := r.changed
		r.mu.Unlock()
		select {
		case <-ch:
		case <-deadline:
			t.Fatalf("no %s record within %v; records: %+v", kind, waitFor, r.all())
		}
	}
}

func (r *fakeRecorder) count(kind string) int {
	n := 0
	for _, rec := range r.all() {
		if rec.Kind == kind {
			n++
		}
	}
	return n
}

// fakeAttr answers every lookup at once with owner.
type fakeAttr struct{ owner procattr.Owner }

func (a fakeAttr) TCPSocketGone(netip.AddrPort, netip.AddrPort) (gone, ok bool) { return false, false }

func (a fakeAttr) Start(string, netip.AddrPort, netip.AddrPort) *procattr.Pending {
	return procattr.Known(a.owner)
}

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
	res     *fakeResolver
	dial    *pipeDialer
	rec     *fakeRecorder
	denials *syncBuffer
}

// newRig builds an Engine for a one-phase policy whose allow list is
// allowYAML; mod, if not nil, changes its Config before New.
func newRig(t *testing.T, allowYAML string, mod func(*Config)) *rig {
	t.Helper()
	leaktest.Check(t)
	p, err := policy.Parse("test.yaml", []byte("version: 1\nphases:\n  test:\n    allow:\n"+allowYAML))
	if err != nil {
		t.Fatal(err)
	}
	rs, err := policy.Select(p, "", nil, policy.Guard{Extra: []netip.Prefix{testPool4, testPool6}})
	if err != nil {
		t.Fatal(err)
	}
	pool, err := dnsintercept.NewPoolReserved(testPool4, testPool6, 16)
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{
		rules:   rs,
		pool:    pool,
		res:     &fakeResolver{addrs: map[string][]netip.Addr{}},
		dial:    &pipeDialer{servers: make(chan net.Conn, 16)},
		rec:     newRecorder(),
		denials: &syncBuffer{},
	}
	cfg := Config{
		Rules:        rs,
		Pool:         pool,
		Resolver:     r.res,
		Dial:         r.dial.Dial,
		Audit:        r.rec,
		Attr:         fakeAttr{procattr.Owner{PID: 4242, Comm: "curl", Exe: "/usr/bin/curl"}},
		Denials:      r.denials,
		SniffTimeout: 2 * time.Second,
		DialTimeout:  2 * time.Second,
	}
	if mod != nil {
		mod(&cfg)
	}
	if r.e, err = New(cfg); err != nil {
		t.Fatal(err)
	}
	return r
}

// resolves makes name resolve to addrs.
func (r *rig) resolves(name string, addrs ...string) {
	r.res.mu.Lock()
	defer r.res.mu.Unlock()
	for _, a := range addrs {
		r.res.addrs[name] = append(r.res.addrs[name], netip.MustParseAddr(a))
	}
}

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
