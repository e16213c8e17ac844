package stack

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/tunwall/tunwall/stack/internal/rt"
	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/waiter"
)

// The event relay moves bytes between a sandbox-side connection of this
// package and an upstream socket without a goroutine or a buffer per flow:
// gVisor tells it (through the connection's waiter queue) when the sandbox
// side can be read or written, the Stack's poller tells it when the upstream
// socket can, and a short-lived goroutine moves whatever can move without
// blocking, then exits. A flow that waits costs its two sockets and a small
// struct; data waiting to move stays where it is, in the budgeted gVisor
// buffers or in the host kernel's socket buffers:
//
//   - sandbox -> upstream: the sandbox's bytes are peeked from gVisor's
//     receive queue, written to the upstream socket without blocking, and
//     only what the kernel took is consumed; the rest stays queued (and the
//     sandbox's window closes) until the socket is writable again.
//   - upstream -> sandbox: only as many bytes as the upstream socket holds
//     (SIOCINQ) and gVisor's send buffer has room for are read, straight
//     into gVisor's buffer; the rest stays in the kernel until the sandbox
//     reads.

// Pump states. A relay's pump runs on at most one goroutine at a time.
const (
	pumpIdle     = iota
	pumpRunning  // a goroutine is pumping
	pumpAgain    // ... and must look again before it stops
	pumpFinished // the relay is over; nothing runs any more
)

// pumpCore is what the TCP and UDP event relays share: scheduling, hints
// from events, idleness, ending.
type pumpCore struct {
	ctx   context.Context
	s     *Stack
	fd    int // upstream socket
	pid   uint64
	idle  time.Duration
	entry waiter.Entry
	wq    *waiter.Queue
	// step moves what can move, at most limit times (0: no limit). It
	// reports whether the relay is over, and whether it stopped at the
	// limit with more to move.
	step func(limit int) (over, more bool)

	state atomic.Int32
	// Hints set by events, consumed by the pump.
	hUpR, hUpW, hSbR, hSbW atomic.Bool
	// upHup is set for good once the upstream socket reported its peer's
	// FIN (or an error): a read that comes back short then does not mean
	// "drained", since no new edge will come.
	upHup atomic.Bool
	// Writability matters only to a direction blocked on it: other
	// writable events (one per ACK) only set the hint.
	wantUpW, wantSbW atomic.Bool
	idleOut          atomic.Bool
	waiting          atomic.Bool // a direction has data waiting for the other side: not idle
	lastSeen         atomic.Int64
	idleTimer        *time.Timer
	stopCtx          func() bool
	prog             *Progress // counts what moved, when not nil

	watchingOut bool // the poller watches writability (pump-owned)
	inline      bool // the pump runs on a caller's goroutine (pump-owned)
}

// schedule makes sure a pump runs after this call, on another goroutine
// (the Stack's pumpRunner).
func (p *pumpCore) schedule() { p.kick(false) }

// kick starts a pump, or tells the running one to look again. inline runs
// the first few moves on the caller's goroutine (the poller's: a goroutine
// less between an upstream's bytes and the sandbox) and hands the rest to
// a new goroutine.
func (p *pumpCore) kick(inline bool) {
	for {
		switch p.state.Load() {
		case pumpIdle:
			if p.state.CompareAndSwap(pumpIdle, pumpRunning) {
				if !inline || p.pump(inlineMoves, true) {
					p.s.pumps.Start(p)
				}
				return
			}
		case pumpRunning:
			if p.state.CompareAndSwap(pumpRunning, pumpAgain) {
				return
			}
		default: // again, or finished
			return
		}
	}
}

// Pump implements rt.Pump: a runner goroutine's turn.
func (p *pumpCore) Pump(limit int) bool { return p.pump(limit, false) }

// inlineMoves bounds the moves a pump makes on the poller's goroutine, so
// that one busy flow does not hold up the others' events.
const inlineMoves = 4

