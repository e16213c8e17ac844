package socksserver

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
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
	"github.com/tunwall/tunwall/internal/engine"
	"github.com/tunwall/tunwall/internal/leaktest"
	"github.com/tunwall/tunwall/internal/socks5"
	"github.com/tunwall/tunwall/policy"
)

// The front end's tests run a real engine (policy, guard, relay, records)
// behind Serve on a loopback listener, with fakes for what the engine calls:
// names resolve from a map, dials connect to net.Pipes whose other end the
// test takes, records are kept in memory. Clients are tunwall's own SOCKS5
// client (internal/socks5).

// waitFor bounds every wait in these tests.
const waitFor = 5 * time.Second

const allowTLS = `      - host: allowed.test
        ports: [443]
`

var (
	testPool4 = netip.MustParsePrefix("198.18.0.0/24")
	testPool6 = netip.MustParsePrefix("fd74:756e:7761:6c6d::/120")
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

func (r *fakeResolver) askedFor() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.asked...)
}

// pipeDialer records dials and connects each to a fresh net.Pipe whose
// other end the test takes from servers; refuse makes every dial fail as a
// refused connection does.
type pipeDialer struct {
	mu      sync.Mutex
	dials   []string // "tcp 192.0.2.10:443"
	refuse  bool
	servers chan net.Conn
}

func (d *pipeDialer) Dial(_ context.Context, network, addr string) (net.Conn, error) {
	d.mu.Lock()
	d.dials = append(d.dials, network+" "+addr)
	refuse := d.refuse
	d.mu.Unlock()
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

// fakeRecorder keeps records.
type fakeRecorder struct {
	mu      sync.Mutex
	recs    []audit.Record
	changed chan struct{} // closed and replaced at every record
}

func (r *fakeRecorder) Admit() error { return nil }

func (r *fakeRecorder) Write(rec audit.Record) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recs = append(r.recs, rec)
	close(r.changed)
	r.changed = make(chan struct{})
}

func (r *fakeRecorder) Commit(rec audit.Record) <-chan error {
	r.Write(rec)
	done := make(chan error, 1)
	done <- nil
	return done
}

func (r *fakeRecorder) all() []audit.Record {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]audit.Record(nil), r.recs...)
}

// waitN returns the n-th record of kind (from 1), waiting for it at most
// waitFor.
func (r *fakeRecorder) waitN(t *testing.T, kind string, n int) audit.Record {
	t.Helper()
	deadline := time.After(waitFor)
	for {
		r.mu.Lock()
		seen := 0
		for _, rec := range r.recs {
			if rec.Kind == kind {
				if seen++; seen == n {
					r.mu.Unlock()
					return rec
				}
			}
		}
		ch := r.changed
		r.mu.Unlock()
		select {
		case <-ch:
		case <-deadline:
			t.Fatalf("no %d %s records within %v; records: %+v", n, kind, waitFor, r.all())
		}
	}
}

// rig is an engine with fakes around it, served by Serve.
type rig struct {
	e    *engine.Engine
	res  *fakeResolver
	dial *pipeDialer
	rec  *fakeRecorder
	d    *socks5.Dialer // a client of the proxy
}

// newRig serves a one-phase policy whose allow list is allowYAML.
func newRig(t *testing.T, allowYAML string) *rig {
	t.Helper()
	return newRigWith(t, allowYAML, nil)
}

// refusingUpstream is an --upstream proxy that answers every CONNECT with
// "connection refused".
type refusingUpstream struct{}

func (refusingUpstream) DialContext(context.Context, string, string) (net.Conn, error) {
	return nil, fmt.Errorf("socks5: CONNECT via proxy: %w", &socks5.ReplyError{Code: socks5.ReplyConnectionRefused})
}

func (refusingUpstream) DialUDP(context.Context, string) (net.Conn, error) {
	return nil, &socks5.ReplyError{Code: socks5.ReplyCommandNotSupported}
}

// newRigWith is newRig with an --upstream proxy (nil: none).
func newRigWith(t *testing.T, allowYAML string, up engine.Upstream) *rig {
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
		res:  &fakeResolver{addrs: map[string][]netip.Addr{}},
		dial: &pipeDialer{servers: make(chan net.Conn, 16)},
		rec:  &fakeRecorder{changed: make(chan struct{})},
	}
	r.e, err = engine.New(engine.Config{
		Rules:       rs,
		Pool:        pool,
		Resolver:    r.res,
		Dial:        r.dial.Dial,
		Audit:       r.rec,
		Upstream:    up,
		DialTimeout: 2 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		Serve(ctx, r.e, ln, Options{Drain: time.Millisecond})
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(waitFor):
			t.Error("Serve did not return")
		}
	})
	r.d = &socks5.Dialer{Addr: ln.Addr().String(), Timeout: waitFor}
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

func readUpTo(t *testing.T, c net.Conn, n int) []byte {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(waitFor))
	b := make([]byte, n)
	m, err := io.ReadFull(c, b)
	if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("read: %v (got %d bytes)", err, m)
	}
	return b[:m]
}

// helloFor returns the first TLS record of a real ClientHello for
// serverName.
func helloFor(t testing.TB, serverName string) []byte {
	t.Helper()
	c, s := net.Pipe()
	go tls.Client(c, &tls.Config{ServerName: serverName}).Handshake()
	s.SetReadDeadline(time.Now().Add(waitFor))
	hdr := make([]byte, 5)
	if _, err := io.ReadFull(s, hdr); err != nil {
		t.Fatal(err)
	}
	body := make([]byte, int(hdr[3])<<8|int(hdr[4]))
	if _, err := io.ReadFull(s, body); err != nil {
		t.Fatal(err)
	}
	c.Close()
	s.Close()
	return append(hdr, body...)
}
