package stack

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tunwall/tunwall/stack/internal/rt"
	"github.com/tunwall/tunwall/stack/internal/tunlink"
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

	"github.com/tunwall/tunwall/flow"
)

// Proto is a flow's transport protocol: flow's, the one type the policy,
// the engine and the audit log use too.
type Proto = flow.Proto

// Transport protocols.
const (
	TCP = flow.TCP
	UDP = flow.UDP
)

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
	// TCP runs on its own goroutine for each SYN, with the flow's request
	// (see TCPRequest): dial upstream first, then accept and relay, or
	// read the sandbox's side itself. Returning without accepting resets
	// the sandbox's connection. ctx is cancelled when the Stack closes.
	TCP(ctx context.Context, r TCPRequest)

	// UDP runs on the packet-dispatch goroutine for the first datagram of a
	// new session and must not block. ok=false makes the stack answer with
	// ICMP port unreachable. Otherwise serve runs on a goroutine the Stack
	// owns, with the sandbox's side of the session (connected to f.Src; the
	// first datagram is already queued on it). serve must return when ctx is
	// cancelled; the Stack closes c after serve returns, unless serve handed
	// it to StartRelayUDP.
	UDP(f Flow) (serve func(ctx context.Context, s UDPSession), ok bool)

	// Refused is told of each flow the Stack refused at one of its limits
	// (err wraps ErrTooManyTCPFlows, ErrTooManyHandshakes,
	// ErrTooManyUDPSessions or ErrMemoryBudget), so that it can be
	// recorded; the sandbox gets an RST or ICMP port unreachable. Like UDP
	// it may run on the packet-dispatch goroutine and must not block.
	Refused(f Flow, err error)
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
	// Sources are the addresses the sandbox's packets may come from (its
	// own /32 and /128). Every other packet is dropped and counted before
	// gVisor sees it: a spoofed source could otherwise open flows and hold
	// handshakes under addresses no socket in the sandbox owns. IPv6
	// link-local and unspecified sources (the sandbox kernel's own NDP and
	// MLD) are dropped too, and counted apart. Empty means no filtering
	// (for unit tests; tunwall always sets it).
	Sources []netip.Prefix
	// MaxTCPFlows bounds concurrent TCP flows, from SYN to close: a SYN
	// beyond it is reset at once and Handler.Refused is told. 0 means
	// 16384.
	MaxTCPFlows int
	// MaxUDPSessions bounds concurrent UDP sessions: a datagram that would
	// start one more is answered with ICMP port unreachable and
	// Handler.Refused is told. 0 means 16384.
	MaxUDPSessions int
	// MaxInFlightTCP bounds TCP flows whose Handler.TCP has not yet called
	// accept (or given up): being dialled, or in the sandbox's handshake.
	// A SYN beyond it is reset at once and counted. 0 means 16384.
	MaxInFlightTCP int
	// MaxInFlightPerDest bounds the TCP flows in flight to one destination
	// (address and port): a SYN beyond it is reset at once, counted and
	// told to Handler.Refused, so that a burst to one host leaves the
	// others their slots. 0 means MaxInFlightTCP (no share of its own).
	MaxInFlightPerDest int
	// HandshakeTimeout bounds the sandbox's side of the TCP handshake: a
	// SYN-ACK it does not acknowledge within this long fails accept and
	// frees the flow's slot (gVisor alone would retransmit for two
	// minutes). 0 means 5s.
	HandshakeTimeout time.Duration
	// BufferBudget bounds the bytes the gVisor buffers of all live flows
	// may hold together (TCP send and receive buffers, UDP receive
	// buffers): each buffer's limit is the budget divided among them, at
	// most TCPBuffer and at least 2 KiB, so buffers shrink as flows grow.
	// Buffers that filled before flows grew keep what they hold until it is
	// read, so in the worst case (flows ramping up to the flow limit, each
	// stalling full) the buffers hold up to about three times the budget.
	// 0 means 16 MiB.
	BufferBudget int
	// MemoryLimit is the process's memory target. When the memory the Go
	// runtime holds in live objects and stacks passes five eighths of it
	// (the caller sets the runtime's soft limit above that), new flows
	// are refused (ErrMemoryBudget, Handler.Refused) until it falls back.
	// 0 means no such check.
	MemoryLimit int64
	// MemoryHigh, when not nil, is where the memory watch keeps its
	// verdict (past the mark: true), for others of the process to read;
	// nil keeps it in the Stack (Stack.MemoryHigh).
	MemoryHigh *atomic.Bool
	// TimeWait is how long a TCP endpoint that closed first lingers in
	// TIME_WAIT. A new SYN reusing the 4-tuple of an endpoint in TIME_WAIT is
	// only handed to listening endpoints, which a forwarding stack has none
	// of, so a long TIME_WAIT makes such a connect hang until it expires.
	// 0 means 1s.
	TimeWait time.Duration
	// TCPBuffer is the maximum send and receive buffer of each sandbox-side
	// TCP endpoint (auto-tuned up to this, while the BufferBudget allows).
	// 0 means 2 MiB: as fast as 4 MiB on a TUN (whose round trip is tens of
	// microseconds) and 6 MiB less at the peak of a transfer (issue 25).
	TCPBuffer int
	// CongestionControl is "cubic" or "reno"; "" means "cubic".
	CongestionControl string
}