// pump moves what is ready, at most limit times, on a goroutine that is
// inline (the poller's or a caller's) or the runner's. It reports whether
// it stopped at the limit with more to move: the pump is still
// pumpRunning, and the caller must have it carried on (rt.Runner).
func (p *pumpCore) pump(limit int, inline bool) (more bool) {
	p.inline = inline
	for {
		over, more := p.step(limit)
		if over {
			p.state.Store(pumpFinished)
			return false
		}
		if more {
			return true
		}
		if p.state.CompareAndSwap(pumpRunning, pumpIdle) {
			return false
		}
		p.state.Store(pumpRunning) // it was pumpAgain: an event came meanwhile
	}
}

// PollEvent implements rt.Target.
func (p *pumpCore) PollEvent(ev uint32) {
	run := false
	if ev&(unix.EPOLLRDHUP|unix.EPOLLHUP|unix.EPOLLERR) != 0 {
		p.upHup.Store(true)
	}
	if ev&(unix.EPOLLIN|unix.EPOLLRDHUP|unix.EPOLLHUP|unix.EPOLLERR) != 0 {
		p.hUpR.Store(true)
		run = true
	}
	if ev&(unix.EPOLLOUT|unix.EPOLLHUP|unix.EPOLLERR) != 0 {
		p.hUpW.Store(true)
		run = run || p.wantUpW.Load()
	}
	if run {
		p.kick(true)
	}
}

// sandboxEvent is the waiter callback of the sandbox side.
func (p *pumpCore) sandboxEvent(m waiter.EventMask) {
	run := false
	if m&(waiter.ReadableEvents|waiter.EventHUp|waiter.EventErr) != 0 {
		p.hSbR.Store(true)
		run = true
	}
	if m&(waiter.WritableEvents|waiter.EventHUp|waiter.EventErr) != 0 {
		p.hSbW.Store(true)
		run = run || p.wantSbW.Load()
	}
	if run {
		p.schedule()
	}
}

func (p *pumpCore) touch() {
	if p.idle > 0 {
		p.lastSeen.Store(time.Now().UnixNano())
	}
}

func (p *pumpCore) idleTick() {
	if p.state.Load() == pumpFinished {
		return
	}
	if p.waiting.Load() {
		p.idleTimer.Reset(p.idle)
		return
	}
	if quiet := time.Since(time.Unix(0, p.lastSeen.Load())); quiet < p.idle {
		p.idleTimer.Reset(p.idle - quiet)
		return
	}
	p.idleOut.Store(true)
	p.schedule()
}

// start registers for events and runs the first pump. It returns false if
// the upstream socket cannot be watched; nothing is registered then.
func (p *pumpCore) start(mask waiter.EventMask) bool {
	// Until the setup is done, events only ask the pump to look again.
	p.state.Store(pumpRunning)
	p.entry = waiter.NewFunctionEntry(mask, p.sandboxEvent)
	p.wq.EventRegister(&p.entry)
	id, err := p.s.poller.Add(p.fd, p)
	if err != nil {
		p.wq.EventUnregister(&p.entry)
		p.s.log.Debug("event relay unavailable", "err", err)
		return false
	}
	p.pid = id
	p.stopCtx = context.AfterFunc(p.ctx, p.schedule)
	if p.idle > 0 {
		p.touch()
		p.idleTimer = time.AfterFunc(p.idle, p.idleTick)
	}
	p.hUpR.Store(true)
	p.hUpW.Store(true)
	p.hSbR.Store(true)
	p.hSbW.Store(true)
	if p.pump(inlineMoves, true) { // on the caller's goroutine: most flows have little to move yet
		p.s.pumps.Start(p)
	}
	return true
}

// finish calls done and releases the flow, on a new goroutine when the
// pump runs on a goroutine it must not hold up (done may block: the engine
// writes an audit record).
func (p *pumpCore) finish(done func(RelayResult), res RelayResult) {
	end := func() {
		done(res)
		p.s.flows.Done()
	}
	if p.inline {
		p.s.warm.Run(end)
	} else {
		end()
	}
}

