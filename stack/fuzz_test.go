package stack

import (
	"errors"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	gstack "gvisor.dev/gvisor/pkg/tcpip/stack"
)

func fuzzSeeds(f *testing.F) {
	src4, dst4 := netip.AddrPortFrom(sandbox4, 40000), netip.AddrPortFrom(remote4, 80)
	src6, dst6 := netip.AddrPortFrom(sandbox6, 40000), netip.AddrPortFrom(remote6, 443)
	for _, b := range [][]byte{
		echoPacket(sandbox4, remote4, 1, 1, []byte("payload")),
		echoPacket(sandbox6, remote6, 1, 1, []byte("payload")),
		echoPacket(sandbox6, remote6, 1, 1, make([]byte, 1400)),
		echoPacket(netip.IPv6Unspecified(), remote6, 1, 1, nil),
		synPacket(src4, dst4, 1),
		synPacket(src6, dst6, 1),
		udpPacket(src4, netip.AddrPortFrom(remote4, 53), []byte("q")),
		udpPacket(src6, netip.AddrPortFrom(remote6, 53), []byte("q")),
		{0x45},
		{0x41, 0, 0, 0, 0, 0, 0, 0, 0, 0},
		{0x60, 0, 0, 0},
	} {
		f.Add(b)
	}
}

// FuzzIntercept feeds arbitrary bytes to the link's ICMP filter, which runs
// before gVisor sees a packet. It must never panic, and whatever it writes
// back must be a well-formed ICMP destination unreachable addressed to the
// packet's source. (The filter is driven directly, on one Stack per fuzz
// process; its replies arrive on the sandbox end.)
func FuzzIntercept(f *testing.F) {
	fuzzSeeds(f)
	s, p := newTestStack(f, newFakeHandler(), nil)
	f.Fuzz(func(t *testing.T, b []byte) {
		var proto tcpip.NetworkProtocolNumber
		switch {
		case len(b) == 0:
			return
		case header.IPVersion(b) == header.IPv4Version:
			proto = header.IPv4ProtocolNumber
		case header.IPVersion(b) == header.IPv6Version:
			proto = header.IPv6ProtocolNumber
		default:
			return // the link drops these before the filter
		}
		rejected := s.link.echoRejected.Load()
		pb := gstack.NewPacketBuffer(gstack.PacketBufferOptions{Payload: buffer.MakeWithData(b)})
		defer pb.DecRef()
		consumed := s.link.intercept(proto, pb)
		wrote := s.link.echoRejected.Load() - rejected

		reply := make([]byte, 65536)
		n, _, err := unix.Recvfrom(p.fd, reply, unix.MSG_DONTWAIT)
		if errors.Is(err, unix.EAGAIN) {
			if wrote != 0 {
				t.Fatalf("echoRejected counted a reply that was not written")
			}
			return
		}
		if err != nil {
			t.Fatalf("recv: %v", err)
		}
		if !consumed {
			t.Fatalf("intercept wrote a reply but let gVisor have the packet too")
		}
		k, ok := parse(reply[:n])
		if !ok {
			t.Fatalf("reply is not a valid IP packet: % x", reply[:n])
		}
		if proto == header.IPv4ProtocolNumber {
			in := header.IPv4(b)
			if !header.IPv4(k.raw).IsChecksumValid() || checksum.Checksum(k.l4, 0) != 0xffff {
				t.Fatalf("IPv4 reply checksums do not verify: % x", k.raw)
			}
			if ic := header.ICMPv4(k.l4); ic.Type() != header.ICMPv4DstUnreachable || ic.Code() != header.ICMPv4AdminProhibited {
				t.Fatalf("reply ICMPv4 %d/%d, want 3/13", ic.Type(), ic.Code())
			}
			if k.dst != addrOf(in.SourceAddress()) || k.src != addrOf(in.DestinationAddress()) {
				t.Fatalf("reply %v -> %v does not answer %v -> %v", k.src, k.dst, in.SourceAddress(), in.DestinationAddress())
			}
			if len(k.raw) > 576 {
				t.Fatalf("ICMPv4 error is %d bytes, more than 576", len(k.raw))
			}
		} else {
			in := header.IPv6(b)
			if !icmpv6Valid(k) {
				t.Fatalf("ICMPv6 reply checksum does not verify")
			}
			if ic := header.ICMPv6(k.l4); ic.Type() != header.ICMPv6DstUnreachable || ic.Code() != header.ICMPv6Prohibited {
				t.Fatalf("reply ICMPv6 %d/%d, want 1/1", ic.Type(), ic.Code())
			}
			if k.dst != addrOf(in.SourceAddress()) || k.src != addrOf(in.DestinationAddress()) {
				t.Fatalf("reply %v -> %v does not answer %v -> %v", k.src, k.dst, in.SourceAddress(), in.DestinationAddress())
			}
			if d := tAddr(k.dst); d.Unspecified() || header.IsV6MulticastAddress(d) {
				t.Fatalf("ICMPv6 error sent to %v", k.dst)
			}
			if len(k.raw) > header.IPv6MinimumMTU {
				t.Fatalf("ICMPv6 error is %d bytes, more than %d", len(k.raw), header.IPv6MinimumMTU)
			}
		}
		if wrote != 1 {
			t.Fatalf("echoRejected grew by %d for one reply", wrote)
		}
	})
}

