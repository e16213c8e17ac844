package stack

import (
	"bytes"
	"net/netip"
	"testing"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"
)

func TestEchoRequestGetsAdminProhibited(t *testing.T) {
	goroutineLeakCheck(t)
	h := newFakeHandler()
	s, p := newTestStack(t, h, nil)
	tests := []struct {
		name     string
		src, dst netip.Addr
	}{
		{"an IPv4 ping to a documentation address", sandbox4, remote4},
		{"an IPv4 ping to another documentation address", sandbox4, netip.MustParseAddr("203.0.113.77")},
		{"an IPv6 ping to a documentation address", sandbox6, remote6},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			orig := echoPacket(tc.src, tc.dst, 7, uint16(i), []byte("ping payload"))
			p.send(orig)
			k := p.expect("ICMP error", isICMP)
			if k.src != tc.dst || k.dst != tc.src {
				t.Errorf("ICMP error %v -> %v, want %v -> %v", k.src, k.dst, tc.dst, tc.src)
			}
			if tc.src.Is4() {
				ip := header.IPv4(k.raw)
				if !ip.IsChecksumValid() {
					t.Errorf("IPv4 header checksum does not verify")
				}
				ic := header.ICMPv4(k.l4)
				if ic.Type() != header.ICMPv4DstUnreachable || ic.Code() != header.ICMPv4AdminProhibited {
					t.Errorf("ICMPv4 type/code = %d/%d, want 3/13", ic.Type(), ic.Code())
				}
				if checksum.Checksum(k.l4, 0) != 0xffff {
					t.Errorf("ICMPv4 checksum does not verify")
				}
				// RFC 792: the IP header plus the first 8 bytes of its data.
				quote := k.l4[header.ICMPv4MinimumSize:]
				if want := orig[:header.IPv4MinimumSize+8]; !bytes.Equal(quote, want) {
					t.Errorf("ICMPv4 quote\n% x\nwant\n% x", quote, want)
				}
			} else {
				ic := header.ICMPv6(k.l4)
				if ic.Type() != header.ICMPv6DstUnreachable || ic.Code() != header.ICMPv6Prohibited {
					t.Errorf("ICMPv6 type/code = %d/%d, want 1/1", ic.Type(), ic.Code())
				}
				if !icmpv6Valid(k) {
					t.Errorf("ICMPv6 checksum does not verify")
				}
				// RFC 4443: as much of the invoking packet as fits in 1280.
				if quote := k.l4[header.ICMPv6DstUnreachableMinimumSize:]; !bytes.Equal(quote, orig) {
					t.Errorf("ICMPv6 quote\n% x\nwant\n% x", quote, orig)
				}
			}
			// The counter is bumped right after the write, so poll for it.
			waitStat(t, s, "ICMPEchoReject", func(st Stats) uint64 { return st.ICMPEchoReject }, uint64(i+1))
		})
	}
}

func TestLargeIPv6EchoQuoteFitsMinimumMTU(t *testing.T) {
	goroutineLeakCheck(t)
	_, p := newTestStack(t, newFakeHandler(), nil)
	p.send(echoPacket(sandbox6, remote6, 1, 1, make([]byte, 1400)))
	k := p.expect("ICMPv6 error", isICMP)
	if len(k.raw) != header.IPv6MinimumMTU {
		t.Errorf("ICMPv6 error is %d bytes, want %d (the IPv6 minimum MTU)", len(k.raw), header.IPv6MinimumMTU)
	}
	if !icmpv6Valid(k) {
		t.Errorf("ICMPv6 checksum does not verify")
	}
}

func TestEchoFromUnspecifiedIPv6SourceIsDropped(t *testing.T) {
	goroutineLeakCheck(t)
	s, p := newTestStack(t, newFakeHandler(), nil)
	p.send(echoPacket(netip.IPv6Unspecified(), remote6, 1, 1, nil))
	p.expectNone("an ICMP answer to an unspecified source", quiet, anyPacket)
	if got := s.Stats().ICMPEchoReject; got != 0 {
		t.Errorf("Stats().ICMPEchoReject = %d, want 0", got)
	}
}

