package stack

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/link/fdbased"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv6"
	gstack "gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/icmp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"
)

// Proto is a flow's transport protocol.
type Proto uint8

// Transport protocols.
const (
	TCP Proto = 1
	UDP Proto = 2
)

func (p Proto) String() string {
	switch p {
	case TCP:
		return "tcp"
	case UDP:
		return "udp"
	}
	return fmt.Sprintf("proto(%d)", uint8(p))
}

// Flow is a new connection (TCP) or session (UDP) the sandbox started: Src is
// the sandbox's socket, Dst the address it asked for.
type Flow struct {
	Proto    Proto
	Src, Dst netip.AddrPort
}

func (f Flow) String() string {
	return f.Proto.String() + " " + f.Src.String() + " -> " + f.Dst.String()
}

// Handler decides and serves flows. It must be safe for concurrent use.
type Handler interface {
	// TCP runs on its own goroutine for each SYN. Dial upstream first, then
	// call accept to complete the sandbox's handshake and get its side of the
	// connection (the caller owns and must close it). Returning without
	// calling accept — or after accept failed — resets the connection. ctx
	// is cancelled when the Stack closes.
	TCP(ctx context.Context, f Flow, accept func() (net.Conn, error))

	// UDP runs on the packet-dispatch goroutine for the first datagram of a
	// new session and must not block. ok=false makes the stack answer with
	// ICMP port unreachable. Otherwise serve runs on a goroutine the Stack
	// owns, with the sandbox's side of the session (connected to f.Src; the
	// first datagram is already queued on it). serve must return when ctx is
	// cancelled; the Stack closes c after serve returns.
	UDP(f Flow) (serve func(ctx context.Context, c net.Conn), ok bool)
}

// Config configures a Stack. Zero values mean the documented defaults.
type Config struct {
	// FD is the TUN descriptor (IFF_TUN|IFF_NO_PI: raw IP packets). The Stack
	// owns it once New returns a nil error and closes it in Close.
	FD int
	// MTU of the TUN. Required; it must match the device's.
	MTU uint32
	// Handler receives every new flow. Required.
	Handler Handler
	// Logger is tunwall's operational log; nil discards.
	Logger *slog.Logger
	// MaxInFlightTCP bounds SYNs whose Handler.TCP has not yet called accept
	// (or given up). Extra SYNs are dropped and counted; the sandbox's kernel
	// retransmits them. 0 means 1024.
	MaxInFlightTCP int
	// TimeWait is how long a TCP endpoint that closed first lingers in
	// TIME_WAIT. A new SYN reusing the 4-tuple of an endpoint in TIME_WAIT is
	// only handed to listening endpoints, which a forwarding stack has none
	// of, so a long TIME_WAIT makes such a connect hang until it expires.
	// 0 means 1s.
	TimeWait time.Duration
	// TCPBuffer is the maximum send and receive buffer of each sandbox-side
	// TCP endpoint (auto-tuned up to this). 0 means 4 MiB.
	TCPBuffer int
	// CongestionControl is "cubic" or "reno"; "" means "cubic".
	CongestionControl string
}

// Stats are counters of what the stack did with packets it did not pass to
// a Handler as a flow. All are read atomically.
type Stats struct {
	TCPFlows        uint64 // SYNs handed to Handler.TCP
	UDPFlows        uint64 // UDP sessions handed to Handler.UDP
	UDPRefused      uint64 // UDP sessions the Handler refused (ICMP unreachable sent)
	ICMPEchoReject  uint64 // ICMP echo requests answered with "administratively prohibited"
	Malformed       uint64 // packets dropped as malformed (bad headers, lengths or checksums)
	TCPInFlightDrop uint64 // SYNs dropped because MaxInFlightTCP were pending
	InvalidSegments uint64 // TCP segments gVisor rejected as invalid
}

// Stack is gVisor netstack serving one TUN.
type Stack struct {
	cfg    Config
	log    *slog.Logger
	ns     *gstack.Stack
	link   *filterLink
	ctx    context.Context
	cancel context.CancelFunc

	mu     sync.Mutex // guards closed and flows.Add
	closed bool
	flows  sync.WaitGroup

	tcpFlows, udpFlows, udpRefused atomic.Uint64

	closeOnce sync.Once
	closeErr  error
	done      chan struct{}
	peerGone  chan struct{}
	goneOnce  sync.Once
}

const nicID tcpip.NICID = 1

