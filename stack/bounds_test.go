package stack

import (
	"errors"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"github.com/tunwall/tunwall/stack/internal/rt"
	"gvisor.dev/gvisor/pkg/tcpip/header"
)

// Tests of what bounds what a sandbox can make the stack hold: its packets'
// source addresses, handshakes it never completes, flow and session
// counts, buffer memory, memory in use.

func TestPacketsNotFromTheSandboxAreDroppedBeforeTheStack(t *testing.T) {
	goroutineLeakCheck(t)
	h := newFakeHandler()
	h.udpOK = true
	s, p := newTestStack(t, h, func(c *Config) {
		c.Sources = []netip.Prefix{netip.PrefixFrom(sandbox4, 32), netip.PrefixFrom(sandbox6, 128)}
	})
	foreign4 := netip.MustParseAddr("192.0.2.99")
	foreign6 := netip.MustParseAddr("2001:db8::99")
	linkLocal := netip.MustParseAddr("fe80::1")
	dst4, dst6 := netip.AddrPortFrom(remote4, 80), netip.AddrPortFrom(remote6, 80)
	for _, b := range [][]byte{
		synPacket(netip.AddrPortFrom(foreign4, 40000), dst4, 1),
		synPacket(netip.AddrPortFrom(foreign6, 40000), dst6, 1),
		udpPacket(netip.AddrPortFrom(foreign4, 40000), netip.AddrPortFrom(remote4, 53), []byte("q")),
		echoPacket(foreign4, remote4, 1, 1, nil), // not even answered with an ICMP error
		echoPacket(foreign6, remote6, 1, 1, nil),
		synPacket(netip.AddrPortFrom(linkLocal, 40000), dst6, 1),
		echoPacket(netip.IPv6Unspecified(), remote6, 1, 1, nil),
	} {
		p.send(b)
	}
	waitStat(t, s, "ForeignSource", func(st Stats) uint64 { return st.ForeignSource }, 5)
	waitStat(t, s, "LinkLocalSource", func(st Stats) uint64 { return st.LinkLocalSource }, 2)
	p.expectNone("any reply to a packet not from the sandbox", quiet, anyPacket)
	h.noTCP(t, 0)
	select {
	case f := <-h.udp:
		t.Fatalf("a UDP session from %v reached the Handler", f.Src)
	default:
	}

	// The sandbox's own addresses still get through, both families.
	for _, src := range []netip.AddrPort{netip.AddrPortFrom(sandbox4, 40001), netip.AddrPortFrom(sandbox6, 40001)} {
		dst := dst4
		if src.Addr().Is6() {
			dst = dst6
		}
		p.send(synPacket(src, dst, 1))
		c := h.nextTCP(t)
		if c.flow.Src != src {
			t.Errorf("flow from %v, want %v", c.flow.Src, src)
		}
		c.refuse()
		<-c.done
	}
	if st := s.Stats(); st.ForeignSource != 5 || st.TCPFlows != 2 {
		t.Errorf("Stats: ForeignSource %d TCPFlows %d, want 5 and 2", st.ForeignSource, st.TCPFlows)
	}
}