// wantOut asks the poller for the upstream socket's writability, or stops.
func (p *pumpCore) wantOut(on bool) {
	if on != p.watchingOut {
		p.watchingOut = on
		p.s.poller.WatchOut(p.fd, p.pid, on)
	}
}

// stop undoes start. It runs on the pump, once, before the sockets close.
func (p *pumpCore) stop() {
	p.stopCtx()
	if p.idleTimer != nil {
		p.idleTimer.Stop()
	}
	p.wq.EventUnregister(&p.entry)
	p.s.poller.Del(p.fd, p.pid)
}

// takeSocket takes the descriptor of a plain TCP or UDP socket from package
// net for the event relay: it duplicates it and closes c, so that Go's own
// poller no longer watches the socket (it would be woken for nothing at
// every event). Wrappers (TLS, SOCKS5 UDP) are not taken: ok is false and c
// is untouched.
func takeSocket(c net.Conn) (fd int, ok bool) {
	var rc syscall.RawConn
	var err error
	switch c := c.(type) {
	case *net.TCPConn:
		rc, err = c.SyscallConn()
	case *net.UDPConn:
		rc, err = c.SyscallConn()
	default:
		return -1, false
	}
	if err != nil {
		return -1, false
	}
	fd = -1
	if err := rc.Control(func(f uintptr) {
		fd, err = unix.FcntlInt(f, unix.F_DUPFD_CLOEXEC, 0)
	}); err != nil || fd < 0 {
		return -1, false
	}
	c.Close()
	return fd, true
}

// tcpRelay is one TCP flow's event relay.
type tcpRelay struct {
	pumpCore
	sb   *tcpConn
	done func(RelayResult)
	// wrap, if not nil, is what the sandbox's bytes are read through (the
	// Handler's check of what the client sends, over sb).
	wrap ClientFilter
	// tap, if not nil, sees upstream's bytes before the sandbox does.
	tap func(b []byte, err error) bool

	// Owned by the pump.
	upR, upW, sbR, sbW bool   // what the pump believes is ready
	inDone, outDone    bool   // upstream's / the sandbox's EOF was passed on
	pending            []byte // read from upstream, not yet taken by gVisor
	pendingOut         []byte // read through wrap, not yet taken by upstream
	sndbuf             int    // the upstream socket's SO_SNDBUF when the relay began
	outEOF             bool   // wrap reported the end; passed on once pendingOut is
	draining           bool
	drainTimer         *time.Timer
	in, out            int64
	err                error
}

// startTCPEventRelay relays sb (read through wrap, if not nil) and the
// upstream socket fd, which it owns (its bytes shown to tap, if not nil).
func startTCPEventRelay(ctx context.Context, sb *tcpConn, wrap ClientFilter, fd int, tap func([]byte, error) bool, idle time.Duration, prog *Progress, done func(RelayResult)) bool {
	r := &tcpRelay{sb: sb, wrap: wrap, tap: tap, done: done, upR: true, upW: true, sbR: true, sbW: true}
	if wrap != nil {
		wrap.ReadByEvents()
		r.sndbuf, _ = unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF)
		// The wrapper reads sb; sb must then never block the pump, and its
		// read deadline (the wrapper's timeouts) must wake it.
		sb.nonBlocking(func() {
			r.hSbR.Store(true)
			r.schedule()
		})
	}
	r.pumpCore = pumpCore{ctx: ctx, s: sb.s, fd: fd, idle: idle, wq: sb.wq, step: r.step, prog: prog}
	return r.start(waiter.ReadableEvents | waiter.WritableEvents | waiter.EventHUp | waiter.EventErr)
}

func (r *tcpRelay) fail(err error) {
	if r.err == nil {
		r.err = err
	}
}

