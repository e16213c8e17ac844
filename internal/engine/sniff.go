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
	"github.com/tunwall/tunwall/internal/audit"
	"github.com/tunwall/tunwall/internal/sniff"
	"github.com/tunwall/tunwall/policy"
	"github.com/tunwall/tunwall/stack"
)

// The name checks (ARCHITECTURE.md: "names are read before bytes move").
//
// A gate is the sandbox's side of a TCP flow as the relay reads it: its Read
// returns only bytes that passed the checks, so stack.RelayTCP, with its
// half-close, idle timeout and byte counts, relays a checked stream:
//
//   - The client's first bytes are classified (sniff.Classify) whenever they
//     come, however late, and whoever spoke first. Neither TLS nor HTTP:
//     the flow is judged by its name alone and the gate steps aside.
//   - TLS: the ClientHello is held until it is complete and parsed, then its
//     SNI must be the flow's name; after it TLS is opaque and passes as is.
//   - HTTP: every request head is held until complete and parsed, strictly,
//     and its Host must be the flow's name; bodies are followed (length,
//     chunked) to find the next head. After a WebSocket upgrade that the
//     server accepted (its 101, watched on the way back) bytes pass as is.
//   - Anything that is or may be TLS or HTTP and cannot be parsed whole and
//     unambiguously is reset, and so is one that takes longer than the
//     sniff timeout to complete once its first byte came. A request that
//     parses but is refused gets a 403 once the server has answered the
//     ones before it.
//
// Bytes that cannot complete anything a server acts on (the first word of
// what may become a request line) pass at once, so a protocol whose client
// sends a short token and waits is not held up.

// errRefused ends a relay whose client was reset by the name checks.
var errRefused = errors.New("engine: refused by the name checks")

// maxRecorded bounds a sniffed value copied into a record or a reason.
const maxRecorded = 255

type gateState uint8

const (
	gsFirst  gateState = iota // classifying the first bytes
	gsHello                   // reading a TLS ClientHello
	gsHead                    // reading an HTTP request head
	gsBody                    // passing a request body
	gsSwitch                  // waiting for the server's answer to an Upgrade request
	gsPass                    // no more checks: bytes pass as they come
	gsDenied                  // refused
)

// gate checks the client's bytes of one TCP flow. Read runs on the relay's
// client-to-upstream goroutine only; CloseWrite on the other one.
type gate struct {
	net.Conn // the sandbox's connection

	name  string        // every SNI and Host must be this name ("" until read, on a raw IP)
	rule  string        // the rule that allowed the flow, for denials
	why   string        // prefixed to the reason of a denial
	limit time.Duration // how long a started ClientHello or request head may take
	up    *upConn       // the upstream side, while relaying
	// decide judges the first name read on a raw-IP flow (name set from
	// it); nil for a flow to a name.
	decide func(name, from string) (verdict, bool)
	// foreign finds, in a plain HTTP request head to the flow's name, the
	// placeholder of a secret that name does not receive (l7.go); nil
	// when there are no secrets.
	foreign func(name string, port uint16, head []byte) (verdict, bool)
	port    uint16 // the flow's destination port
	// kind is what the first bytes were classified as.
	kind sniff.Kind
	// search is the host's search list: the name may be sent short
	// (search.go).
	search []string

	mem   []byte     // read buffer; mem[r:w] is held: read, not yet passed on
	fresh bool       // mem is a first buffer nothing was read into yet (firstBufs)
	held  *heldBytes // counts mem against the limit of all gates
	r, w  int
	ahead int       // bytes of mem[r:w] already passed on (a safe first-line prefix)
	out   []byte    // checked bytes for the next Read
	since time.Time // when the bytes being held started to arrive
	dlAt  time.Time // the read deadline set on Conn (zero: none)
	rerr  error     // a read error to return once held bytes are dealt with

	st       gateState
	req      sniff.Request
	body     sniff.Body
	requests int
	upgrade  bool // the request being passed asked to switch protocols
	judged   bool // the first ClientHello or request head passed
	note     string

	// What was seen, for the flow record.
	sni, httpHost string

	mu      sync.Mutex // guards the fields below, shared with CloseWrite and the grace timer
	denied  *verdict
	reply   []byte // a response to send before half-closing the sandbox's side
	forced  bool   // the grace ran out: reset instead of replying
	replyN  int64  // reply bytes written
	grace   *time.Timer
	closed  chan struct{}
	closing sync.Once
}