// A sandbox that never acknowledges tunwall's SYN-ACK (it drops it, or it
// sent the SYN from a raw socket) holds the flow's slot for
// HandshakeTimeout, not for gVisor's two minutes of SYN-ACK retransmits.
func TestAHandshakeNeverCompletedFreesItsSlotWithinTheTimeout(t *testing.T) {
	goroutineLeakCheck(t)
	const timeout = 400 * time.Millisecond
	h := newFakeHandler()
	s, p := newTestStack(t, h, func(c *Config) {
		c.HandshakeTimeout = timeout
		c.MaxInFlightTCP = 1
	})
	c := newTCPClient(p, netip.AddrPortFrom(sandbox4, 40100), netip.AddrPortFrom(remote4, 80))
	c.syn()
	call := h.nextTCP(t)
	start := time.Now()
	res := call.acceptAsync()
	c.expectSynAck(t) // and never ACK
	waitStat(t, s, "TCPInFlight", func(st Stats) uint64 { return st.TCPInFlight }, 1)

	// Meanwhile the only slot is taken: another SYN is reset at once.
	other := netip.AddrPortFrom(sandbox4, 40101)
	p.send(synPacket(other, c.dst, 5))
	if k := p.expect("RST for a SYN beyond the handshake limit", isTCP(c.dst, other)); !header.TCP(k.l4).Flags().Contains(header.TCPFlagRst) {
		t.Fatalf("reply to the SYN beyond the limit: flags %v, want RST", header.TCP(k.l4).Flags())
	}
	select {
	case r := <-h.refused:
		if !errors.Is(r.err, ErrTooManyHandshakes) || r.flow.Src != other {
			t.Errorf("Refused(%v, %v), want %v and ErrTooManyHandshakes", r.flow, r.err, other)
		}
	case <-time.After(waitFor):
		t.Fatal("Handler.Refused was not told of the SYN beyond the limit")
	}

	select {
	case r := <-res:
		if !errors.Is(r.err, ErrHandshakeTimeout) {
			t.Fatalf("accept err = %v, want ErrHandshakeTimeout", r.err)
		}
		if d := time.Since(start); d < timeout || d > timeout+2*time.Second {
			t.Errorf("accept gave up after %v, want about %v", d, timeout)
		}
	case <-time.After(timeout + waitFor):
		t.Fatal("accept did not give up on a handshake the sandbox never completed")
	}
	<-call.done
	p.expect("RST once the handshake was given up", func(k pkt) bool {
		return isTCP(c.dst, c.src)(k) && header.TCP(k.l4).Flags().Contains(header.TCPFlagRst)
	})
	waitStat(t, s, "HandshakeTimeouts", func(st Stats) uint64 { return st.HandshakeTimeouts }, 1)
	waitStat(t, s, "TCPInFlight", func(st Stats) uint64 { return st.TCPInFlight }, 0)
	waitStat(t, s, "TCPLive", func(st Stats) uint64 { return st.TCPLive }, 0)

	// The slot is free: the next connection completes.
	n := newTCPClient(p, netip.AddrPortFrom(sandbox4, 40102), c.dst)
	n.syn()
	call = h.nextTCP(t)
	res = call.acceptAsync()
	n.handshake(t)
	r := <-res
	if r.err != nil {
		t.Fatalf("accept after the slot was freed: %v", r.err)
	}
	r.c.Close()
	<-call.done
}

func TestMaxTCPFlowsResetsTheNextSYNAndTellsTheHandler(t *testing.T) {
	goroutineLeakCheck(t)
	h := newFakeHandler()
	s, p := newTestStack(t, h, func(c *Config) { c.MaxTCPFlows = 2 })
	dst := netip.AddrPortFrom(remote4, 80)
	var conns []acceptResult
	var calls []*tcpCall
	for i := range 2 {
		c := newTCPClient(p, netip.AddrPortFrom(sandbox4, uint16(40200+i)), dst)
		c.syn()
		call := h.nextTCP(t)
		res := call.acceptAsync()
		c.handshake(t)
		r := <-res
		if r.err != nil {
			t.Fatal(r.err)
		}
		conns, calls = append(conns, r), append(calls, call)
	}
	// The handlers returned; their connections live on (as a relay's do).
	for _, c := range calls {
		<-c.done
	}
	waitStat(t, s, "TCPLive", func(st Stats) uint64 { return st.TCPLive }, 2)

	third := netip.AddrPortFrom(sandbox4, 40202)
	p.send(synPacket(third, dst, 1))
	if k := p.expect("RST for a SYN beyond MaxTCPFlows", isTCP(dst, third)); !header.TCP(k.l4).Flags().Contains(header.TCPFlagRst) {
		t.Fatalf("reply flags %v, want RST", header.TCP(k.l4).Flags())
	}
	h.noTCP(t, quiet)
	select {
	case r := <-h.refused:
		if !errors.Is(r.err, ErrTooManyTCPFlows) || r.flow.Src != third {
			t.Errorf("Refused(%v, %v), want %v and ErrTooManyTCPFlows", r.flow, r.err, third)
		}
	case <-time.After(waitFor):
		t.Fatal("Handler.Refused was not told")
	}
	waitStat(t, s, "TCPLimitReset", func(st Stats) uint64 { return st.TCPLimitReset }, 1)

	// Closing one connection frees its place.
	conns[0].c.Close()
	waitStat(t, s, "TCPLive", func(st Stats) uint64 { return st.TCPLive }, 1)
	p.send(synPacket(third, dst, 100))
	call := h.nextTCP(t)
	call.refuse()
	<-call.done
	conns[1].c.Close()
	waitStat(t, s, "TCPLive", func(st Stats) uint64 { return st.TCPLive }, 0)
}

