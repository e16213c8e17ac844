// Package l7 is tunwall's terminator: for a flow to a host whose rules have
// http or inject, and only for such a flow, it terminates the client's TLS
// with a leaf the run's CA mints for the flow's name (or reads plain HTTP),
// serves HTTP/1.1 and HTTP/2, checks every request (its name, its method and
// path against the policy, the placeholders it carries), puts the secrets
// the host's rules inject into it, and sends it on over its own TLS
// connection to the real server, verified against the host's roots or the
// rule's ca, with the original name. One record per request goes to the
// Recorder the engine gives it.
//
// The terminator never resolves or dials a name itself: its first upstream
// connection is the one the engine dialled (and the rebinding guard
// checked) before the sandbox's handshake completed, and more come from
// the engine's dialer. It never sees flows of other hosts (the engine
// routes only terminated hosts here), and never writes a secret's value
// anywhere but into requests to a host whose rule injects it: records
// hold secret names; responses that carry an injected value back are
// masked before the sandbox sees them.
package l7

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"

	"github.com/tunwall/tunwall/internal/secrets"
	"github.com/tunwall/tunwall/policy"
)

// Defaults of Config.
const (
	DefaultHandshakeTimeout = 10 * time.Second
	DefaultHeaderTimeout    = 30 * time.Second
	DefaultIdleTimeout      = 5 * time.Minute
	DefaultMaxScans         = 64
	// ScanPrefix is how much of a request body is read and scanned for
	// placeholders before any of it is sent on.
	ScanPrefix = 64 << 10
	// maxStreams bounds the concurrent requests of one HTTP/2 connection.
	maxStreams = 64
	// maxUpConns bounds the upstream connections one client connection
	// may make the terminator open.
	maxUpConns = 4
	// freshUp is how long the connection the engine dialled first stays
	// worth using: a server may close an idle connection it never got a
	// handshake on.
	freshUp = 5 * time.Second
)

// Config configures a Terminator. Zero values mean the documented defaults.
type Config struct {
	// CA mints the leaves clients are shown. Required.
	CA *CA
	// Rules decide each request (DecideRequest) and say what a host
	// injects (HTTPFor). Required.
	Rules *policy.RuleSet
	// Secrets are the run's secrets; nil means none.
	Secrets *secrets.Store
	// Roots verify upstream servers whose rules name no ca; nil means the
	// system's roots.
	Roots *x509.CertPool
	// CARoots are the roots of each rule's ca, by the file name the rule
	// gives. A rule's ca missing here fails its requests (never falls back
	// to no verification).
	CARoots map[string]*x509.CertPool
	// Logger is the operational log; nil discards.
	Logger *slog.Logger
	// HandshakeTimeout bounds the client's TLS handshake; 0 means 10s.
	HandshakeTimeout time.Duration
	// HeaderTimeout bounds reading one request head; 0 means 30s.
	HeaderTimeout time.Duration
	// IdleTimeout closes a client connection idle between requests this
	// long; 0 means 5m.
	IdleTimeout time.Duration
	// Learn allows requests the http rules deny, recording what enforce
	// mode would have said (placeholders sent where their secrets do not
	// go are refused all the same).
	Learn bool
	// MaxScans bounds the request bodies whose first ScanPrefix bytes are
	// held for scanning at once, across all flows (memory: MaxScans x 64
	// KiB); 0 means 64. Further requests wait.
	MaxScans int
}

// Terminator terminates flows. It is safe for concurrent use.
type Terminator struct {
	cfg      Config
	rulesNow atomic.Pointer[policy.RuleSet] // the policy in effect: cfg.Rules, then SetRules
	log      *slog.Logger
	scans    chan struct{}
	bufs     sync.Pool // *[ScanPrefix]byte
	copy     bufferPool
}

