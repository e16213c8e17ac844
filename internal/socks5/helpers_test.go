package socks5

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"testing"

	gosocks "github.com/things-go/go-socks5"

	"github.com/tunwall/tunwall/internal/leaktest"

	"github.com/tunwall/tunwall/internal/testenv"
)

// goroutineLeakCheck fails the test if it ends with goroutines it started
// still running (leaktest.Check). Register it first so its cleanup runs
// last, after every server the test started has been shut down.
func goroutineLeakCheck(t *testing.T) {
	t.Helper()
	leaktest.Check(t)
}

// group runs goroutines and waits for them in Cleanup.
type group struct{ wg sync.WaitGroup }

func (g *group) Go(f func()) {
	g.wg.Add(1)
	go func() { defer g.wg.Done(); f() }()
}

// startTCPEcho serves an echo on network ("tcp4" or "tcp6") loopback. Each
// connection echoes until EOF, then closes.
func startTCPEcho(t *testing.T, network string) *net.TCPAddr {
	t.Helper()
	ln, err := net.Listen(network, loopback(network)+":0")
	if err != nil {
		t.Fatalf("echo listen: %v", err)
	}
	var g group
	var mu sync.Mutex
	var conns []net.Conn
	g.Go(func() {
		for range 1000 {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			g.Go(func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
			})
		}
	})
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		g.wg.Wait()
	})
	return ln.Addr().(*net.TCPAddr)
}

// startUDPEcho echoes every datagram back to its sender, prefixed with
// "echo:".
func startUDPEcho(t *testing.T, network string) *net.UDPAddr {
	t.Helper()
	pc, err := net.ListenPacket(network, loopback(network)+":0")
	if err != nil {
		t.Fatalf("udp echo listen: %v", err)
	}
	var g group
	g.Go(func() {
		buf := make([]byte, 65535)
		for range 100000 {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = pc.WriteTo(append([]byte("echo:"), buf[:n]...), from)
		}
	})
	t.Cleanup(func() {
		pc.Close()
		g.wg.Wait()
	})
	return pc.LocalAddr().(*net.UDPAddr)
}

func loopback(network string) string {
	if network[len(network)-1] == '6' {
		return "[::1]"
	}
	return "127.0.0.1"
}

func requireIPv6(t *testing.T) {
	t.Helper()
	ln, err := net.Listen("tcp6", "[::1]:0")
	if err != nil {
		testenv.Skip(t, "no IPv6 loopback: %v", err)
	}
	ln.Close()
}

// names maps test hostnames to loopback addresses for the go-socks5 server,
// records every name it was asked about, and never resolves anything else.
type names struct {
	mu    sync.Mutex
	hosts map[string]netip.Addr
	asked []string // names passed to Resolve
	udp   []string // hostnames the server dialled for UDP datagrams
}

func (n *names) lookup(name string) (netip.Addr, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	ip, ok := n.hosts[name]
	return ip, ok
}

// Resolve implements gosocks.NameResolver.
func (n *names) Resolve(ctx context.Context, name string) (context.Context, net.IP, error) {
	n.mu.Lock()
	n.asked = append(n.asked, name)
	n.mu.Unlock()
	ip, ok := n.lookup(name)
	if !ok {
		return ctx, nil, fmt.Errorf("test resolver: no such host %q", name)
	}
	return ctx, ip.AsSlice(), nil
}

func (n *names) askedNames() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]string(nil), n.asked...)
}

func (n *names) udpNames() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]string(nil), n.udp...)
}

// dial is the go-socks5 server's outbound dialer. It only ever reaches
// loopback: known names map to loopback, IP literals must be loopback.
func (n *names) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		var ok bool
		if ip, ok = n.lookup(host); !ok {
			return nil, fmt.Errorf("test dialer: no such host %q", host)
		}
		if network == "udp" {
			n.mu.Lock()
			n.udp = append(n.udp, host)
			n.mu.Unlock()
		}
	}
	if !ip.Unmap().IsLoopback() {
		return nil, fmt.Errorf("test dialer: refusing non-loopback %s", ip)
	}
	var d net.Dialer
	return d.DialContext(ctx, network, net.JoinHostPort(ip.String(), port))
}