func TestMaxUDPSessionsAnswersICMPAndTellsTheHandler(t *testing.T) {
	goroutineLeakCheck(t)
	h := newFakeHandler()
	h.udpOK = true
	s, p := newTestStack(t, h, func(c *Config) { c.MaxUDPSessions = 1 })
	dst := netip.AddrPortFrom(remote4, 53)
	first, second := netip.AddrPortFrom(sandbox4, 40300), netip.AddrPortFrom(sandbox4, 40301)
	p.send(udpPacket(first, dst, []byte("one")))
	sess := h.nextSession(t)
	waitStat(t, s, "UDPLive", func(st Stats) uint64 { return st.UDPLive }, 1)

	p.send(udpPacket(second, dst, []byte("two")))
	k := p.expect("ICMP port unreachable for the session beyond the limit", isICMP)
	if ic := header.ICMPv4(k.l4); ic.Type() != header.ICMPv4DstUnreachable || ic.Code() != header.ICMPv4PortUnreachable {
		t.Fatalf("got ICMP %d/%d, want port unreachable", ic.Type(), ic.Code())
	}
	select {
	case r := <-h.refused:
		if !errors.Is(r.err, ErrTooManyUDPSessions) || r.flow.Src != second {
			t.Errorf("Refused(%v, %v), want %v and ErrTooManyUDPSessions", r.flow, r.err, second)
		}
	case <-time.After(waitFor):
		t.Fatal("Handler.Refused was not told")
	}
	waitStat(t, s, "UDPLimitRefused", func(st Stats) uint64 { return st.UDPLimitRefused }, 1)

	close(sess.release) // serve returns: the Stack closes the session
	<-sess.done
	waitStat(t, s, "UDPLive", func(st Stats) uint64 { return st.UDPLive }, 0)
	p.send(udpPacket(second, dst, []byte("three")))
	sess = h.nextSession(t)
	close(sess.release)
	<-sess.done
}