// Stats are counters of what the stack did with packets and flows, and
// gauges ("now") of what it holds. All are read atomically.
type Stats struct {
	TCPFlows          uint64 // SYNs handed to Handler.TCP
	UDPFlows          uint64 // UDP sessions handed to Handler.UDP
	UDPRefused        uint64 // UDP sessions the Handler refused (ICMP unreachable sent)
	ICMPEchoReject    uint64 // ICMP echo requests answered with "administratively prohibited"
	Malformed         uint64 // packets dropped as malformed (bad headers, lengths or checksums)
	ForeignSource     uint64 // packets dropped because their source is not the sandbox's
	LinkLocalSource   uint64 // IPv6 packets from link-local or unspecified sources, dropped
	TCPLive           uint64 // now: live TCP flows (MaxTCPFlows)
	UDPLive           uint64 // now: live UDP sessions (MaxUDPSessions)
	TCPLimitReset     uint64 // SYNs reset because MaxTCPFlows flows were live
	UDPLimitRefused   uint64 // UDP sessions refused because MaxUDPSessions were live
	MemoryRefused     uint64 // flows refused because memory in use neared MemoryLimit
	TCPInFlight       uint64 // now: TCP flows not yet accepted (dialling or handshaking)
	TCPInFlightReset  uint64 // SYNs reset because MaxInFlightTCP flows were in flight
	TCPDestReset      uint64 // SYNs reset because MaxInFlightPerDest flows to their destination were in flight
	TCPInFlightDrop   uint64 // SYNs gVisor dropped at its own in-flight limit
	HandshakeTimeouts uint64 // handshakes the sandbox did not complete within HandshakeTimeout
	InvalidSegments   uint64 // TCP segments gVisor rejected as invalid
	BufferCap         uint64 // now: the most bytes one flow buffer may hold
	TimeWaitReopened  uint64 // TIME_WAIT endpoints a new SYN on their tuple ended (timewait.go)
}

// Stack is gVisor netstack serving one TUN.
type Stack struct {
	cfg  Config
	log  *slog.Logger
	ns   *gstack.Stack
	link *filterLink
	// vnetLink is the TUN endpoint when the TUN carries virtio-net
	// headers, else nil (fdbased's).
	vnetLink *tunlink.Endpoint
	ctx      context.Context
	cancel   context.CancelFunc

	mu     sync.Mutex // guards closed and flows.Add
	closed bool
	flows  sync.WaitGroup

	poller *rt.Poller
	pumps  *rt.Runner
	budget *rt.Budget
	warm   *rt.WarmPool // goroutines for flows and pumps, stacks grown

	tcpFlows, udpFlows, udpRefused atomic.Uint64
	inFlight, tcpLive, udpLive     atomic.Int64
	tcpLimitReset, udpLimitRefused atomic.Uint64
	memHigh                        *atomic.Bool // Config.MemoryHigh, or one of its own
	memRefused                     atomic.Uint64
	memWatchDone                   chan struct{}
	inFlightReset                  atomic.Uint64
	destReset                      atomic.Uint64
	perDest                        destCounts
	handshakeTimeouts              atomic.Uint64
	timeWaitReopened               atomic.Uint64

	closeOnce sync.Once
	closeErr  error
	done      chan struct{}
	peerGone  chan struct{}
	goneOnce  sync.Once
	stopFDs   []int // the link's eventfds (linkStopFDs), closed by Close
}

const nicID tcpip.NICID = 1