// New starts a Stack on cfg.FD.
func New(cfg Config) (_ *Stack, err error) {
	if cfg.Handler == nil {
		return nil, errors.New("stack: Config.Handler is required")
	}
	if cfg.MTU < 1280 || cfg.MTU > 65535 {
		return nil, fmt.Errorf("stack: MTU %d out of range 1280-65535", cfg.MTU)
	}
	if cfg.FD < 0 {
		return nil, fmt.Errorf("stack: bad FD %d", cfg.FD)
	}
	if cfg.MaxInFlightTCP == 0 {
		cfg.MaxInFlightTCP = 1024
	}
	if cfg.TimeWait == 0 {
		cfg.TimeWait = time.Second
	}
	if cfg.TCPBuffer == 0 {
		cfg.TCPBuffer = 4 << 20
	}
	if cfg.CongestionControl == "" {
		cfg.CongestionControl = "cubic"
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	routeGVisorLog(cfg.Logger)

	s := &Stack{cfg: cfg, log: log, done: make(chan struct{}), peerGone: make(chan struct{})}
	s.ctx, s.cancel = context.WithCancel(context.Background())

	s.ns = gstack.New(gstack.Options{
		NetworkProtocols:   []gstack.NetworkProtocolFactory{ipv4.NewProtocol, ipv6.NewProtocol},
		TransportProtocols: []gstack.TransportProtocolFactory{tcp.NewProtocol, udp.NewProtocol, icmp.NewProtocol4, icmp.NewProtocol6},
	})
	defer func() {
		if err != nil {
			s.cancel()
			s.ns.Destroy()
		}
	}()
	if err := s.setOptions(); err != nil {
		return nil, err
	}
	ep, err := fdbased.New(&fdbased.Options{
		FDs: []int{cfg.FD},
		MTU: cfg.MTU,
		// The sandbox's kernel computes full checksums for packets it writes
		// to a TUN without offloads, so verifying them again is wasted work.
		// We must still compute ours: the kernel verifies what it reads.
		RXChecksumOffload: true,
		ClosedFunc:        s.onLinkClosed,
	})
	if err != nil {
		return nil, fmt.Errorf("stack: fdbased endpoint: %w", err)
	}
	s.link = newFilterLink(ep, cfg.FD)
	tcpFwd := tcp.NewForwarder(s.ns, 0, cfg.MaxInFlightTCP, s.handleTCP)
	s.ns.SetTransportProtocolHandler(tcp.ProtocolNumber, tcpFwd.HandlePacket)
	udpFwd := udp.NewForwarder(s.ns, s.handleUDP)
	s.ns.SetTransportProtocolHandler(udp.ProtocolNumber, func(id gstack.TransportEndpointID, pkt *gstack.PacketBuffer) bool {
		u := header.UDP(pkt.TransportHeader().Slice())
		if l := int(u.Length()); l < header.UDPMinimumSize || l > len(u)+pkt.Data().Size() {
			s.link.malformed.Add(1)
			return true
		}
		return udpFwd.HandlePacket(id, pkt)
	})
	s.ns.SetTransportProtocolHandler(header.ICMPv6ProtocolNumber, func(id gstack.TransportEndpointID, pkt *gstack.PacketBuffer) bool {
		h := header.ICMPv6(pkt.TransportHeader().Slice())
		if len(h) < header.ICMPv6MinimumSize || h.Type() != header.ICMPv6EchoRequest {
			return false
		}
		if r, ok := s.ns.NetworkProtocolInstance(header.IPv6ProtocolNumber).(gstack.RejectIPv6WithHandler); ok {
			if r.SendRejectionError(pkt, gstack.RejectIPv6WithICMPAdminProhibited, false) == nil {
				s.link.echoRejected.Add(1)
			}
		}
		return true
	})
	if e := s.ns.CreateNICWithOptions(nicID, s.link, gstack.NICOptions{Name: "tun"}); e != nil {
		return nil, wrapTCPIP("create NIC", e)
	}
	if e := s.ns.SetPromiscuousMode(nicID, true); e != nil {
		return nil, wrapTCPIP("promiscuous mode", e)
	}
	if e := s.ns.SetSpoofing(nicID, true); e != nil {
		return nil, wrapTCPIP("spoofing", e)
	}
	s.ns.SetRouteTable([]tcpip.Route{
		{Destination: header.IPv4EmptySubnet, NIC: nicID},
		{Destination: header.IPv6EmptySubnet, NIC: nicID},
	})

	log.Debug("stack started", "mtu", cfg.MTU, "max_inflight_tcp", cfg.MaxInFlightTCP, "time_wait", cfg.TimeWait, "cc", cfg.CongestionControl)
	return s, nil
}

// setOptions applies the TCP tuning. An option that fails to apply is a
// startup error: a security tool does not run half-configured.
func (s *Stack) setOptions() error {
	sack := tcpip.TCPSACKEnabled(true)
	mod := tcpip.TCPModerateReceiveBufferOption(true)
	tw := tcpip.TCPTimeWaitTimeoutOption(s.cfg.TimeWait)
	cc := tcpip.CongestionControlOption(s.cfg.CongestionControl)
	rcv := tcpip.TCPReceiveBufferSizeRangeOption{Min: 4 << 10, Default: 256 << 10, Max: s.cfg.TCPBuffer}
	snd := tcpip.TCPSendBufferSizeRangeOption{Min: 4 << 10, Default: 256 << 10, Max: s.cfg.TCPBuffer}
	opts := []struct {
		name string
		opt  tcpip.SettableTransportProtocolOption
	}{
		{"SACK", &sack},
		{"receive buffer moderation", &mod},
		{"TIME_WAIT timeout", &tw},
		{"congestion control " + s.cfg.CongestionControl, &cc},
		{"receive buffer range", &rcv},
		{"send buffer range", &snd},
	}
	for _, o := range opts {
		if e := s.ns.SetTransportProtocolOption(tcp.ProtocolNumber, o.opt); e != nil {
			return wrapTCPIP("set TCP option "+o.name, e)
		}
	}
	return nil
}

func wrapTCPIP(op string, e tcpip.Error) error { return fmt.Errorf("stack: %s: %s", op, e) }

// onLinkClosed runs when reading the TUN fails for good: the device is gone
// (its namespace was destroyed) or the descriptor was closed.
func (s *Stack) onLinkClosed(e tcpip.Error) {
	s.goneOnce.Do(func() {
		s.log.Debug("TUN closed", "err", e)
		close(s.peerGone)
	})
}

// PeerGone is closed when the TUN stops delivering packets for good (the
// sandbox's namespace is gone). Owners then call Close.
func (s *Stack) PeerGone() <-chan struct{} { return s.peerGone }

// Done is closed once Close has finished.
func (s *Stack) Done() <-chan struct{} { return s.done }

// startFlow registers a flow goroutine unless the Stack is closing.
func (s *Stack) startFlow() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.flows.Add(1)
	return true
}

