package stack

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"

	"github.com/tunwall/tunwall/internal/leaktest"
)

// Addresses the tests use: documentation ranges only (RFC 5737, RFC 3849).
var (
	sandbox4 = netip.MustParseAddr("192.0.2.10")
	remote4  = netip.MustParseAddr("192.0.2.1")
	sandbox6 = netip.MustParseAddr("2001:db8::10")
	remote6  = netip.MustParseAddr("2001:db8::1")
)

const (
	testMTU = 1500
	// waitFor bounds every wait for something that should happen.
	waitFor = 5 * time.Second
	// quiet is how long we watch for something that should not happen.
	quiet = 300 * time.Millisecond
)

// goroutineLeakCheck fails the test if, after every other cleanup has run,
// goroutines it started still run (leaktest.Check). Register it first so
// its cleanup runs last.
func goroutineLeakCheck(t *testing.T) {
	t.Helper()
	leaktest.Check(t)
}

// peer is the sandbox's end of the socketpair that stands in for the TUN.
type peer struct {
	t  testing.TB
	fd int
}

var errNoPacket = errors.New("no packet before deadline")

func (p *peer) send(b []byte) {
	p.t.Helper()
	if _, err := unix.Write(p.fd, b); err != nil {
		p.t.Fatalf("write packet to stack: %v", err)
	}
}

// recv reads one packet, waiting at most d. It returns io.EOF when the stack
// closed its end.
func (p *peer) recv(d time.Duration) ([]byte, error) {
	fds := []unix.PollFd{{Fd: int32(p.fd), Events: unix.POLLIN}}
	deadline := time.Now().Add(d)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return nil, errNoPacket
		}
		n, err := unix.Poll(fds, int(left/time.Millisecond)+1)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if n == 0 {
			continue
		}
		buf := make([]byte, 65536)
		n, err = unix.Read(p.fd, buf)
		if err != nil {
			return nil, err
		}
		if n == 0 {
			return nil, io.EOF
		}
		return buf[:n], nil
	}
}

// expect returns the first packet matching match, skipping others, or fails.
func (p *peer) expect(what string, match func(pkt) bool) pkt {
	p.t.Helper()
	deadline := time.Now().Add(waitFor)
	for {
		b, err := p.recv(time.Until(deadline))
		if err != nil {
			p.t.Fatalf("waiting for %s: %v", what, err)
		}
		if k, ok := parse(b); ok && match(k) {
			return k
		}
	}
}

// expectNone fails if a packet matching match arrives within d.
func (p *peer) expectNone(what string, d time.Duration, match func(pkt) bool) {
	p.t.Helper()
	deadline := time.Now().Add(d)
	for {
		b, err := p.recv(time.Until(deadline))
		if errors.Is(err, errNoPacket) {
			return
		}
		if err != nil {
			p.t.Fatalf("watching for %s: %v", what, err)
		}
		if k, ok := parse(b); ok && match(k) {
			p.t.Fatalf("got %s, want none: % x", what, b)
		}
	}
}

// pkt is a parsed IP packet the stack sent.
type pkt struct {
	raw      []byte
	src, dst netip.Addr
	proto    tcpip.TransportProtocolNumber
	l4       []byte // transport header and payload
}

func parse(b []byte) (pkt, bool) {
	if len(b) == 0 {
		return pkt{}, false
	}
	switch header.IPVersion(b) {
	case header.IPv4Version:
		ip := header.IPv4(b)
		if !ip.IsValid(len(b)) {
			return pkt{}, false
		}
		return pkt{raw: b, src: addrOf(ip.SourceAddress()), dst: addrOf(ip.DestinationAddress()),
			proto: ip.TransportProtocol(), l4: ip.Payload()}, true
	case header.IPv6Version:
		ip := header.IPv6(b)
		if !ip.IsValid(len(b)) {
			return pkt{}, false
		}
		return pkt{raw: b, src: addrOf(ip.SourceAddress()), dst: addrOf(ip.DestinationAddress()),
			proto: tcpip.TransportProtocolNumber(ip.NextHeader()), l4: ip.Payload()}, true
	}
	return pkt{}, false
}

func addrOf(a tcpip.Address) netip.Addr {
	ip, _ := netip.AddrFromSlice(a.AsSlice())
	return ip
}

func tAddr(a netip.Addr) tcpip.Address { return tcpip.AddrFromSlice(a.AsSlice()) }

// transportValid reports whether a TCP or UDP packet's checksum (with the
// pseudo-header) verifies.
func (k pkt) transportValid() bool {
	xsum := header.PseudoHeaderChecksum(k.proto, tAddr(k.src), tAddr(k.dst), uint16(len(k.l4)))
	return checksum.Checksum(k.l4, xsum) == 0xffff
}