// step implements pumpCore.step.
func (r *tcpRelay) step(limit int) (over, more bool) {
	if err := r.ctx.Err(); err != nil {
		r.fail(err)
	} else if r.idleOut.Swap(false) {
		r.fail(ErrIdle)
	}
	moves := 0
	for {
		if r.hUpR.Swap(false) {
			r.upR = true
		}
		if r.hUpW.Swap(false) {
			r.upW = true
		}
		if r.hSbR.Swap(false) {
			r.sbR = true
		}
		if r.hSbW.Swap(false) {
			r.sbW = true
		}
		for r.err == nil {
			if limit > 0 && moves >= limit {
				return false, true
			}
			moved := false
			if !r.inDone && len(r.pending) == 0 && r.tap != nil && !r.tap(nil, nil) {
				// Cut by its wrapper, once what was read before the cut
				// has been passed on.
				moved = r.upstreamEnded()
			}
			if !r.inDone && (r.upR || len(r.pending) > 0) && r.sbW {
				moved = r.moveIn() || moved
			}
			if r.err == nil && !r.outDone && (r.sbR || len(r.pendingOut) > 0 || r.outEOF) && r.upW {
				moved = r.moveOut() || moved
			}
			if !moved {
				break
			}
			moves++
		}
		if r.err != nil {
			r.end()
			return true, false
		}
		if r.inDone && r.outDone && r.drained() {
			r.end()
			return true, false
		}
		// Blocked on writability: ask for the events, then look at the
		// hints once more (an event may have come before the ask).
		needSbW := !r.inDone && (r.upR || len(r.pending) > 0) && !r.sbW || r.draining
		needUpW := !r.outDone && (r.sbR || len(r.pendingOut) > 0 || r.outEOF) && !r.upW
		r.wantSbW.Store(needSbW)
		r.wantUpW.Store(needUpW)
		r.wantOut(needUpW)
		r.waiting.Store(needSbW && !r.draining || needUpW)
		if !(needSbW && r.hSbW.Load()) && !(needUpW && r.hUpW.Load()) {
			return false, false
		}
	}
}

// moveIn moves bytes from upstream to the sandbox; it reports progress.
// It reads only when gVisor's send buffer has room, at most one buffer's
// cap (so that what gVisor cannot take at once, kept in pending, stays
// within the budget), and gives gVisor exactly what it read.
func (r *tcpRelay) moveIn() bool {
	if len(r.pending) > 0 {
		return r.writeIn(r.pending, true)
	}
	if r.sb.ep.Readiness(waiter.WritableEvents) == 0 {
		r.sbW = false
		return false
	}
	bp, h := rt.GetScratch(r.s.budget.CapNow())
	defer rt.PutScratch(h)
	n, err := unix.Read(r.fd, bp)
	switch {
	case err == unix.EAGAIN:
		r.upR = false
		return false
	case err == unix.EINTR:
		return true
	case err != nil:
		r.fail(os.NewSyscallError("read", err))
		return false
	case n == 0: // FIN: passed on after what gVisor holds
		if r.tap != nil {
			r.tap(nil, io.EOF)
		}
		return r.upstreamEnded()
	}
	if n < len(bp) && !r.upHup.Load() {
		// The socket held less than asked: its next bytes (or its FIN)
		// bring a new edge-triggered event, so no probing read is needed.
		r.upR = false
	}
	if r.tap != nil {
		if !r.tap(bp[:n], nil) {
			return r.upstreamEnded() // cut: what came after is dropped
		}
		r.sbR = true // the wrapper may be waiting on what upstream says
	}
	return r.writeIn(bp[:n], false)
}

// upstreamEnded passes upstream's end to the sandbox: a FIN once gVisor has
// sent what it holds (through the wrapper's CloseWrite, which may first
// send a reply of its own).
func (r *tcpRelay) upstreamEnded() bool {
	r.inDone = true
	r.pending = nil
	if r.wrap != nil {
		if err := r.wrap.CloseWrite(); err != nil {
			r.fail(err)
		}
		return true
	}
	r.sb.ep.Shutdown(tcpip.ShutdownWrite)
	return true
}

