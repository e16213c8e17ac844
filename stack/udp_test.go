package stack

import (
	"bytes"
	"net/netip"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"
)

var udpFlowCases = []struct {
	name     string
	src, dst netip.AddrPort
}{
	{"an IPv4 datagram to a documentation address", netip.AddrPortFrom(sandbox4, 50000), netip.AddrPortFrom(remote4, 9999)},
	{"an IPv6 datagram to a documentation address", netip.AddrPortFrom(sandbox6, 50000), netip.AddrPortFrom(remote6, 9999)},
}

func TestUDPRefusedFlowGetsPortUnreachable(t *testing.T) {
	for _, tc := range udpFlowCases {
		t.Run(tc.name, func(t *testing.T) {
			goroutineLeakCheck(t)
			h := newFakeHandler()
			s, p := newTestStack(t, h, nil)
			orig := udpPacket(tc.src, tc.dst, []byte("are you there?"))
			p.send(orig)

			want := Flow{Proto: UDP, Src: tc.src, Dst: tc.dst}
			if f := h.nextUDP(t); f != want {
				t.Fatalf("Handler.UDP flow = %v, want %v", f, want)
			}
			k := p.expect("ICMP port unreachable", isICMP)
			if k.src != tc.dst.Addr() || k.dst != tc.src.Addr() {
				t.Errorf("ICMP error %v -> %v, want %v -> %v", k.src, k.dst, tc.dst.Addr(), tc.src.Addr())
			}
			var quote []byte
			if tc.src.Addr().Is4() {
				ic := header.ICMPv4(k.l4)
				if ic.Type() != header.ICMPv4DstUnreachable || ic.Code() != header.ICMPv4PortUnreachable {
					t.Errorf("ICMPv4 type/code = %d/%d, want 3/3", ic.Type(), ic.Code())
				}
				if checksum.Checksum(k.l4, 0) != 0xffff {
					t.Errorf("ICMPv4 checksum does not verify")
				}
				quote = k.l4[header.ICMPv4MinimumSize:]
			} else {
				ic := header.ICMPv6(k.l4)
				if ic.Type() != header.ICMPv6DstUnreachable || ic.Code() != header.ICMPv6PortUnreachable {
					t.Errorf("ICMPv6 type/code = %d/%d, want 1/4", ic.Type(), ic.Code())
				}
				if !icmpv6Valid(k) {
					t.Errorf("ICMPv6 checksum does not verify")
				}
				quote = k.l4[header.ICMPv6DstUnreachableMinimumSize:]
			}
			// The quote must carry at least the IP header and the UDP header
			// (RFC 792, RFC 4443), byte for byte.
			minQuote := len(orig) - len("are you there?")
			if len(quote) < minQuote || !bytes.Equal(quote, orig[:len(quote)]) {
				t.Errorf("ICMP error quotes\n% x\nwant a prefix of at least %d bytes of\n% x", quote, minQuote, orig)
			}
			waitStat(t, s, "UDPRefused", func(st Stats) uint64 { return st.UDPRefused }, 1)
			if got := s.Stats().UDPFlows; got != 0 {
				t.Errorf("Stats().UDPFlows = %d, want 0 for a refused flow", got)
			}
		})
	}
}

func TestUDPAcceptedFlowServesBothWays(t *testing.T) {
	for _, tc := range udpFlowCases {
		t.Run(tc.name, func(t *testing.T) {
			goroutineLeakCheck(t)
			h := newFakeHandler()
			h.udpOK = true
			s, p := newTestStack(t, h, nil)
			p.send(udpPacket(tc.src, tc.dst, []byte("first")))

			want := Flow{Proto: UDP, Src: tc.src, Dst: tc.dst}
			if f := h.nextUDP(t); f != want {
				t.Fatalf("Handler.UDP flow = %v, want %v", f, want)
			}
			ss := h.nextSession(t)
			if ss.flow != want {
				t.Errorf("serve flow = %v, want %v", ss.flow, want)
			}
			buf := make([]byte, 64)
			ss.conn.SetReadDeadline(time.Now().Add(waitFor))
			n, err := ss.conn.Read(buf)
			if err != nil || string(buf[:n]) != "first" {
				t.Fatalf("first datagram on the session = %q, %v; want %q", buf[:n], err, "first")
			}

			// A second datagram of the same session reaches the same conn,
			// not a new Handler call.
			p.send(udpPacket(tc.src, tc.dst, []byte("second")))
			n, err = ss.conn.Read(buf)
			if err != nil || string(buf[:n]) != "second" {
				t.Fatalf("second datagram = %q, %v; want %q", buf[:n], err, "second")
			}
			select {
			case f := <-h.udp:
				t.Errorf("second datagram made a new Handler.UDP call: %v", f)
			default:
			}

			if _, err := ss.conn.Write([]byte("reply")); err != nil {
				t.Fatalf("session write: %v", err)
			}
			k := p.expect("UDP reply", isUDP(tc.dst, tc.src))
			if got := header.UDP(k.l4).Payload(); string(got) != "reply" {
				t.Errorf("sandbox got %q, want %q", got, "reply")
			}
			if !k.transportValid() {
				t.Errorf("UDP reply checksum does not verify")
			}
			if got := s.Stats().UDPFlows; got != 1 {
				t.Errorf("Stats().UDPFlows = %d, want 1", got)
			}

			// After serve returns, the stack closes the conn.
			close(ss.release)
			<-ss.done
			deadline := time.Now().Add(waitFor)
			for {
				if _, err := ss.conn.Write([]byte("late")); err != nil {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("session conn still writable after serve returned")
				}
				time.Sleep(5 * time.Millisecond)
			}
		})
	}
}

func icmpv6Valid(k pkt) bool {
	ic := header.ICMPv6(k.l4)
	return ic.Checksum() == header.ICMPv6Checksum(header.ICMPv6ChecksumParams{Header: ic, Src: tAddr(k.src), Dst: tAddr(k.dst)})
}
