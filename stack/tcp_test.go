package stack

import (
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip/header"
)

var tcpFlowCases = []struct {
	name     string
	src, dst netip.AddrPort
}{
	{"an IPv4 SYN to a documentation address", netip.AddrPortFrom(sandbox4, 40000), netip.AddrPortFrom(remote4, 80)},
	{"an IPv6 SYN to a documentation address", netip.AddrPortFrom(sandbox6, 40000), netip.AddrPortFrom(remote6, 443)},
}

func TestTCPRefusedFlowGetsRST(t *testing.T) {
	for _, tc := range tcpFlowCases {
		t.Run(tc.name, func(t *testing.T) {
			goroutineLeakCheck(t)
			h := newFakeHandler()
			s, p := newTestStack(t, h, nil)
			c := newTCPClient(p, tc.src, tc.dst)
			c.syn()

			call := h.nextTCP(t)
			want := Flow{Proto: TCP, Src: tc.src, Dst: tc.dst}
			if call.flow != want {
				t.Fatalf("Handler.TCP flow = %v, want %v", call.flow, want)
			}
			if got := s.Stats().TCPFlows; got != 1 {
				t.Errorf("Stats().TCPFlows = %d, want 1", got)
			}
			call.refuse()

			k := p.expect("RST", c.fromStack())
			th := header.TCP(k.l4)
			if th.Flags() != header.TCPFlagRst|header.TCPFlagAck {
				t.Errorf("reply flags = %v, want RST|ACK", th.Flags())
			}
			if th.AckNumber() != c.iss+1 {
				t.Errorf("RST ack = %d, want %d (our SYN's seq+1)", th.AckNumber(), c.iss+1)
			}
			if !k.transportValid() {
				t.Errorf("RST has a bad checksum")
			}
			<-call.done
		})
	}
}

func TestTCPAcceptedFlowSpoofsDestinationAndCarriesData(t *testing.T) {
	for _, tc := range tcpFlowCases {
		t.Run(tc.name, func(t *testing.T) {
			goroutineLeakCheck(t)
			h := newFakeHandler()
			_, p := newTestStack(t, h, nil)
			c := newTCPClient(p, tc.src, tc.dst)
			c.syn()
			call := h.nextTCP(t)
			res := call.acceptAsync()

			// expectSynAck only matches packets whose source is tc.dst.
			k := c.expectSynAck(t)
			if k.src != tc.dst.Addr() || k.dst != tc.src.Addr() {
				t.Fatalf("SYN-ACK %v -> %v, want %v -> %v", k.src, k.dst, tc.dst.Addr(), tc.src.Addr())
			}
			c.ack()
			var r acceptResult
			select {
			case r = <-res:
			case <-time.After(waitFor):
				t.Fatal("accept did not return after the handshake completed")
			}
			if r.err != nil {
				t.Fatalf("accept: %v", r.err)
			}
			defer r.c.Close()
			if got := r.c.RemoteAddr().String(); got != tc.src.String() {
				t.Errorf("conn RemoteAddr = %s, want %s", got, tc.src)
			}
			if got := r.c.LocalAddr().String(); got != tc.dst.String() {
				t.Errorf("conn LocalAddr = %s, want %s", got, tc.dst)
			}

			// Handler -> sandbox.
			msg := []byte("hello from upstream")
			if _, err := r.c.Write(msg); err != nil {
				t.Fatalf("conn write: %v", err)
			}
			if got := c.readN(t, len(msg)); string(got) != string(msg) {
				t.Errorf("sandbox got %q, want %q", got, msg)
			}

			// Sandbox -> handler.
			c.write([]byte("ping"))
			buf := make([]byte, 16)
			r.c.SetReadDeadline(time.Now().Add(waitFor))
			n, err := io.ReadAtLeast(r.c, buf, 4)
			if err != nil || string(buf[:n]) != "ping" {
				t.Errorf("handler read %q, %v; want %q", buf[:n], err, "ping")
			}

			// A second accept fails instead of creating a second endpoint.
			if _, err := call.accept(); err == nil {
				t.Errorf("second accept succeeded, want an error")
			}
			<-call.done
		})
	}
}