// New starts a Stack on cfg.FD.
func New(cfg Config) (_ *Stack, err error) {
	if cfg, err = cfg.withDefaults(); err != nil {
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	routeGVisorLog(cfg.Logger)

	s := &Stack{cfg: cfg, log: log, done: make(chan struct{}), peerGone: make(chan struct{}), memHigh: cfg.MemoryHigh}
	if s.memHigh == nil {
		s.memHigh = new(atomic.Bool)
	}
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
	if s.poller, err = rt.NewPoller(); err != nil {
		return nil, err
	}
	s.warm = rt.NewWarmPool()
	s.pumps = rt.NewRunner(rt.MaxGoroutines(), s.warm.Run)
	defer func() {
		if err != nil {
			s.poller.Close()
		}
	}()
	s.budget = rt.NewBudget(cfg.BufferBudget, minBuffer, cfg.TCPBuffer, s.setBufferCeiling)
	s.startMemoryWatch()
	ep, vnet, err := s.newLinkEndpoint(cfg)
	if err != nil {
		return nil, err
	}
	if s.vnetLink != nil {
		s.stopFDs = s.vnetLink.StopFDs()
	} else {
		s.stopFDs = linkStopFDs(ep)
	}
	defer func() {
		if err != nil {
			closeStopFDs(s.stopFDs) // after ns.Destroy (deferred earlier, run later)
		}
	}()
	s.link = newFilterLink(ep, cfg.FD, cfg.Sources)
	s.link.vnet = vnet
	s.link.onSYN = s.reopenTimeWait
	s.installTransportHandlers()
	if err := s.attachNIC(); err != nil {
		return nil, err
	}

	log.Debug("stack started", "mtu", cfg.MTU, "max_tcp_flows", cfg.MaxTCPFlows, "max_udp_sessions", cfg.MaxUDPSessions, "max_inflight_tcp", cfg.MaxInFlightTCP, "handshake_timeout", cfg.HandshakeTimeout,
		"buffer_budget", cfg.BufferBudget, "time_wait", cfg.TimeWait, "cc", cfg.CongestionControl, "sources", cfg.Sources)
	return s, nil
}

// newLinkEndpoint returns the link endpoint for cfg.FD, and whether its
// packets carry a virtio-net header. A TUN opened with IFF_VNET_HDR (as
// tun.Setup opens it, with checksum and TCP segmentation offloads) gets
// tunlink's endpoint, which hands gVisor's TCP segments to the TUN with
// partial checksums and takes the sandbox's unchecksummed ones; any other
// descriptor (a TUN without the header, a socket pair in tests) gets
// gVisor's fdbased endpoint. Both read the TUN on a dedicated goroutine and
// deliver through per-connection processor goroutines.
func (s *Stack) newLinkEndpoint(cfg Config) (gstack.LinkEndpoint, bool, error) {
	vnet, err := hasVnetHdr(cfg.FD)
	if err != nil {
		return nil, false, err
	}
	if vnet {
		ep, err := tunlink.New(tunlink.Options{
			FD:  cfg.FD,
			MTU: cfg.MTU,
			// As below; partial checksums (the offload) are not verified
			// either.
			RXChecksumOffload: true,
			ClosedFunc:        s.onLinkClosed,
		})
		if err != nil {
			return nil, false, fmt.Errorf("stack: TUN endpoint: %w", err)
		}
		s.vnetLink = ep
		return ep, true, nil
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
		return nil, false, fmt.Errorf("stack: fdbased endpoint: %w", err)
	}
	return ep, false, nil
}

// hasVnetHdr reports whether fd is a TUN opened with IFF_VNET_HDR; a
// descriptor that is not a TUN has none.
func hasVnetHdr(fd int) (bool, error) {
	ifr, err := unix.NewIfreq("")
	if err != nil {
		return false, err
	}
	if err := unix.IoctlIfreq(fd, unix.TUNGETIFF, ifr); err != nil {
		if errors.Is(err, unix.ENOTTY) || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.EBADFD) {
			return false, nil
		}
		return false, fmt.Errorf("stack: TUNGETIFF: %w", err)
	}
	return ifr.Uint16()&unix.IFF_VNET_HDR != 0, nil
}

