package tunlink

import (
	"encoding/binary"
	"errors"

	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
)

// HdrSize is the size of struct virtio_net_hdr (linux/virtio_net.h), which
// precedes every packet on a TUN opened with IFF_VNET_HDR.
const HdrSize = 10

// Values of the header's fields (linux/virtio_net.h).
const (
	flagNeedsCsum = 1 // VIRTIO_NET_HDR_F_NEEDS_CSUM
	flagDataValid = 2 // VIRTIO_NET_HDR_F_DATA_VALID

	gsoNone  = 0    // VIRTIO_NET_HDR_GSO_NONE
	gsoTCPv4 = 1    // VIRTIO_NET_HDR_GSO_TCPV4
	gsoTCPv6 = 4    // VIRTIO_NET_HDR_GSO_TCPV6
	gsoECN   = 0x80 // VIRTIO_NET_HDR_GSO_ECN
)

// vnetHdr is a virtio-net header. Its fields are little-endian on the wire
// (a TUN is little-endian unless TUNSETVNETBE says otherwise).
type vnetHdr struct {
	flags      uint8
	gsoType    uint8
	hdrLen     uint16
	gsoSize    uint16
	csumStart  uint16
	csumOffset uint16
}

func (h *vnetHdr) encode(b *[HdrSize]byte) {
	b[0] = h.flags
	b[1] = h.gsoType
	binary.LittleEndian.PutUint16(b[2:], h.hdrLen)
	binary.LittleEndian.PutUint16(b[4:], h.gsoSize)
	binary.LittleEndian.PutUint16(b[6:], h.csumStart)
	binary.LittleEndian.PutUint16(b[8:], h.csumOffset)
}

func decodeHdr(b []byte) vnetHdr {
	return vnetHdr{
		flags:      b[0],
		gsoType:    b[1],
		hdrLen:     binary.LittleEndian.Uint16(b[2:]),
		gsoSize:    binary.LittleEndian.Uint16(b[4:]),
		csumStart:  binary.LittleEndian.Uint16(b[6:]),
		csumOffset: binary.LittleEndian.Uint16(b[8:]),
	}
}

// Why checkHdr refuses a header.
var (
	errFlags     = errors.New("unknown flags")
	errGSOType   = errors.New("unknown or mismatched GSO type")
	errGSOSize   = errors.New("GSO size out of bounds")
	errHdrLen    = errors.New("header length beyond the packet")
	errCsumRange = errors.New("checksum start/offset beyond the packet")
	errShort     = errors.New("packet too short")
)

// checkHdr judges the virtio-net header the sandbox's kernel put before a
// packet of n bytes whose first bytes are head (at least the first byte, and
// the IPv4 protocol field when n reaches it). tunwall uses none of the
// header's fields to read the packet (every packet is one IP packet, as
// long as its own length says; gVisor reads the rest), but a header that
// does not describe the packet it precedes did not come from a kernel
// following the offloads the TUN was given, so the packet is dropped:
// unknown flags, a GSO type the TUN did not offer (UDP, or TCP over the
// other IP version), a segment size of zero or beyond the packet, or a
// header length or checksum position past the packet's end.
func checkHdr(h vnetHdr, head []byte, n int) error {
	if n < 1 || len(head) < 1 {
		return errShort
	}
	if h.flags&^(flagNeedsCsum|flagDataValid) != 0 {
		return errFlags
	}
	if int(h.hdrLen) > n {
		return errHdrLen
	}
	if h.flags&flagNeedsCsum != 0 {
		// The checksum field (2 bytes at start+offset) lies inside the
		// packet and after a minimal IP header.
		if h.csumStart < header.IPv4MinimumSize || int(h.csumStart)+int(h.csumOffset)+2 > n {
			return errCsumRange
		}
	}
	v := header.IPVersion(head)
	switch h.gsoType &^ gsoECN {
	case gsoNone:
		if h.gsoType != gsoNone || h.gsoSize != 0 {
			return errGSOType
		}
		return nil
	case gsoTCPv4:
		if v != header.IPv4Version || n < header.IPv4MinimumSize || len(head) < header.IPv4MinimumSize ||
			header.IPv4(head).Protocol() != uint8(header.TCPProtocolNumber) {
			return errGSOType
		}
	case gsoTCPv6:
		if v != header.IPv6Version || n < header.IPv6MinimumSize {
			return errGSOType
		}
	default:
		return errGSOType
	}
	if h.gsoSize == 0 || int(h.gsoSize) > n {
		return errGSOSize
	}
	return nil
}

// hdrFor is the header written before pkt: for a TCP segment gVisor left to
// the offloads (host GSO), a partial checksum from the start of its TCP
// header (which the sandbox's kernel accepts for a packet it delivers
// locally without computing it, and completes should it forward it), and
// the segment size if the segment is larger; for everything else an empty
// header (the packet is complete).
func hdrFor(pkt *stack.PacketBuffer) vnetHdr {
	var h vnetHdr
	gso := pkt.GSOOptions
	if gso.Type == stack.GSONone {
		return h
	}
	h.hdrLen = uint16(pkt.HeaderSize())
	if gso.NeedsCsum {
		h.flags = flagNeedsCsum
		h.csumStart = uint16(len(pkt.NetworkHeader().Slice()))
		h.csumOffset = gso.CsumOffset
	}
	if pkt.Data().Size() > int(gso.MSS) {
		switch gso.Type {
		case stack.GSOTCPv4:
			h.gsoType = gsoTCPv4
		case stack.GSOTCPv6:
			h.gsoType = gsoTCPv6
		default:
			return h // only host GSO is offered (SupportedGSO)
		}
		h.gsoSize = gso.MSS
	}
	return h
}
