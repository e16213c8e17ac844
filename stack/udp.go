package stack

import (
	"fmt"
	"sync"
	"sync/atomic"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"
	"gvisor.dev/gvisor/pkg/waiter"
)

// handleUDP runs on the packet-dispatch goroutine for a datagram that matches
// no existing session. Returning false makes gVisor answer with ICMP port
// unreachable.
func (s *Stack) handleUDP(r *udp.ForwarderRequest) bool {
	id := r.ID()
	f := Flow{
		Proto: UDP,
		Src:   addrPort(id.RemoteAddress, id.RemotePort),
		Dst:   addrPort(id.LocalAddress, id.LocalPort),
	}
	// A session is live from here until its connection is closed.
	if n := s.udpLive.Add(1); n > int64(s.cfg.MaxUDPSessions) {
		s.udpLive.Add(-1)
		s.udpLimitRefused.Add(1)
		s.cfg.Handler.Refused(f, fmt.Errorf("%w (%d, --max-udp-sessions)", ErrTooManyUDPSessions, s.cfg.MaxUDPSessions))
		return false
	}
	if s.memHigh.Load() {
		s.udpLive.Add(-1)
		s.memRefused.Add(1)
		s.cfg.Handler.Refused(f, fmt.Errorf("%w (--max-memory %d MiB)", ErrMemoryBudget, s.cfg.MemoryLimit>>20))
		return false
	}
	serve, ok := s.cfg.Handler.UDP(f)
	if !ok {
		s.udpLive.Add(-1)
		s.udpRefused.Add(1)
		return false
	}
	if !s.startFlow() {
		s.udpLive.Add(-1)
		return true // closing: drop silently, the sandbox is going away
	}
	wq := new(waiter.Queue)
	ep, e := r.CreateEndpoint(wq)
	if e != nil {
		s.udpLive.Add(-1)
		s.flows.Done()
		s.log.Debug("udp endpoint", "flow", f.String(), "err", e.String())
		return true
	}
	s.udpFlows.Add(1)
	c := &udpConn{UDPConn: gonet.NewUDPConn(wq, ep), ep: ep, wq: wq, s: s}
	s.budget.Add(c, 1)
	go func() {
		defer s.flows.Done()
		serve(s.ctx, udpSession{f: f, c: c})
		if !c.relayed.Load() {
			c.Close()
		}
	}()
	return true
}

// udpConn is the sandbox's side of a UDP session.
type udpConn struct {
	*gonet.UDPConn
	ep tcpip.Endpoint
	wq *waiter.Queue
	s  *Stack

	relayed     atomic.Bool // a relay owns it: serve's return does not close it
	releaseOnce sync.Once
}

// Close closes the session.
func (c *udpConn) Close() error {
	c.releaseOnce.Do(func() {
		c.s.budget.Remove(c)
		c.s.udpLive.Add(-1)
	})
	return c.UDPConn.Close()
}

// CapBuffers implements rt.Owner. A UDP endpoint always takes a datagram
// when its queue is empty, whatever the limit.
func (c *udpConn) CapBuffers(max int) {
	so := c.ep.SocketOptions()
	if so.GetReceiveBufferSize() > int64(max) {
		so.SetReceiveBufferSize(int64(max), true)
	}
}