// New checks cfg and builds a Terminator.
func New(cfg Config) (*Terminator, error) {
	if cfg.CA == nil || cfg.Rules == nil {
		return nil, errors.New("l7: a CA and Rules are required")
	}
	if cfg.HandshakeTimeout == 0 {
		cfg.HandshakeTimeout = DefaultHandshakeTimeout
	}
	if cfg.HeaderTimeout == 0 {
		cfg.HeaderTimeout = DefaultHeaderTimeout
	}
	if cfg.IdleTimeout == 0 {
		cfg.IdleTimeout = DefaultIdleTimeout
	}
	if cfg.MaxScans == 0 {
		cfg.MaxScans = DefaultMaxScans
	}
	tm := &Terminator{cfg: cfg, log: cfg.Logger, scans: make(chan struct{}, cfg.MaxScans)}
	tm.rulesNow.Store(cfg.Rules)
	if tm.log == nil {
		tm.log = slog.New(slog.DiscardHandler)
	}
	tm.bufs.New = func() any { return new([ScanPrefix]byte) }
	return tm, nil
}

// SetRules makes rs the policy every request from now on is checked
// against, on the flows open now too (the engine cuts those whose host's
// http or inject rules changed).
func (tm *Terminator) SetRules(rs *policy.RuleSet) { tm.rulesNow.Store(rs) }

func (tm *Terminator) rules() *policy.RuleSet { return tm.rulesNow.Load() }

// Recorder receives what the terminator does with each request. Calls may come
// from several goroutines at once.
type Recorder interface {
	// Admit reports whether a new request may start (the audit log can
	// take its record); a request refused here gets a 503.
	Admit() error
	// Request is called once per request, when it is over.
	Request(Record)
}

// Record is one request on a terminated flow. It never holds a secret's
// value or a query string.
type Record struct {
	Start    time.Time
	Duration time.Duration
	Method   string
	Host     string // the flow's name
	Path     string // escaped, without the query; at most 1 KiB
	URL      string // scheme://host[:port] and Path, for humans
	Proto    string // "HTTP/1.1" or "HTTP/2.0", as the client spoke
	Status   int    // the status the client got (0: none, the client went away)
	// BytesOut and BytesIn are the request body bytes sent on and the
	// response body bytes the client got.
	BytesOut, BytesIn int64
	Allowed           bool
	Rule, Reason      string
	// UpstreamFailed says the request was allowed but could not be sent
	// to the server or got no response (tunwall answered 502; Reason says
	// why).
	UpstreamFailed bool
	// Injected names the secrets put into the request.
	Injected []string
}

// Flow is one client connection handed to the terminator.
type Flow struct {
	// Host is the flow's name, already allowed; the client's SNI and every
	// request's Host must be it.
	Host string
	Port uint16
	// TLS says the client's first bytes were a TLS ClientHello (its SNI
	// already checked); otherwise they were a plain HTTP/1.x request.
	TLS bool
	// Client is the sandbox's connection, its first bytes unread.
	Client net.Conn
	// Up is the upstream TCP connection the engine dialled (the guard
	// checked its address) when the flow was accepted, UpAt when.
	Up   net.Conn
	UpAt time.Time
	// Dial opens another upstream TCP connection to the same name,
	// through the engine (resolved, guard-checked). Required.
	Dial func(ctx context.Context) (net.Conn, error)
	// Rec receives one record per request. Required.
	Rec Recorder
	// SandboxReset reports whether an error of Client means the sandbox
	// reset its connection, and Abort closes a connection (Client, or one
	// Dial returned) with a reset rather than a FIN. With both, a reset of
	// either end reaches the other as one, as on a relayed flow: the
	// sandbox's resets every upstream connection of the flow, a server's
	// mid-response resets an HTTP/1 client (an HTTP/2 one gets its
	// stream reset). nil: connections are only closed.
	SandboxReset func(error) bool
	Abort        func(net.Conn)
}

// Result is how a terminated flow went.
type Result struct {
	// In and Out are the bytes read from and written to the client's
	// connection (TLS included).
	In, Out int64
	// Requests counts the requests served.
	Requests int
	// CertRefused is set when the client ended the TLS handshake after it
	// was shown tunwall's certificate: it pins certificates or does not
	// trust the run's CA.
	CertRefused bool
	// Note says how the flow ended when it did not end well.
	Note string
}