// writeIn gives b to gVisor; what it does not take is kept in pending.
func (r *tcpRelay) writeIn(b []byte, fromPending bool) bool {
	var rd bytes.Reader
	rd.Reset(b)
	n, terr := r.sb.ep.Write(&rd, tcpip.WriteOptions{})
	switch {
	case terr == nil, isWouldBlock(terr):
	default:
		r.fail(sandboxErr("write", terr))
		return false
	}
	r.in += n
	r.prog.addIn(n)
	if n > 0 {
		r.touch()
	}
	switch rest := b[n:]; {
	case len(rest) == 0:
		r.pending = nil
	case fromPending:
		r.pending = rest
		r.sbW = false
	default:
		r.pending = append([]byte(nil), rest...)
		r.sbW = false
	}
	return n > 0 || !fromPending
}

// moveOut moves bytes from the sandbox to upstream; it reports progress.
func (r *tcpRelay) moveOut() bool {
	if r.wrap != nil {
		return r.moveOutWrapped()
	}
	bp, h := rt.GetScratch(r.s.budget.CapNow())
	defer rt.PutScratch(h)
	w := tcpip.SliceWriter(bp)
	res, terr := r.sb.ep.Read(&w, tcpip.ReadOptions{Peek: true})
	switch {
	case terr == nil:
	case isWouldBlock(terr):
		r.sbR = false
		return false
	case isClosedForReceive(terr): // FIN from the sandbox
		r.outDone = true
		if err := unix.Shutdown(r.fd, unix.SHUT_WR); err != nil && err != unix.ENOTCONN {
			r.fail(os.NewSyscallError("shutdown", err))
		}
		return true
	default:
		r.fail(sandboxErr("read", terr))
		return false
	}
	n := res.Count
	m, err := unix.Write(r.fd, bp[:n])
	switch {
	case err == unix.EAGAIN:
		r.upW = false
		return false
	case err == unix.EINTR:
		return true
	case err != nil:
		r.fail(os.NewSyscallError("write", err))
		return false
	}
	lw := tcpip.LimitedWriter{W: io.Discard, N: int64(m)}
	r.sb.ep.Read(&lw, tcpip.ReadOptions{})
	r.sb.ep.ModerateRecvBuf(m)
	r.out += int64(m)
	r.prog.addOut(int64(m))
	r.touch()
	if m < n {
		r.upW = false
	}
	return m > 0
}

// moveOutWrapped moves bytes the wrapper lets through: read (consumed)
// through it, at most a buffer's cap at a time, and what upstream does not
// take at once kept in pendingOut.
func (r *tcpRelay) moveOutWrapped() bool {
	if len(r.pendingOut) > 0 {
		m, err := r.writeOut(r.pendingOut)
		r.pendingOut = r.pendingOut[m:]
		if len(r.pendingOut) == 0 {
			r.pendingOut = nil
		}
		return m > 0 || err
	}
	if r.outEOF {
		r.outDone = true
		if err := unix.Shutdown(r.fd, unix.SHUT_WR); err != nil && err != unix.ENOTCONN {
			r.fail(os.NewSyscallError("shutdown", err))
		}
		return true
	}
	// Read about what the upstream socket has room for (its send buffer,
	// less what waits in it), so that little is left over in pendingOut.
	want := min(relayBufSize, r.s.budget.CapNow())
	if outq, err := unix.IoctlGetInt(r.fd, unix.SIOCOUTQ); err == nil && r.sndbuf > 0 {
		room := r.sndbuf/2 - outq
		if room <= 0 && !writable(r.fd) {
			r.upW = false // the kernel agrees: wait for EPOLLOUT
			return false
		}
		want = max(min(want, room), 1<<10)
	}
	bp, h := rt.GetScratch(want)
	defer rt.PutScratch(h)
	n, rerr := r.wrap.Read(bp)
	if n > 0 {
		m, _ := r.writeOut(bp[:n])
		if m < n && r.err == nil {
			r.pendingOut = append([]byte(nil), bp[m:n]...)
		}
	}
	switch {
	case rerr == nil:
	case errors.Is(rerr, ErrWouldBlock):
		r.sbR = false
	case rerr == io.EOF:
		r.outEOF = true
	default:
		r.fail(sandboxReset(rerr))
	}
	return n > 0 || rerr != nil && !errors.Is(rerr, ErrWouldBlock)
}