func (e *Engine) newGate(c net.Conn, name, rule string) *gate {
	g := &gate{Conn: c, name: name, rule: rule, limit: e.cfg.SniffTimeout, closed: make(chan struct{}), held: &e.held}
	g.search = e.cfg.Resolver.Search()
	if e.cfg.Secrets.Len() > 0 {
		g.foreign = e.foreignInHead
	}
	return g
}

// Read returns the next checked bytes.
func (g *gate) Read(p []byte) (int, error) {
	for {
		if len(g.out) > 0 {
			n := copy(p, g.out)
			g.out = g.out[n:]
			if len(g.out) == 0 && g.st == gsPass && g.r == g.w && g.mem != nil {
				// Checks are over and all is passed on: the buffer goes
				// now, and with it the sniff deadline.
				g.setMem(nil)
				g.setDeadline(time.Time{})
			}
			return n, nil
		}
		switch g.st {
		case gsPass:
			if g.r < g.w {
				g.out = g.mem[g.r+g.ahead : g.w]
				g.r, g.w, g.ahead = 0, 0, 0
				continue
			}
			if g.rerr != nil {
				return 0, g.rerr
			}
			if g.mem != nil {
				g.setMem(nil) // checks are over: the buffer goes
				g.setDeadline(time.Time{})
			}
			return g.Conn.Read(p)
		case gsDenied:
			return 0, g.deniedErr()
		case gsSwitch:
			if err := g.awaitSwitch(); err != nil {
				return 0, err
			}
			continue
		case gsBody:
			if g.r == g.w && g.rerr == nil {
				return g.readBody(p)
			}
		}
		progress, err := g.step()
		if err != nil {
			return 0, err
		}
		if !progress {
			if err := g.fill(); err != nil {
				return 0, err
			}
		}
	}
}

// first reads, on a raw-IP flow, until the client's first ClientHello or
// request head is complete and its name judged by decide (or refused).
// Nothing is passed on meanwhile: there is no upstream yet. The sniff
// timeout counts from now, first byte included.
func (g *gate) first() error {
	g.since = time.Now()
	return g.judge()
}

// judge reads until the client's first ClientHello or request head is
// complete and judged (or refused), passing nothing on. Whenever the first
// byte comes, the sniff timeout counts from it.
func (g *gate) judge() error {
	for !g.judged {
		progress, err := g.step()
		if err != nil {
			return err
		}
		if !progress {
			if err := g.fill(); err != nil {
				return err
			}
		}
	}
	return nil
}

