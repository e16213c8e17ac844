package stack

import (
	"net/netip"
	"sync/atomic"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/link/nested"
	gstack "gvisor.dev/gvisor/pkg/tcpip/stack"

	"github.com/tunwall/tunwall/stack/internal/tunlink"
)

// filterLink sits between the fdbased endpoint and the stack. It drops every
// packet whose source address is not the sandbox's own (spoofed sources
// would otherwise take handshake slots and flows under addresses no socket
// in the sandbox owns), answers ICMP echo requests with "administratively
// prohibited" (a promiscuous gVisor NIC would otherwise drop them silently,
// or answer them itself and pretend every host is up), and counts packets
// too short to carry the IP header they claim.
type filterLink struct {
	nested.Endpoint
	fd int
	// vnet: every packet on fd carries a virtio-net header (tunlink).
	vnet bool
	// sources are the prefixes a packet's source must be in; empty means
	// any (unit tests only).
	sources []netip.Prefix

	echoRejected atomic.Uint64
	malformed    atomic.Uint64
	foreignSrc   atomic.Uint64 // dropped: source not the sandbox's
	linkLocalSrc atomic.Uint64 // dropped: IPv6 link-local or unspecified source (the sandbox kernel's own NDP/MLD)

	// onSYN is told of every TCP SYN without ACK from the sandbox before
	// the stack sees it (timewait.go); nil in unit tests of the link.
	onSYN func(proto tcpip.NetworkProtocolNumber, src, dst tcpip.Address, srcPort, dstPort uint16)
}

func newFilterLink(child gstack.LinkEndpoint, fd int, sources []netip.Prefix) *filterLink {
	l := &filterLink{fd: fd, sources: sources}
	l.Endpoint.Init(child, l)
	return l
}

// fromSandbox reports whether src is one of the sandbox's addresses, and
// counts the packet when it is not.
func (l *filterLink) fromSandbox(src netip.Addr) bool {
	if len(l.sources) == 0 {
		return true
	}
	for _, p := range l.sources {
		if p.Contains(src) {
			return true
		}
	}
	if src.Is6() && (src.IsLinkLocalUnicast() || src.IsUnspecified()) {
		l.linkLocalSrc.Add(1)
	} else {
		l.foreignSrc.Add(1)
	}
	return false
}

// DeliverNetworkPacket implements stack.NetworkDispatcher.
func (l *filterLink) DeliverNetworkPacket(proto tcpip.NetworkProtocolNumber, pkt *gstack.PacketBuffer) {
	if l.intercept(proto, pkt) {
		return
	}
	l.Endpoint.DeliverNetworkPacket(proto, pkt)
}

// maxICMPQuote bounds how much of the offending packet an ICMP error quotes.
const maxICMPQuote = 548 // 576-byte IPv4 minimum MTU minus headers

// intercept reports whether it consumed pkt.
func (l *filterLink) intercept(proto tcpip.NetworkProtocolNumber, pkt *gstack.PacketBuffer) bool {
	switch proto {
	case header.IPv4ProtocolNumber:
		h, ok := pkt.Data().PullUp(header.IPv4MinimumSize)
		if !ok {
			l.malformed.Add(1)
			return true
		}
		ip := header.IPv4(h)
		if !l.fromSandbox(netip.AddrFrom4(ip.SourceAddress().As4())) {
			return true
		}
		hl := int(ip.HeaderLength())
		if hl >= header.IPv4MinimumSize && ip.Protocol() == uint8(header.TCPProtocolNumber) && ip.FragmentOffset() == 0 && l.onSYN != nil {
			if th, ok := pkt.Data().PullUp(hl + header.TCPMinimumSize); ok {
				if sp, dp, ok := newSYN(th[hl:]); ok {
					ip := header.IPv4(th)
					l.onSYN(proto, ip.SourceAddress(), ip.DestinationAddress(), sp, dp)
				}
			}
			return false
		}
		if hl < header.IPv4MinimumSize || ip.Protocol() != uint8(header.ICMPv4ProtocolNumber) || ip.FragmentOffset() != 0 {
			return false
		}
		h, ok = pkt.Data().PullUp(hl + header.ICMPv4MinimumSize)
		if !ok {
			return false // let gVisor count it
		}
		if header.ICMPv4(h[hl:]).Type() != header.ICMPv4Echo {
			return false
		}
		n := min(pkt.Data().Size(), hl+maxICMPQuote)
		orig, _ := pkt.Data().PullUp(n)
		l.writeReject4(orig, hl)
		return true
	case header.IPv6ProtocolNumber:
		h, ok := pkt.Data().PullUp(header.IPv6MinimumSize)
		if !ok {
			l.malformed.Add(1)
			return true
		}
		if !l.fromSandbox(netip.AddrFrom16(header.IPv6(h).SourceAddress().As16())) {
			return true
		}
		if header.IPv6(h).NextHeader() == uint8(header.TCPProtocolNumber) && l.onSYN != nil { // no extension headers
			if th, ok := pkt.Data().PullUp(header.IPv6MinimumSize + header.TCPMinimumSize); ok {
				if sp, dp, ok := newSYN(th[header.IPv6MinimumSize:]); ok {
					ip := header.IPv6(th)
					l.onSYN(proto, ip.SourceAddress(), ip.DestinationAddress(), sp, dp)
				}
			}
			return false
		}
		h, ok = pkt.Data().PullUp(header.IPv6MinimumSize + header.ICMPv6MinimumSize)
		if !ok {
			return false
		}
		ip := header.IPv6(h)
		if ip.NextHeader() != uint8(header.ICMPv6ProtocolNumber) { // no extension headers: those go to gVisor
			return false
		}
		if header.ICMPv6(h[header.IPv6MinimumSize:]).Type() != header.ICMPv6EchoRequest {
			return false
		}
		src := ip.SourceAddress()
		if src.Unspecified() || header.IsV6MulticastAddress(src) {
			return true // never answer these; drop
		}
		n := min(pkt.Data().Size(), header.IPv6MinimumMTU-header.IPv6MinimumSize-header.ICMPv6DstUnreachableMinimumSize)
		orig, _ := pkt.Data().PullUp(n)
		l.writeReject6(orig)
		return true
	}
	return false
}