// Serve terminates one flow until it ends or ctx is done, and returns how
// it went. It closes f.Client and f.Up.
func (tm *Terminator) Serve(ctx context.Context, f Flow) Result {
	cc := &countConn{Conn: f.Client}
	fs := &flowServer{tm: tm, f: f, view: tm.rules().HTTPFor(f.Host, f.Port)}
	if f.SandboxReset != nil && f.Abort != nil {
		cc.onErr = func(err error) {
			if f.SandboxReset(err) {
				fs.resetUps()
			}
		}
	}
	defer fs.closeUp()
	var conn net.Conn = cc
	proto := "http/1.1"
	res := func(note string) Result {
		return Result{In: cc.in.Load(), Out: cc.out.Load(), Requests: int(fs.requests.Load()), Note: note}
	}
	if f.TLS {
		bc := &batchConn{Conn: cc}
		tc := tls.Server(bc, &tls.Config{
			GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return tm.cfg.CA.Leaf(f.Host) },
			NextProtos:     []string{"h2", "http/1.1"},
			MinVersion:     tls.VersionTLS12,
		})
		cc.SetDeadline(time.Now().Add(tm.cfg.HandshakeTimeout))
		err := tc.HandshakeContext(ctx)
		cc.SetDeadline(time.Time{})
		if err != nil {
			tc.Close()
			r := res("")
			r.CertRefused, r.Note = handshakeFailure(err, cc.out.Load() > 0)
			return r
		}
		st := tc.ConnectionState()
		if st.ServerName != "" && !sameName(st.ServerName, f.Host) {
			tc.Close()
			return res(fmt.Sprintf("TLS SNI %q is not %s", clip(st.ServerName), f.Host))
		}
		conn, proto = &flushConn{Conn: tc, b: bc}, st.NegotiatedProtocol
	}
	fs.h2 = proto == "h2"
	fs.tr = fs.transport()
	defer fs.tr.CloseIdleConnections()
	// ctx ends when tunwall stops or the flow is revoked (a change of the
	// policy denies it): both ends are reset, never closed as if done.
	stop := context.AfterFunc(ctx, func() {
		if f.Abort != nil {
			fs.resetUps()
			f.Abort(f.Client)
		}
		conn.Close()
	})
	defer stop()
	if proto == "h2" {
		hs := newH2Streams(conn)
		start := time.Now()
		// x/net's ServeConn is deprecated for net/http's Serve, which speaks
		// HTTP/2 only on a *tls.Conn or as cleartext h2c; this connection is
		// TLS below a flushConn, so ServeConn is the API that fits it.
		//lint:ignore SA1019 see above
		h2 := &http2.Server{MaxConcurrentStreams: maxStreams, IdleTimeout: tm.cfg.IdleTimeout, MaxReadFrameSize: 1 << 20}
		//lint:ignore SA1019 see above
		h2.ServeConn(hs, &http2.ServeConnOpts{
			Context:    ctx,
			Handler:    fs,
			BaseConfig: &http.Server{ErrorLog: discardLog, MaxHeaderBytes: maxHeaderBytes, DisableGeneralOptionsHandler: true},
		})
		conn.Close()
		fs.handlers.Wait()
		fs.unseen(hs, start)
		return fs.quiet(res(""))
	}
	lc := &localConn{Conn: conn, fs: fs}
	fs.lc = lc
	ln := newOneConnListener(lc)
	srv := &http.Server{
		Handler: fs,
		// OPTIONS * comes to the handler, to be decided and recorded,
		// rather than answered here unseen.
		DisableGeneralOptionsHandler: true,
		ReadHeaderTimeout:            tm.cfg.HeaderTimeout,
		IdleTimeout:                  tm.cfg.IdleTimeout,
		MaxHeaderBytes:               maxHeaderBytes,
		ErrorLog:                     discardLog,
		// An empty map: no HTTP/2 over this server (ALPN chose HTTP/1.1).
		TLSNextProto: map[string]func(*http.Server, *tls.Conn, http.Handler){},
		BaseContext:  func(net.Listener) context.Context { return ctx },
		ConnState: func(_ net.Conn, s http.ConnState) {
			switch s {
			case http.StateNew, http.StateIdle:
				lc.arm() // a request may come: watch for an answer no handler gives
			case http.StateClosed:
				lc.closed()
				ln.Close()
			case http.StateHijacked:
				ln.Close()
			}
		},
	}
	srv.Serve(ln)
	fs.handlers.Wait()
	conn.Close()
	return fs.quiet(res(""))
}