// step works on the held bytes. It reports whether it got anywhere (output,
// or a new state); an error means the flow is refused or over.
func (g *gate) step() (bool, error) {
	held := g.mem[g.r:g.w]
	switch g.st {
	case gsFirst:
		k, safe, ok := sniff.Classify(held)
		g.kind = k
		if !ok {
			if g.up != nil && safe > g.ahead {
				g.out = held[g.ahead:safe]
				g.ahead = safe
				return true, nil
			}
			return false, g.rerr
		}
		switch k {
		case sniff.TLS:
			g.st = gsHello
		case sniff.HTTP:
			g.st = gsHead
		default:
			if g.decide != nil {
				return false, g.refuse(verdict{Reason: "the client sent no name (TLS SNI or HTTP Host) to judge by"})
			}
			g.st, g.judged = gsPass, true
		}
		return true, nil

	case gsHello:
		var h sniff.Hello
		switch h.Parse(held) {
		case sniff.NeedMore:
			return false, g.incomplete("ClientHello")
		case sniff.NotThis:
			return false, g.refuse(verdict{Reason: "TLS ClientHello refused: " + h.Bad})
		}
		if h.ServerName != nil {
			g.sni = recorded(h.ServerName)
		}
		if err := g.checkName(h.ServerName, audit.HostFromSNI); err != nil {
			return false, err
		}
		g.st, g.judged = gsPass, true
		return true, nil

	case gsHead:
		if len(held) == 0 {
			return false, g.rerr
		}
		r := &g.req
		switch r.Parse(held) {
		case sniff.NeedMore:
			return false, g.incomplete("request head")
		case sniff.NotThis:
			why := r.Bad
			if r.BadValue != nil {
				why += " (" + strconv.Quote(recorded(r.BadValue)) + ")"
			}
			return false, g.refuse(verdict{Reason: "HTTP request refused: " + why})
		}
		g.requests++
		if r.Host != nil {
			g.httpHost = recorded(r.Host)
		}
		if err := g.checkRequest(r); err != nil {
			return false, err
		}
		if g.foreign != nil {
			if v, found := g.foreign(g.name, g.port, held[:r.HeadLen]); found {
				return false, g.forbid(v)
			}
		}
		g.out = held[min(g.ahead, r.HeadLen):r.HeadLen]
		g.r += r.HeadLen
		g.ahead, g.since, g.judged = 0, time.Time{}, true
		g.body.Start(r)
		switch {
		case !g.body.Done():
			g.st = gsBody
		case g.upgrade:
			g.st = gsSwitch
		}
		return true, nil

	case gsBody:
		if len(held) == 0 {
			return false, g.rerr
		}
		n, st := g.body.Feed(held)
		if st == sniff.NotThis {
			return false, g.refuse(verdict{Reason: "HTTP request body refused: " + g.body.Bad})
		}
		g.out = held[:n]
		g.r += n
		if st == sniff.Done {
			g.endBody()
		}
		return true, nil
	}
	return false, nil
}

// passAll ends the checks of a judged flow: its bytes, held ones first,
// pass as they come (the L7 gate checks every request itself).
func (g *gate) passAll() {
	if g.st == gsDenied {
		return
	}
	g.st = gsPass
	g.setDeadline(time.Time{})
}

// endBody moves on once a request's body has been passed.
func (g *gate) endBody() {
	if g.upgrade {
		g.st = gsSwitch
	} else {
		g.st = gsHead
	}
}

// readBody reads body bytes straight into p (nothing is held), keeping
// whatever follows the body for the next head.
func (g *gate) readBody(p []byte) (int, error) {
	g.setDeadline(time.Time{})
	nr, err := g.Conn.Read(p)
	if nr == 0 {
		return 0, err
	}
	n, st := g.body.Feed(p[:nr])
	switch st {
	case sniff.NotThis:
		return 0, g.refuse(verdict{Reason: "HTTP request body refused: " + g.body.Bad})
	case sniff.Done:
		g.endBody()
		if n < nr {
			if herr := g.hold(p[n:nr]); herr != nil {
				return 0, herr
			}
			g.rerr, err = err, nil // after the bytes held are dealt with
		}
	}
	return n, err
}

// hold appends b, the bytes after a body in one read of the relay's (at
// most its buffer's size), to the held bytes.
func (g *gate) hold(b []byte) error {
	g.compact()
	if len(g.mem)-g.w < len(b) {
		if err := g.grow(g.w + len(b)); err != nil {
			return err
		}
	}
	g.w += copy(g.mem[g.w:], b)
	g.since = time.Now()
	return nil
}

// maxHeld bounds what a gate reads into its buffer: a ClientHello stream
// ends within sniff.MaxHelloWire, a request head within
// sniff.MaxRequestHead, and the parsers refuse what does not. (Bytes left
// over after a body, at most one relay read, may add to it; they are
// parsed before anything more is read.)
const maxHeld = sniff.MaxHelloWire + 4<<10

func (g *gate) compact() {
	if g.r > 0 {
		g.w = copy(g.mem, g.mem[g.r:g.w])
		g.r = 0
	}
}

