package engine

import (
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tunwall/tunwall/flow"
	"github.com/tunwall/tunwall/internal/inspect"
	"github.com/tunwall/tunwall/internal/sniff"
	"github.com/tunwall/tunwall/stack"
)

// The name checks (ARCHITECTURE.md: "names are read before bytes move")
// are internal/inspect's Inspector, which does no I/O. inspectConn drives
// one over the sandbox's connection: it reads and holds the client's
// bytes (within the sniff timeout and the held-bytes budget), passes what
// the inspector passes, watches the server's answer to an Upgrade request
// (upConn), and carries out a refusal: a reset, or a 403 once the server
// has answered the requests before it.

// errRefused ends a relay whose client was reset by the name checks.
var errRefused = errors.New("engine: refused by the name checks")

// inspectConn is the sandbox's side of a TCP flow as the relay reads it:
// its Read returns only bytes its inspector passed. It holds the bytes
// read and not yet passed, keeps the sniff deadline, and carries out the
// inspector's refusals (reset, 403). Read runs on the relay's
// client-to-upstream goroutine only; CloseWrite on the other one.
type inspectConn struct {
	net.Conn // the sandbox's connection

	in    inspect.Inspector
	why   string        // prefixed to the reason of a denial
	limit time.Duration // how long a started ClientHello or request head may take
	up    *upConn       // the upstream side, while relaying

	byEvents atomic.Bool // the stack's event relay reads it (ReadByEvents)
	// reset resets the sandbox's connection: the flow's request's Reset,
	// or an abort of the connection of a flow without one (SOCKS5).
	reset func()

	mem   []byte     // read buffer; mem[r:w] is held: read, not yet passed on
	fresh bool       // mem is a first buffer nothing was read into yet (firstBufs)
	held  *heldBytes // counts mem against the limit of all inspected conns
	r, w  int
	out   []byte    // checked bytes for the next Read
	since time.Time // when the bytes being held started to arrive
	dlAt  time.Time // the read deadline set on Conn (zero: none)
	rerr  error     // a read error to return once held bytes are dealt with
	note  string

	mu      sync.Mutex // guards the fields below, shared with CloseWrite and the grace timer
	denied  *verdict
	reply   []byte // a response to send before half-closing the sandbox's side
	forced  bool   // the grace ran out: reset instead of replying
	replyN  int64  // reply bytes written
	grace   *time.Timer
	closed  chan struct{}
	closing sync.Once
}

// newInspectConn wraps c, the sandbox's connection, in an inspector
// configured by cfg; held counts its buffer (nil: uncounted).
func newInspectConn(c net.Conn, cfg inspect.Config, limit time.Duration, held *heldBytes) *inspectConn {
	return &inspectConn{Conn: c, in: inspect.New(cfg), limit: limit, held: held, closed: make(chan struct{}), reset: func() { abort(c) }}
}

// inspectFlow returns the inspected conn of a flow for name (on a raw-IP
// flow "", and decide judges the first name read) to port.
func (e *Engine) inspectFlow(c net.Conn, name, rule string, port uint16, decide func(name, from string) (verdict, bool)) *inspectConn {
	return e.inspectWith(c, inspect.Config{Name: name, Rule: rule, Decide: decide}, port)
}

// inspectWith returns the inspected conn of a flow to port checked by cfg,
// with the host's search list and the run's secrets added.
func (e *Engine) inspectWith(c net.Conn, cfg inspect.Config, port uint16) *inspectConn {
	cfg.Search = e.cfg.Resolver.Search()
	if e.cfg.Secrets.Len() > 0 {
		cfg.Foreign = func(name string, head []byte) (verdict, bool) {
			return e.foreignInHead(name, port, head)
		}
	}
	return newInspectConn(c, cfg, e.cfg.SniffTimeout, &e.held)
}

// inspectReq is inspectFlow for a flow of the stack's: its request resets
// the sandbox's side.
func (e *Engine) inspectReq(fr *flowRecord, c net.Conn, name, rule string, port uint16, decide func(name, from string) (verdict, bool)) *inspectConn {
	ic := e.inspectFlow(c, name, rule, port, decide)
	if fr.req != nil {
		ic.reset = fr.req.Reset
	}
	return ic
}