// ipPacket wraps an L4 payload in an IPv4 or IPv6 header (by src's family).
func ipPacket(src, dst netip.Addr, proto tcpip.TransportProtocolNumber, l4 []byte) []byte {
	if src.Is4() {
		b := make([]byte, header.IPv4MinimumSize+len(l4))
		ip := header.IPv4(b)
		ip.Encode(&header.IPv4Fields{
			TotalLength: uint16(len(b)),
			TTL:         64,
			Protocol:    uint8(proto),
			SrcAddr:     tAddr(src),
			DstAddr:     tAddr(dst),
		})
		ip.SetChecksum(^ip.CalculateChecksum())
		copy(b[header.IPv4MinimumSize:], l4)
		return b
	}
	b := make([]byte, header.IPv6MinimumSize+len(l4))
	header.IPv6(b).Encode(&header.IPv6Fields{
		PayloadLength:     uint16(len(l4)),
		TransportProtocol: proto,
		HopLimit:          64,
		SrcAddr:           tAddr(src),
		DstAddr:           tAddr(dst),
	})
	copy(b[header.IPv6MinimumSize:], l4)
	return b
}

// tcpPacket builds a TCP segment in an IP packet, with a correct checksum.
func tcpPacket(src, dst netip.AddrPort, seq, ack uint32, flags header.TCPFlags, opts, payload []byte) []byte {
	hl := header.TCPMinimumSize + len(opts)
	t := make([]byte, hl+len(payload))
	header.TCP(t).Encode(&header.TCPFields{
		SrcPort: src.Port(), DstPort: dst.Port(),
		SeqNum: seq, AckNum: ack,
		DataOffset: uint8(hl),
		Flags:      flags,
		WindowSize: 65535,
	})
	copy(t[header.TCPMinimumSize:], opts)
	copy(t[hl:], payload)
	xsum := header.PseudoHeaderChecksum(header.TCPProtocolNumber, tAddr(src.Addr()), tAddr(dst.Addr()), uint16(len(t)))
	header.TCP(t).SetChecksum(^checksum.Checksum(t, xsum))
	return ipPacket(src.Addr(), dst.Addr(), header.TCPProtocolNumber, t)
}

// synOpts is an MSS option of 1460.
var synOpts = []byte{header.TCPOptionMSS, 4, 0x05, 0xb4}

func synPacket(src, dst netip.AddrPort, iss uint32) []byte {
	return tcpPacket(src, dst, iss, 0, header.TCPFlagSyn, synOpts, nil)
}

// udpPacket builds a UDP datagram in an IP packet, with a correct checksum.
func udpPacket(src, dst netip.AddrPort, payload []byte) []byte {
	u := make([]byte, header.UDPMinimumSize+len(payload))
	header.UDP(u).Encode(&header.UDPFields{SrcPort: src.Port(), DstPort: dst.Port(), Length: uint16(len(u))})
	copy(u[header.UDPMinimumSize:], payload)
	xsum := header.PseudoHeaderChecksum(header.UDPProtocolNumber, tAddr(src.Addr()), tAddr(dst.Addr()), uint16(len(u)))
	header.UDP(u).SetChecksum(^checksum.Checksum(u, xsum))
	return ipPacket(src.Addr(), dst.Addr(), header.UDPProtocolNumber, u)
}

// echoPacket builds an ICMP (v4 or v6) echo request.
func echoPacket(src, dst netip.Addr, id, seq uint16, data []byte) []byte {
	if src.Is4() {
		b := make([]byte, header.ICMPv4MinimumSize+len(data))
		ic := header.ICMPv4(b)
		ic.SetType(header.ICMPv4Echo)
		ic.SetIdent(id)
		ic.SetSequence(seq)
		copy(ic.Payload(), data)
		ic.SetChecksum(^checksum.Checksum(b, 0))
		return ipPacket(src, dst, header.ICMPv4ProtocolNumber, b)
	}
	b := make([]byte, header.ICMPv6EchoMinimumSize+len(data))
	ic := header.ICMPv6(b)
	ic.SetType(header.ICMPv6EchoRequest)
	ic.SetIdent(id)
	ic.SetSequence(seq)
	copy(b[header.ICMPv6EchoMinimumSize:], data)
	ic.SetChecksum(header.ICMPv6Checksum(header.ICMPv6ChecksumParams{Header: ic, Src: tAddr(src), Dst: tAddr(dst)}))
	return ipPacket(src, dst, header.ICMPv6ProtocolNumber, b)
}

