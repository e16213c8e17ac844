package procattr

import (
	"net"
	"net/netip"
	"os"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/tunwall/tunwall/internal/testenv"
)

// testFlow is a flow from the sandbox's point of view plus the inode of the
// socket that must be reported for it.
type testFlow struct {
	proto         string
	local, remote netip.AddrPort
	inode         uint64
}

// strategy is the lookup step expected to find a socket.
type strategy int

const (
	firstExact strategy = iota
	secondExact
	dumpFallback
)

func (s strategy) String() string {
	return [...]string{"first exact order", "second exact order", "dump fallback"}[s]
}

func hitsOf(r *Resolver) [3]uint64 {
	return [3]uint64{r.stats.exact[0].Load(), r.stats.exact[1].Load(), r.stats.dump.Load()}
}

func tcpClient(t testing.TB, network, listen string) testFlow {
	ln := mustListen(t, network, listen)
	c, err := net.Dial(network, ln.Addr().String())
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return testFlow{"tcp", addrPortOf(t, c.LocalAddr()), addrPortOf(t, c.RemoteAddr()), connInode(t, c.(*net.TCPConn))}
}

func udpServer(t *testing.T, network, addr string) *net.UDPConn {
	s, err := net.ListenPacket(network, addr)
	if err != nil {
		testenv.Skip(t, "cannot listen on %s %s: %v", network, addr, err)
	}
	t.Cleanup(func() { s.Close() })
	return s.(*net.UDPConn)
}

func udpConnected(t *testing.T, network, addr string) testFlow {
	s := udpServer(t, network, addr)
	c, err := net.DialUDP(network, nil, s.LocalAddr().(*net.UDPAddr))
	if err != nil {
		t.Fatalf("dial udp: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := c.Write([]byte("x")); err != nil {
		t.Fatalf("write: %v", err)
	}
	return testFlow{"udp", addrPortOf(t, c.LocalAddr()), addrPortOf(t, c.RemoteAddr()), connInode(t, c)}
}

// udpUnconnected binds a socket to bind and sends one datagram to a server on
// serverAddr; the flow's local address is src (what a packet would carry).
func udpUnconnected(t *testing.T, network, bind, serverAddr string, src netip.Addr) testFlow {
	s := udpServer(t, network, serverAddr)
	c, err := net.ListenPacket(network, bind)
	if err != nil {
		t.Fatalf("listen %s: %v", bind, err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := c.WriteTo([]byte("x"), s.LocalAddr()); err != nil {
		t.Fatalf("write: %v", err)
	}
	port := addrPortOf(t, c.LocalAddr()).Port()
	return testFlow{"udp", netip.AddrPortFrom(src, port), addrPortOf(t, s.LocalAddr()), connInode(t, c.(*net.UDPConn))}
}

// rawDualStack connects an AF_INET6 socket (IPV6_V6ONLY off) to the
// v4-mapped form of a 127.0.0.1 server, which Go's net package would not do.
func rawDualStack(t *testing.T, sotype int, server netip.AddrPort, bindAny bool) testFlow {
	fd, err := unix.Socket(unix.AF_INET6, sotype|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("socket: %v", err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if err := unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, 0); err != nil {
		t.Fatalf("IPV6_V6ONLY: %v", err)
	}
	mapped := &unix.SockaddrInet6{Port: int(server.Port()), Addr: netip.AddrFrom4(server.Addr().As4()).As16()}
	proto := "tcp"
	if sotype == unix.SOCK_DGRAM {
		proto = "udp"
	}
	if bindAny {
		if err := unix.Bind(fd, &unix.SockaddrInet6{}); err != nil {
			t.Fatalf("bind [::]:0: %v", err)
		}
		if err := unix.Sendto(fd, []byte("x"), 0, mapped); err != nil {
			t.Fatalf("sendto: %v", err)
		}
		sa, err := unix.Getsockname(fd)
		if err != nil {
			t.Fatalf("getsockname: %v", err)
		}
		port := sockaddrAddrPort(t, sa).Port()
		return testFlow{proto, netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), port), server, fdInode(t, fd)}
	}
	if err := unix.Connect(fd, mapped); err != nil {
		t.Fatalf("connect: %v", err)
	}
	sa, err := unix.Getsockname(fd)
	if err != nil {
		t.Fatalf("getsockname: %v", err)
	}
	// The sandbox's packets are IPv4: report the flow unmapped, as tunwall sees it.
	local := sockaddrAddrPort(t, sa)
	return testFlow{proto, netip.AddrPortFrom(local.Addr().Unmap(), local.Port()), server, fdInode(t, fd)}
}

// boundToLo makes a socket bound to the "lo" device, which the exact lookup
// (idiag_if 0) cannot see, so only the dump fallback finds it.
func boundToLo(t *testing.T, network string) testFlow {
	switch network {
	case "udp4":
		s := udpServer(t, "udp4", "127.0.0.1:0")
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatalf("socket: %v", err)
		}
		t.Cleanup(func() { unix.Close(fd) })
		if err := unix.BindToDevice(fd, "lo"); err != nil {
			t.Fatalf("SO_BINDTODEVICE: %v", err)
		}
		sp := addrPortOf(t, s.LocalAddr())
		if err := unix.Connect(fd, &unix.SockaddrInet4{Port: int(sp.Port()), Addr: sp.Addr().As4()}); err != nil {
			t.Fatalf("connect: %v", err)
		}
		sa, _ := unix.Getsockname(fd)
		return testFlow{"udp", sockaddrAddrPort(t, sa), sp, fdInode(t, fd)}
	default: // tcp4
		ln := mustListen(t, "tcp4", "127.0.0.1:0")
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatalf("socket: %v", err)
		}
		t.Cleanup(func() { unix.Close(fd) })
		if err := unix.BindToDevice(fd, "lo"); err != nil {
			t.Fatalf("SO_BINDTODEVICE: %v", err)
		}
		sp := addrPortOf(t, ln.Addr())
		if err := unix.Connect(fd, &unix.SockaddrInet4{Port: int(sp.Port()), Addr: sp.Addr().As4()}); err != nil {
			t.Fatalf("connect: %v", err)
		}
		sa, _ := unix.Getsockname(fd)
		return testFlow{"tcp", sockaddrAddrPort(t, sa), sp, fdInode(t, fd)}
	}
}