// The stack must not complete the sandbox's handshake before the Handler has
// dialled upstream and called accept (dial-first).
func TestTCPHandshakeWaitsForAccept(t *testing.T) {
	goroutineLeakCheck(t)
	h := newFakeHandler()
	_, p := newTestStack(t, h, nil)
	c := newTCPClient(p, netip.AddrPortFrom(sandbox4, 40001), netip.AddrPortFrom(remote4, 80))
	c.syn()
	call := h.nextTCP(t)

	p.expectNone("a reply to the SYN while the handler dials", quiet, c.fromStack())
	// The sandbox's kernel retransmits: still no answer and no second call.
	c.syn()
	p.expectNone("a reply to the retransmitted SYN", quiet, c.fromStack())
	h.noTCP(t, 50*time.Millisecond)

	res := call.acceptAsync()
	c.handshake(t)
	r := <-res
	if r.err != nil {
		t.Fatalf("accept: %v", r.err)
	}
	r.c.Close()
	<-call.done
}

func TestTCPAbortSendsRST(t *testing.T) {
	goroutineLeakCheck(t)
	h := newFakeHandler()
	_, p := newTestStack(t, h, nil)
	c := newTCPClient(p, netip.AddrPortFrom(sandbox6, 40002), netip.AddrPortFrom(remote6, 443))
	c.syn()
	call := h.nextTCP(t)
	res := call.acceptAsync()
	k := c.expectSynAck(t)
	c.ack()
	r := <-res
	if r.err != nil {
		t.Fatalf("accept: %v", r.err)
	}
	ab, ok := r.c.(interface{ Abort() })
	if !ok {
		t.Fatalf("accepted conn %T has no Abort method", r.c)
	}
	ab.Abort()

	rst := p.expect("RST after Abort", func(k pkt) bool {
		return c.fromStack()(k) && header.TCP(k.l4).Flags().Contains(header.TCPFlagRst)
	})
	th := header.TCP(rst.l4)
	if th.Flags().Contains(header.TCPFlagFin) {
		t.Errorf("Abort sent flags %v, want RST without FIN", th.Flags())
	}
	if want := header.TCP(k.l4).SequenceNumber() + 1; th.SequenceNumber() != want {
		t.Errorf("RST seq = %d, want %d (the stack's next sequence number)", th.SequenceNumber(), want)
	}
	if _, err := r.c.Write([]byte("x")); err == nil {
		t.Errorf("write after Abort succeeded")
	}
	<-call.done
}

// A connection the handler closes normally ends with FIN, not RST, so the
// difference Abort makes is observable.
func TestTCPCloseSendsFIN(t *testing.T) {
	goroutineLeakCheck(t)
	h := newFakeHandler()
	_, p := newTestStack(t, h, nil)
	c := newTCPClient(p, netip.AddrPortFrom(sandbox4, 40003), netip.AddrPortFrom(remote4, 80))
	c.syn()
	call := h.nextTCP(t)
	res := call.acceptAsync()
	c.handshake(t)
	r := <-res
	if r.err != nil {
		t.Fatalf("accept: %v", r.err)
	}
	r.c.Close()
	fin := p.expect("FIN", c.fromStack())
	if f := header.TCP(fin.l4).Flags(); !f.Contains(header.TCPFlagFin) || f.Contains(header.TCPFlagRst) {
		t.Errorf("Close sent flags %v, want FIN", f)
	}
	<-call.done
}

// SYNs beyond MaxInFlightTCP fail fast: an RST at once, counted, no
// Handler call. (gVisor alone drops them silently and the sandbox's connect
// hangs in SYN retransmits.)
func TestMaxInFlightTCPResetsExtraSYNs(t *testing.T) {
	goroutineLeakCheck(t)
	h := newFakeHandler()
	s, p := newTestStack(t, h, func(c *Config) { c.MaxInFlightTCP = 2 })
	dst := netip.AddrPortFrom(remote4, 80)
	src := func(i int) netip.AddrPort { return netip.AddrPortFrom(sandbox4, uint16(41000+i)) }

	var calls []*tcpCall
	for i := range 2 {
		p.send(synPacket(src(i), dst, 1000))
		calls = append(calls, h.nextTCP(t))
	}
	waitStat(t, s, "TCPInFlight", func(st Stats) uint64 { return st.TCPInFlight }, 2)
	for i := 2; i < 5; i++ {
		p.send(synPacket(src(i), dst, 1000))
		k := p.expect("RST for the SYN beyond the limit", isTCP(dst, src(i)))
		if f := header.TCP(k.l4).Flags(); !f.Contains(header.TCPFlagRst) {
			t.Fatalf("reply to a SYN beyond the limit has flags %v, want RST", f)
		}
	}
	h.noTCP(t, quiet)
	waitStat(t, s, "TCPInFlightReset", func(st Stats) uint64 { return st.TCPInFlightReset }, 3)

	// Finishing one pending flow frees a slot: a new SYN gets in.
	calls[0].refuse()
	<-calls[0].done
	waitStat(t, s, "TCPInFlight", func(st Stats) uint64 { return st.TCPInFlight }, 1)
	p.send(synPacket(src(2), dst, 2000))
	c := h.nextTCP(t)
	if c.flow.Src != src(2) {
		t.Errorf("flow after a slot freed = %v, want source %v", c.flow, src(2))
	}
	c.refuse()
	calls[1].refuse()
	<-calls[1].done
	<-c.done
	if got := s.Stats().TCPFlows; got != 3 {
		t.Errorf("Stats().TCPFlows = %d, want 3", got)
	}
	waitStat(t, s, "TCPInFlight", func(st Stats) uint64 { return st.TCPInFlight }, 0)
}

