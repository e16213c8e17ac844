package enginetest

import (
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
	"github.com/tunwall/tunwall/internal/procattr"
)

// Resolver is an engine.Resolver that resolves names from a map; a name not
// in it is NXDOMAIN. It forwards no query.
type Resolver struct {
	mu    sync.Mutex
	addrs map[string][]netip.Addr
	asked []string
}

// NewResolver returns a Resolver that knows no name.
func NewResolver() *Resolver { return &Resolver{addrs: map[string][]netip.Addr{}} }

// Add makes name resolve to addrs too.
func (r *Resolver) Add(name string, addrs ...string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, a := range addrs {
		r.addrs[name] = append(r.addrs[name], netip.MustParseAddr(a))
	}
}

// Asked returns the names Resolve was asked for, in order.
func (r *Resolver) Asked() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.asked...)
}

func (r *Resolver) Resolve(_ context.Context, name string) ([]netip.Addr, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.asked = append(r.asked, name)
	a, ok := r.addrs[name]
	if !ok {
		return nil, &dnsintercept.RcodeError{Name: name, Rcode: dns.RcodeNameError}
	}
	return a, nil
}

func (r *Resolver) Search() []string { return nil }

func (r *Resolver) Query(context.Context, string, uint16) (*dns.Msg, error) {
	return nil, errors.New("the fake resolver forwards nothing")
}

// Dialer is an engine.Config.Dial (its Dial method) that records dials and
// connects each to a fresh net.Pipe whose other end the test takes with
// Server.
type Dialer struct {
	mu      sync.Mutex
	dials   []string // "tcp 192.0.2.10:443"
	refuse  bool
	before  func()
	servers chan net.Conn
}

// NewDialer returns a Dialer that holds up to 16 upstream ends not yet
// taken by Server (a 17th dial blocks until one is).
func NewDialer() *Dialer { return &Dialer{servers: make(chan net.Conn, 16)} }

// SetRefuse makes every later dial fail as a refused connection does (or,
// with false, connect again).
func (d *Dialer) SetRefuse(refuse bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.refuse = refuse
}

// SetBefore makes f run at each later dial, before it connects.
func (d *Dialer) SetBefore(f func()) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.before = f
}

func (d *Dialer) Dial(_ context.Context, network, addr string) (net.Conn, error) {
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

// Dialled returns the dials so far, in order, each as "network addr".
func (d *Dialer) Dialled() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.dials...)
}

// Server returns the upstream end of the next dial, waiting for it at most
// Wait; the test's cleanup closes it.
func (d *Dialer) Server(t testing.TB) net.Conn {
	t.Helper()
	select {
	case c := <-d.servers:
		t.Cleanup(func() { c.Close() })
		return c
	case <-time.After(Wait):
		t.Fatal("nothing was dialled")
		return nil
	}
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

// Recorder is an engine.Recorder that keeps the records in memory. Commit
// writes at once.
type Recorder struct {
	mu      sync.Mutex
	recs    []audit.Record
	admit   error
	commit  error
	changed chan struct{} // closed and replaced at every record
}

// NewRecorder returns a Recorder that admits and commits everything.
func NewRecorder() *Recorder { return &Recorder{changed: make(chan struct{})} }

// SetAdmit makes Admit return err from now on.
func (r *Recorder) SetAdmit(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.admit = err
}

// SetCommit makes Commit fail with err (and keep nothing) from now on;
// nil makes it keep records again.
func (r *Recorder) SetCommit(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.commit = err
}

func (r *Recorder) Admit() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.admit
}

func (r *Recorder) Write(rec audit.Record) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recs = append(r.recs, rec)
	close(r.changed)
	r.changed = make(chan struct{})
}

func (r *Recorder) Commit(rec audit.Record) <-chan error {
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

// All returns the records so far, in order.
func (r *Recorder) All() []audit.Record {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]audit.Record(nil), r.recs...)
}

// Count returns how many records of kind there are so far.
func (r *Recorder) Count(kind string) int {
	n := 0
	for _, rec := range r.All() {
		if rec.Kind == kind {
			n++
		}
	}
	return n
}

// Wait returns the first record of kind, waiting for it at most Wait.
func (r *Recorder) Wait(t testing.TB, kind string) audit.Record {
	t.Helper()
	return r.WaitN(t, kind, 1)
}

// WaitN returns the n-th record of kind (from 1), waiting for it at most
// Wait.
func (r *Recorder) WaitN(t testing.TB, kind string, n int) audit.Record {
	t.Helper()
	return r.wait(t, n, fmt.Sprintf("%d %s record(s)", n, kind), func(rec audit.Record) bool { return rec.Kind == kind })
}

// WaitMatch returns the first record match accepts, waiting for it at most
// Wait; what names it in the failure.
func (r *Recorder) WaitMatch(t testing.TB, what string, match func(audit.Record) bool) audit.Record {
	t.Helper()
	return r.wait(t, 1, what, match)
}

// wait returns the n-th record match accepts, woken by every record.
func (r *Recorder) wait(t testing.TB, n int, what string, match func(audit.Record) bool) audit.Record {
	t.Helper()
	deadline := time.After(Wait)
	for {
		r.mu.Lock()
		seen := 0
		for _, rec := range r.recs {
			if match(rec) {
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
			t.Fatalf("no %s within %v; records: %+v", what, Wait, r.All())
		}
	}
}

// Attr is an engine.Attributor that finds Owner behind every flow at once
// and cannot tell whether a socket is gone.
type Attr struct{ Owner procattr.Owner }

func (a Attr) TCPSocketGone(netip.AddrPort, netip.AddrPort) (gone, ok bool) { return false, false }

func (a Attr) Start(string, netip.AddrPort, netip.AddrPort) *procattr.Pending {
	return procattr.Known(a.Owner)
}

func (a Attr) StartWaited(string, netip.AddrPort, netip.AddrPort) *procattr.Pending {
	return procattr.Known(a.Owner)
}

// StalledAttr is an engine.Attributor whose lookups are never answered:
// every wait for one lasts its whole bound.
type StalledAttr struct{}

func (StalledAttr) TCPSocketGone(netip.AddrPort, netip.AddrPort) (gone, ok bool) { return false, false }

func (StalledAttr) Start(string, netip.AddrPort, netip.AddrPort) *procattr.Pending {
	return procattr.Unanswered()
}

func (StalledAttr) StartWaited(string, netip.AddrPort, netip.AddrPort) *procattr.Pending {
	return procattr.Unanswered()
}
