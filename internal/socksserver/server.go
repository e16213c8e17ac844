package socksserver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"syscall"
	"time"

	socks5 "github.com/things-go/go-socks5"
	"github.com/things-go/go-socks5/statute"

	"github.com/tunwall/tunwall/internal/engine"
	"github.com/tunwall/tunwall/policy"
)

// DefaultDrain is how long Serve lets open flows run on, once it is told
// to stop, before it ends them.
const DefaultDrain = 5 * time.Second

// endWait bounds the wait for flows to end and be recorded once they were
// told to (their sockets closed): a flow that takes longer is lost.
const endWait = 5 * time.Second

// Options configure Serve. Zero values mean the documented defaults.
type Options struct {
	// Drain is how long open flows may run on once ctx is done, before
	// they are ended. 0 means DefaultDrain.
	Drain time.Duration
	// Logger is tunwall's operational log; nil discards.
	Logger *slog.Logger
}

// Serve runs a SOCKS5 proxy (github.com/things-go/go-socks5) on ln whose
// every request the engine decides, dials, relays and records
// (engine.Connect, engine.OpenUDP): CONNECT and UDP ASSOCIATE, by name or
// address. A name is never resolved unless the policy allows it.
//
// When ctx is done it stops accepting (closing ln), lets open flows run on
// for up to opts.Drain, then ends those still open, and returns once every
// flow has been recorded (waiting at most a few seconds more), so that the
// caller may close the audit log. It also returns, the same way, if ln
// fails.
func Serve(ctx context.Context, e *engine.Engine, ln net.Listener, opts Options) error {
	drain := opts.Drain
	if drain <= 0 {
		drain = DefaultDrain
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	// Flows outlive ctx by the drain; they end when endFlows is called.
	flowCtx, endFlows := context.WithCancel(context.WithoutCancel(ctx))
	defer endFlows()
	tl := &trackingListener{Listener: ln, conns: map[*trackedConn]struct{}{}}
	srv := socks5.NewServer(
		socks5.WithResolver(noResolve{}), // names are resolved only once allowed, by the engine
		socks5.WithRule(commands{}),
		socks5.WithConnectHandle(func(_ context.Context, w io.Writer, req *socks5.Request) error {
			return connect(flowCtx, e, w, req)
		}),
		socks5.WithAssociateHandle(func(_ context.Context, w io.Writer, req *socks5.Request) error {
			return associate(flowCtx, e, w, req)
		}),
		socks5.WithLogger(logger{log}),
		socks5.WithGPool(trackingPool{&tl.wg}),
	)
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	err := srv.Serve(tl)
	open := tl.stopAccepting()
	if open > 0 {
		log.Info("socks: waiting for open flows", "flows", open, "drain", drain)
	}
	if !waitTimeout(&tl.wg, drain) {
		n := tl.closeAll()
		endFlows()
		log.Info("socks: ending open flows", "flows", n)
		if !waitTimeout(&tl.wg, endWait) {
			log.Warn("socks: flows did not end in time; their records are lost", "wait", endWait)
		}
	}
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// waitTimeout waits for wg at most d and reports whether it finished.
func waitTimeout(wg *sync.WaitGroup, d time.Duration) bool {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		return false
	}
}

// trackingPool runs each connection's handler (go-socks5's ServeConn,
// which returns after the flow's record is written) on a goroutine counted
// in wg. Serve calls Submit from its accept loop, so every Add happens
// before Serve returns and Serve starts waiting.
type trackingPool struct{ wg *sync.WaitGroup }

func (p trackingPool) Submit(f func()) error {
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		f()
	}()
	return nil
}

// trackingListener keeps the connections it accepted until each is closed,
// so that Serve can end the flows still open after the drain.
type trackingListener struct {
	net.Listener
	wg      sync.WaitGroup // handlers running (see trackingPool)
	mu      sync.Mutex
	stopped bool
	conns   map[*trackedConn]struct{}
}

func (l *trackingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stopped {
		c.Close()
		return nil, net.ErrClosed
	}
	tc := &trackedConn{Conn: c, l: l}
	l.conns[tc] = struct{}{}
	return tc, nil
}

// stopAccepting refuses any further connection and returns how many are
// open.
func (l *trackingListener) stopAccepting() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.stopped = true
	return len(l.conns)
}

// closeAll closes every open connection and returns how many there were.
func (l *trackingListener) closeAll() int {
	l.mu.Lock()
	conns := make([]*trackedConn, 0, len(l.conns))
	for c := range l.conns {
		conns = append(conns, c)
	}
	l.mu.Unlock()
	for _, c := range conns {
		c.Conn.Close() // the handler notices and returns, closing c
	}
	return len(conns)
}