// Read returns the next checked bytes.
func (ic *inspectConn) Read(p []byte) (int, error) {
	for {
		if len(ic.out) > 0 {
			n := copy(p, ic.out)
			ic.out = ic.out[n:]
			if len(ic.out) == 0 && ic.in.State() == inspect.Passing && ic.r == ic.w && ic.mem != nil {
				// Checks are over and all is passed on: the buffer goes
				// now, and with it the sniff deadline.
				ic.setMem(nil)
				ic.setDeadline(time.Time{})
			}
			return n, nil
		}
		switch ic.in.State() {
		case inspect.Passing:
			if ic.r < ic.w {
				break // the held bytes pass first
			}
			if ic.rerr != nil {
				return 0, ic.rerr
			}
			if ic.mem != nil {
				ic.setMem(nil) // checks are over: the buffer goes
				ic.setDeadline(time.Time{})
			}
			return ic.Conn.Read(p)
		case inspect.Denied:
			return 0, ic.deniedErr()
		case inspect.Switch:
			if err := ic.awaitSwitch(); err != nil {
				return 0, err
			}
			continue
		case inspect.Body:
			if ic.r == ic.w && ic.rerr == nil {
				return ic.readBody(p)
			}
		}
		progress, err := ic.step()
		if err != nil {
			return 0, err
		}
		if !progress {
			if err := ic.fill(); err != nil {
				return 0, err
			}
		}
	}
}

// first reads, on a raw-IP flow, until the client's first ClientHello or
// request head is complete and its name judged by decide (or refused).
// Nothing is passed on meanwhile: there is no upstream yet. The sniff
// timeout counts from now, first byte included.
func (ic *inspectConn) first() error {
	ic.since = time.Now()
	return ic.judge()
}

// judge reads until the client's first ClientHello or request head is
// complete and judged (or refused), passing nothing on. Whenever the first
// byte comes, the sniff timeout counts from it.
func (ic *inspectConn) judge() error {
	for !ic.in.Judged() {
		progress, err := ic.step()
		if err != nil {
			return err
		}
		if !progress {
			if err := ic.fill(); err != nil {
				return err
			}
		}
	}
	return nil
}

// step shows the held bytes to the inspector and does what it says. It
// reports whether it got anywhere (output, or a new state); an error means
// the flow is refused or over.
func (ic *inspectConn) step() (bool, error) {
	held := ic.mem[ic.r:ic.w]
	s := ic.in.Next(held, ic.up != nil)
	switch s.Op {
	case inspect.Wait:
		if s.Incomplete != "" {
			return false, ic.incomplete(s.Incomplete)
		}
		return false, ic.rerr
	case inspect.Refuse:
		return false, ic.refuse(s.Verdict)
	case inspect.Forbid:
		return false, ic.forbid(s.Verdict)
	case inspect.Pass:
		if s.Upgrade && ic.up != nil {
			ic.up.arm() // before the head passes: every byte of the answer is seen
		}
		ic.out = held[s.From:s.To]
		ic.r += s.Drop
		if s.Drop > 0 {
			ic.since = time.Time{}
		}
	}
	return true, nil
}

// passAll ends the checks of a judged flow: its bytes, held ones first,
// pass as they come (the terminator checks every request itself).
func (ic *inspectConn) passAll() {
	if ic.in.State() == inspect.Denied {
		return
	}
	ic.in.PassAll()
	ic.setDeadline(time.Time{})
}

// readBody reads body bytes straight into p (nothing is held), keeping
// whatever follows the body for the next head.
func (ic *inspectConn) readBody(p []byte) (int, error) {
	ic.setDeadline(time.Time{})
	nr, err := ic.Conn.Read(p)
	if nr == 0 {
		return 0, err
	}
	s := ic.in.Next(p[:nr], true)
	n := s.To
	switch {
	case s.Op == inspect.Refuse:
		return 0, ic.refuse(s.Verdict)
	case ic.in.State() != inspect.Body: // the body is done
		if n < nr {
			if herr := ic.hold(p[n:nr]); herr != nil {
				return 0, herr
			}
			ic.rerr, err = err, nil // after the bytes held are dealt with
		}
	}
	return n, err
}

