package stack

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/link/fdbased"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv6"
	gstack "gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"
)

// sandboxNet is a second gVisor stack on the sandbox's end of the
// socketpair: a full TCP/UDP client, for tests that need real connections
// (relays, half-closes, window behaviour) rather than hand-made packets.
type sandboxNet struct {
	s *gstack.Stack
}

func newSandboxNet(t testing.TB, fd int) *sandboxNet {
	t.Helper()
	s := gstack.New(gstack.Options{
		NetworkProtocols:   []gstack.NetworkProtocolFactory{ipv4.NewProtocol, ipv6.NewProtocol},
		TransportProtocols: []gstack.TransportProtocolFactory{tcp.NewProtocol, udp.NewProtocol},
	})
	ep, err := fdbased.New(&fdbased.Options{FDs: []int{fd}, MTU: testMTU})
	if err != nil {
		t.Fatalf("sandbox net: %v", err)
	}
	if e := s.CreateNIC(1, ep); e != nil {
		t.Fatalf("sandbox net NIC: %v", e)
	}
	for _, a := range []netip.Addr{sandbox4, sandbox6} {
		proto := ipv4.ProtocolNumber
		if a.Is6() {
			proto = ipv6.ProtocolNumber
		}
		pa := tcpip.ProtocolAddress{Protocol: proto, AddressWithPrefix: tAddr(a).WithPrefix()}
		if e := s.AddProtocolAddress(1, pa, gstack.AddressProperties{}); e != nil {
			t.Fatalf("sandbox net address: %v", e)
		}
	}
	s.SetRouteTable([]tcpip.Route{
		{Destination: header.IPv4EmptySubnet, NIC: 1},
		{Destination: header.IPv6EmptySubnet, NIC: 1},
	})
	n := &sandboxNet{s: s}
	t.Cleanup(func() {
		s.Close()
		s.Wait()
		s.Destroy()
	})
	return n
}

func netProto(a netip.Addr) tcpip.NetworkProtocolNumber {
	if a.Is4() {
		return ipv4.ProtocolNumber
	}
	return ipv6.ProtocolNumber
}

// dial connects from the sandbox to dst.
func (n *sandboxNet) dial(ctx context.Context, dst netip.AddrPort) (*gonet.TCPConn, error) {
	return gonet.DialContextTCP(ctx, n.s, tcpip.FullAddress{NIC: 1, Addr: tAddr(dst.Addr()), Port: dst.Port()}, netProto(dst.Addr()))
}

// dialUDP opens a connected UDP socket from the sandbox to dst.
func (n *sandboxNet) dialUDP(dst netip.AddrPort) (*gonet.UDPConn, error) {
	return gonet.DialUDP(n.s, nil, &tcpip.FullAddress{NIC: 1, Addr: tAddr(dst.Addr()), Port: dst.Port()}, netProto(dst.Addr()))
}

// relayHandler serves every flow by dialling its upstream (a function of
// the flow) and relaying; results arrive on res.
type relayHandler struct {
	upstream func(f Flow) (net.Conn, error)
	idle     time.Duration
	res      chan RelayResult
	refused  chan refusal
	// goroutines relays with the two-goroutine relay (relayTCPConns), on
	// Handler.TCP's goroutine, instead of StartRelayTCP: for comparisons.
	goroutines bool
	// wrap, if set, makes a filter of the sandbox's connection and a tap
	// of the upstream for the relay (as the engine's name checks do).
	wrap func(sb, up net.Conn) (ClientFilter, func([]byte, error) bool)
}

func newRelayHandler(up func(f Flow) (net.Conn, error)) *relayHandler {
	return &relayHandler{upstream: up, res: make(chan RelayResult, 1<<14), refused: make(chan refusal, 1<<14)}
}