// synSent leaves a TCP socket in SYN_SENT, the state a sandbox socket is in
// while tunwall holds its handshake: the listener's backlog of 0 is filled by
// a first connection, so the kernel drops the second one's SYNs.
func synSent(t *testing.T) testFlow {
	lfd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("socket: %v", err)
	}
	t.Cleanup(func() { unix.Close(lfd) })
	if err := unix.Bind(lfd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatalf("bind: %v", err)
	}
	if err := unix.Listen(lfd, 0); err != nil {
		t.Fatalf("listen: %v", err)
	}
	lsa, _ := unix.Getsockname(lfd)
	server := sockaddrAddrPort(t, lsa)
	var last testFlow
	for i := 0; i < 3; i++ { // the first fills the queue; later ones hang in SYN_SENT
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
		if err != nil {
			t.Fatalf("socket: %v", err)
		}
		t.Cleanup(func() { unix.Close(fd) })
		err = unix.Connect(fd, &unix.SockaddrInet4{Port: int(server.Port()), Addr: server.Addr().As4()})
		if err != nil && err != unix.EINPROGRESS {
			t.Fatalf("connect: %v", err)
		}
		sa, _ := unix.Getsockname(fd)
		last = testFlow{"tcp", sockaddrAddrPort(t, sa), server, fdInode(t, fd)}
	}
	return last
}

