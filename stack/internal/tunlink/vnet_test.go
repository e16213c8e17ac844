package tunlink

import (
	"encoding/binary"
	"errors"
	"testing"

	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
)

// packet4 is the first bytes of an IPv4 packet of protocol proto.
func packet4(proto uint8) []byte {
	b := make([]byte, 60)
	b[0] = 0x45
	b[9] = proto
	return b
}

func packet6() []byte {
	b := make([]byte, 60)
	b[0] = 0x60
	b[6] = uint8(header.TCPProtocolNumber)
	return b
}

func TestHeadersTheSandboxKernelWritesAreAccepted(t *testing.T) {
	tcp4, tcp6 := packet4(6), packet6()
	for _, c := range []struct {
		name string
		h    vnetHdr
		head []byte
		n    int
	}{
		{"complete packet, empty header", vnetHdr{}, tcp4, 100},
		{"partial TCP checksum after a 20-byte IPv4 header", vnetHdr{flags: flagNeedsCsum, hdrLen: 40, csumStart: 20, csumOffset: 16}, tcp4, 40},
		{"partial UDP checksum", vnetHdr{flags: flagNeedsCsum, hdrLen: 28, csumStart: 20, csumOffset: 6}, packet4(17), 28},
		{"TSO over IPv4", vnetHdr{flags: flagNeedsCsum, gsoType: gsoTCPv4, hdrLen: 52, gsoSize: 1448, csumStart: 20, csumOffset: 16}, tcp4, 65000},
		{"TSO over IPv6 with ECN", vnetHdr{flags: flagNeedsCsum, gsoType: gsoTCPv6 | gsoECN, hdrLen: 72, gsoSize: 1428, csumStart: 40, csumOffset: 16}, tcp6, 30000},
		{"data valid", vnetHdr{flags: flagDataValid}, tcp6, 60},
	} {
		if err := checkHdr(c.h, c.head, c.n); err != nil {
			t.Errorf("%s: refused: %v", c.name, err)
		}
	}
}

func TestHeadersThatDoNotFitTheirPacketAreRefused(t *testing.T) {
	tcp4, tcp6, udp4 := packet4(6), packet6(), packet4(17)
	for _, c := range []struct {
		name string
		h    vnetHdr
		head []byte
		n    int
		want error
	}{
		{"unknown flag", vnetHdr{flags: 4}, tcp4, 100, errFlags},
		{"header length past the end", vnetHdr{hdrLen: 101}, tcp4, 100, errHdrLen},
		{"checksum field past the end", vnetHdr{flags: flagNeedsCsum, csumStart: 20, csumOffset: 79}, tcp4, 100, errCsumRange},
		{"checksum start and offset at their largest", vnetHdr{flags: flagNeedsCsum, csumStart: 65535, csumOffset: 65535}, tcp4, 65535, errCsumRange},
		{"checksum inside the IP header", vnetHdr{flags: flagNeedsCsum, csumStart: 2, csumOffset: 0}, tcp4, 100, errCsumRange},
		{"UDP segmentation (not offered)", vnetHdr{gsoType: 5, gsoSize: 1000}, udp4, 3000, errGSOType},
		{"UFO (not offered)", vnetHdr{gsoType: 3, gsoSize: 1000}, udp4, 3000, errGSOType},
		{"TCPv4 segmentation of a UDP packet", vnetHdr{gsoType: gsoTCPv4, gsoSize: 1000}, udp4, 3000, errGSOType},
		{"TCPv4 segmentation of an IPv6 packet", vnetHdr{gsoType: gsoTCPv4, gsoSize: 1000}, tcp6, 3000, errGSOType},
		{"TCPv6 segmentation of an IPv4 packet", vnetHdr{gsoType: gsoTCPv6, gsoSize: 1000}, tcp4, 3000, errGSOType},
		{"segment size zero", vnetHdr{gsoType: gsoTCPv4}, tcp4, 3000, errGSOSize},
		{"segment size past the packet", vnetHdr{gsoType: gsoTCPv4, gsoSize: 3001}, tcp4, 3000, errGSOSize},
		{"segment size without segmentation", vnetHdr{gsoSize: 1000}, tcp4, 3000, errGSOType},
		{"ECN without segmentation", vnetHdr{gsoType: gsoECN}, tcp4, 3000, errGSOType},
		{"empty packet", vnetHdr{}, nil, 0, errShort},
		{"TCPv4 segmentation of a packet shorter than an IPv4 header", vnetHdr{gsoType: gsoTCPv4, gsoSize: 1}, tcp4[:10], 10, errGSOType},
	} {
		if err := checkHdr(c.h, c.head, c.n); !errors.Is(err, c.want) {
			t.Errorf("%s: got %v, want %v", c.name, err, c.want)
		}
	}
}