// withDefaults rejects a Config New cannot run with and fills the
// documented defaults of its zero fields.
func (cfg Config) withDefaults() (Config, error) {
	if cfg.Handler == nil {
		return cfg, errors.New("stack: Config.Handler is required")
	}
	if cfg.MTU < 1280 || cfg.MTU > 65535 {
		return cfg, fmt.Errorf("stack: MTU %d out of range 1280-65535", cfg.MTU)
	}
	if cfg.FD < 0 {
		return cfg, fmt.Errorf("stack: bad FD %d", cfg.FD)
	}
	if cfg.MaxTCPFlows == 0 {
		cfg.MaxTCPFlows = 16384
	}
	if cfg.MaxUDPSessions == 0 {
		cfg.MaxUDPSessions = 16384
	}
	if cfg.MaxInFlightTCP == 0 {
		cfg.MaxInFlightTCP = 16384
	}
	if cfg.MaxInFlightPerDest <= 0 {
		cfg.MaxInFlightPerDest = cfg.MaxInFlightTCP
	}
	if cfg.HandshakeTimeout == 0 {
		cfg.HandshakeTimeout = 5 * time.Second
	}
	if cfg.BufferBudget == 0 {
		cfg.BufferBudget = 16 << 20
	}
	if cfg.TimeWait == 0 {
		cfg.TimeWait = time.Second
	}
	if cfg.TCPBuffer == 0 {
		cfg.TCPBuffer = 2 << 20
	}
	if cfg.CongestionControl == "" {
		cfg.CongestionControl = "cubic"
	}
	return cfg, nil
}

// MemoryHigh reports whether the memory in use is past the mark where new
// flows are refused (Config.MemoryLimit; false without one).
func (s *Stack) MemoryHigh() bool { return s.memHigh.Load() }

// startMemoryWatch starts the process-memory watcher when a MemoryLimit
// is set (taking its first reading before the first flow); without one
// it marks the watcher done at once.
func (s *Stack) startMemoryWatch() {
	s.memWatchDone = make(chan struct{})
	if s.cfg.MemoryLimit > 0 {
		m := rt.NewMemWatch(s.cfg.MemoryLimit)
		s.memHigh.Store(m.High()) // before the first flow
		go func() {
			defer close(s.memWatchDone)
			m.Watch(s.ctx.Done(), s.memHigh)
		}()
	} else {
		close(s.memWatchDone)
	}
}

// installTransportHandlers routes TCP SYNs to handleTCP, UDP to
// handleUDP (after dropping and counting datagrams whose length field
// lies), and answers ICMPv6 echo requests with admin-prohibited.
func (s *Stack) installTransportHandlers() {
	// gVisor drops SYNs silently beyond its own in-flight limit; ours
	// (handleTCP) resets them, so gVisor's is set above it.
	//
	// A new connection's receive buffer (and the window its SYN-ACK
	// advertises, which gVisor never shrinks) starts small: what the
	// sandbox sends into that window is held whatever the budget says
	// later, and a big first window on every connection is a lot of
	// memory for a sandbox that sends and stalls. Auto-tuning grows the
	// buffer (to the budget's cap) as soon as the relay reads.
	tcpFwd := tcp.NewForwarder(s.ns, initialRcvBuffer, s.cfg.MaxInFlightTCP+1024, s.forwardTCP)
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
}

// attachNIC creates the single NIC on s.link, accepting every
// destination (promiscuous) and source (spoofing), and routes all of
// IPv4 and IPv6 to it.
func (s *Stack) attachNIC() error {
	if e := s.ns.CreateNICWithOptions(nicID, s.link, gstack.NICOptions{Name: "tun"}); e != nil {
		return wrapTCPIP("create NIC", e)
	}
	if e := s.ns.SetPromiscuousMode(nicID, true); e != nil {
		return wrapTCPIP("promiscuous mode", e)
	}
	if e := s.ns.SetSpoofing(nicID, true); e != nil {
		return wrapTCPIP("spoofing", e)
	}
	s.ns.SetRouteTable([]tcpip.Route{
		{Destination: header.IPv4EmptySubnet, NIC: nicID},
		{Destination: header.IPv6EmptySubnet, NIC: nicID},
	})
	return nil
}

// setOptions applies the TCP tuning. An option that fails to apply is a
// startup error: a security tool does not run half-configured.
func (s *Stack) setOptions() error {
	sack := tcpip.TCPSACKEnabled(true)
	mod := tcpip.TCPModerateReceiveBufferOption(true)
	tw := tcpip.TCPTimeWaitTimeoutOption(s.cfg.TimeWait)
	cc := tcpip.CongestionControlOption(s.cfg.CongestionControl)
	rcv := tcpip.TCPReceiveBufferSizeRangeOption{Min: minBuffer, Default: min(defaultBuffer, s.cfg.TCPBuffer), Max: s.cfg.TCPBuffer}
	snd := tcpip.TCPSendBufferSizeRangeOption{Min: minBuffer, Default: min(defaultBuffer, s.cfg.TCPBuffer), Max: s.cfg.TCPBuffer}
	// A connection tunwall closed that the sandbox never closes lingers in
	// FIN_WAIT_2 this long (gVisor's default is a minute).
	linger := tcpip.TCPLingerTimeoutOption(finWait2Timeout)
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
		{"FIN_WAIT_2 timeout", &linger},
	}
	for _, o := range opts {
		if e := s.ns.SetTransportProtocolOption(tcp.ProtocolNumber, o.opt); e != nil {
			return wrapTCPIP("set TCP option "+o.name, e)
		}
	}
	return nil
}