// writable reports whether fd can be written now.
func writable(fd int) bool {
	p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLOUT}}
	n, err := unix.Poll(p, 0)
	return err == nil && n > 0 && p[0].Revents&unix.POLLOUT != 0
}

// writeOut writes b to the upstream socket without blocking; it returns
// how much it wrote and whether it got anywhere (bytes, or an error).
func (r *tcpRelay) writeOut(b []byte) (int, bool) {
	for {
		m, err := unix.Write(r.fd, b)
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
			r.upW = false
			return 0, false
		case err != nil:
			r.fail(os.NewSyscallError("write", err))
			return 0, true
		}
		r.out += int64(m)
		r.prog.addOut(int64(m))
		r.touch()
		if m < len(b) {
			r.upW = false
		}
		return m, m > 0
	}
}

// drained reports whether the sandbox has acknowledged everything, our FIN
// included, once both directions ended. Until then the flow stays live (and
// budgeted): closing it earlier would leave its unread data in an endpoint
// nobody counts.
func (r *tcpRelay) drained() bool {
	switch tcp.EndpointState(r.sb.ep.State()) {
	case tcp.StateFinWait2, tcp.StateTimeWait, tcp.StateClose, tcp.StateError:
		return true
	}
	// gVisor does not signal every ACK: look again soon.
	if r.drainTimer == nil {
		r.drainTimer = time.AfterFunc(100*time.Millisecond, r.schedule)
	} else {
		r.drainTimer.Reset(250 * time.Millisecond)
	}
	r.draining = true
	return false
}

// end releases everything, on the pump, once.
func (r *tcpRelay) end() {
	if err := r.ctx.Err(); err != nil && r.err != nil {
		r.err = err // the Stack is closing: that is why the sockets failed
	}
	r.stop()
	if r.drainTimer != nil {
		r.drainTimer.Stop()
	}
	r.err = upstreamReset(r.err)
	switch {
	case r.wrap != nil && r.err != nil:
		r.wrap.Abort()
		r.wrap.Close()
	case r.wrap != nil:
		r.wrap.Close()
	case r.err != nil:
		r.sb.Abort()
		r.sb.Close()
	default:
		r.sb.Close()
	}
	r.sb.blocking()
	if errors.Is(r.err, ErrSandboxReset) || r.ctx.Err() != nil {
		// Resets stay resets (reset.go); a relay whose context ended (the
		// flow was revoked, or tunwall is stopping) resets the upstream
		// connection too, as it did the sandbox's.
		lingerZero(r.fd)
	}
	unix.Close(r.fd)
	r.finish(r.done, RelayResult{Out: r.out, In: r.in, Err: r.err})
}

func isWouldBlock(e tcpip.Error) bool {
	_, ok := e.(*tcpip.ErrWouldBlock)
	return ok
}

func isClosedForReceive(e tcpip.Error) bool {
	_, ok := e.(*tcpip.ErrClosedForReceive)
	return ok
}

// ErrWouldBlock is what a sandbox connection of this package returns from
// Read, once a relay drives a wrapper of it, when it has nothing to read
// now: the wrapper passes it on (without taking it for the end of the
// stream), and the relay calls it again when there is more.
var ErrWouldBlock = errors.New("stack: would block")

// ErrSandboxReset is how a relay ends when the sandbox reset its side.
var ErrSandboxReset = errors.New("stack: the sandbox reset the connection")

func sandboxErr(op string, e tcpip.Error) error {
	if _, ok := e.(*tcpip.ErrConnectionReset); ok {
		return ErrSandboxReset
	}
	return fmt.Errorf("stack: sandbox %s: %s", op, e)
}

