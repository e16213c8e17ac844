package stack

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
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
	ErrTooManyTCPFlows   = errors.New("too many concurrent TCP flows")
	ErrTooManyHandshakes = errors.New("too many TCP handshakes in progress")
	// ErrTooManyToOneDest is Refused's error for a SYN beyond
	// Config.MaxInFlightPerDest flows in flight to its destination.
	ErrTooManyToOneDest   = errors.New("too many TCP handshakes in progress to one destination")
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

// forwardTCP runs on the goroutine gVisor starts for each SYN it has no
// endpoint for; it hands the flow to a goroutine of the warm pool, or runs
// it there and then joins the pool.
func (s *Stack) forwardTCP(r *tcp.ForwarderRequest) {
	fn := func() { s.handleTCP(r) }
	if !s.warm.HandOff(fn) {
		s.warm.Serve(fn)
	}
}

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
	if !s.admitTCP(r, f) {
		return
	}
	var pendingOnce sync.Once
	done := func() {
		pendingOnce.Do(func() {
			s.inFlight.Add(-1)
			s.perDest.release(f.Dst)
		})
	}
	defer done()
	s.tcpFlows.Add(1)

	q := &tcpRequest{s: s, r: r, f: f, done: done}
	s.cfg.Handler.TCP(s.ctx, q)
	if !q.finished() {
		s.tcpLive.Add(-1)
	}
}

// admitTCP takes a live-flow slot and a handshake slot for f's SYN. When
// a limit (--max-tcp-flows, --max-memory, --max-tcp-handshakes) refuses
// it, admitTCP resets the SYN, counts it, tells the Handler, and reports
// false. A flow is live from its SYN until its connection is closed (or,
// if none was accepted, until the Handler returns).
func (s *Stack) admitTCP(r *tcp.ForwarderRequest, f Flow) bool {
	if n := s.tcpLive.Add(1); n > int64(s.cfg.MaxTCPFlows) {
		s.tcpLive.Add(-1)
		s.tcpLimitReset.Add(1)
		r.Complete(true)
		s.cfg.Handler.Refused(f, fmt.Errorf("%w (%d, --max-tcp-flows)", ErrTooManyTCPFlows, s.cfg.MaxTCPFlows))
		return false
	}
	if s.memHigh.Load() {
		s.tcpLive.Add(-1)
		s.memRefused.Add(1)
		r.Complete(true)
		s.cfg.Handler.Refused(f, fmt.Errorf("%w (--max-memory %d MiB)", ErrMemoryBudget, s.cfg.MemoryLimit>>20))
		return false
	}
	if n := s.inFlight.Add(1); n > int64(s.cfg.MaxInFlightTCP) {
		s.inFlight.Add(-1)
		s.tcpLive.Add(-1)
		s.inFlightReset.Add(1)
		r.Complete(true)
		s.cfg.Handler.Refused(f, fmt.Errorf("%w (%d, --max-tcp-handshakes)", ErrTooManyHandshakes, s.cfg.MaxInFlightTCP))
		return false
	}
	// One destination's share: a burst of SYNs to one host (whose
	// handshakes it never completes) must not take every slot from the
	// others.
	if !s.perDest.take(f.Dst, s.cfg.MaxInFlightPerDest) {
		s.inFlight.Add(-1)
		s.tcpLive.Add(-1)
		s.destReset.Add(1)
		r.Complete(true)
		s.cfg.Handler.Refused(f, fmt.Errorf("%w (%d to %s)", ErrTooManyToOneDest, s.cfg.MaxInFlightPerDest, f.Dst))
		return false
	}
	return true
}

// destCounts counts the TCP flows in flight to each destination. It
// holds an entry only while a flow to it is in flight, so it is bounded
// by Config.MaxInFlightTCP.
type destCounts struct {
	mu sync.Mutex
	n  map[netip.AddrPort]int
}

// take counts a flow in flight to dst unless limit are already.
func (d *destCounts) take(dst netip.AddrPort, limit int) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.n == nil {
		d.n = make(map[netip.AddrPort]int)
	}
	if d.n[dst] >= limit {
		return false
	}
	d.n[dst]++
	return true
}

func (d *destCounts) release(dst netip.AddrPort) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.n[dst] <= 1 {
		delete(d.n, dst)
		return
	}
	d.n[dst]--
}