// Buffer sizes: every flow buffer may hold at least minBuffer; new TCP
// connections start at defaultBuffer (or less, when the budget says so).
const (
	minBuffer        = 2 << 10
	initialRcvBuffer = 4 << 10
	defaultBuffer    = 256 << 10
	finWait2Timeout  = 5 * time.Second
)

// setBufferCeiling is the budget's hook: it sets what gVisor's auto-tuning
// may grow a TCP buffer to, and where new connections start.
func (s *Stack) setBufferCeiling(max int) {
	rcv := tcpip.TCPReceiveBufferSizeRangeOption{Min: minBuffer, Default: min(defaultBuffer, max), Max: max}
	snd := tcpip.TCPSendBufferSizeRangeOption{Min: minBuffer, Default: min(defaultBuffer, max), Max: max}
	if e := s.ns.SetTransportProtocolOption(tcp.ProtocolNumber, &rcv); e != nil {
		s.log.Warn("set TCP receive buffer range", "err", e)
	}
	if e := s.ns.SetTransportProtocolOption(tcp.ProtocolNumber, &snd); e != nil {
		s.log.Warn("set TCP send buffer range", "err", e)
	}
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
		closeStopFDs(s.stopFDs) // the readers have stopped: gVisor never closes them
		s.poller.Close()        // every relay has ended and left it
		s.warm.Close()          // no flow or pump runs any more
		<-s.memWatchDone
		s.closeErr = unix.Close(s.cfg.FD) // only now: nothing reads it any more
		close(s.done)
	})
	return s.closeErr
}

// vnetMalformed counts the packets the TUN endpoint dropped for a
// virtio-net header that did not fit them.
func (s *Stack) vnetMalformed() uint64 {
	if s.vnetLink == nil {
		return 0
	}
	return s.vnetLink.Malformed()
}

// Stats returns the stack's counters.
func (s *Stack) Stats() Stats {
	st := s.ns.Stats()
	capBytes, _ := s.budget.Current()
	return Stats{
		TCPFlows:       s.tcpFlows.Load(),
		UDPFlows:       s.udpFlows.Load(),
		UDPRefused:     s.udpRefused.Load(),
		ICMPEchoReject: s.link.echoRejected.Load(),
		Malformed: s.link.malformed.Load() + s.vnetMalformed() +
			st.IP.MalformedPacketsReceived.Value() +
			st.IP.MalformedFragmentsReceived.Value() +
			st.NICs.MalformedL4RcvdPackets.Value() +
			st.TCP.ChecksumErrors.Value() +
			st.UDP.MalformedPacketsReceived.Value() +
			st.UDP.ChecksumErrors.Value() +
			st.ICMP.V4.PacketsReceived.Invalid.Value() +
			st.ICMP.V6.PacketsReceived.Invalid.Value(),
		ForeignSource:     s.link.foreignSrc.Load(),
		LinkLocalSource:   s.link.linkLocalSrc.Load(),
		TCPLive:           uint64(max(s.tcpLive.Load(), 0)),
		UDPLive:           uint64(max(s.udpLive.Load(), 0)),
		TCPLimitReset:     s.tcpLimitReset.Load(),
		UDPLimitRefused:   s.udpLimitRefused.Load(),
		MemoryRefused:     s.memRefused.Load(),
		TCPInFlight:       uint64(max(s.inFlight.Load(), 0)),
		TCPInFlightReset:  s.inFlightReset.Load(),
		TCPDestReset:      s.destReset.Load(),
		TCPInFlightDrop:   st.TCP.ForwardMaxInFlightDrop.Value(),
		HandshakeTimeouts: s.handshakeTimeouts.Load(),
		InvalidSegments:   st.TCP.InvalidSegmentsReceived.Value(),
		BufferCap:         uint64(capBytes),
		TimeWaitReopened:  s.timeWaitReopened.Load(),
	}
}

func addrPort(a tcpip.Address, port uint16) netip.AddrPort {
	ip, _ := netip.AddrFromSlice(a.AsSlice())
	return netip.AddrPortFrom(ip.Unmap(), port)
}