// quiet notes a TLS connection that ended without a request: what a
// client that pins certificates does once it has seen tunwall's.
func (fs *flowServer) quiet(r Result) Result {
	if fs.f.TLS && r.Requests == 0 && fs.locals.Load() == 0 && r.Note == "" {
		r.CertRefused = true
		r.Note = "the client closed the connection after the TLS handshake without a request: if it pins certificates, leave this host without http and inject to pass its TLS through"
	}
	return r
}

// maxHeaderBytes bounds a request head.
const maxHeaderBytes = 64 << 10

var discardLog = log.New(io.Discard, "", 0)

// certAdvice ends the note of a client that refused the run's certificate:
// how to make it trust the run's CA, or not terminate its TLS at all.
const certAdvice = "point it at the run's CA (in the sandbox, the bundle $SSL_CERT_FILE names, as do REQUESTS_CA_BUNDLE, CURL_CA_BUNDLE and NODE_EXTRA_CA_CERTS; the CA file attach and socks print), or leave this host without http and inject to pass its TLS through"

// handshakeFailure says why a client's TLS handshake failed; certRefused
// when the client ended it after tunwall sent its certificate (a remote
// alert, or a hang-up, once the server's flight was written).
func handshakeFailure(err error, wrote bool) (certRefused bool, note string) {
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Op == "remote error" {
		return true, "the client refused tunwall's certificate (" + oe.Err.Error() + "): it pins certificates or does not trust the run's CA; " + certAdvice
	}
	if wrote && (errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) || errors.Is(err, io.ErrUnexpectedEOF)) {
		return true, "the client hung up after it was shown tunwall's certificate: it may pin certificates or not trust the run's CA; " + certAdvice
	}
	var ne net.Error
	if wrote && !(errors.As(err, &ne) && ne.Timeout()) {
		// Whatever else ends the handshake once the client has the
		// certificate is the client ending it: OpenSSL's alert, under
		// keys tunwall no longer reads with, arrives as "bad record MAC"
		// (curl --cacert, python's verify=).
		return true, "the client ended the TLS handshake after it was shown tunwall's certificate (" + err.Error() + "): it does not trust the run's CA (a CA bundle of its own: curl --cacert, python verify=, NODE_EXTRA_CA_CERTS replaced?) or pins certificates; " + certAdvice
	}
	return false, "TLS handshake with the client failed: " + err.Error()
}

// sameName compares host names case-insensitively, ignoring a trailing dot.
func sameName(a, b string) bool {
	return strings.EqualFold(strings.TrimSuffix(a, "."), strings.TrimSuffix(b, "."))
}

func clip(s string) string {
	if len(s) > 200 {
		return s[:200] + "..."
	}
	return s
}

// flowServer serves the requests of one flow.
type flowServer struct {
	tm       *Terminator
	f        Flow
	view     policy.HTTPView
	tr       *http.Transport
	requests atomic.Int64
	locals   atomic.Int64 // requests the server answered itself, recorded
	handlers sync.WaitGroup

	h2 bool       // the client speaks HTTP/2
	lc *localConn // the HTTP/1 connection, watched for answers no handler gives

	upMu   sync.Mutex
	upUsed bool                 // f.Up was handed to the transport (or closed)
	ups    map[*upConn]struct{} // the upstream connections open now
	reset  bool                 // the sandbox reset its connection
}

// upConn is an upstream connection of the flow, known to the flowServer
// while it is open, so that a reset of the sandbox's connection resets it.
type upConn struct {
	net.Conn
	fs   *flowServer
	once sync.Once
}