// The sandbox gives up (RST) while the handler dials: accept fails and the
// handler's error path works.
func TestTCPAcceptAfterSandboxResetFails(t *testing.T) {
	goroutineLeakCheck(t)
	h := newFakeHandler()
	_, p := newTestStack(t, h, nil)
	c := newTCPClient(p, netip.AddrPortFrom(sandbox4, 40004), netip.AddrPortFrom(remote4, 80))
	c.syn()
	call := h.nextTCP(t)
	res := call.acceptAsync()
	c.expectSynAck(t)
	// Instead of ACK, the sandbox resets.
	p.send(tcpPacket(c.src, c.dst, c.iss+1, 0, header.TCPFlagRst, nil, nil))
	select {
	case r := <-res:
		if r.err == nil {
			r.c.Close()
			t.Fatalf("accept succeeded after the sandbox reset the handshake")
		}
	case <-time.After(waitFor):
		t.Fatal("accept did not return after the sandbox reset the handshake")
	}
	<-call.done
}

var _ net.Conn = (*tcpConn)(nil)

// A destination's share of the handshake slots: SYNs to one destination
// beyond MaxInFlightPerDest are reset at once, counted, with no Handler
// call, while a SYN to another destination still gets a slot.
func TestSYNsBeyondADestinationsShareAreResetAndOthersGetIn(t *testing.T) {
	goroutineLeakCheck(t)
	h := newFakeHandler()
	s, p := newTestStack(t, h, func(c *Config) { c.MaxInFlightTCP = 8; c.MaxInFlightPerDest = 2 })
	dst := netip.AddrPortFrom(remote4, 80)
	other := netip.AddrPortFrom(remote4, 81)
	src := func(i int) netip.AddrPort { return netip.AddrPortFrom(sandbox4, uint16(42000+i)) }
	var calls []*tcpCall
	for i := range 2 {
		p.send(synPacket(src(i), dst, 1000))
		calls = append(calls, h.nextTCP(t))
	}
	for i := 2; i < 5; i++ {
		p.send(synPacket(src(i), dst, 1000))
		k := p.expect("RST for the SYN beyond the destination's share", isTCP(dst, src(i)))
		if f := header.TCP(k.l4).Flags(); !f.Contains(header.TCPFlagRst) {
			t.Fatalf("reply has flags %v, want RST", f)
		}
	}
	h.noTCP(t, quiet)
	waitStat(t, s, "TCPDestReset", func(st Stats) uint64 { return st.TCPDestReset }, 3)
	p.send(synPacket(src(9), other, 1000))
	c := h.nextTCP(t)
	if c.flow.Dst != other {
		t.Errorf("flow to another destination = %v, want %v", c.flow, other)
	}
	c.refuse()
	<-c.done
	// A slot of the first destination freed: a SYN to it gets in again.
	// The slot is given back just after the Handler returns, so a SYN
	// sent at once may still find it taken (and be reset): try again,
	// from a new port each time, a bounded number of times.
	calls[0].refuse()
	<-calls[0].done
	c = nil
	for i := 0; i < 20 && c == nil; i++ {
		p.send(synPacket(src(20+i), dst, 2000))
		select {
		case c = <-h.tcp:
		case <-time.After(100 * time.Millisecond):
		}
	}
	if c == nil {
		t.Fatal("no SYN to the destination got in after one of its slots was freed")
	}
	c.refuse()
	<-c.done
	calls[1].refuse()
	<-calls[1].done
}