// udpRelay is one UDP session's event relay.
type udpRelay struct {
	pumpCore
	sb   *udpConn
	done func(RelayResult)

	upR, sbR bool
	in, out  int64
	err      error
	over     bool
}

// startUDPEventRelay relays sb and the upstream socket fd, which it owns.
func startUDPEventRelay(ctx context.Context, sb *udpConn, fd int, idle time.Duration, prog *Progress, done func(RelayResult)) bool {
	r := &udpRelay{sb: sb, done: done, upR: true, sbR: true}
	r.pumpCore = pumpCore{ctx: ctx, s: sb.s, fd: fd, idle: idle, wq: sb.wq, step: r.step, prog: prog}
	return r.start(waiter.ReadableEvents | waiter.EventHUp | waiter.EventErr)
}

func (r *udpRelay) step(limit int) (over, more bool) {
	if err := r.ctx.Err(); err != nil {
		r.err = err
		r.over = true
	} else if r.idleOut.Swap(false) {
		r.over = true // a UDP session's normal end
	}
	if r.hUpR.Swap(false) {
		r.upR = true
	}
	if r.hSbR.Swap(false) {
		r.sbR = true
	}
	for moves := 0; !r.over; moves++ {
		if limit > 0 && moves >= limit {
			return false, true
		}
		moved := false
		if r.upR {
			moved = r.moveIn()
		}
		if !r.over && r.sbR {
			moved = r.moveOut() || moved
		}
		if !moved {
			break
		}
	}
	if !r.over {
		return false, false
	}
	if err := r.ctx.Err(); err != nil && r.err != nil {
		r.err = err
	}
	r.stop()
	r.sb.Close()
	unix.Close(r.fd)
	r.finish(r.done, RelayResult{Out: r.out, In: r.in, Err: r.err})
	return true, false
}

func (r *udpRelay) fail(err error) {
	if r.err == nil {
		r.err = err
	}
	r.over = true
}

// moveIn passes one datagram from upstream to the sandbox.
func (r *udpRelay) moveIn() bool {
	bp, h := rt.GetScratch(relayBufSize) // a datagram may be that long
	defer rt.PutScratch(h)
	n, err := unix.Read(r.fd, bp)
	switch {
	case err == unix.EAGAIN:
		r.upR = false
		return false
	case err == unix.EINTR:
		return true
	case err != nil:
		// An ICMP error from upstream (e.g. port unreachable) ends the
		// session.
		r.fail(os.NewSyscallError("read", err))
		return false
	}
	var rd bytes.Reader
	rd.Reset(bp[:n])
	if _, terr := r.sb.ep.Write(&rd, tcpip.WriteOptions{}); terr != nil && !isWouldBlock(terr) {
		r.fail(sandboxErr("write", terr))
		return false
	}
	r.in += int64(n)
	r.prog.addIn(int64(n))
	r.touch()
	return true
}

// moveOut passes one datagram from the sandbox upstream. A datagram the
// upstream socket has no room for is dropped, as a full link would.
func (r *udpRelay) moveOut() bool {
	bp, h := rt.GetScratch(relayBufSize) // a datagram may be that long
	defer rt.PutScratch(h)
	w := tcpip.SliceWriter(bp)
	res, terr := r.sb.ep.Read(&w, tcpip.ReadOptions{})
	switch {
	case terr == nil:
	case isWouldBlock(terr):
		r.sbR = false
		return false
	case isClosedForReceive(terr):
		r.over = true
		return false
	default:
		r.fail(sandboxErr("read", terr))
		return false
	}
	for {
		_, err := unix.Write(r.fd, bp[:res.Count])
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN || err == unix.ENOBUFS:
		case err != nil:
			r.fail(os.NewSyscallError("write", err))
			return false
		default:
			r.out += int64(res.Count)
			r.prog.addOut(int64(res.Count))
		}
		break
	}
	r.touch()
	return true
}
