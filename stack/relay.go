package stack

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// relayBufSize is the copy buffer per direction. Buffers are pooled as
// pointers to arrays (a []byte in a sync.Pool allocates on every Put, SA6002).
const relayBufSize = 64 << 10

var relayBufs = sync.Pool{New: func() any { return new([relayBufSize]byte) }}

// RelayResult says how a relay ended.
type RelayResult struct {
	Out, In int64 // bytes sandbox->upstream and upstream->sandbox
	Err     error // first error other than a clean EOF, or ErrIdle; IsReset(Err) if an end reset the connection
}

// errCannotWatch ends a relay whose upstream socket the poller cannot
// watch.
var errCannotWatch = errors.New("stack: cannot watch the upstream socket")

// ErrIdle ends a relay that moved no byte in either direction for the idle
// timeout.
var ErrIdle = errors.New("stack: idle timeout")

type closeWriter interface{ CloseWrite() error }

// relayEnd is how a relay ends: the first error, and closing both conns
// once. Both relays, their ctx callback and their idle checks share it.
type relayEnd struct {
	a, b      net.Conn
	closeOnce sync.Once
	mu        sync.Mutex
	err       error
}

// fail records err if it is the first, and closes both conns.
func (r *relayEnd) fail(err error) {
	r.mu.Lock()
	if r.err == nil {
		r.err = err
	}
	r.mu.Unlock()
	r.close()
}

// close closes both conns once. After a reset of one (the first error is
// ErrSandboxReset or ErrUpstreamReset) the other is aborted (see reset.go);
// a is the sandbox's side.
func (r *relayEnd) close() {
	r.closeOnce.Do(func() {
		r.mu.Lock()
		err := r.err
		r.mu.Unlock()
		switch {
		case errors.Is(err, ErrUpstreamReset):
			abortConn(r.a)
			r.b.Close()
		case errors.Is(err, ErrSandboxReset):
			r.a.Close()
			abortConn(r.b)
		case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
			// The relay's context ended (the flow was revoked, or tunwall
			// is stopping): both ends are reset, neither told it is done.
			abortConn(r.a)
			abortConn(r.b)
		default:
			r.a.Close()
			r.b.Close()
		}
	})
}

// firstErr returns the first error, after the relay's goroutines are done.
func (r *relayEnd) firstErr() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}

// RelayTCP copies bytes both ways between the sandbox's connection and the
// upstream one until both directions are finished. When one side stops
// sending (EOF) the other side's write half is closed, so half-closed
// protocols work. A direction that errors tears both down (the sandbox sees
// RST). If no byte moves in either direction for idle (0 means never), both
// are closed with ErrIdle. ctx cancellation closes both. It closes both
// conns before returning.
//
// A sandbox connection of this package with a plain upstream socket is
// relayed by events, with no goroutine or buffer of its own while it waits
// (see StartRelayTCP); other pairs by two goroutines with a buffer each.
func RelayTCP(ctx context.Context, sandbox, upstream net.Conn, idle time.Duration) RelayResult {
	ch := make(chan RelayResult, 1)
	StartRelayTCP(ctx, sandbox, upstream, idle, func(r RelayResult) { ch <- r })
	return <-ch
}

// startRelayTCP relays sb, the sandbox's side of a flow of this Stack, and
// up (TCPRequest.Relay). A plain upstream socket is relayed by events,
// and startRelayTCP returns at once; done is called once, on another
// goroutine, when the relay has ended, and the relay counts as one of the
// Stack's flows until done returns (Stack.Close waits for it). Any other
// upstream (a proxy's, a TLS connection) is relayed on the caller's
// goroutine, and startRelayTCP returns after done. It owns both conns.
func startRelayTCP(ctx context.Context, sb *tcpConn, up net.Conn, o RelayOptions, done func(RelayResult)) {
	var sandbox net.Conn = sb
	if o.Client != nil {
		sandbox = clientConn{tcpConn: sb, f: o.Client}
	}
	if !sb.s.startFlow() {
		abortConn(sandbox)
		up.Close()
		done(RelayResult{Err: context.Canceled})
		return
	}
	fd, ok := takeUpstream(up)
	if !ok {
		defer sb.s.flows.Done()
		if o.Tap != nil {
			up = tapConn{Conn: up, tap: o.Tap}
		}
		done(relayTCPConns(ctx, sandbox, up, o.Idle))
		return
	}
	if !startTCPEventRelay(ctx, sb, o.Client, fd, o.Tap, o.Idle, o.Progress, done) {
		// The socket cannot be watched (out of epoll watches): the flow
		// fails, closed.
		unix.Close(fd)
		abortConn(sandbox)
		defer sb.s.flows.Done()
		done(RelayResult{Err: errCannotWatch})
	}
}