// writeReject4 sends ICMP destination unreachable, "communication
// administratively prohibited" (type 3 code 13), quoting orig.
func (l *filterLink) writeReject4(orig []byte, hl int) {
	const ihl = header.IPv4MinimumSize
	quote := orig[:min(len(orig), hl+8)]
	b := make([]byte, ihl+header.ICMPv4MinimumSize+len(quote))
	ip := header.IPv4(b)
	ip.Encode(&header.IPv4Fields{
		TotalLength: uint16(len(b)),
		TTL:         64,
		Protocol:    uint8(header.ICMPv4ProtocolNumber),
		SrcAddr:     header.IPv4(orig).DestinationAddress(),
		DstAddr:     header.IPv4(orig).SourceAddress(),
	})
	ip.SetChecksum(^ip.CalculateChecksum())
	icmp := header.ICMPv4(b[ihl:])
	icmp.SetType(header.ICMPv4DstUnreachable)
	icmp.SetCode(header.ICMPv4AdminProhibited)
	copy(icmp[header.ICMPv4MinimumSize:], quote)
	icmp.SetChecksum(^checksum.Checksum(icmp, 0))
	l.write(b)
}

// writeReject6 sends ICMPv6 destination unreachable, "communication with
// destination administratively prohibited" (type 1 code 1), quoting orig.
func (l *filterLink) writeReject6(orig []byte) {
	o := header.IPv6(orig)
	b := make([]byte, header.IPv6MinimumSize+header.ICMPv6DstUnreachableMinimumSize+len(orig))
	ip := header.IPv6(b)
	ip.Encode(&header.IPv6Fields{
		PayloadLength:     uint16(len(b) - header.IPv6MinimumSize),
		TransportProtocol: header.ICMPv6ProtocolNumber,
		HopLimit:          64,
		SrcAddr:           o.DestinationAddress(),
		DstAddr:           o.SourceAddress(),
	})
	icmp := header.ICMPv6(b[header.IPv6MinimumSize:])
	icmp.SetType(header.ICMPv6DstUnreachable)
	icmp.SetCode(header.ICMPv6Prohibited)
	copy(icmp[header.ICMPv6DstUnreachableMinimumSize:], orig)
	icmp.SetChecksum(header.ICMPv6Checksum(header.ICMPv6ChecksumParams{
		Header: icmp,
		Src:    ip.SourceAddress(),
		Dst:    ip.DestinationAddress(),
	}))
	l.write(b)
}

// write puts one packet on the TUN. A TUN write is one packet, atomic with
// respect to the fdbased endpoint's own writes on the same descriptor.
func (l *filterLink) write(b []byte) {
	if l.vnet {
		_ = tunlink.WriteRaw(l.fd, b)
		l.echoRejected.Add(1)
		return
	}
	for range 3 {
		_, err := unix.Write(l.fd, b)
		if err != unix.EAGAIN && err != unix.EINTR {
			break
		}
	}
	l.echoRejected.Add(1)
}