// isTCP matches TCP packets from -> to.
func isTCP(from, to netip.AddrPort) func(pkt) bool {
	return func(k pkt) bool {
		if k.proto != header.TCPProtocolNumber || k.src != from.Addr() || k.dst != to.Addr() || len(k.l4) < header.TCPMinimumSize {
			return false
		}
		t := header.TCP(k.l4)
		return t.SourcePort() == from.Port() && t.DestinationPort() == to.Port()
	}
}

func isUDP(from, to netip.AddrPort) func(pkt) bool {
	return func(k pkt) bool {
		if k.proto != header.UDPProtocolNumber || k.src != from.Addr() || k.dst != to.Addr() || len(k.l4) < header.UDPMinimumSize {
			return false
		}
		u := header.UDP(k.l4)
		return u.SourcePort() == from.Port() && u.DestinationPort() == to.Port()
	}
}

func isICMP(k pkt) bool {
	return k.proto == header.ICMPv4ProtocolNumber || k.proto == header.ICMPv6ProtocolNumber
}

func anyPacket(pkt) bool { return true }

// tcpClient is the sandbox's side of one TCP connection, just enough TCP to
// complete a handshake and receive data.
type tcpClient struct {
	p        *peer
	src, dst netip.AddrPort
	iss      uint32
	sndNxt   uint32 // next sequence number we send
	rcvNxt   uint32 // next sequence number we expect
}

func newTCPClient(p *peer, src, dst netip.AddrPort) *tcpClient {
	return &tcpClient{p: p, src: src, dst: dst, iss: 1000, sndNxt: 1001}
}

func (c *tcpClient) syn() { c.p.send(synPacket(c.src, c.dst, c.iss)) }

func (c *tcpClient) fromStack() func(pkt) bool { return isTCP(c.dst, c.src) }

// expectSynAck waits for the SYN-ACK and checks it answers our SYN.
func (c *tcpClient) expectSynAck(t testing.TB) pkt {
	t.Helper()
	k := c.p.expect("SYN-ACK from "+c.dst.String(), c.fromStack())
	h := header.TCP(k.l4)
	if h.Flags() != header.TCPFlagSyn|header.TCPFlagAck {
		t.Fatalf("handshake reply flags = %v, want SYN|ACK", h.Flags())
	}
	if h.AckNumber() != c.iss+1 {
		t.Fatalf("SYN-ACK ack = %d, want %d", h.AckNumber(), c.iss+1)
	}
	if !k.transportValid() {
		t.Errorf("SYN-ACK has a bad checksum")
	}
	c.rcvNxt = h.SequenceNumber() + 1
	return k
}

func (c *tcpClient) ack() {
	c.p.send(tcpPacket(c.src, c.dst, c.sndNxt, c.rcvNxt, header.TCPFlagAck, nil, nil))
}

// handshake runs SYN, SYN-ACK, ACK.
func (c *tcpClient) handshake(t testing.TB) {
	t.Helper()
	c.expectSynAck(t)
	c.ack()
}

// write sends data in one segment.
func (c *tcpClient) write(b []byte) {
	c.p.send(tcpPacket(c.src, c.dst, c.sndNxt, c.rcvNxt, header.TCPFlagAck|header.TCPFlagPsh, nil, b))
	c.sndNxt += uint32(len(b))
}

// readN collects n in-order payload bytes from the stack, ACKing them.
func (c *tcpClient) readN(t testing.TB, n int) []byte {
	t.Helper()
	var got []byte
	for len(got) < n {
		k := c.p.expect("data from "+c.dst.String(), c.fromStack())
		h := header.TCP(k.l4)
		if h.Flags().Contains(header.TCPFlagRst) {
			t.Fatalf("got RST after %d of %d bytes", len(got), n)
		}
		data := h.Payload()
		if len(data) == 0 {
			continue
		}
		if !k.transportValid() {
			t.Fatalf("data segment has a bad checksum")
		}
		if h.SequenceNumber() == c.rcvNxt {
			got = append(got, data...)
			c.rcvNxt += uint32(len(data))
		}
		c.ack()
	}
	return got
}

// fakeHandler hands every flow to the test over channels (wireguard-go
// tuntest style) and does what the test tells it.
type fakeHandler struct {
	tcp      chan *tcpCall
	udp      chan Flow // every Handler.UDP call; buffered, never blocks
	udpOK    bool      // Handler.UDP's verdict; set before New
	sessions chan *udpCall
	refused  chan refusal // every Handler.Refused call; buffered, never blocks
}

// refusal is one Handler.Refused call.
type refusal struct {
	flow Flow
	err  error
}

func (h *fakeHandler) Refused(f Flow, err error) {
	select {
	case h.refused <- refusal{f, err}:
	default:
	}
}