// grow makes the buffer at least n bytes long, doubling it. It starts
// small: every flow has one while its first bytes are classified, and most
// first messages are short.
func (g *gate) grow(n int) error {
	n = max(n, 2*len(g.mem), firstBufSize)
	if g.held != nil && n > firstBufSize && g.held.high != nil && g.held.high() {
		return g.refuse(verdict{Reason: "tunwall's memory is near --max-memory: a first message or request head that needs more than " + strconv.Itoa(firstBufSize) + " bytes of buffer is refused until it falls"})
	}
	if g.held != nil && !g.held.take(n-len(g.mem)) {
		// What all gates hold at once is bounded (Config.MaxHeld): a flood
		// of long first messages is refused, not buffered.
		return g.refuse(verdict{Reason: fmt.Sprintf("tunwall holds %d KiB of clients' unfinished first messages and request heads already (its limit, a sixteenth of --max-memory): new ones are refused", g.held.max>>10)})
	}
	if len(g.mem) == 0 && n == firstBufSize {
		g.mem, g.fresh = firstBufs.Get().(*[firstBufSize]byte)[:], true
		return nil
	}
	nb := make([]byte, n)
	copy(nb, g.mem[:g.w])
	g.mem = nb
	return nil
}

// firstBufSize is a gate's first buffer. Most first messages fit.
const firstBufSize = 1 << 10

// firstBufs are empty first buffers: a gate takes one to read its flow's
// first bytes into and gives it back (cleared) if none came, so that the
// thousands of flows that wait hold none. A buffer bytes were read into is
// its gate's until dropped, never given back: no flow's bytes can show in
// another's buffer. Pointers to arrays (SA6002).
var firstBufs = sync.Pool{New: func() any { return new([firstBufSize]byte) }}

// setMem replaces the buffer, keeping the held-bytes count right.
func (g *gate) setMem(b []byte) {
	if g.held != nil {
		g.held.give(len(g.mem) - len(b))
	}
	g.mem = b
}

// releaseHeld gives back what the gate's buffer counted, once its flow has
// ended (nothing reads the gate any more).
func (g *gate) releaseHeld() {
	g.setMem(nil)
	g.r, g.w = 0, 0
}

// heldBytes counts the bytes all gates hold in their buffers.
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

// holding reports whether the gate holds bytes it is waiting to complete.
func (g *gate) holding() bool {
	switch g.st {
	case gsFirst, gsHello, gsHead:
		return g.w-g.r > g.ahead || (g.decide != nil && !g.judged)
	}
	return false
}

// fill reads more of the client's bytes into the buffer.
func (g *gate) fill() error {
	if g.rerr != nil {
		err := g.rerr
		if g.holding() && err == io.EOF {
			g.note = "the client closed before its first message was complete"
		}
		return err
	}
	g.compact()
	if g.w == len(g.mem) {
		if g.w >= maxHeld {
			// The parsers refuse long before; this is a backstop.
			return g.refuse(verdict{Reason: "more than " + strconv.Itoa(maxHeld) + " bytes with no complete ClientHello or request head"})
		}
		if err := g.grow(min(2*len(g.mem), maxHeld)); err != nil {
			return err
		}
	}
	if g.holding() {
		if g.since.IsZero() {
			g.since = time.Now()
		}
		g.setDeadline(g.since.Add(g.limit))
	} else {
		g.since = time.Time{}
		g.setDeadline(time.Time{})
	}
	n, err := g.Conn.Read(g.mem[g.w:])
	g.w += n
	if n == 0 && g.fresh {
		// Nothing came: a flow that waits for its first bytes holds no
		// buffer (the relay reads it again when bytes arrive).
		b := (*[firstBufSize]byte)(g.mem)
		g.setMem(nil)
		clear(b[:]) // Read may have used it as scratch (io.Reader)
		firstBufs.Put(b)
	}
	g.fresh = false
	if n > 0 && g.since.IsZero() && g.holding() {
		g.since = time.Now()
	}
	if err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() && g.holding() && !g.dlAt.IsZero() {
			what := "first message"
			switch g.st {
			case gsHello:
				what = "ClientHello"
			case gsHead:
				what = "request head"
			}
			return g.refuse(verdict{Reason: fmt.Sprintf("the %s was not complete %v after it began", what, g.limit)})
		}
		if n > 0 {
			g.rerr = err
			return nil
		}
		return err
	}
	return nil
}