// hold appends b, the bytes after a body in one read of the relay's (at
// most its buffer's size), to the held bytes.
func (ic *inspectConn) hold(b []byte) error {
	ic.compact()
	if len(ic.mem)-ic.w < len(b) {
		if err := ic.grow(ic.w + len(b)); err != nil {
			return err
		}
	}
	ic.w += copy(ic.mem[ic.w:], b)
	ic.since = time.Now()
	return nil
}

// maxHeld bounds what an inspectConn reads into its buffer: a ClientHello stream
// ends within sniff.MaxHelloWire, a request head within
// sniff.MaxRequestHead, and the parsers refuse what does not. (Bytes left
// over after a body, at most one relay read, may add to it; they are
// parsed before anything more is read.)
const maxHeld = sniff.MaxHelloWire + 4<<10

func (ic *inspectConn) compact() {
	if ic.r > 0 {
		ic.w = copy(ic.mem, ic.mem[ic.r:ic.w])
		ic.r = 0
	}
}

// grow makes the buffer at least n bytes long, doubling it. It starts
// small: every flow has one while its first bytes are classified, and most
// first messages are short.
func (ic *inspectConn) grow(n int) error {
	n = max(n, 2*len(ic.mem), firstBufSize)
	if ic.held != nil && n > firstBufSize && ic.held.high != nil && ic.held.high() {
		return ic.refuse(verdict{Reason: "tunwall's memory is near --max-memory: a first message or request head that needs more than " + strconv.Itoa(firstBufSize) + " bytes of buffer is refused until it falls"})
	}
	if ic.held != nil && !ic.held.take(n-len(ic.mem)) {
		// What all inspected conns hold at once is bounded (Config.MaxHeld): a flood
		// of long first messages is refused, not buffered.
		return ic.refuse(verdict{Reason: fmt.Sprintf("tunwall holds %d KiB of clients' unfinished first messages and request heads already (its limit, a sixteenth of --max-memory): new ones are refused", ic.held.max>>10)})
	}
	if len(ic.mem) == 0 && n == firstBufSize {
		ic.mem, ic.fresh = firstBufs.Get().(*[firstBufSize]byte)[:], true
		return nil
	}
	nb := make([]byte, n)
	copy(nb, ic.mem[:ic.w])
	ic.mem = nb
	return nil
}

// firstBufSize is an inspectConn's first buffer. Most first messages fit.
const firstBufSize = 1 << 10

// firstBufs are empty first buffers: an inspectConn takes one to read its flow's
// first bytes into and gives it back (cleared) if none came, so that the
// thousands of flows that wait hold none. A buffer bytes were read into is
// its inspectConn's until dropped, never given back: no flow's bytes can show in
// another's buffer. Pointers to arrays (SA6002).
var firstBufs = sync.Pool{New: func() any { return new([firstBufSize]byte) }}

// setMem replaces the buffer, keeping the held-bytes count right.
func (ic *inspectConn) setMem(b []byte) {
	if ic.held != nil {
		ic.held.give(len(ic.mem) - len(b))
	}
	ic.mem = b
}

// releaseHeld gives back what the inspectConn's buffer counted, once its flow has
// ended (nothing reads the inspectConn any more).
func (ic *inspectConn) releaseHeld() {
	ic.setMem(nil)
	ic.r, ic.w = 0, 0
}

// heldBytes counts the bytes all inspected conns hold in their buffers.
type heldBytes struct {
	n   atomic.Int64
	max int64
	// high reports memory pressure (Config.MemoryHigh); nil: never.
	high func() bool
}

func (h *heldBytes) take(n int) bool {
	if h.n.Add(int64(n)) > h.max {
		h.n.Add(-int64(n))
		return false
	}
	return true
}