// Close stops the stack: flows' contexts are cancelled, the NIC is removed
// (which stops the TUN readers), flow goroutines are waited for, and only then
// is the TUN descriptor closed. It is idempotent and returns after every
// goroutine the Stack started has exited.
func (s *Stack) Close() error {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closed = true
		s.mu.Unlock()
		s.cancel()     // flows derive from s.ctx: dials abort, relays unwind
		s.ns.Close()   // closes every endpoint: relays see errors and return
		s.flows.Wait() // handler goroutines we started
		s.ns.Wait()    // removes the NIC; fdbased readers stop
		s.ns.Destroy()
		s.closeErr = unix.Close(s.cfg.FD) // only now: nothing reads it any more
		close(s.done)
	})
	return s.closeErr
}

// Stats returns the stack's counters.
func (s *Stack) Stats() Stats {
	st := s.ns.Stats()
	return Stats{
		TCPFlows:       s.tcpFlows.Load(),
		UDPFlows:       s.udpFlows.Load(),
		UDPRefused:     s.udpRefused.Load(),
		ICMPEchoReject: s.link.echoRejected.Load(),
		Malformed: s.link.malformed.Load() +
			st.IP.MalformedPacketsReceived.Value() +
			st.IP.MalformedFragmentsReceived.Value() +
			st.NICs.MalformedL4RcvdPackets.Value() +
			st.TCP.ChecksumErrors.Value() +
			st.UDP.MalformedPacketsReceived.Value() +
			st.UDP.ChecksumErrors.Value() +
			st.ICMP.V4.PacketsReceived.Invalid.Value() +
			st.ICMP.V6.PacketsReceived.Invalid.Value(),
		TCPInFlightDrop: st.TCP.ForwardMaxInFlightDrop.Value(),
		InvalidSegments: st.TCP.InvalidSegmentsReceived.Value(),
	}
}

func addrPort(a tcpip.Address, port uint16) netip.AddrPort {
	ip, _ := netip.AddrFromSlice(a.AsSlice())
	return netip.AddrPortFrom(ip.Unmap(), port)
}