// completeHandshake answers the SYN of r and waits (at most
// HandshakeTimeout) for the sandbox to complete the handshake; on
// success it returns the sandbox's side of the connection, its buffers
// under the budget.
func (s *Stack) completeHandshake(r *tcp.ForwarderRequest, f Flow) (*tcpConn, error) {
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
		return nil, ErrHandshakeTimeout
	}
	if e != nil {
		// The sandbox gave up (RST, or its SYN timed out) while we
		// dialled: the caller's Complete(true) answers with RST.
		return nil, wrapTCPIP("complete handshake with "+f.Src.String(), e)
	}
	r.Complete(false)
	tc := &tcpConn{TCPConn: gonet.NewTCPConn(wq, ep), ep: ep, wq: wq, s: s}
	s.budget.Add(tc, 2)
	return tc, nil
}

// tcpConn is the sandbox's side of a TCP flow.
type tcpConn struct {
	*gonet.TCPConn
	ep tcpip.Endpoint
	wq *waiter.Queue
	s  *Stack

	releaseOnce sync.Once

	// While an event relay reads it through a wrapper, Read does not block
	// (ErrWouldBlock) and the read deadline wakes the relay (kick) instead
	// of a blocked reader.
	nb       atomic.Bool
	nbMu     sync.Mutex
	kick     func()
	deadline time.Time
	dlTimer  *time.Timer
}

// nonBlocking makes Read return ErrWouldBlock instead of waiting, and the
// read deadline call kick when it passes.
func (c *tcpConn) nonBlocking(kick func()) {
	c.nbMu.Lock()
	c.kick = kick
	c.nbMu.Unlock()
	c.nb.Store(true)
}

// NonBlocking reports whether Read returns ErrWouldBlock rather than wait
// (an event relay reads the connection through a wrapper).
func (c *tcpConn) NonBlocking() bool { return c.nb.Load() }

// blocking undoes nonBlocking.
func (c *tcpConn) blocking() {
	c.nb.Store(false)
	c.nbMu.Lock()
	if c.dlTimer != nil {
		c.dlTimer.Stop()
	}
	c.kick = nil
	c.nbMu.Unlock()
}

// Read reads the sandbox's bytes.
func (c *tcpConn) Read(p []byte) (int, error) {
	if !c.nb.Load() {
		return c.TCPConn.Read(p)
	}
	c.nbMu.Lock()
	dl := c.deadline
	c.nbMu.Unlock()
	if !dl.IsZero() && !time.Now().Before(dl) {
		return 0, &net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}
	}
	w := tcpip.SliceWriter(p)
	res, e := c.ep.Read(&w, tcpip.ReadOptions{})
	switch {
	case e == nil:
		c.ep.ModerateRecvBuf(res.Count)
		return res.Count, nil
	case isWouldBlock(e):
		return 0, ErrWouldBlock
	case isClosedForReceive(e):
		return 0, io.EOF
	}
	return 0, sandboxErr("read", e)
}

// Write writes to the sandbox. While an event relay drives a wrapper of
// the connection it does not wait (it may run on the relays' poller): what
// gVisor does not take at once is not written, and Write returns
// ErrWouldBlock with the count it did write.
func (c *tcpConn) Write(p []byte) (int, error) {
	if !c.nb.Load() {
		return c.TCPConn.Write(p)
	}
	var rd bytes.Reader
	rd.Reset(p)
	n, e := c.ep.Write(&rd, tcpip.WriteOptions{})
	switch {
	case e == nil && int(n) == len(p):
		return len(p), nil
	case e == nil, isWouldBlock(e):
		return int(n), ErrWouldBlock
	}
	return int(n), sandboxErr("write", e)
}

// SetReadDeadline sets the read deadline.
func (c *tcpConn) SetReadDeadline(t time.Time) error {
	if !c.nb.Load() {
		return c.TCPConn.SetReadDeadline(t)
	}
	c.nbMu.Lock()
	defer c.nbMu.Unlock()
	c.deadline = t
	if c.dlTimer != nil {
		c.dlTimer.Stop()
	}
	if !t.IsZero() && c.kick != nil {
		c.dlTimer = time.AfterFunc(time.Until(t), c.kick)
	}
	return nil
}

// SetDeadline sets both deadlines.
func (c *tcpConn) SetDeadline(t time.Time) error {
	c.SetReadDeadline(t)
	return c.TCPConn.SetWriteDeadline(t)
}

// release ends the flow's accounting (live flows, buffer budget), once.
func (c *tcpConn) release() {
	c.releaseOnce.Do(func() {
		c.s.budget.Remove(c)
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

// CapBuffers implements rt.Owner.
func (c *tcpConn) CapBuffers(max int) {
	so := c.ep.SocketOptions()
	if so.GetSendBufferSize() > int64(max) {
		so.SetSendBufferSize(int64(max), true)
	}
	if so.GetReceiveBufferSize() > int64(max) {
		so.SetReceiveBufferSize(int64(max), true)
	}
}
