package stack

import (
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
	serve, ok := s.cfg.Handler.UDP(f)
	if !ok {
		s.udpRefused.Add(1)
		return false
	}
	if !s.startFlow() {
		return true // closing: drop silently, the sandbox is going away
	}
	var wq waiter.Queue
	ep, e := r.CreateEndpoint(&wq)
	if e != nil {
		s.flows.Done()
		s.log.Debug("udp endpoint", "flow", f.String(), "err", e.String())
		return true
	}
	s.udpFlows.Add(1)
	c := gonet.NewUDPConn(&wq, ep)
	go func() {
		defer s.flows.Done()
		defer c.Close()
		serve(s.ctx, c)
	}()
	return true
}