// FuzzCheckHdr feeds arbitrary headers and packets: checkHdr never panics,
// and a header it accepts points nowhere outside its packet.
func FuzzCheckHdr(f *testing.F) {
	f.Add(make([]byte, HdrSize), packet4(6))
	f.Add([]byte{1, 1, 52, 0, 0xa8, 5, 20, 0, 16, 0}, packet4(6))
	f.Add([]byte{1, 4, 72, 0, 0x94, 5, 40, 0, 16, 0}, packet6())
	f.Fuzz(func(t *testing.T, hb, pkt []byte) {
		if len(hb) < HdrSize {
			return
		}
		h := decodeHdr(hb)
		head := pkt[:min(len(pkt), 128)]
		if checkHdr(h, head, len(pkt)) != nil {
			return
		}
		if int(h.hdrLen) > len(pkt) {
			t.Fatalf("accepted header length %d past a %d-byte packet", h.hdrLen, len(pkt))
		}
		if h.flags&flagNeedsCsum != 0 && int(h.csumStart)+int(h.csumOffset)+2 > len(pkt) {
			t.Fatalf("accepted checksum at %d+%d past a %d-byte packet", h.csumStart, h.csumOffset, len(pkt))
		}
		if h.gsoType != gsoNone && (h.gsoSize == 0 || int(h.gsoSize) > len(pkt)) {
			t.Fatalf("accepted segment size %d for a %d-byte packet", h.gsoSize, len(pkt))
		}
	})
}

func TestHeaderRoundTripsLittleEndian(t *testing.T) {
	h := vnetHdr{flags: 1, gsoType: 4, hdrLen: 0x0102, gsoSize: 0x0304, csumStart: 0x0506, csumOffset: 0x0708}
	var b [HdrSize]byte
	h.encode(&b)
	if binary.LittleEndian.Uint16(b[2:]) != 0x0102 || b[2] != 0x02 {
		t.Errorf("hdr_len not little-endian: % x", b)
	}
	if got := decodeHdr(b[:]); got != h {
		t.Errorf("round trip: %+v, want %+v", got, h)
	}
}

// tcpSegment is a gVisor TCP segment over IPv4 with payload bytes of
// data and the GSO options gVisor's TCP gives it under host GSO.
func tcpSegment(payload int, mss uint16) *stack.PacketBuffer {
	pkt := stack.NewPacketBuffer(stack.PacketBufferOptions{
		ReserveHeaderBytes: header.IPv4MinimumSize + header.TCPMinimumSize + 12,
		Payload:            buffer.MakeWithData(make([]byte, payload)),
	})
	pkt.TransportHeader().Push(header.TCPMinimumSize + 12)
	pkt.NetworkHeader().Push(header.IPv4MinimumSize)
	pkt.GSOOptions = stack.GSO{Type: stack.GSOTCPv4, NeedsCsum: true, CsumOffset: header.TCPChecksumOffset, MSS: mss, L3HdrLen: header.IPv4MinimumSize}
	return pkt
}

func TestASegmentLeftToTheOffloadsCarriesItsPartialChecksumAfterTheIPHeader(t *testing.T) {
	pkt := tcpSegment(1000, 1448)
	defer pkt.DecRef()
	h := hdrFor(pkt)
	want := vnetHdr{flags: flagNeedsCsum, hdrLen: 52, csumStart: 20, csumOffset: 16}
	if h != want {
		t.Errorf("header %+v, want %+v (no link header on a TUN: the checksum starts right after the IP header)", h, want)
	}
	if err := checkHdr(h, packet4(6), pkt.Size()); err != nil {
		t.Errorf("the header written does not pass the reader's own check: %v", err)
	}

	big := tcpSegment(4000, 1448)
	defer big.DecRef()
	if h := hdrFor(big); h.gsoType != gsoTCPv4 || h.gsoSize != 1448 {
		t.Errorf("a segment of 4000 bytes with MSS 1448: %+v, want TCPv4 segmentation by 1448", h)
	}

	plain := stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: buffer.MakeWithData(make([]byte, 30))})
	defer plain.DecRef()
	if h := hdrFor(plain); h != (vnetHdr{}) {
		t.Errorf("a packet without GSO: %+v, want an empty header (its checksums are complete)", h)
	}
}