// socksServer is a things-go/go-socks5 server on loopback.
type socksServer struct {
	addr  string // host:port
	names *names

	mu    sync.Mutex
	atyps []byte // ATYP of every CONNECT request
}

func (s *socksServer) connectATYPs() []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]byte(nil), s.atyps...)
}

// startSOCKS starts go-socks5 on network ("tcp4" or "tcp6") loopback, with
// the names table as its resolver and outbound dialer.
func startSOCKS(t *testing.T, network string, hosts map[string]netip.Addr, opts ...gosocks.Option) *socksServer {
	t.Helper()
	ln, err := net.Listen(network, loopback(network)+":0")
	if err != nil {
		t.Fatalf("socks listen: %v", err)
	}
	s := &socksServer{addr: ln.Addr().String(), names: &names{hosts: hosts}}
	record := func(_ context.Context, _ io.Writer, r *gosocks.Request) error {
		s.mu.Lock()
		s.atyps = append(s.atyps, r.RawDestAddr.AddrType)
		s.mu.Unlock()
		return nil
	}
	all := append([]gosocks.Option{
		gosocks.WithResolver(s.names),
		gosocks.WithDial(s.names.dial),
		gosocks.WithConnectMiddleware(record),
	}, opts...)
	srv := gosocks.NewServer(all...)
	var g group
	g.Go(func() { _ = srv.Serve(ln) })
	t.Cleanup(func() {
		ln.Close()
		g.wg.Wait()
	})
	return s
}

// fakeProxy accepts TCP connections and runs script on each one; it is the
// scripted server for behaviour go-socks5 cannot produce.
type fakeProxy struct {
	ln net.Listener
}

func startFakeProxy(t *testing.T, network string, script func(c net.Conn)) *fakeProxy {
	t.Helper()
	ln, err := net.Listen(network, loopback(network)+":0")
	if err != nil {
		t.Fatalf("fake proxy listen: %v", err)
	}
	var g group
	var mu sync.Mutex
	var conns []net.Conn
	g.Go(func() {
		for range 100 {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			g.Go(func() {
				defer c.Close()
				script(c)
			})
		}
	})
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		g.wg.Wait()
	})
	return &fakeProxy{ln: ln}
}

func (p *fakeProxy) addr() string { return p.ln.Addr().String() }

// The helpers below are the fake proxy's half of RFC 1928, written
// independently of the client code under test.

// srvGreet reads the client greeting and selects method; it returns the
// methods offered.
func srvGreet(c net.Conn, method byte) ([]byte, error) {
	var h [2]byte
	if _, err := io.ReadFull(c, h[:]); err != nil {
		return nil, err
	}
	if h[0] != 5 {
		return nil, fmt.Errorf("greeting version %d", h[0])
	}
	methods := make([]byte, h[1])
	if _, err := io.ReadFull(c, methods); err != nil {
		return nil, err
	}
	_, err := c.Write([]byte{5, method})
	return methods, err
}

// srvRequest reads one request and returns its raw bytes.
func srvRequest(c net.Conn) ([]byte, error) {
	b := make([]byte, 5)
	if _, err := io.ReadFull(c, b); err != nil {
		return nil, err
	}
	var rest int
	switch b[3] {
	case 1:
		rest = 4 - 1 + 2
	case 4:
		rest = 16 - 1 + 2
	case 3:
		rest = int(b[4]) + 2
	default:
		return b, errors.New("bad atyp")
	}
	tail := make([]byte, rest)
	if _, err := io.ReadFull(c, tail); err != nil {
		return nil, err
	}
	return append(b, tail...), nil
}

// srvReply writes a reply whose BND is ap (IPv4 or IPv6 ATYP by family).
func srvReply(c net.Conn, rep byte, ap netip.AddrPort) error {
	b := []byte{5, rep, 0}
	if ap.Addr().Is4() {
		b = append(b, 1)
	} else {
		b = append(b, 4)
	}
	b = append(b, ap.Addr().AsSlice()...)
	b = append(b, byte(ap.Port()>>8), byte(ap.Port()))
	_, err := c.Write(b)
	return err
}

// waitEOF blocks until the peer closes c (or the test's cleanup does).
func waitEOF(c net.Conn) {
	_, _ = io.Copy(io.Discard, c)
}