func (u *upConn) Close() error {
	u.once.Do(func() {
		u.fs.upMu.Lock()
		delete(u.fs.ups, u)
		u.fs.upMu.Unlock()
	})
	return u.Conn.Close()
}

// track wraps an upstream connection, or resets it at once if the sandbox
// reset its connection already.
func (fs *flowServer) track(c net.Conn) (net.Conn, error) {
	if fs.f.Abort == nil {
		return c, nil
	}
	u := &upConn{Conn: c, fs: fs}
	fs.upMu.Lock()
	defer fs.upMu.Unlock()
	if fs.reset {
		fs.f.Abort(c)
		return nil, errors.New("l7: the sandbox reset its connection")
	}
	if fs.ups == nil {
		fs.ups = make(map[*upConn]struct{})
	}
	fs.ups[u] = struct{}{}
	return u, nil
}

// resetUps resets every upstream connection of the flow: the sandbox reset
// its own.
func (fs *flowServer) resetUps() {
	fs.upMu.Lock()
	fs.reset = true
	ups := make([]*upConn, 0, len(fs.ups))
	for u := range fs.ups {
		ups = append(ups, u)
	}
	fs.upMu.Unlock()
	for _, u := range ups {
		fs.f.Abort(u.Conn)
	}
}

// resetClient resets the sandbox's connection: a server reset its own in
// the middle of a response. Only an HTTP/1 client's: an HTTP/2 one shares
// its connection with other requests, and gets its stream reset.
func (fs *flowServer) resetClient() {
	if fs.f.Abort != nil && !fs.h2 {
		fs.f.Abort(fs.f.Client)
	}
}

// closeUp closes the first upstream connection if the transport never
// took it.
func (fs *flowServer) closeUp() {
	fs.upMu.Lock()
	defer fs.upMu.Unlock()
	if !fs.upUsed && fs.f.Up != nil {
		fs.f.Up.Close()
	}
	fs.upUsed = true
}

// dial gives the transport the engine's first connection while it is
// fresh, then new ones through the engine's dialer.
func (fs *flowServer) dial(ctx context.Context, _, _ string) (net.Conn, error) {
	fs.upMu.Lock()
	if !fs.upUsed && fs.f.Up != nil {
		fs.upUsed = true
		up := fs.f.Up
		fs.upMu.Unlock()
		if time.Since(fs.f.UpAt) < freshUp {
			return fs.track(up)
		}
		up.Close()
	} else {
		fs.upMu.Unlock()
	}
	if fs.f.Dial == nil {
		return nil, errors.New("l7: no upstream dialer")
	}
	c, err := fs.f.Dial(ctx)
	if err != nil {
		return nil, err
	}
	return fs.track(c)
}

// transport is the flow's own upstream client: its connections go only to
// the flow's name, through the engine.
func (fs *flowServer) transport() *http.Transport {
	tr := &http.Transport{
		DialContext:            fs.dial,
		ForceAttemptHTTP2:      fs.f.TLS,
		MaxConnsPerHost:        maxUpConns,
		MaxIdleConnsPerHost:    maxUpConns,
		IdleConnTimeout:        90 * time.Second,
		TLSHandshakeTimeout:    fs.tm.cfg.HandshakeTimeout,
		ExpectContinueTimeout:  time.Second,
		MaxResponseHeaderBytes: 256 << 10,
		// Accept-Encoding is the client's; tunwall decodes nothing.
		DisableCompression: true,
	}
	if fs.f.TLS {
		tr.TLSClientConfig = &tls.Config{
			ServerName: fs.f.Host,
			RootCAs:    fs.roots(),
			MinVersion: tls.VersionTLS12,
		}
	}
	return tr
}

// roots returns the pool the flow's server is verified against. A rule's
// ca that did not load yields an empty pool: every handshake fails, none
// goes unverified.
func (fs *flowServer) roots() *x509.CertPool {
	if fs.view.CA == "" {
		return fs.tm.cfg.Roots
	}
	if p, ok := fs.tm.cfg.CARoots[fs.view.CA]; ok && p != nil {
		return p
	}
	return x509.NewCertPool()
}