func TestLookupFindsSocketsOfThisProcess(t *testing.T) {
	requireRoot(t)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	lo4 := netip.MustParseAddr("127.0.0.1")
	lo6 := netip.MustParseAddr("::1")
	tests := []struct {
		name string
		open func(t *testing.T) testFlow
		want strategy
	}{
		{"a TCP client over IPv4 loopback is found by the first exact lookup",
			func(t *testing.T) testFlow { return tcpClient(t, "tcp4", "127.0.0.1:0") }, firstExact},
		{"a TCP client over IPv6 loopback is found by the first exact lookup",
			func(t *testing.T) testFlow { return tcpClient(t, "tcp6", "[::1]:0") }, firstExact},
		{"a TCP socket still in SYN_SENT is found by the first exact lookup",
			synSent, firstExact},
		{"a connected IPv4 UDP socket is found with the kernel's swapped UDP order first",
			func(t *testing.T) testFlow { return udpConnected(t, "udp4", "127.0.0.1:0") }, firstExact},
		{"a connected IPv6 UDP socket is found with the kernel's swapped UDP order first",
			func(t *testing.T) testFlow { return udpConnected(t, "udp6", "[::1]:0") }, firstExact},
		{"an unconnected UDP socket bound to 0.0.0.0 is found by a packet's 4-tuple",
			func(t *testing.T) testFlow { return udpUnconnected(t, "udp4", "0.0.0.0:0", "127.0.0.1:0", lo4) }, firstExact},
		{"an unconnected UDP socket bound to 127.0.0.1 is found by a packet's 4-tuple",
			func(t *testing.T) testFlow { return udpUnconnected(t, "udp4", "127.0.0.1:0", "127.0.0.1:0", lo4) }, firstExact},
		{"an unconnected IPv6-only UDP socket bound to [::] is found by a packet's 4-tuple",
			func(t *testing.T) testFlow { return udpUnconnected(t, "udp6", "[::]:0", "[::1]:0", lo6) }, firstExact},
		{"a dual-stack IPv6 TCP socket connected to a v4-mapped address is found in the IPv4 tables",
			func(t *testing.T) testFlow {
				ln := mustListen(t, "tcp4", "127.0.0.1:0")
				return rawDualStack(t, unix.SOCK_STREAM, addrPortOf(t, ln.Addr()), false)
			}, firstExact},
		{"a dual-stack IPv6 UDP socket connected to a v4-mapped address is found in the IPv4 tables",
			func(t *testing.T) testFlow {
				s := udpServer(t, "udp4", "127.0.0.1:0")
				return rawDualStack(t, unix.SOCK_DGRAM, addrPortOf(t, s.LocalAddr()), false)
			}, firstExact},
		{"an unconnected dual-stack UDP socket bound to [::] sending IPv4 is found in the IPv4 tables",
			func(t *testing.T) testFlow {
				s := udpServer(t, "udp4", "127.0.0.1:0")
				return rawDualStack(t, unix.SOCK_DGRAM, addrPortOf(t, s.LocalAddr()), true)
			}, firstExact},
		{"a UDP socket bound to a device is found only by the dump fallback",
			func(t *testing.T) testFlow { return boundToLo(t, "udp4") }, dumpFallback},
		{"a TCP socket bound to a device is found only by the dump fallback",
			func(t *testing.T) testFlow { return boundToLo(t, "tcp4") }, dumpFallback},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := tt.open(t)
			r := newTestResolver(t, Config{})
			before := hitsOf(r)
			got := r.Lookup(f.proto, f.local, f.remote)
			t.Logf("Lookup(%s, %v, %v) = %+v", f.proto, f.local, f.remote, got)
			want := Owner{
				PID: os.Getpid(), NSPID: os.Getpid(), Comm: expectedComm(os.Args[0]), Exe: exe,
				UID: uint32(os.Geteuid()), Inode: f.inode,
			}
			if got != want {
				t.Fatalf("Lookup = %+v, want %+v", got, want)
			}
			after := hitsOf(r)
			if after[tt.want] != before[tt.want]+1 {
				t.Errorf("found by %v? hits before %v, after %v (index %d should grow by 1)", tt.want, before, after, tt.want)
			}
		})
	}
}

func TestSynSentHelperReallyLeavesSynSent(t *testing.T) {
	requireRoot(t)
	f := synSent(t)
	r := newTestResolver(t, Config{})
	s, err := r.findSocket(unix.IPPROTO_TCP, f.local, f.remote, farDeadline())
	if err != nil {
		t.Fatalf("findSocket: %v", err)
	}
	const tcpSynSent = 2
	if s.state != tcpSynSent || s.inode != f.inode {
		t.Fatalf("socket state %d inode %d, want SYN_SENT (2) inode %d", s.state, s.inode, f.inode)
	}
}

func TestLookupMapsSwappedOrderMatchesToTheRightSocket(t *testing.T) {
	requireRoot(t)
	// A UDP server and client in one process: the swapped (TCP-style) order
	// names the server's 4-tuple as a packet source, and would find the
	// server socket if matchScore did not check the reply.
	s := udpServer(t, "udp4", "127.0.0.1:0")
	c, err := net.DialUDP("udp4", nil, s.LocalAddr().(*net.UDPAddr))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := newTestResolver(t, Config{})
	client := r.Lookup("udp", addrPortOf(t, c.LocalAddr()), addrPortOf(t, c.RemoteAddr()))
	server := r.Lookup("udp", addrPortOf(t, s.LocalAddr()), addrPortOf(t, c.LocalAddr()))
	if client.Inode != connInode(t, c) {
		t.Errorf("client flow: inode %d, want client socket %d", client.Inode, connInode(t, c))
	}
	if server.Inode != connInode(t, s) {
		t.Errorf("server-side flow: inode %d, want server socket %d", server.Inode, connInode(t, s))
	}
}