// FuzzStackSurvivesPacket sends arbitrary packets into one running Stack;
// it must not crash, must not report PeerGone, and must still hand a valid
// SYN sent after each packet to the Handler. (One Stack per fuzz process:
// a Stack per input would be slow.)
func FuzzStackSurvivesPacket(f *testing.F) {
	fuzzSeeds(f)
	h := newFakeHandler()
	s, p := newTestStack(f, h, nil)
	var probePort uint16 = 1024
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) == 0 {
			return // an empty SEQPACKET record reads as EOF (see TestEmptyRecordStopsTheLinkFailClosed)
		}
		if _, err := unix.Write(p.fd, b); err != nil {
			if errors.Is(err, unix.EMSGSIZE) {
				return
			}
			t.Fatalf("write: %v", err)
		}
		probePort++
		if probePort == 0 {
			probePort = 1024
		}
		probe := netip.AddrPortFrom(netip.MustParseAddr("198.51.100.9"), probePort)
		if _, err := unix.Write(p.fd, synPacket(probe, netip.AddrPortFrom(remote4, 80), 77)); err != nil {
			t.Fatalf("write probe: %v", err)
		}
		timeout := time.After(waitFor)
		for {
			select {
			case c := <-h.tcp:
				c.refuse()
				if c.flow.Src == probe {
					select {
					case <-s.PeerGone():
						t.Fatalf("PeerGone after % x", b)
					default:
					}
					return
				}
			case <-timeout:
				t.Fatalf("a valid SYN after % x did not reach the Handler", b)
			}
		}
	})
}

// FuzzSourceFilter feeds arbitrary bytes to the link filter of a Stack that
// admits only the sandbox's addresses: a packet that claims any other source
// must be consumed, counted and never answered; whatever is answered must
// answer the sandbox.
func FuzzSourceFilter(f *testing.F) {
	fuzzSeeds(f)
	f.Add(synPacket(netip.AddrPortFrom(netip.MustParseAddr("203.0.113.5"), 1), netip.AddrPortFrom(remote4, 80), 1))
	f.Add(echoPacket(netip.MustParseAddr("fe80::1"), remote6, 1, 1, nil))
	sources := []netip.Prefix{netip.PrefixFrom(sandbox4, 32), netip.PrefixFrom(sandbox6, 128)}
	s, p := newTestStack(f, newFakeHandler(), func(c *Config) { c.Sources = sources })
	f.Fuzz(func(t *testing.T, b []byte) {
		var proto tcpip.NetworkProtocolNumber
		var src netip.Addr
		switch {
		case len(b) >= header.IPv4MinimumSize && header.IPVersion(b) == header.IPv4Version:
			proto, src = header.IPv4ProtocolNumber, addrOf(header.IPv4(b).SourceAddress())
		case len(b) >= header.IPv6MinimumSize && header.IPVersion(b) == header.IPv6Version:
			proto, src = header.IPv6ProtocolNumber, addrOf(header.IPv6(b).SourceAddress())
		default:
			return
		}
		ours := sources[0].Contains(src) || sources[1].Contains(src)
		dropped := s.link.foreignSrc.Load() + s.link.linkLocalSrc.Load()
		pb := gstack.NewPacketBuffer(gstack.PacketBufferOptions{Payload: buffer.MakeWithData(b)})
		defer pb.DecRef()
		consumed := s.link.intercept(proto, pb)
		counted := s.link.foreignSrc.Load() + s.link.linkLocalSrc.Load() - dropped
		if !ours && (!consumed || counted != 1) {
			t.Fatalf("a packet from %v (not the sandbox's): consumed %v, counted %d; want consumed and counted once", src, consumed, counted)
		}
		if ours && counted != 0 {
			t.Fatalf("a packet from the sandbox's own %v was counted as foreign", src)
		}
		reply := make([]byte, 65536)
		n, _, err := unix.Recvfrom(p.fd, reply, unix.MSG_DONTWAIT)
		if errors.Is(err, unix.EAGAIN) {
			return
		}
		if err != nil {
			t.Fatalf("recv: %v", err)
		}
		k, ok := parse(reply[:n])
		if !ok || !ours || k.dst != src {
			t.Fatalf("answered a packet from %v with % x", src, reply[:n])
		}
	})
}