// oneConnListener hands out one connection, then blocks until closed.
type oneConnListener struct {
	c      chan net.Conn
	addr   net.Addr
	closed chan struct{}
	once   sync.Once
}

func newOneConnListener(c net.Conn) *oneConnListener {
	l := &oneConnListener{c: make(chan net.Conn, 1), addr: c.LocalAddr(), closed: make(chan struct{})}
	l.c <- c
	return l
}

func (l *oneConnListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.c:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

func (l *oneConnListener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return nil
}

func (l *oneConnListener) Addr() net.Addr { return l.addr }

// batchConn gathers the TLS records of one write to the client into one
// write of the connection below (the sandbox's, through the netstack, where
// each write costs a packet or more). It gathers only while corked, which
// flushConn does around each of its writes; other writes of the TLS
// connection (its handshake, a key update answered while reading, an
// alert) pass as they are written, after whatever is gathered.
type batchConn struct {
	net.Conn
	mu     sync.Mutex
	corked bool
	buf    []byte
	err    error
}

// batchMax is how much batchConn gathers before it writes anyway.
const batchMax = 256 << 10

func (b *batchConn) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.err != nil {
		return 0, b.err
	}
	if !b.corked {
		return b.Conn.Write(p)
	}
	b.buf = append(b.buf, p...)
	if len(b.buf) >= batchMax {
		b.flushLocked()
	}
	return len(p), b.err
}

func (b *batchConn) cork() {
	b.mu.Lock()
	b.corked = true
	b.mu.Unlock()
}

// uncork writes what was gathered and stops gathering.
func (b *batchConn) uncork() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.flushLocked()
	b.corked = false
	return b.err
}

func (b *batchConn) flushLocked() {
	if len(b.buf) == 0 || b.err != nil {
		return
	}
	_, b.err = b.Conn.Write(b.buf)
	if cap(b.buf) > batchMax+(64<<10) {
		b.buf = nil
	} else {
		b.buf = b.buf[:0]
	}
}

// flushConn is the client's TLS connection whose writes go out through
// its batchConn, one underlying write each.
type flushConn struct {
	net.Conn // *tls.Conn
	b        *batchConn
	wmu      sync.Mutex
}

func (f *flushConn) Write(p []byte) (int, error) {
	f.wmu.Lock()
	defer f.wmu.Unlock()
	f.b.cork()
	n, err := f.Conn.Write(p)
	if ferr := f.b.uncork(); err == nil && ferr != nil {
		return n, ferr
	}
	return n, err
}

// ConnectionState is the TLS connection's (HTTP/2 reads it).
func (f *flushConn) ConnectionState() tls.ConnectionState {
	return f.Conn.(*tls.Conn).ConnectionState()
}

// CloseWrite sends close_notify and half-closes.
func (f *flushConn) CloseWrite() error {
	if cw, ok := f.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return f.Close()
}

// countConn counts the bytes each way of the client's connection.
type countConn struct {
	net.Conn
	in, out atomic.Int64
	onErr   func(error) // told each read error (nil: none)
}

func (c *countConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.in.Add(int64(n))
	if err != nil && c.onErr != nil {
		c.onErr(err)
	}
	return n, err
}

func (c *countConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.out.Add(int64(n))
	return n, err
}

// CloseWrite half-closes when the connection can.
func (c *countConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return c.Conn.Close()
}

// copyBuf is the size of the buffers a response is copied through: large,
// so that one write to the client carries several TLS records.
const copyBuf = 64 << 10

// bufferPool is httputil.BufferPool over copyBuf-byte buffers.
type bufferPool struct{ p sync.Pool }

func (b *bufferPool) Get() []byte {
	if v, ok := b.p.Get().(*[]byte); ok {
		return *v
	}
	return make([]byte, copyBuf)
}

func (b *bufferPool) Put(buf []byte) { b.p.Put(&buf) }
