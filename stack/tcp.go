package stack

import (
	"errors"
	"net"
	"sync"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/waiter"
)

// errAcceptTwice is returned by a flow's accept func when called again.
var errAcceptTwice = errors.New("stack: accept called twice")

// handleTCP runs on a goroutine gVisor starts for each SYN it has no endpoint
// for. The sandbox's handshake is not answered until the Handler calls
// accept, so an upstream that refuses becomes an RST, as on a real network.
func (s *Stack) handleTCP(r *tcp.ForwarderRequest) {
	if !s.startFlow() {
		r.Complete(true)
		return
	}
	defer s.flows.Done()
	s.tcpFlows.Add(1)

	id := r.ID()
	f := Flow{
		Proto: TCP,
		Src:   addrPort(id.RemoteAddress, id.RemotePort),
		Dst:   addrPort(id.LocalAddress, id.LocalPort),
	}

	var (
		once     sync.Once
		accepted bool
	)
	accept := func() (c net.Conn, err error) {
		err = errAcceptTwice
		once.Do(func() {
			var wq waiter.Queue
			ep, e := r.CreateEndpoint(&wq)
			if e != nil {
				// The sandbox gave up (RST, or its SYN timed out) while we
				// dialled: Complete(true) below answers with RST.
				err = wrapTCPIP("complete handshake with "+f.Src.String(), e)
				return
			}
			accepted = true
			r.Complete(false)
			c, err = &tcpConn{TCPConn: gonet.NewTCPConn(&wq, ep), ep: ep}, nil
		})
		return c, err
	}
	s.cfg.Handler.TCP(s.ctx, f, accept)
	if !accepted {
		once.Do(func() {}) // a late accept from a stray goroutine now fails
		r.Complete(true)
	}
}

// tcpConn is the sandbox's side of a TCP flow.
type tcpConn struct {
	*gonet.TCPConn
	ep tcpip.Endpoint
}

// Abort resets the connection (the sandbox sees RST, not FIN) and closes it.
func (c *tcpConn) Abort() {
	c.ep.Abort()
	c.TCPConn.Close()
}