// incomplete is the answer while a message is incomplete: wait for more,
// unless the client already stopped sending.
func (g *gate) incomplete(what string) error {
	if g.rerr == io.EOF {
		g.note = "the client closed before its " + what + " was complete"
	}
	return g.rerr
}

func (g *gate) setDeadline(t time.Time) {
	if t.Equal(g.dlAt) {
		return
	}
	g.dlAt = t
	g.Conn.SetReadDeadline(t)
}

// checkName checks a name the client sent (raw, as sent; nil if none)
// against the flow's name, or, on a raw-IP flow, has decide judge it. A
// refused TLS name resets; a refused HTTP name gets a 403.
func (g *gate) checkName(raw []byte, from string) error {
	what, deny := "TLS SNI", g.refuse
	if from == audit.HostFromHTTP {
		what, deny = "HTTP Host", g.forbid
	}
	if raw == nil {
		if g.decide != nil && g.name == "" {
			return deny(verdict{Reason: "the client sent no name (TLS SNI or HTTP Host) to judge by"})
		}
		return nil // judged by the name the client connected to
	}
	var name string
	if flow.ValidHostname(raw) {
		name, _ = policy.NormalizeHost(string(raw))
	}
	if name == "" {
		return deny(verdict{Reason: fmt.Sprintf("%s %q is not a hostname", what, recorded(raw))})
	}
	if g.name == "" && g.decide != nil {
		v, ok := g.decide(name, from)
		if !ok {
			return deny(v)
		}
		g.name, g.rule = name, v.Rule
		return nil
	}
	if name != g.name && !searchExpands(g.search, name, g.name) {
		return deny(verdict{Reason: fmt.Sprintf("%s name %s disagrees with %s, the name this connection is for (domain fronting)", from, name, g.name)})
	}
	return nil
}

// checkRequest checks one parsed request head: its name, and what it asks
// the server to do with the connection.
func (g *gate) checkRequest(r *sniff.Request) error {
	if err := g.checkName(r.Host, audit.HostFromHTTP); err != nil {
		return err
	}
	if equalFoldASCII(r.Method, "CONNECT") {
		return g.forbid(verdict{Reason: "CONNECT is not relayed: what goes through the tunnel could not be checked"})
	}
	if r.Upgrade == nil {
		return nil
	}
	for _, tok := range upgradeTokens(r.Upgrade) {
		switch {
		case equalFoldASCII(tok, "h2c"):
			return g.forbid(verdict{Reason: "Upgrade: h2c is not relayed: HTTP/2 requests could not be checked"})
		case !equalFoldASCII(tok, "websocket"):
			return g.forbid(verdict{Reason: fmt.Sprintf("Upgrade: %q is not relayed: only websocket is", recorded(tok))})
		}
	}
	if g.requests > 1 {
		return g.forbid(verdict{Reason: "an Upgrade request must be the first on its connection (tunwall watches the first response for the switch)"})
	}
	if g.up != nil {
		g.up.arm()
	}
	g.upgrade = true
	return nil
}

// awaitSwitch waits for the server's answer to the Upgrade request: after
// a 101 the bytes pass as they are, otherwise HTTP goes on being checked.
func (g *gate) awaitSwitch() error {
	if g.up == nil || g.up.decided == nil {
		g.st, g.upgrade = gsHead, false
		return nil
	}
	select {
	case <-g.up.decided:
	case <-g.closed:
		return net.ErrClosed
	default:
		// Under the event relay reads must not wait: it asks again once
		// upstream has said more.
		if g.nonBlocking() {
			return stack.ErrWouldBlock
		}
		select {
		case <-g.up.decided:
		case <-g.closed:
			return net.ErrClosed
		}
	}
	g.upgrade = false
	if g.up.switched {
		g.st = gsPass
	} else {
		g.st = gsHead
	}
	return nil
}