type trackedConn struct {
	net.Conn
	l    *trackingListener
	once sync.Once
}

func (c *trackedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.l.mu.Lock()
		delete(c.l.conns, c)
		c.l.mu.Unlock()
	})
	return err
}

// CloseWrite half-closes the client's connection, as the relay does when the
// upstream is done sending.
func (c *trackedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return c.Conn.Close()
}

// noResolve leaves names unresolved: go-socks5 resolves before it asks the
// rules, which would send denied names to DNS.
type noResolve struct{}

func (noResolve) Resolve(ctx context.Context, _ string) (context.Context, net.IP, error) {
	return ctx, nil, nil
}

// commands allows CONNECT and UDP ASSOCIATE; BIND (listening on the
// sandbox's behalf) is never allowed.
type commands struct{}

func (commands) Allow(ctx context.Context, req *socks5.Request) (context.Context, bool) {
	return ctx, req.Command == statute.CommandConnect || req.Command == statute.CommandAssociate
}

type logger struct{ log *slog.Logger }

func (l logger) Errorf(format string, args ...any) {
	l.log.Debug("socks5: " + fmt.Sprintf(format, args...))
}

func addrPortOf(a net.Addr) netip.AddrPort {
	switch a := a.(type) {
	case *net.TCPAddr:
		return a.AddrPort()
	case *net.UDPAddr:
		return a.AddrPort()
	}
	ap, _ := netip.ParseAddrPort(a.String())
	return ap
}

// target turns what a SOCKS request or datagram names into the engine's
// request: a name (normalized) or an address, and a port.
func target(a *statute.AddrSpec, client, local netip.AddrPort) (engine.ProxyRequest, error) {
	r := engine.ProxyRequest{Client: client, Local: local, Port: uint16(a.Port)}
	if a.Port <= 0 || a.Port > 65535 {
		return r, fmt.Errorf("bad port %d", a.Port)
	}
	if a.FQDN != "" {
		if ip, err := netip.ParseAddr(a.FQDN); err == nil {
			r.IP = ip.Unmap()
			return r, nil
		}
		name, err := policy.NormalizeHost(a.FQDN)
		if err != nil || strings.HasPrefix(name, "*") {
			return r, fmt.Errorf("bad host name %q", a.FQDN)
		}
		r.Host = name
		return r, nil
	}
	ip, ok := netip.AddrFromSlice(a.IP)
	if !ok {
		return r, errors.New("no address")
	}
	r.IP = ip.Unmap()
	return r, nil
}

// replyCode is the SOCKS reply to a request the engine did not open.
func replyCode(err error) uint8 {
	switch {
	case errors.Is(err, engine.ErrDenied):
		return statute.RepRuleFailure
	case errors.Is(err, syscall.ECONNREFUSED):
		return statute.RepConnectionRefused
	}
	return statute.RepHostUnreachable
}

func connect(ctx context.Context, e *engine.Engine, w io.Writer, req *socks5.Request) error {
	r, err := target(req.RawDestAddr, addrPortOf(req.RemoteAddr), addrPortOf(req.LocalAddr))
	if err != nil {
		socks5.SendReply(w, statute.RepAddrTypeNotSupported, nil)
		return err
	}
	conn, ok := w.(net.Conn)
	if !ok {
		socks5.SendReply(w, statute.RepServerFailure, nil)
		return errors.New("socks5: writer is not a connection")
	}
	accepted := false
	err = e.Connect(ctx, r, func(bound net.Addr) (net.Conn, error) {
		accepted = true
		if err := socks5.SendReply(w, statute.RepSuccess, bound); err != nil {
			return nil, err
		}
		return &readerConn{Conn: conn, r: req.Reader}, nil
	})
	if err != nil && !accepted {
		socks5.SendReply(w, replyCode(err), nil)
	}
	return nil
}

// readerConn reads through the SOCKS request's buffered reader, so bytes the
// client sent right after its request are not lost.
type readerConn struct {
	net.Conn
	r io.Reader
}

func (c *readerConn) Read(b []byte) (int, error) { return c.r.Read(b) }
func (c *readerConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return c.Conn.Close()
}