func (h *relayHandler) TCP(ctx context.Context, r TCPRequest) {
	up, err := h.upstream(r.Flow())
	if err != nil {
		return
	}
	c, err := r.Accept()
	if err != nil {
		up.Close()
		return
	}
	if h.goroutines {
		h.res <- relayTCPConns(ctx, c, up, h.idle)
		return
	}
	o := RelayOptions{Idle: h.idle}
	if h.wrap != nil {
		o.Client, o.Tap = h.wrap(c, up)
	}
	r.Relay(ctx, up, o, func(r RelayResult) { h.res <- r })
}

func (h *relayHandler) UDP(f Flow) (func(context.Context, UDPSession), bool) {
	return func(ctx context.Context, s UDPSession) {
		up, err := h.upstream(f)
		if err != nil {
			return
		}
		s.Relay(ctx, up, RelayOptions{Idle: h.idle}, func(r RelayResult) { h.res <- r })
	}, true
}

func (h *relayHandler) Refused(f Flow, err error) {
	select {
	case h.refused <- refusal{f, err}:
	default:
	}
}

func (h *relayHandler) result(t testing.TB) RelayResult {
	t.Helper()
	select {
	case r := <-h.res:
		return r
	case <-time.After(waitFor):
		t.Fatal("no relay result")
		return RelayResult{}
	}
}

// relayTestbed is sandbox app (sandboxNet) <-> Stack <-> relay <-> upstream
// listener on 127.0.0.1, whose accepted connections arrive on ups.
type relayTestbed struct {
	st  *Stack
	sb  *sandboxNet
	h   *relayHandler
	ln  net.Listener
	ups chan net.Conn
	dst netip.AddrPort // where the sandbox connects (any address: the handler ignores it)
}

func newRelayTestbed(t testing.TB, mod func(*Config), idle time.Duration, hmod ...func(*relayHandler)) *relayTestbed {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tb := &relayTestbed{ln: ln, ups: make(chan net.Conn, 1<<14), dst: netip.AddrPortFrom(remote4, 80)}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			tb.ups <- c
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
		for {
			select {
			case c := <-tb.ups:
				c.Close()
			default:
				return
			}
		}
	})
	tb.h = newRelayHandler(func(f Flow) (net.Conn, error) {
		if f.Proto == UDP {
			return nil, errors.New("no UDP upstream")
		}
		return net.Dial("tcp4", ln.Addr().String())
	})
	tb.h.idle = idle
	for _, m := range hmod {
		m(tb.h) // before the Stack starts: the handler's goroutines read it
	}
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	// Room for bursts, as a TUN's queue has: a full socketpair drops.
	for _, fd := range fds {
		unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF, 4<<20)
		unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 4<<20)
	}
	cfg := Config{FD: fds[0], MTU: testMTU, Handler: tb.h}
	if mod != nil {
		mod(&cfg)
	}
	st, err := New(cfg)
	if err != nil {
		unix.Close(fds[0])
		unix.Close(fds[1])
		t.Fatal(err)
	}
	tb.st = st
	t.Cleanup(func() { closeWithin(t, st, waitFor) }) // before the sandbox net's cleanup (LIFO)
	tb.sb = newSandboxNet(t, fds[1])
	return tb
}

// connect opens one relayed connection: the sandbox's end and upstream's.
func (tb *relayTestbed) connect(t testing.TB) (*gonet.TCPConn, net.Conn) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	c, err := tb.sb.dial(ctx, tb.dst)
	if err != nil {
		t.Fatalf("sandbox dial: %v", err)
	}
	select {
	case u := <-tb.ups:
		return c, u
	case <-time.After(waitFor):
		t.Fatal("the upstream saw no connection")
		return nil, nil
	}
}

// readFull reads len(b) bytes within waitFor.
func readFull(t testing.TB, c net.Conn, b []byte) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(waitFor))
	if _, err := io.ReadFull(c, b); err != nil {
		t.Fatalf("read %d bytes: %v", len(b), err)
	}
	c.SetReadDeadline(time.Time{})
}