// StartRelayTCP relays a sandbox connection of this Stack that no Handler
// checks (as TCPRequest.Relay with only RelayOptions.Idle), or any other
// pair of connections on two goroutines, on the caller's goroutine.
func StartRelayTCP(ctx context.Context, sandbox, upstream net.Conn, idle time.Duration, done func(RelayResult)) {
	if sb, ok := sandbox.(*tcpConn); ok {
		startRelayTCP(ctx, sb, upstream, RelayOptions{Idle: idle}, done)
		return
	}
	done(relayTCPConns(ctx, sandbox, upstream, idle))
}

// takeUpstream takes the socket of a plain TCP upstream: one TCPRequest.Dial
// returned, or one of package net's.
func takeUpstream(c net.Conn) (int, bool) {
	if u, ok := c.(*upSocket); ok {
		if fd, ok := u.take(); ok {
			return fd, true
		}
		u.mu.Lock()
		c = u.conn // Go's connection over it, if one was made
		u.mu.Unlock()
	}
	if _, ok := c.(*net.TCPConn); !ok {
		return -1, false
	}
	return takeSocket(c)
}

// relayTCPConns relays two conns with two goroutines, one of them the
// caller's; reads carry no deadlines (a single timer watches for idleness),
// so the per-read cost is a read and a write.
func relayTCPConns(ctx context.Context, sandbox, upstream net.Conn, idle time.Duration) RelayResult {
	var res RelayResult
	r := &connRelay{sandbox: sandbox, end: &relayEnd{a: sandbox, b: upstream}, idle: idle}
	stop := context.AfterFunc(ctx, func() { r.end.fail(ctx.Err()) })
	defer stop()
	if idle > 0 {
		defer r.watchIdle().Stop()
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.copy(sandbox, upstream, &res.In)
	}()
	r.copy(upstream, sandbox, &res.Out)
	<-done
	r.end.close()
	res.Err = r.end.firstErr()
	if isClosedErr(res.Err) {
		res.Err = nil
	}
	return res
}

// connRelay is the state the two directions of relayTCPConns share.
type connRelay struct {
	sandbox  net.Conn
	end      *relayEnd
	idle     time.Duration // 0: no idle timeout
	lastSeen atomic.Int64  // UnixNano of the last byte read or written
	writing  atomic.Int32  // writes in progress
}

// watchIdle starts the single timer that ends the relay with ErrIdle once
// no byte has moved for r.idle and no write is blocked.
func (r *connRelay) watchIdle() *time.Timer {
	r.lastSeen.Store(time.Now().UnixNano())
	var t *time.Timer
	t = time.AfterFunc(r.idle, func() {
		if r.writing.Load() > 0 {
			t.Reset(r.idle)
			return
		}
		if quiet := time.Since(time.Unix(0, r.lastSeen.Load())); quiet < r.idle {
			t.Reset(r.idle - quiet)
			return
		}
		r.end.fail(ErrIdle)
	})
	return t
}

// why says what an error of c means: a reset of either side becomes
// ErrSandboxReset or ErrUpstreamReset.
func (r *connRelay) why(c net.Conn, err error) error {
	if c == r.sandbox {
		return sandboxReset(err)
	}
	return upstreamReset(err)
}

// copy moves src's bytes to dst, counting them in *n, until src ends
// (EOF becomes a half-close of dst where dst allows one) or either fails.
func (r *connRelay) copy(dst, src net.Conn, n *int64) {
	bp := relayBufs.Get().(*[relayBufSize]byte)
	defer relayBufs.Put(bp)
	buf := bp[:]
	for {
		nr, rerr := src.Read(buf)
		if nr > 0 {
			if r.idle > 0 {
				r.lastSeen.Store(time.Now().UnixNano())
			}
			// A write to a slow reader may block longer than the idle
			// timeout while bytes are still moving: it counts as activity.
			r.writing.Add(1)
			nw, werr := dst.Write(buf[:nr])
			r.writing.Add(-1)
			*n += int64(nw)
			if r.idle > 0 {
				r.lastSeen.Store(time.Now().UnixNano())
			}
			if werr != nil {
				r.end.fail(r.why(dst, werr))
				return
			}
		}
		if rerr == nil {
			continue
		}
		if rerr == io.EOF {
			if cw, ok := dst.(closeWriter); ok && cw.CloseWrite() == nil {
				return
			}
			r.end.close()
		} else {
			r.end.fail(r.why(src, rerr))
		}
		return
	}
}