func (h *heldBytes) give(n int) { h.n.Add(-int64(n)) }

// holding reports whether the inspectConn holds bytes it is waiting to complete.
func (ic *inspectConn) holding() bool {
	return ic.in.Holding(ic.w - ic.r)
}

// fill reads more of the client's bytes into the buffer.
func (ic *inspectConn) fill() error {
	if ic.rerr != nil {
		err := ic.rerr
		if ic.holding() && err == io.EOF {
			ic.note = "the client closed before its first message was complete"
		}
		return err
	}
	ic.compact()
	if ic.w == len(ic.mem) {
		if ic.w >= maxHeld {
			// The parsers refuse long before; this is a backstop.
			return ic.refuse(verdict{Reason: "more than " + strconv.Itoa(maxHeld) + " bytes with no complete ClientHello or request head"})
		}
		if err := ic.grow(min(2*len(ic.mem), maxHeld)); err != nil {
			return err
		}
	}
	if ic.holding() {
		if ic.since.IsZero() {
			ic.since = time.Now()
		}
		ic.setDeadline(ic.since.Add(ic.limit))
	} else {
		ic.since = time.Time{}
		ic.setDeadline(time.Time{})
	}
	n, err := ic.Conn.Read(ic.mem[ic.w:])
	ic.w += n
	if n == 0 && ic.fresh {
		// Nothing came: a flow that waits for its first bytes holds no
		// buffer (the relay reads it again when bytes arrive).
		b := (*[firstBufSize]byte)(ic.mem)
		ic.setMem(nil)
		clear(b[:]) // Read may have used it as scratch (io.Reader)
		firstBufs.Put(b)
	}
	ic.fresh = false
	if n > 0 && ic.since.IsZero() && ic.holding() {
		ic.since = time.Now()
	}
	if err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() && ic.holding() && !ic.dlAt.IsZero() {
			what := ic.in.Waiting()
			return ic.refuse(verdict{Reason: fmt.Sprintf("the %s was not complete %v after it began", what, ic.limit)})
		}
		if n > 0 {
			ic.rerr = err
			return nil
		}
		return err
	}
	return nil
}

// incomplete is the answer while a message is incomplete: wait for more,
// unless the client already stopped sending.
func (ic *inspectConn) incomplete(what string) error {
	if ic.rerr == io.EOF {
		ic.note = "the client closed before its " + what + " was complete"
	}
	return ic.rerr
}

func (ic *inspectConn) setDeadline(t time.Time) {
	if t.Equal(ic.dlAt) {
		return
	}
	ic.dlAt = t
	ic.Conn.SetReadDeadline(t)
}

// awaitSwitch waits for the server's answer to the Upgrade request: after
// a 101 the bytes pass as they are, otherwise HTTP goes on being checked.
func (ic *inspectConn) awaitSwitch() error {
	if ic.up == nil || ic.up.decided == nil {
		ic.in.Switched(false)
		return nil
	}
	select {
	case <-ic.up.decided:
	case <-ic.closed:
		return net.ErrClosed
	default:
		// Under the event relay reads must not wait: it asks again once
		// upstream has said more.
		if ic.nonBlocking() {
			return stack.ErrWouldBlock
		}
		select {
		case <-ic.up.decided:
		case <-ic.closed:
			return net.ErrClosed
		}
	}
	ic.in.Switched(ic.up.switched)
	return nil
}

// refuse denies the flow with v (its rule defaulting to the flow's) and
// resets the sandbox's connection. It returns the error the relay sees.
func (ic *inspectConn) refuse(v verdict) error {
	ic.setDenied(v)
	ic.reset()
	return errRefused
}

// forbid denies a request that parsed with v: plain HTTP gets a 403 that
// says why.
func (ic *inspectConn) forbid(v verdict) error {
	ic.setDenied(v)
	return ic.reply403(*ic.denied)
}