// Past five eighths of MemoryLimit in use, new flows are refused. (The
// test process's own heap is far above a 64 KiB limit.)
func TestNewFlowsAreRefusedNearTheMemoryLimit(t *testing.T) {
	goroutineLeakCheck(t)
	h := newFakeHandler()
	h.udpOK = true
	runtime.GC() // the live heap is measured at the last GC
	s, p := newTestStack(t, h, func(c *Config) { c.MemoryLimit = 64 << 10 })
	dst := netip.AddrPortFrom(remote4, 80)
	var src netip.AddrPort
	deadline := time.Now().Add(waitFor)
	for i := 0; s.Stats().MemoryRefused == 0; i++ {
		if time.Now().After(deadline) {
			t.Fatal("no flow was refused at the memory limit")
		}
		src = netip.AddrPortFrom(sandbox4, uint16(40400+i))
		p.send(synPacket(src, dst, 1))
		if k, err := p.recv(2 * rt.MemSampleEvery); err == nil {
			if kk, ok := parse(k); ok && isTCP(dst, src)(kk) && !header.TCP(kk.l4).Flags().Contains(header.TCPFlagRst) {
				t.Fatalf("a SYN got %v, want RST", header.TCP(kk.l4).Flags())
			}
		}
	}
	if s.Stats().TCPFlows != 0 {
		t.Errorf("%d flows reached the Handler", s.Stats().TCPFlows)
	}
	select {
	case r := <-h.refused:
		if !errors.Is(r.err, ErrMemoryBudget) {
			t.Errorf("Refused err = %v, want ErrMemoryBudget", r.err)
		}
	case <-time.After(waitFor):
		t.Fatal("Handler.Refused was not told")
	}
	p.send(udpPacket(src, netip.AddrPortFrom(remote4, 53), []byte("q")))
	p.expect("ICMP port unreachable for UDP at the memory limit", isICMP)
}

// The buffers of live connections shrink as connections are added: the
// data they can hold together stays within the budget.
func TestLiveConnectionBuffersShrinkToTheBudget(t *testing.T) {
	goroutineLeakCheck(t)
	const budgetBytes = 512 << 10
	tb := newRelayTestbed(t, func(c *Config) {
		c.BufferBudget = budgetBytes
		c.TCPBuffer = 256 << 10
	}, 0)
	first, _ := tb.connect(t)
	defer first.Close()
	if got := tb.st.Stats().BufferCap; got != 256<<10 {
		t.Fatalf("BufferCap with one flow = %d, want 256 KiB", got)
	}
	var conns []interface{ Close() error }
	for range 63 {
		c, u := tb.connect(t)
		conns = append(conns, c, u)
	}
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	// 64 flows, 128 shares of 512 KiB: 4 KiB each.
	if got := tb.st.Stats().BufferCap; got != 4<<10 {
		t.Fatalf("BufferCap with 64 flows = %d, want 4096", got)
	}
	total := 0
	tb.st.budget.Each(func(o rt.Owner) {
		c := o.(*tcpConn)
		so := c.ep.SocketOptions()
		snd, rcv := int(so.GetSendBufferSize()), int(so.GetReceiveBufferSize())
		if snd > 4<<10 || rcv > 4<<10 {
			t.Errorf("a live connection's buffers are %d/%d bytes, more than the 4 KiB cap", snd, rcv)
		}
		total += snd + rcv
	})
	if total > budgetBytes {
		t.Errorf("the live connections' buffers add up to %d bytes, more than the %d budget", total, budgetBytes)
	}
}

// SYNs beyond MaxInFlightTCP never reach the Handler: however many come,
// no more than MaxInFlightTCP handler calls wait on dials.
func TestSYNsBeyondTheHandshakeLimitNeverReachTheHandler(t *testing.T) {
	goroutineLeakCheck(t)
	h := newFakeHandler()
	s, p := newTestStack(t, h, func(c *Config) { c.MaxInFlightTCP = 4 })
	dst := netip.AddrPortFrom(remote4, 80)
	var calls []*tcpCall
	for i := range 4 {
		p.send(synPacket(netip.AddrPortFrom(sandbox4, uint16(40500+i)), dst, 1))
		calls = append(calls, h.nextTCP(t))
	}
	for i := range 200 {
		p.send(synPacket(netip.AddrPortFrom(sandbox4, uint16(41000+i)), dst, 1))
	}
	waitStat(t, s, "TCPInFlightReset", func(st Stats) uint64 { return st.TCPInFlightReset }, 200)
	h.noTCP(t, quiet)
	for _, c := range calls {
		c.refuse()
		<-c.done
	}
	waitStat(t, s, "TCPInFlight", func(st Stats) uint64 { return st.TCPInFlight }, 0)
}