// refuse denies the flow with v (its rule defaulting to the flow's) and
// resets the sandbox's connection. It returns the error the relay sees.
func (g *gate) refuse(v verdict) error {
	g.setDenied(v)
	abort(g.Conn)
	return errRefused
}

// forbid denies a request that parsed with v: plain HTTP gets a 403 that
// says why.
func (g *gate) forbid(v verdict) error {
	g.setDenied(v)
	return g.reply403(*g.denied)
}

func (g *gate) setDenied(v verdict) {
	if v.Rule == "" {
		v.Rule = g.rule
	}
	v.Reason = g.why + v.Reason
	v.Verdict = flow.Deny
	g.mu.Lock()
	if g.denied == nil {
		g.denied = &v
	}
	g.mu.Unlock()
	g.st, g.out = gsDenied, nil
}

// reply403 refuses a parsed request with a 403. Before the relay starts it
// is written at once; during the relay it is written when the sandbox's
// side is half-closed, after the server has answered the requests before
// it (they were passed on; it sees EOF now), or at once if nothing was.
// If the server takes longer than the sniff timeout to finish, the client
// is reset instead.
func (g *gate) reply403(v verdict) error {
	body := "tunwall: denied: " + v.Reason + "\n"
	resp := []byte("HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\nContent-Length: " +
		strconv.Itoa(len(body)) + "\r\n\r\n" + body)
	if g.up == nil {
		g.Conn.SetWriteDeadline(time.Now().Add(2 * time.Second))
		n, _ := g.Conn.Write(resp)
		g.mu.Lock()
		g.replyN = int64(n)
		g.mu.Unlock()
		g.Conn.Close()
		return errRefused
	}
	g.mu.Lock()
	g.reply = resp
	if g.requests == 1 && !g.up.heard() {
		g.mu.Unlock()
		g.up.stop() // the server has nothing to finish: answer now
	} else {
		g.grace = time.AfterFunc(g.limit, func() {
			g.mu.Lock()
			forced := g.reply != nil
			g.forced = forced
			g.mu.Unlock()
			if forced {
				abort(g.Conn)
				g.up.stop()
			}
		})
		g.mu.Unlock()
	}
	return io.EOF // the relay half-closes the upstream: the server finishes
}

// deniedErr is what Read returns after a denial.
func (g *gate) deniedErr() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.reply != nil {
		return io.EOF
	}
	return errRefused
}

// CloseWrite half-closes the sandbox's side, first sending a pending 403.
func (g *gate) CloseWrite() error {
	g.mu.Lock()
	reply, forced := g.reply, g.forced
	g.reply = nil
	g.mu.Unlock()
	if forced {
		return errRefused
	}
	if reply != nil {
		// Under the event relay the write does not wait (stack.ErrWouldBlock);
		// otherwise for 2s at most.
		g.Conn.SetWriteDeadline(time.Now().Add(2 * time.Second))
		n, _ := g.Conn.Write(reply)
		g.mu.Lock()
		g.replyN = int64(n)
		g.mu.Unlock()
		if n < len(reply) {
			// The client does not read what it was sent: a reset, not a
			// cut-off reply.
			abort(g.Conn)
			return errRefused
		}
	}
	if cw, ok := g.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.New("engine: the sandbox's connection cannot half-close")
}

// Abort resets the sandbox's connection.
func (g *gate) Abort() { abort(g.Conn) }

// NetConn returns the sandbox's connection (stack.StartRelayTCP relays a
// gate by events, reading it without blocking).
func (g *gate) NetConn() net.Conn { return g.Conn }

// nonBlocking reports whether the relay reads the gate without blocking:
// then the sandbox's connection answers stack.ErrWouldBlock rather than
// wait, and so must the gate.
func (g *gate) nonBlocking() bool {
	nb, ok := g.Conn.(interface{ NonBlocking() bool })
	return ok && nb.NonBlocking()
}

// Close closes the sandbox's connection and ends any wait.
func (g *gate) Close() error {
	g.closing.Do(func() {
		close(g.closed)
		g.mu.Lock()
		if g.grace != nil {
			g.grace.Stop()
		}
		g.mu.Unlock()
	})
	return g.Conn.Close()
}