func (ic *inspectConn) setDenied(v verdict) {
	if v.Rule == "" {
		v.Rule = ic.in.Rule()
	}
	v.Reason = ic.why + v.Reason
	v.Verdict = flow.Deny
	ic.mu.Lock()
	if ic.denied == nil {
		ic.denied = &v
	}
	ic.mu.Unlock()
	ic.in.Deny()
	ic.out = nil
}

// reply403 refuses a parsed request with a 403. Before the relay starts it
// is written at once; during the relay it is written when the sandbox's
// side is half-closed, after the server has answered the requests before
// it (they were passed on; it sees EOF now), or at once if nothing was.
// If the server takes longer than the sniff timeout to finish, the client
// is reset instead.
func (ic *inspectConn) reply403(v verdict) error {
	body := "tunwall: denied: " + v.Reason + "\n"
	resp := []byte("HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\nContent-Length: " +
		strconv.Itoa(len(body)) + "\r\n\r\n" + body)
	if ic.up == nil {
		ic.Conn.SetWriteDeadline(time.Now().Add(2 * time.Second))
		n, _ := ic.Conn.Write(resp)
		ic.mu.Lock()
		ic.replyN = int64(n)
		ic.mu.Unlock()
		ic.Conn.Close()
		return errRefused
	}
	ic.mu.Lock()
	ic.reply = resp
	if ic.in.Requests() == 1 && !ic.up.heard() {
		ic.mu.Unlock()
		ic.up.stop() // the server has nothing to finish: answer now
	} else {
		ic.grace = time.AfterFunc(ic.limit, func() {
			ic.mu.Lock()
			forced := ic.reply != nil
			ic.forced = forced
			ic.mu.Unlock()
			if forced {
				ic.reset()
				ic.up.stop()
			}
		})
		ic.mu.Unlock()
	}
	return io.EOF // the relay half-closes the upstream: the server finishes
}

// deniedErr is what Read returns after a denial.
func (ic *inspectConn) deniedErr() error {
	ic.mu.Lock()
	defer ic.mu.Unlock()
	if ic.reply != nil {
		return io.EOF
	}
	return errRefused
}

// CloseWrite half-closes the sandbox's side, first sending a pending 403.
func (ic *inspectConn) CloseWrite() error {
	ic.mu.Lock()
	reply, forced := ic.reply, ic.forced
	ic.reply = nil
	ic.mu.Unlock()
	if forced {
		return errRefused
	}
	if reply != nil {
		// Under the event relay the write does not wait (stack.ErrWouldBlock);
		// otherwise for 2s at most.
		ic.Conn.SetWriteDeadline(time.Now().Add(2 * time.Second))
		n, _ := ic.Conn.Write(reply)
		ic.mu.Lock()
		ic.replyN = int64(n)
		ic.mu.Unlock()
		if n < len(reply) {
			// The client does not read what it was sent: a reset, not a
			// cut-off reply.
			ic.reset()
			return errRefused
		}
	}
	if cw, ok := ic.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.New("engine: the sandbox's connection cannot half-close")
}

// Abort resets the sandbox's connection.
func (ic *inspectConn) Abort() { ic.reset() }

// ReadByEvents implements stack.ClientFilter: the stack's event relay
// reads the inspectConn without blocking, and the sandbox's connection
// then answers stack.ErrWouldBlock rather than wait; so must the
// inspectConn.
func (ic *inspectConn) ReadByEvents() { ic.byEvents.Store(true) }

// nonBlocking reports whether the relay reads the inspectConn without
// blocking (ReadByEvents).
func (ic *inspectConn) nonBlocking() bool { return ic.byEvents.Load() }

// Close closes the sandbox's connection and ends any wait.
func (ic *inspectConn) Close() error {
	ic.closing.Do(func() {
		close(ic.closed)
		ic.mu.Lock()
		if ic.grace != nil {
			ic.grace.Stop()
		}
		ic.mu.Unlock()
	})
	return ic.Conn.Close()
}

// result returns the denial, if any, and the reply bytes sent.
func (ic *inspectConn) result() (*verdict, int64) {
	ic.mu.Lock()
	defer ic.mu.Unlock()
	return ic.denied, ic.replyN
}