// associate relays UDP for one client: every datagram's destination is
// decided on its own, once per destination.
func associate(ctx context.Context, e *engine.Engine, w io.Writer, req *socks5.Request) error {
	client, local := addrPortOf(req.RemoteAddr), addrPortOf(req.LocalAddr)
	pc, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(local.Addr(), 0)))
	if err != nil {
		socks5.SendReply(w, statute.RepServerFailure, nil)
		return err
	}
	if err := socks5.SendReply(w, statute.RepSuccess, pc.LocalAddr()); err != nil {
		pc.Close()
		return err
	}
	a := &assoc{e: e, pc: pc, client: client, local: local, sessions: map[string]net.Conn{}, denied: map[string]bool{}}
	var cancel context.CancelFunc
	a.ctx, cancel = context.WithCancel(ctx)
	// Ending the flows (ctx) ends the association too.
	stopOnCtx := context.AfterFunc(a.ctx, func() { pc.Close() })
	defer stopOnCtx()
	defer a.close(cancel)
	// The association lives as long as the control connection.
	go func() {
		io.Copy(io.Discard, req.Reader)
		cancel()
		pc.Close()
	}()
	a.serve()
	return nil
}

// assoc is one UDP association: its relay socket, and a session per
// destination the client sent to.
type assoc struct {
	e             *engine.Engine
	ctx           context.Context // ends with the control connection or the flows
	pc            *net.UDPConn    // the relay socket the client sends to
	client, local netip.AddrPort  // the control connection's ends

	mu        sync.Mutex
	sessions  map[string]net.Conn // by destination, as the client wrote it (engine.OpenUDP's)
	denied    map[string]bool     // destinations refused, never asked again
	clientUDP netip.AddrPort      // where the client last sent from
	wg        sync.WaitGroup      // relays back to the client
}

// serve reads the client's datagrams until the relay socket is closed, and
// sends each to its destination's session, opened at the first datagram.
func (a *assoc) serve() {
	buf := make([]byte, 64<<10)
	for {
		n, from, err := a.pc.ReadFromUDPAddrPort(buf)
		if err != nil {
			return
		}
		from = netip.AddrPortFrom(from.Addr().Unmap(), from.Port())
		if from.Addr() != a.client.Addr() {
			continue // only the client that asked may use the relay
		}
		a.mu.Lock()
		a.clientUDP = from
		a.mu.Unlock()
		d, err := statute.ParseDatagram(buf[:n])
		if err != nil || d.Frag != 0 {
			continue
		}
		r, err := target(&d.DstAddr, from, a.local)
		if err != nil {
			continue
		}
		key := d.DstAddr.String()
		a.mu.Lock()
		up, ok := a.sessions[key]
		wasDenied := a.denied[key]
		a.mu.Unlock()
		if wasDenied {
			continue
		}
		if !ok {
			if up = a.open(key, r, d.Header()); up == nil {
				continue
			}
		}
		up.Write(d.Data) // the engine counts what was sent
	}
}

// open has the engine decide, record and dial the session for destination
// key (request r), and starts relaying its replies to the client, each
// behind hdr. A destination denied, not recorded or not reached is
// remembered as denied and open returns nil.
func (a *assoc) open(key string, r engine.ProxyRequest, hdr []byte) net.Conn {
	up, err := a.e.OpenUDP(a.ctx, r)
	if err != nil {
		a.mu.Lock()
		a.denied[key] = true
		a.mu.Unlock()
		return nil
	}
	a.mu.Lock()
	a.sessions[key] = up
	a.mu.Unlock()
	a.wg.Add(1)
	go a.relayBack(key, up, hdr)
	return up
}

// relayBack sends the destination's replies to the client until it is idle
// for the engine's UDPIdle or ended, then closes the session, which writes
// its record.
func (a *assoc) relayBack(key string, up net.Conn, hdr []byte) {
	defer a.wg.Done()
	rb := make([]byte, 64<<10)
	for {
		up.SetReadDeadline(time.Now().Add(a.e.UDPIdle()))
		m, err := up.Read(rb)
		if err != nil {
			break
		}
		a.mu.Lock()
		to := a.clientUDP
		a.mu.Unlock()
		a.pc.WriteToUDPAddrPort(append(append([]byte(nil), hdr...), rb[:m]...), to)
	}
	a.mu.Lock()
	delete(a.sessions, key)
	a.mu.Unlock()
	up.Close()
}

// close ends the association: the relay socket and every session, and
// waits for their records.
func (a *assoc) close(cancel context.CancelFunc) {
	cancel()
	a.pc.Close()
	a.mu.Lock()
	open := make([]net.Conn, 0, len(a.sessions))
	for _, up := range a.sessions {
		open = append(open, up)
	}
	a.mu.Unlock()
	for _, up := range open {
		up.Close() // ends the session's record; its relayBack returns
	}
	a.wg.Wait()
}