// result returns the denial, if any, and the reply bytes sent.
func (g *gate) result() (*verdict, int64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.denied, g.replyN
}

// upConn is the upstream side of a checked flow. It can be cut (its reads
// then end as at EOF, so the relay half-closes the sandbox's side), and it
// watches the server's first response when the client asked to switch
// protocols.
type upConn struct {
	net.Conn
	got      atomic.Bool // the server has sent something
	cut      atomic.Bool
	watching atomic.Bool
	mu       sync.Mutex
	sw       sniff.Switch
	decided  chan struct{} // closed once the switch is decided
	switched bool
}

func (u *upConn) Read(p []byte) (int, error) {
	if u.cut.Load() {
		return 0, io.EOF
	}
	n, err := u.Conn.Read(p)
	if u.cut.Load() {
		return 0, io.EOF
	}
	if n > 0 && !u.got.Load() {
		u.got.Store(true)
	}
	if u.watching.Load() {
		u.observe(p[:n], err)
	}
	return n, err
}

// observe feeds the server's bytes to the switch watcher.
func (u *upConn) observe(b []byte, err error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if !u.watching.Load() {
		return
	}
	_, st, sw := u.sw.Feed(b)
	if st == sniff.NeedMore && err == nil {
		return
	}
	u.switched = st == sniff.Done && sw
	u.watching.Store(false)
	close(u.decided)
}

// arm starts watching the server's answer to an Upgrade request. The
// caller arms before the request is passed on, so every byte of the
// answer is seen.
func (u *upConn) arm() {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.sw = sniff.Switch{}
	u.decided = make(chan struct{})
	u.watching.Store(true)
}

// heard reports whether the server has sent anything yet.
func (u *upConn) heard() bool { return u.got.Load() }

// NetConn and Tap implement stack.UpstreamTap: the event relay reads the
// upstream socket itself and shows upConn what it read.
func (u *upConn) NetConn() net.Conn { return u.Conn }

func (u *upConn) Tap(b []byte, err error) bool {
	if u.cut.Load() {
		return false
	}
	if len(b) > 0 && !u.got.Load() {
		u.got.Store(true)
	}
	if u.watching.Load() && (len(b) > 0 || err != nil) {
		u.observe(b, err)
	}
	return !u.cut.Load()
}

// stop cuts the upstream's reads.
func (u *upConn) stop() {
	u.cut.Store(true)
	u.Conn.SetReadDeadline(time.Unix(1, 0))
}

// CloseWrite half-closes the upstream connection.
func (u *upConn) CloseWrite() error {
	if cw, ok := u.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.New("engine: the upstream connection cannot half-close")
}

// upgradeTokens splits an Upgrade value into its protocol names (the part
// before any "/version"), at most 8.
func upgradeTokens(v []byte) [][]byte {
	var out [][]byte
	for len(v) > 0 && len(out) < 8 {
		i := 0
		for i < len(v) && v[i] != ',' {
			i++
		}
		tok := trimSpace(v[:i])
		for j := range tok {
			if tok[j] == '/' {
				tok = tok[:j]
				break
			}
		}
		out = append(out, tok)
		if i == len(v) {
			break
		}
		v = v[i+1:]
	}
	return out
}

func trimSpace(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t') {
		b = b[1:]
	}
	for len(b) > 0 && (b[len(b)-1] == ' ' || b[len(b)-1] == '\t') {
		b = b[:len(b)-1]
	}
	return b
}

func equalFoldASCII(b []byte, s string) bool {
	if len(b) != len(s) {
		return false
	}
	for i := range len(b) {
		x, y := b[i], s[i]
		if 'a' <= x && x <= 'z' {
			x -= 'a' - 'A'
		}
		if 'a' <= y && y <= 'z' {
			y -= 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}

// recorded returns b as a string for a record, at most maxRecorded bytes.
func recorded(b []byte) string {
	if len(b) > maxRecorded {
		b = b[:maxRecorded]
	}
	return string(b)
}
