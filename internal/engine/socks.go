package engine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"

	socks5 "github.com/things-go/go-socks5"
	"github.com/things-go/go-socks5/statute"

	"github.com/tunwall/tunwall/policy"
	"github.com/tunwall/tunwall/stack"
)

// HostFromSOCKS marks a hostname a SOCKS5 client asked for by name.
const HostFromSOCKS = "socks"

// DefaultSOCKSDrain is how long ServeSOCKS lets open flows run on, once it
// is told to stop, before it ends them.
const DefaultSOCKSDrain = 5 * time.Second

// socksEndWait bounds the wait for flows to end and be recorded once they
// were told to (their sockets closed): a flow that takes longer is lost.
const socksEndWait = 5 * time.Second

// ServeSOCKS runs a SOCKS5 proxy (github.com/things-go/go-socks5) on ln with
// the engine's policy, rebinding guard and audit: CONNECT and UDP ASSOCIATE,
// by name or address. A name is never resolved unless the policy allows it.
//
// When ctx is done it stops accepting (closing ln), lets open flows run on
// for up to drain (0 means DefaultSOCKSDrain), then ends those still open,
// and returns once every flow has been recorded (waiting at most a few
// seconds more), so that the caller may close the audit log. It also
// returns, the same way, if ln fails.
func (e *Engine) ServeSOCKS(ctx context.Context, ln net.Listener, drain time.Duration) error {
	if drain <= 0 {
		drain = DefaultSOCKSDrain
	}
	// Flows outlive ctx by the drain; they end when endFlows is called.
	flowCtx, endFlows := context.WithCancel(context.WithoutCancel(ctx))
	defer endFlows()
	tl := &trackingListener{Listener: ln, conns: map[*trackedConn]struct{}{}}
	srv := socks5.NewServer(
		socks5.WithResolver(noResolve{}), // names are resolved only once allowed, in dialName
		socks5.WithRule(socksCommands{}),
		socks5.WithConnectHandle(func(_ context.Context, w io.Writer, req *socks5.Request) error {
			return e.socksConnect(flowCtx, w, req)
		}),
		socks5.WithAssociateHandle(func(_ context.Context, w io.Writer, req *socks5.Request) error {
			return e.socksAssociate(flowCtx, w, req)
		}),
		socks5.WithLogger(socksLogger{e}),
		socks5.WithGPool(trackingPool{&tl.wg}),
	)
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	err := srv.Serve(tl)
	open := tl.stopAccepting()
	if open > 0 {
		e.log.Info("socks: waiting for open flows", "flows", open, "drain", drain)
	}
	if !waitTimeout(&tl.wg, drain) {
		n := tl.closeAll()
		endFlows()
		e.log.Info("socks: ending open flows", "flows", n)
		if !waitTimeout(&tl.wg, socksEndWait) {
			e.log.Warn("socks: flows did not end in time; their records are lost", "wait", socksEndWait)
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
// before Serve returns and ServeSOCKS starts waiting.
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
// so that ServeSOCKS can end the flows still open after the drain.
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

// socksCommands allows CONNECT and UDP ASSOCIATE; BIND (listening on the
// sandbox's behalf) is never allowed.
type socksCommands struct{}

func (socksCommands) Allow(ctx context.Context, req *socks5.Request) (context.Context, bool) {
	return ctx, req.Command == statute.CommandConnect || req.Command == statute.CommandAssociate
}

type socksLogger struct{ e *Engine }

func (l socksLogger) Errorf(format string, args ...any) {
	l.e.log.Debug("socks5: " + fmt.Sprintf(format, args...))
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

// socksTarget is what a SOCKS request or datagram names.
type socksTarget struct {
	host string     // normalized name, or ""
	ip   netip.Addr // when not a name
	port uint16
}

func parseSOCKSTarget(a *statute.AddrSpec) (socksTarget, error) {
	t := socksTarget{port: uint16(a.Port)}
	if a.Port <= 0 || a.Port > 65535 {
		return t, fmt.Errorf("bad port %d", a.Port)
	}
	if a.FQDN != "" {
		if ip, err := netip.ParseAddr(a.FQDN); err == nil {
			t.ip = ip.Unmap()
			return t, nil
		}
		name, err := policy.NormalizeHost(a.FQDN)
		if err != nil || strings.HasPrefix(name, "*") {
			return t, fmt.Errorf("bad host name %q", a.FQDN)
		}
		t.host = name
		return t, nil
	}
	ip, ok := netip.AddrFromSlice(a.IP)
	if !ok {
		return t, errors.New("no address")
	}
	t.ip = ip.Unmap()
	return t, nil
}

// socksFlow starts a flow record for a SOCKS request and decides it.
func (e *Engine) socksFlow(proto stack.Proto, client netip.AddrPort, local netip.AddrPort, t socksTarget) (*flowRecord, verdict) {
	fr := &flowRecord{f: stack.Flow{Proto: proto, Src: client}, start: time.Now()}
	if t.host == "" {
		fr.f.Dst = netip.AddrPortFrom(t.ip, t.port)
	} else {
		// The record's dst carries the port; there is no address yet.
		fr.f.Dst = netip.AddrPortFrom(netip.Addr{}, t.port)
		fr.host, fr.hostFrom = t.host, HostFromSOCKS
	}
	if client.Addr().IsLoopback() {
		fr.owner = e.lookupOwner(proto.String(), client, local)
	} else {
		fr.owner = e.lookupOwner(proto.String(), netip.AddrPort{}, netip.AddrPort{})
	}
	if v, ok := e.auditHealthy(); !ok {
		return fr, v
	}
	if t.host != "" {
		return fr, e.decideName(t.host, t.port, toPolicy(proto))
	}
	return fr, e.decideIP(t.ip, t.port, toPolicy(proto))
}

func (e *Engine) socksConnect(ctx context.Context, w io.Writer, req *socks5.Request) error {
	client, local := addrPortOf(req.RemoteAddr), addrPortOf(req.LocalAddr)
	t, err := parseSOCKSTarget(req.RawDestAddr)
	if err != nil {
		socks5.SendReply(w, statute.RepAddrTypeNotSupported, nil)
		return err
	}
	fr, v := e.socksFlow(stack.TCP, client, local, t)
	if !v.allow {
		// The client exits as soon as it has the refusal: find it first.
		fr.owner.waitFor(dnsAttributionWait)
		socks5.SendReply(w, statute.RepRuleFailure, nil)
		e.deny(fr, v)
		return nil
	}
	fr.v = v
	if !e.opened(ctx, fr) {
		socks5.SendReply(w, statute.RepRuleFailure, nil)
		return nil
	}
	up, err := e.dialTarget(ctx, fr, t.host, netip.AddrPortFrom(t.ip, t.port))
	if err != nil {
		var ge *guardError
		rep := statute.RepHostUnreachable
		switch {
		case errors.As(err, &ge):
			rep = statute.RepRuleFailure
		case strings.Contains(err.Error(), "refused"):
			rep = statute.RepConnectionRefused
		}
		socks5.SendReply(w, rep, nil)
		e.dialFailed(fr, err)
		return nil
	}
	conn, ok := w.(net.Conn)
	if !ok {
		up.Close()
		return errors.New("socks5: writer is not a connection")
	}
	// A SOCKS client's socket lives only as long as its exchange, which may
	// be over a millisecond after this reply: find its owner first (the
	// lookup ran during the dial, so this rarely waits).
	fr.owner.waitFor(dnsAttributionWait)
	if err := socks5.SendReply(w, statute.RepSuccess, up.LocalAddr()); err != nil {
		up.Close()
		fr.v.reason += "; client went away"
		e.writeFlow(fr)
		return nil
	}
	e.relay(ctx, fr, &readerConn{Conn: conn, r: req.Reader}, up)
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

// socksAssociate relays UDP for one client: every datagram's destination is
// decided on its own, once per destination.
func (e *Engine) socksAssociate(ctx context.Context, w io.Writer, req *socks5.Request) error {
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
	a := &socksAssoc{e: e, pc: pc, client: client, local: local, sessions: map[string]*socksSession{}, denied: map[string]bool{}}
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

// socksAssoc is one UDP association: its relay socket, and a session per
// destination the client sent to.
type socksAssoc struct {
	e             *Engine
	ctx           context.Context // ends with the control connection or the flows
	pc            *net.UDPConn    // the relay socket the client sends to
	client, local netip.AddrPort  // the control connection's ends

	mu        sync.Mutex
	sessions  map[string]*socksSession // by destination, as the client wrote it
	denied    map[string]bool          // destinations refused, never asked again
	clientUDP netip.AddrPort           // where the client last sent from
	wg        sync.WaitGroup           // relays back to the client
}

// socksSession is one destination's flow within an association.
type socksSession struct {
	fr *flowRecord
	up net.Conn
}

// serve reads the client's datagrams until the relay socket is closed, and
// sends each to its destination's session, opened at the first datagram.
func (a *socksAssoc) serve() {
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
		t, err := parseSOCKSTarget(&d.DstAddr)
		if err != nil {
			continue
		}
		key := d.DstAddr.String()
		a.mu.Lock()
		s, ok := a.sessions[key]
		wasDenied := a.denied[key]
		a.mu.Unlock()
		if wasDenied {
			continue
		}
		if !ok {
			if s = a.open(key, from, t, d.Header()); s == nil {
				continue
			}
		}
		if m, err := s.up.Write(d.Data); err == nil {
			a.mu.Lock()
			s.fr.out += int64(m)
			a.mu.Unlock()
		}
	}
}

// open decides, records and dials the session for destination key (target
// t), and starts relaying its replies to the client, each behind hdr. A
// destination denied, not recorded or not reached is remembered as denied
// and open returns nil.
func (a *socksAssoc) open(key string, from netip.AddrPort, t socksTarget, hdr []byte) *socksSession {
	e := a.e
	refuse := func() {
		a.mu.Lock()
		a.denied[key] = true
		a.mu.Unlock()
	}
	fr, v := e.socksFlow(stack.UDP, from, a.local, t)
	if !v.allow {
		refuse()
		e.deny(fr, v)
		return nil
	}
	fr.v = v
	if !e.opened(a.ctx, fr) {
		refuse()
		return nil
	}
	up, err := e.dialTarget(a.ctx, fr, t.host, netip.AddrPortFrom(t.ip, t.port))
	if err != nil {
		refuse()
		e.dialFailed(fr, err)
		return nil
	}
	s := &socksSession{fr: fr, up: up}
	a.mu.Lock()
	a.sessions[key] = s
	a.mu.Unlock()
	a.wg.Add(1)
	go a.relayBack(key, s, hdr)
	return s
}

// relayBack sends the destination's replies to the client until it is idle
// for UDPIdle or closed, then ends the session and writes its record.
func (a *socksAssoc) relayBack(key string, s *socksSession, hdr []byte) {
	defer a.wg.Done()
	rb := make([]byte, 64<<10)
	for {
		s.up.SetReadDeadline(time.Now().Add(a.e.cfg.UDPIdle))
		m, err := s.up.Read(rb)
		if err != nil {
			break
		}
		a.mu.Lock()
		to := a.clientUDP
		s.fr.in += int64(m)
		a.mu.Unlock()
		a.pc.WriteToUDPAddrPort(append(append([]byte(nil), hdr...), rb[:m]...), to)
	}
	s.up.Close()
	a.mu.Lock()
	delete(a.sessions, key)
	fr := *s.fr
	a.mu.Unlock()
	a.e.writeFlow(&fr)
}

// close ends the association: the relay socket and every session, and
// waits for their records.
func (a *socksAssoc) close(cancel context.CancelFunc) {
	cancel()
	a.pc.Close()
	a.mu.Lock()
	for _, s := range a.sessions {
		s.up.Close()
	}
	a.mu.Unlock()
	a.wg.Wait()
}