func newFakeHandler() *fakeHandler {
	return &fakeHandler{
		tcp:      make(chan *tcpCall),
		udp:      make(chan Flow, 64),
		sessions: make(chan *udpCall),
		refused:  make(chan refusal, 1024),
	}
}

// tcpCall is one Handler.TCP call, parked until the test sends it an action.
type tcpCall struct {
	ctx    context.Context
	flow   Flow
	accept func() (net.Conn, error)
	act    chan func()
	done   chan struct{} // closed when Handler.TCP returned
}

type acceptResult struct {
	c   net.Conn
	err error
}

func (h *fakeHandler) TCP(ctx context.Context, r TCPRequest) {
	c := &tcpCall{ctx: ctx, flow: r.Flow(), accept: r.Accept, act: make(chan func(), 1), done: make(chan struct{})}
	defer close(c.done)
	select {
	case h.tcp <- c:
	case <-ctx.Done():
		return
	}
	select {
	case fn := <-c.act:
		fn()
	case <-ctx.Done():
	}
}

// refuse makes Handler.TCP return without accepting.
func (c *tcpCall) refuse() { c.act <- func() {} }

// acceptAsync makes Handler.TCP call accept; the result arrives on the
// returned channel once the sandbox completed the handshake.
func (c *tcpCall) acceptAsync() <-chan acceptResult {
	res := make(chan acceptResult, 1)
	c.act <- func() {
		conn, err := c.accept()
		res <- acceptResult{conn, err}
	}
	return res
}

func (h *fakeHandler) nextTCP(t testing.TB) *tcpCall {
	t.Helper()
	select {
	case c := <-h.tcp:
		return c
	case <-time.After(waitFor):
		t.Fatalf("no Handler.TCP call")
		return nil
	}
}

func (h *fakeHandler) noTCP(t testing.TB, d time.Duration) {
	t.Helper()
	select {
	case c := <-h.tcp:
		c.refuse()
		t.Fatalf("unexpected Handler.TCP call for %v", c.flow)
	case <-time.After(d):
	}
}

// udpCall is one serve call, parked until released or cancelled.
type udpCall struct {
	ctx     context.Context
	flow    Flow
	conn    net.Conn
	release chan struct{}
	done    chan struct{} // closed when serve returned
}

func (h *fakeHandler) UDP(f Flow) (func(context.Context, UDPSession), bool) {
	select {
	case h.udp <- f:
	default:
	}
	if !h.udpOK {
		return nil, false
	}
	return func(ctx context.Context, us UDPSession) {
		s := &udpCall{ctx: ctx, flow: f, conn: us.Conn(), release: make(chan struct{}), done: make(chan struct{})}
		defer close(s.done)
		select {
		case h.sessions <- s:
		case <-ctx.Done():
			return
		}
		select {
		case <-s.release:
		case <-ctx.Done():
		}
	}, true
}

func (h *fakeHandler) nextUDP(t testing.TB) Flow {
	t.Helper()
	select {
	case f := <-h.udp:
		return f
	case <-time.After(waitFor):
		t.Fatalf("no Handler.UDP call")
		return Flow{}
	}
}

func (h *fakeHandler) nextSession(t testing.TB) *udpCall {
	t.Helper()
	select {
	case s := <-h.sessions:
		return s
	case <-time.After(waitFor):
		t.Fatalf("no UDP serve call")
		return nil
	}
}

// newTestStack starts a Stack on one end of a SOCK_SEQPACKET socketpair and
// returns the other end as the sandbox. Cleanup closes both.
func newTestStack(t testing.TB, h Handler, mod func(*Config)) (*Stack, *peer) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("socketpair: %v", err)
	}
	cfg := Config{FD: fds[0], MTU: testMTU, Handler: h}
	if mod != nil {
		mod(&cfg)
	}
	s, err := New(cfg)
	if err != nil {
		unix.Close(fds[0])
		unix.Close(fds[1])
		t.Fatalf("New: %v", err)
	}
	p := &peer{t: t, fd: fds[1]}
	t.Cleanup(func() {
		closeWithin(t, s, waitFor)
		unix.Close(p.fd)
	})
	return s, p
}

// closeWithin calls s.Close and fails the test if it errs or hangs; a hung
// Close is left behind so that the remaining tests can still run.
func closeWithin(t testing.TB, s *Stack, d time.Duration) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- s.Close() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Close: %v", err)
		}
	case <-time.After(d):
		t.Errorf("Close did not return within %v", d)
	}
}

// waitStat polls a counter until it reaches want.
func waitStat(t testing.TB, s *Stack, name string, get func(Stats) uint64, want uint64) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for {
		got := get(s.Stats())
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("Stats().%s = %d, want %d", name, got, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
