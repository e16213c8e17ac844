package stack

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
)

// TCPRequest is one new TCP flow, as the Stack hands it to Handler.TCP:
// gVisor's tcp.ForwarderRequest, one floor up. The Stack owns it; the
// Handler, on TCP's goroutine, may Dial its upstream (the stack's own
// dial), then Accept (complete the sandbox's handshake) and either Relay
// the flow or read the sandbox's side itself; a flow it never accepts, or
// Resets, ends in an RST to the sandbox. Every way the Handler and the
// Stack meet over a TCP flow is a method here: nothing is found by type
// assertion on the connections they exchange.
type TCPRequest interface {
	// Flow is the flow the SYN asked for.
	Flow() Flow
	// Dial connects to ap from tunwall's side, as the stack dials (see
	// Stack.DialTCP): the socket is handed to Relay as it is.
	Dial(ctx context.Context, ap netip.AddrPort) (net.Conn, error)
	// Accept completes the sandbox's handshake and returns its side of
	// the connection, once; a second call fails.
	Accept() (net.Conn, error)
	// Relay moves bytes between the accepted sandbox side and up until
	// either ends (see RelayOptions), and then calls done once, on another
	// goroutine; the relay counts as one of the Stack's flows until done
	// returns. Relay owns up, and the sandbox side, from the call. Without
	// Accept first, it closes up and done gets ErrNotAccepted.
	Relay(ctx context.Context, up net.Conn, o RelayOptions, done func(RelayResult))
	// Reset resets the sandbox's side once accepted, and closes it (a
	// flow never accepted is reset when TCP returns).
	Reset()
}

// RelayOptions say how TCPRequest.Relay relays.
type RelayOptions struct {
	// Idle ends a flow on which no byte moved for this long (0: never),
	// with ErrIdle.
	Idle time.Duration
	// Client, when not nil, is what the relay reads the sandbox's bytes
	// through: the Handler's check of them, over the connection Accept
	// returned. It is read without blocking (ErrWouldBlock: nothing may
	// pass now; its read deadline, set on the accepted connection, wakes
	// the relay).
	Client ClientFilter
	// Tap, when not nil, is shown each read of the upstream before the
	// sandbox gets its bytes (b nil and err io.EOF at its end; both nil to
	// ask only); returning false ends the upstream's stream there, as at
	// its end.
	Tap func(b []byte, err error) bool
	// Progress, when not nil, counts the bytes relayed so far each way,
	// for whoever lists the open flows (UDP sessions too).
	Progress *Progress
}

// Progress is what a relay has moved so far: Out from the sandbox, In to
// it. It may be read while the relay runs.
type Progress struct{ out, in atomic.Int64 }

// Out and In are the bytes moved so far from and to the sandbox (0 for a
// nil Progress).
func (p *Progress) Out() int64 {
	if p == nil {
		return 0
	}
	return p.out.Load()
}

func (p *Progress) In() int64 {
	if p == nil {
		return 0
	}
	return p.in.Load()
}

func (p *Progress) addOut(n int64) {
	if p != nil {
		p.out.Add(n)
	}
}

func (p *Progress) addIn(n int64) {
	if p != nil {
		p.in.Add(n)
	}
}

// ClientFilter is RelayOptions.Client: the Handler's reader of the
// sandbox's bytes.
type ClientFilter interface {
	// Read reads what may go upstream, without blocking (ErrWouldBlock).
	Read(p []byte) (int, error)
	// CloseWrite ends the sandbox's side for writing once the upstream
	// has ended; the filter may first write a reply of its own.
	CloseWrite() error
	// Abort resets the sandbox's side; Close closes it.
	Abort()
	Close() error
	// ReadByEvents tells the filter, before the first read, that the
	// relay reads it by events, without blocking: where it would wait (for
	// the upstream's answer), it returns ErrWouldBlock, and is read again
	// when there is news. The relay of a flow whose upstream it cannot
	// watch reads it on a goroutine of its own, and does not call this.
	ReadByEvents()
}

// ErrNotAccepted is what Relay reports when the flow was never accepted.
var ErrNotAccepted = errors.New("stack: relay of a flow not accepted")

