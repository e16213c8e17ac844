package stack

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/waiter"
)

// errAcceptTwice is returned by a flow's accept func when called again.
var errAcceptTwice = errors.New("stack: accept called twice")

// Limits at which the Stack refuses a new flow (Handler.Refused is told).
var (
	ErrTooManyTCPFlows    = errors.New("too many concurrent TCP flows")
	ErrTooManyHandshakes  = errors.New("too many TCP handshakes in progress")
	ErrTooManyUDPSessions = errors.New("too many concurrent UDP sessions")
	ErrMemoryBudget       = errors.New("tunwall's memory is near its limit")
)

// ErrHandshakeTimeout is returned by a flow's accept func when the sandbox
// did not complete its handshake within Config.HandshakeTimeout.
var ErrHandshakeTimeout = errors.New("stack: the sandbox did not complete the TCP handshake in time")

// orphanTimeout bounds how long a sandbox-side connection tunwall closed
// keeps unacknowledged data when the sandbox stops reading (gVisor would
// probe a zero window forever): TCP_USER_TIMEOUT.
const orphanTimeout = 30 * time.Second

// handleTCP runs on a goroutine gVisor starts for each SYN it has no endpoint
// for. The sandbox's handshake is not answered until the Handler calls
// accept, so an upstream that refuses becomes an RST, as on a real network.
// A SYN beyond Config.MaxInFlightTCP pending ones is reset at once.
func (s *Stack) handleTCP(r *tcp.ForwarderRequest) {
	if !s.startFlow() {
		r.Complete(true)
		return
	}
	defer s.flows.Done()
	id := r.ID()
	f := Flow{
		Proto: TCP,
		Src:   addrPort(id.RemoteAddress, id.RemotePort),
		Dst:   addrPort(id.LocalAddress, id.LocalPort),
	}
	// A flow is live from its SYN until its connection is closed (or, if
	// none was accepted, until the Handler returns).
	if n := s.tcpLive.Add(1); n > int64(s.cfg.MaxTCPFlows) {
		s.tcpLive.Add(-1)
		s.tcpLimitReset.Add(1)
		r.Complete(true)
		s.cfg.Handler.Refused(f, fmt.Errorf("%w (%d, --max-tcp-flows)", ErrTooManyTCPFlows, s.cfg.MaxTCPFlows))
		return
	}
	if s.memHigh.Load() {
		s.tcpLive.Add(-1)
		s.memRefused.Add(1)
		r.Complete(true)
		s.cfg.Handler.Refused(f, fmt.Errorf("%w (--max-memory %d MiB)", ErrMemoryBudget, s.cfg.MemoryLimit>>20))
		return
	}
	if n := s.inFlight.Add(1); n > int64(s.cfg.MaxInFlightTCP) {
		s.inFlight.Add(-1)
		s.tcpLive.Add(-1)
		s.inFlightReset.Add(1)
		r.Complete(true)
		s.cfg.Handler.Refused(f, fmt.Errorf("%w (%d, --max-tcp-handshakes)", ErrTooManyHandshakes, s.cfg.MaxInFlightTCP))
		return
	}
	var pendingOnce sync.Once
	done := func() { pendingOnce.Do(func() { s.inFlight.Add(-1) }) }
	defer done()
	s.tcpFlows.Add(1)

	var (
		once     sync.Once
		accepted bool
	)
	accept := func() (c net.Conn, err error) {
		err = errAcceptTwice
		once.Do(func() {
			defer done()
			wq := new(waiter.Queue)
			// gVisor answers the SYN and blocks until the handshake
			// completes or fails, retransmitting its SYN-ACK for up to
			// two minutes. A sandbox that never completes it must not
			// hold this flow's slot that long: waking the handshake's
			// waiter early makes it give up (it finds the endpoint not
			// connected, closes it, and returns an error).
			var timedOut atomic.Bool
			t := time.AfterFunc(s.cfg.HandshakeTimeout, func() {
				timedOut.Store(true)
				wq.Notify(waiter.WritableEvents)
			})
			ep, e := r.CreateEndpoint(wq)
			t.Stop()
			if e != nil && timedOut.Load() {
				s.handshakeTimeouts.Add(1)
				err = ErrHandshakeTimeout
				return
			}
			if e != nil {
				// The sandbox gave up (RST, or its SYN timed out) while we
				// dialled: Complete(true) below answers with RST.
				err = wrapTCPIP("complete handshake with "+f.Src.String(), e)
				return
			}
			accepted = true
			r.Complete(false)
			tc := &tcpConn{TCPConn: gonet.NewTCPConn(wq, ep), ep: ep, wq: wq, s: s}
			s.budget.add(tc, 2)
			c, err = tc, nil
		})
		return c, err
	}
	s.cfg.Handler.TCP(s.ctx, f, accept)
	once.Do(func() {}) // a late accept from a stray goroutine now fails
	if !accepted {
		s.tcpLive.Add(-1)
		r.Complete(true)
	}
}

// tcpConn is the sandbox's side of a TCP flow.
type tcpConn struct {
	*gonet.TCPConn
	ep tcpip.Endpoint
	wq *waiter.Queue
	s  *Stack

	releaseOnce sync.Once
}

// release ends the flow's accounting (live flows, buffer budget), once.
func (c *tcpConn) release() {
	c.releaseOnce.Do(func() {
		c.s.budget.remove(c)
		c.s.tcpLive.Add(-1)
	})
}

// Close closes the connection gracefully (FIN). Data still unacknowledged
// is given orphanTimeout to be read before the connection is reset.
func (c *tcpConn) Close() error {
	c.release()
	uto := tcpip.TCPUserTimeoutOption(orphanTimeout)
	c.ep.SetSockOpt(&uto)
	return c.TCPConn.Close()
}

// Abort resets the connection (the sandbox sees RST, not FIN) and closes it.
func (c *tcpConn) Abort() {
	c.release()
	c.ep.Abort()
	c.TCPConn.Close()
}

// capBuffers implements bufferOwner.
func (c *tcpConn) capBuffers(max int) {
	so := c.ep.SocketOptions()
	if so.GetSendBufferSize() > int64(max) {
		so.SetSendBufferSize(int64(max), true)
	}
	if so.GetReceiveBufferSize() > int64(max) {
		so.SetReceiveBufferSize(int64(max), true)
	}
}
