package stack

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tunwall/tunwall/internal/testenv"
	"golang.org/x/sys/unix"
)

func listenLoopback(t *testing.T) *net.TCPListener {
	t.Helper()
	ln, err := net.ListenTCP("tcp4", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// dialAndAccept dials ln with s.DialTCP and returns both ends; the test's
// cleanup closes the server's.
func dialAndAccept(t *testing.T, s *Stack, ln *net.TCPListener) (net.Conn, net.Conn) {
	t.Helper()
	c, err := s.DialTCP(context.Background(), ln.Addr().(*net.TCPAddr).AddrPort())
	if err != nil {
		t.Fatal(err)
	}
	srv, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	return c, srv
}

// TestDialTCPHandsTheRelayTheSocketItself: the relay takes the dialled
// socket's own descriptor (no dup, nothing left open after the taker closes
// it), and what the relay writes to it reaches the server.
func TestDialTCPHandsTheRelayTheSocketItself(t *testing.T) {
	s, _ := newTestStack(t, newFakeHandler(), nil)
	ln := listenLoopback(t)
	before := openFDs(t)
	c, srv := dialAndAccept(t, s, ln)
	if got := openFDs(t) - before; got != 2 { // the dialled socket and the accepted one
		t.Fatalf("%d descriptors more after the dial and accept, want 2", got)
	}
	u, ok := c.(*upSocket)
	if !ok {
		t.Fatalf("DialTCP returned %T, want *upSocket", c)
	}
	want := u.fd
	fd, ok := takeUpstream(c)
	if !ok || fd != want {
		t.Fatalf("takeUpstream = %d, %v; want the socket's own descriptor %d", fd, ok, want)
	}
	if got := openFDs(t) - before; got != 2 {
		t.Fatalf("%d descriptors more after the take, want 2 (no dup)", got)
	}
	if err := c.Close(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Close after take = %v, want net.ErrClosed (the taker owns the socket)", err)
	}
	if _, err := unix.Write(fd, []byte("hello")); err != nil {
		t.Fatalf("write on the taken descriptor: %v", err)
	}
	unix.Close(fd)
	got, err := io.ReadAll(srv)
	if err != nil || string(got) != "hello" {
		t.Fatalf("server read %q, %v; want hello, EOF", got, err)
	}
}

// TestDialTCPIsANetConnWhenUsedAsOne: a dialled connection read and
// written as a net.Conn (TLS termination does) works both ways, with
// deadlines, and Close closes it.
func TestDialTCPIsANetConnWhenUsedAsOne(t *testing.T) {
	s, _ := newTestStack(t, newFakeHandler(), nil)
	ln := listenLoopback(t)
	served := make(chan struct{})
	go func() {
		defer close(served)
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		// Not io.Copy: its splice keeps a pipe pair pooled, which the
		// count of descriptors below would see.
		buf := make([]byte, 64)
		for {
			n, err := c.Read(buf)
			if err != nil {
				c.(*net.TCPConn).CloseWrite()
				return
			}
			c.Write(buf[:n])
		}
	}()
	before := openFDs(t)
	c, err := s.DialTCP(context.Background(), ln.Addr().(*net.TCPAddr).AddrPort())
	if err != nil {
		t.Fatal(err)
	}
	if got, want := c.RemoteAddr().String(), ln.Addr().String(); got != want {
		t.Errorf("RemoteAddr %s, want %s", got, want)
	}
	if la, ok := c.LocalAddr().(*net.TCPAddr); !ok || la.Port == 0 || !la.IP.Equal(net.IPv4(127, 0, 0, 1)) {
		t.Errorf("LocalAddr %v, want 127.0.0.1 and a port", c.LocalAddr())
	}
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4)
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("read %q, %v; want ping", buf, err)
	}
	if err := c.(closeWriter).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if n, err := c.Read(buf); n != 0 || err != io.EOF {
		t.Fatalf("after CloseWrite read %d, %v; want the echo's EOF", n, err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	<-served
	if got := openFDs(t) - before; got != 0 {
		t.Fatalf("%d descriptors left open after Close", got)
	}
	if _, ok := takeUpstream(c); ok {
		t.Fatal("takeUpstream took a closed connection")
	}
}

// TestDialTCPRefusedIsNetDialersError: a refused connect is reported as a
// net.Dialer reports it (the audit's outcome and reason depend on it), and
// leaves no descriptor behind.
func TestDialTCPRefusedIsNetDialersError(t *testing.T) {
	s, _ := newTestStack(t, newFakeHandler(), nil)
	ln := listenLoopback(t)
	ap := ln.Addr().(*net.TCPAddr).AddrPort()
	ln.Close()
	before := openFDs(t)
	_, err := s.DialTCP(context.Background(), ap)
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("err %v, want ECONNREFUSED", err)
	}
	if want := "dial tcp " + ap.String() + ": connect: connection refused"; err.Error() != want {
		t.Errorf("err %q, want %q", err, want)
	}
	if got := openFDs(t) - before; got != 0 {
		t.Fatalf("%d descriptors left open after a refused dial", got)
	}
}

// fullListener is a listening socket whose accept queue holds one
// connection: a second SYN is dropped while that one waits, so the second
// connect stays in progress until the queue has room and the SYN is sent
// again (after a second).
func fullListener(t *testing.T) (fd int, ap netip.AddrPort) {
	t.Helper()
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := unix.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	sa, err := unix.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	ap = netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, 1}), uint16(sa.(*unix.SockaddrInet4).Port))
	first, err := net.Dial("tcp", ap.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { first.Close() })
	return fd, ap
}