// tcpRequest is the Stack's TCPRequest.
type tcpRequest struct {
	s    *Stack
	r    *tcp.ForwarderRequest
	f    Flow
	done func() // the flow's handshake slots go, once

	mu       sync.Mutex
	answered bool     // Accept was called, or the Handler returned
	conn     *tcpConn // the accepted sandbox side
	relayed  bool
}

func (q *tcpRequest) Flow() Flow { return q.f }

func (q *tcpRequest) Dial(ctx context.Context, ap netip.AddrPort) (net.Conn, error) {
	return q.s.DialTCP(ctx, ap)
}

// Accept holds q.mu through the handshake, so that the Handler's return
// (finished) waits for an Accept still in progress.
func (q *tcpRequest) Accept() (net.Conn, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.answered {
		return nil, errAcceptTwice
	}
	q.answered = true
	defer q.done()
	c, err := q.s.completeHandshake(q.r, q.f)
	if err != nil {
		return nil, err
	}
	q.conn = c
	return c, nil
}

// finished ends the request when the Handler returns: a SYN it never
// accepted, or whose handshake failed, is answered with an RST. It
// reports whether the flow was accepted.
func (q *tcpRequest) finished() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.answered = true // a late Accept from a stray goroutine now fails
	if q.conn != nil {
		return true
	}
	q.r.Complete(true)
	return false
}

func (q *tcpRequest) Reset() {
	q.mu.Lock()
	c := q.conn
	q.mu.Unlock()
	if c != nil {
		c.Abort() // and closes
	}
}

func (q *tcpRequest) Relay(ctx context.Context, up net.Conn, o RelayOptions, done func(RelayResult)) {
	q.mu.Lock()
	sb := q.conn
	twice := q.relayed
	q.relayed = true
	q.mu.Unlock()
	if sb == nil || twice {
		up.Close()
		done(RelayResult{Err: ErrNotAccepted})
		return
	}
	startRelayTCP(ctx, sb, up, o, done)
}

// clientConn is the sandbox's side read through a ClientFilter, for the
// goroutine relay, which takes net.Conns.
type clientConn struct {
	*tcpConn
	f ClientFilter
}

func (c clientConn) Read(p []byte) (int, error) { return c.f.Read(p) }
func (c clientConn) CloseWrite() error          { return c.f.CloseWrite() }
func (c clientConn) Abort()                     { c.f.Abort() }
func (c clientConn) Close() error               { return c.f.Close() }

// tapConn shows its reads to a RelayOptions.Tap, for the goroutine relay.
type tapConn struct {
	net.Conn
	tap func([]byte, error) bool
}

func (t tapConn) Read(p []byte) (int, error) {
	if !t.tap(nil, nil) {
		return 0, io.EOF
	}
	n, err := t.Conn.Read(p)
	switch {
	case n > 0:
		if !t.tap(p[:n], nil) {
			return 0, io.EOF
		}
	case err == io.EOF:
		t.tap(nil, io.EOF)
	}
	return n, err
}

// UDPSession is one new UDP association, as the Stack hands it to the
// serve function Handler.UDP returned. The Stack owns it, and closes its
// connection when serve returns, unless serve relayed it.
type UDPSession interface {
	// Flow is the session's first datagram's flow.
	Flow() Flow
	// Conn is the sandbox's side, connected to Flow().Src, the first
	// datagram already queued on it.
	Conn() net.Conn
	// Relay moves datagrams between Conn and up until the session has
	// been idle for o.Idle (0: 60s), ctx ends, or a side fails, and then
	// calls done once (o.Client and o.Tap do not apply to UDP). A plain UDP socket is relayed by events and Relay
	// returns at once (serve may return too); any other upstream on the
	// caller's goroutine. Relay owns both conns from the call.
	Relay(ctx context.Context, up net.Conn, o RelayOptions, done func(RelayResult))
}

// udpSession is the Stack's UDPSession.
type udpSession struct {
	f Flow
	c *udpConn
}

func (u udpSession) Flow() Flow     { return u.f }
func (u udpSession) Conn() net.Conn { return u.c }
func (u udpSession) Relay(ctx context.Context, up net.Conn, o RelayOptions, done func(RelayResult)) {
	startRelayUDP(ctx, u.c, up, o.Idle, o.Progress, done)
}