// isClosedErr reports errors that only mean "the other direction already
// closed this conn".
func isClosedErr(err error) bool {
	return err != nil && errors.Is(err, net.ErrClosed)
}

// RelayUDP copies datagrams both ways between the sandbox's session and a
// connected upstream socket until neither side has sent anything for idle
// (0 means 60s), ctx is cancelled, or a side fails. It closes both. An idle
// expiry is the normal end of a UDP session: Err is nil then. Like RelayTCP,
// a session of this package with a plain upstream socket is relayed by
// events.
func RelayUDP(ctx context.Context, sandbox, upstream net.Conn, idle time.Duration) RelayResult {
	ch := make(chan RelayResult, 1)
	StartRelayUDP(ctx, sandbox, upstream, idle, func(r RelayResult) { ch <- r })
	return <-ch
}

// StartRelayUDP is RelayUDP as StartRelayTCP is RelayTCP: a session of this
// package is relayed as UDPSession.Relay relays it; any other pair on the
// caller's goroutine.
func StartRelayUDP(ctx context.Context, sandbox, upstream net.Conn, idle time.Duration, done func(RelayResult)) {
	if sb, ok := sandbox.(*udpConn); ok {
		startRelayUDP(ctx, sb, upstream, idle, nil, done)
		return
	}
	if idle == 0 {
		idle = 60 * time.Second
	}
	done(relayUDPConns(ctx, sandbox, upstream, idle))
}

// startRelayUDP relays sb, a session of this Stack, and upstream
// (UDPSession.Relay): a plain UDP socket by events, returning at once;
// any other upstream on the caller's goroutine. It takes the session over:
// the Stack does not close it when serve returns.
func startRelayUDP(ctx context.Context, sb *udpConn, upstream net.Conn, idle time.Duration, prog *Progress, done func(RelayResult)) {
	if idle == 0 {
		idle = 60 * time.Second
	}
	sb.relayed.Store(true)
	if !sb.s.startFlow() {
		sb.Close()
		upstream.Close()
		done(RelayResult{Err: context.Canceled})
		return
	}
	fd, ok := takeSocket(upstream)
	if !ok {
		defer sb.s.flows.Done()
		done(relayUDPConns(ctx, sb, upstream, idle))
		return
	}
	if !startUDPEventRelay(ctx, sb, fd, idle, prog, done) {
		unix.Close(fd)
		sb.Close()
		defer sb.s.flows.Done()
		done(RelayResult{Err: errCannotWatch})
	}
}

func relayUDPConns(ctx context.Context, sandbox, upstream net.Conn, idle time.Duration) RelayResult {
	if idle == 0 {
		idle = 60 * time.Second
	}
	var (
		res      RelayResult
		end      = &relayEnd{a: sandbox, b: upstream}
		lastSeen atomic.Int64
		wg       sync.WaitGroup
	)
	lastSeen.Store(time.Now().UnixNano())
	stop := context.AfterFunc(ctx, func() { end.fail(ctx.Err()) })
	defer stop()
	dir := func(dst, src net.Conn, n *int64) {
		defer wg.Done()
		bp := relayBufs.Get().(*[relayBufSize]byte)
		defer relayBufs.Put(bp)
		for {
			src.SetReadDeadline(time.Now().Add(idle))
			nr, err := src.Read(bp[:])
			if err != nil {
				if errors.Is(err, os.ErrDeadlineExceeded) {
					if time.Since(time.Unix(0, lastSeen.Load())) < idle {
						continue
					}
					err = ErrIdle
				}
				end.fail(err)
				return
			}
			lastSeen.Store(time.Now().UnixNano())
			if _, err := dst.Write(bp[:nr]); err != nil {
				// An ICMP error from one side (e.g. port unreachable) makes a
				// later write fail; that ends the session.
				end.fail(err)
				return
			}
			*n += int64(nr)
		}
	}
	wg.Add(2)
	go dir(upstream, sandbox, &res.Out)
	go dir(sandbox, upstream, &res.In)
	wg.Wait()
	res.Err = end.firstErr()
	if errors.Is(res.Err, ErrIdle) || isClosedErr(res.Err) {
		res.Err = nil
	}
	return res
}