// TestDialTCPWaitsForASlowConnect: a connect the kernel has not finished
// when connect(2) returns is waited for on the stack's poller and
// succeeds when the handshake does.
func TestDialTCPWaitsForASlowConnect(t *testing.T) {
	s, _ := newTestStack(t, newFakeHandler(), nil)
	lfd, ap := fullListener(t)
	type result struct {
		c   net.Conn
		err error
	}
	res := make(chan result, 1)
	start := time.Now()
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c, err := s.DialTCP(ctx, ap)
		res <- result{c, err}
	}()
	select {
	case r := <-res:
		t.Fatalf("the dial returned at once (%v, %v) while the listener's queue was full", r.c, r.err)
	case <-time.After(300 * time.Millisecond):
	}
	// Make room: the SYN sent again gets through.
	nfd, _, err := unix.Accept(lfd)
	if err != nil {
		t.Fatal(err)
	}
	unix.Close(nfd)
	r := <-res
	if r.err != nil {
		t.Fatalf("slow connect: %v", r.err)
	}
	defer r.c.Close()
	if d := time.Since(start); d > 8*time.Second {
		t.Fatalf("slow connect took %v", d)
	}
	if _, ok := r.c.(*upSocket); !ok {
		t.Fatalf("DialTCP returned %T", r.c)
	}
}

// TestDialTCPGivesUpWhenTheContextEnds: a connect still in progress when
// the dial's deadline passes, or its context is cancelled, ends with a
// timeout or context.Canceled, and its socket is closed.
func TestDialTCPGivesUpWhenTheContextEnds(t *testing.T) {
	s, _ := newTestStack(t, newFakeHandler(), nil)
	_, ap := fullListener(t)
	before := openFDs(t)

	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err := s.DialTCP(ctx, ap)
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() || !strings.Contains(err.Error(), "i/o timeout") {
		t.Fatalf("err %v, want a net.Error timeout", err)
	}

	ctx, cancel = context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	_, err = s.DialTCP(ctx, ap)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v, want context.Canceled", err)
	}
	if got := openFDs(t) - before; got != 0 {
		t.Fatalf("%d descriptors left open after dials that gave up", got)
	}
	if n := s.poller.Len(); n != 0 {
		t.Fatalf("%d poller targets left after dials that gave up", n)
	}
}

// TestDialTCPAbortResets: an aborted, untaken connection is reset, not
// closed gracefully (the relay resets an upstream whose sandbox reset).
func TestDialTCPAbortResets(t *testing.T) {
	s, _ := newTestStack(t, newFakeHandler(), nil)
	ln := listenLoopback(t)
	c, srv := dialAndAccept(t, s, ln)
	abortConn(c)
	srv.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err := srv.Read(make([]byte, 1))
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("server read after abort: %v, want ECONNRESET", err)
	}
}

// TestDialTCPOverIPv6: an IPv6 destination is dialled over IPv6 (and an
// IPv4-mapped one over IPv4).
func TestDialTCPOverIPv6(t *testing.T) {
	s, _ := newTestStack(t, newFakeHandler(), nil)
	ln, err := net.ListenTCP("tcp6", &net.TCPAddr{IP: net.IPv6loopback})
	if err != nil {
		testenv.Skip(t, "no IPv6 loopback: %v", err)
	}
	defer ln.Close()
	c, err := s.DialTCP(context.Background(), ln.Addr().(*net.TCPAddr).AddrPort())
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	ln4 := listenLoopback(t)
	mapped := netip.AddrPortFrom(netip.AddrFrom16(netip.MustParseAddr("127.0.0.1").As16()), ln4.Addr().(*net.TCPAddr).AddrPort().Port())
	c, err = s.DialTCP(context.Background(), mapped)
	if err != nil {
		t.Fatalf("IPv4-mapped %s: %v", mapped, err)
	}
	c.Close()
}