// An IPv6 echo request whose ICMPv6 header follows an extension header, or
// which arrives in fragments (ping -s 2000 over a 1500-byte TUN), is still an
// echo request to a host the sandbox may not reach: it must be rejected like
// any other (or dropped), never answered with an echo reply that makes every
// address look alive.
func TestIPv6EchoBehindExtensionHeadersIsNotAnswered(t *testing.T) {
	icmp := echoPacket(sandbox6, remote6, 9, 1, []byte("0123456789abcdef0123456789"))[header.IPv6MinimumSize:]
	const icmpv6 = uint8(header.ICMPv6ProtocolNumber)
	frag := func(offset8 uint16, more bool) []byte {
		m := uint16(0)
		if more {
			m = 1
		}
		return []byte{icmpv6, 0, byte((offset8<<3 | m) >> 8), byte(offset8<<3 | m), 0, 0, 0x12, 0x34}
	}
	tests := []struct {
		name  string
		first header.IPv6ExtensionHeaderIdentifier
		pkts  [][]byte // extension header + payload of each packet
	}{
		{"behind a Hop-by-Hop Options header", header.IPv6HopByHopOptionsExtHdrIdentifier,
			[][]byte{append([]byte{icmpv6, 0, 1, 4, 0, 0, 0, 0}, icmp...)}},
		{"behind a Destination Options header", header.IPv6DestinationOptionsExtHdrIdentifier,
			[][]byte{append([]byte{icmpv6, 0, 1, 4, 0, 0, 0, 0}, icmp...)}},
		{"as an atomic fragment", header.IPv6FragmentExtHdrIdentifier,
			[][]byte{append(frag(0, false), icmp...)}},
		{"split into two fragments", header.IPv6FragmentExtHdrIdentifier,
			[][]byte{append(frag(0, true), icmp[:16]...), append(frag(2, false), icmp[16:]...)}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			goroutineLeakCheck(t)
			_, p := newTestStack(t, newFakeHandler(), nil)
			for _, l := range tc.pkts {
				b := make([]byte, header.IPv6MinimumSize+len(l))
				header.IPv6(b).Encode(&header.IPv6Fields{
					PayloadLength:     uint16(len(l)),
					TransportProtocol: tcpip.TransportProtocolNumber(tc.first),
					HopLimit:          64,
					SrcAddr:           tAddr(sandbox6),
					DstAddr:           tAddr(remote6),
				})
				copy(b[header.IPv6MinimumSize:], l)
				p.send(b)
			}
			b, err := p.recv(quiet)
			if err == errNoPacket {
				return // dropped: acceptable
			}
			if err != nil {
				t.Fatalf("recv: %v", err)
			}
			k, ok := parse(b)
			if !ok || k.proto != header.ICMPv6ProtocolNumber {
				t.Fatalf("unexpected answer % x", b)
			}
			if typ := header.ICMPv6(k.l4).Type(); typ != header.ICMPv6DstUnreachable {
				t.Fatalf("echo request %s got ICMPv6 type %d, want no answer or 1 (destination unreachable)", tc.name, typ)
			}
		})
	}
}

// IPv4 fragments of an echo request: the first fragment carries the ICMP
// header and is rejected; the datagram is never reassembled and answered.
func TestIPv4FragmentedEchoIsNotAnswered(t *testing.T) {
	goroutineLeakCheck(t)
	s, p := newTestStack(t, newFakeHandler(), nil)
	icmp := echoPacket(sandbox4, remote4, 9, 1, []byte("0123456789abcdef0123456789"))[header.IPv4MinimumSize:]
	parts := []struct {
		off   uint16
		flags uint8
		data  []byte
	}{
		{16, 0, icmp[16:]}, // the last fragment first
		{0, header.IPv4FlagMoreFragments, icmp[:16]},
	}
	for _, f := range parts {
		b := make([]byte, header.IPv4MinimumSize+len(f.data))
		ip := header.IPv4(b)
		ip.Encode(&header.IPv4Fields{
			TotalLength: uint16(len(b)), ID: 0x4242, Flags: f.flags, FragmentOffset: f.off,
			TTL: 64, Protocol: uint8(header.ICMPv4ProtocolNumber),
			SrcAddr: tAddr(sandbox4), DstAddr: tAddr(remote4),
		})
		ip.SetChecksum(^ip.CalculateChecksum())
		copy(b[header.IPv4MinimumSize:], f.data)
		p.send(b)
	}
	k := p.expect("ICMP error", isICMP)
	if ic := header.ICMPv4(k.l4); ic.Type() != header.ICMPv4DstUnreachable || ic.Code() != header.ICMPv4AdminProhibited {
		t.Errorf("fragmented echo got ICMPv4 %d/%d, want 3/13", ic.Type(), ic.Code())
	}
	p.expectNone("an echo reply", quiet, func(k pkt) bool {
		return isICMP(k) && header.ICMPv4(k.l4).Type() == header.ICMPv4EchoReply
	})
	waitStat(t, s, "ICMPEchoReject", func(st Stats) uint64 { return st.ICMPEchoReject }, 1)
}
