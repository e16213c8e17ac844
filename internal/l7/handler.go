package l7

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/tunwall/tunwall/internal/secrets"
	"github.com/tunwall/tunwall/policy"
)

// maxRecordedPath bounds the path in a record.
const maxRecordedPath = 1 << 10

// ServeHTTP checks one request, and sends it on or refuses it.
func (fs *flowServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	fs.handlers.Add(1)
	defer fs.handlers.Done()
	if fs.lc != nil {
		fs.lc.taken()
	}
	fs.requests.Add(1)
	rq := &request{fs: fs, w: &countWriter{ResponseWriter: w}, r: r, rec: Record{
		Start:  time.Now(),
		Method: clip(r.Method),
		Host:   fs.f.Host,
		Path:   recordPath(r),
		Proto:  r.Proto,
	}}
	defer rq.done()
	rq.serve()
}

// request is one request as it is handled.
type request struct {
	fs       *flowServer
	w        *countWriter
	r        *http.Request
	rec      Record
	body     *countReader
	injected []*secrets.Secret
	upReset  atomic.Bool // the server reset its connection mid-response
	mw       *maskWriter // what the response is written through
	masked   []string    // secrets whose values the response carried
	unheard  bool        // refused before the audit log could take it: no record
	// partsDenied is the denial of a multipart part naming _method, met
	// while the body streamed.
	partsDenied atomic.Pointer[policy.RequestDecision]
}

func (rq *request) done() {
	if rq.unheard {
		return
	}
	if d := rq.partsDenied.Load(); d != nil {
		rq.rec.Allowed, rq.rec.Rule, rq.rec.Reason = false, d.Rule, d.Reason+"; the body was cut there"
	}
	rq.rec.URL = rq.url()
	rq.rec.Duration = time.Since(rq.rec.Start)
	rq.rec.Status = rq.w.status
	rq.rec.BytesIn = rq.w.n
	if rq.body != nil {
		rq.rec.BytesOut = rq.body.n
	}
	for _, s := range rq.injected {
		rq.rec.Injected = append(rq.rec.Injected, s.Name)
	}
	if len(rq.masked) > 0 {
		rq.rec.Reason += "; the response carried the value of " + strings.Join(rq.masked, ", ") + ", masked before the client got it"
	}
	rq.fs.f.Rec.Request(rq.rec)
}

// url is the request as a URL for humans: scheme, host, escaped path.
func (rq *request) url() string {
	scheme := "http"
	if rq.fs.f.TLS {
		scheme = "https"
	}
	return scheme + "://" + rq.fs.hostPort() + rq.rec.Path
}

// hostPort is the flow's name, with its port unless it is the scheme's.
func (fs *flowServer) hostPort() string {
	if (fs.f.TLS && fs.f.Port == 443) || (!fs.f.TLS && fs.f.Port == 80) {
		return fs.f.Host
	}
	return net.JoinHostPort(fs.f.Host, strconv.Itoa(int(fs.f.Port)))
}

// refuse answers with status and a plain-text body saying what was denied
// and why (and what would allow it), and records the denial.
func (rq *request) refuse(status int, rule, reason, hint string) {
	rq.rec.Allowed = false
	rq.rec.Rule, rq.rec.Reason = rule, reason
	if rq.rec.Rule == "" {
		rq.rec.Rule = "default-deny"
	}
	body := fmt.Sprintf("tunwall: %s %s denied: %s\n", rq.rec.Method, rq.url(), reason)
	if hint != "" {
		body += "tunwall: " + hint + "\n"
	}
	h := rq.w.Header()
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	h.Set("X-Tunwall-Denied", "1")
	if rq.r.ProtoMajor == 1 {
		h.Set("Connection", "close")
	}
	rq.w.WriteHeader(status)
	io.WriteString(rq.w, body)
}

func (rq *request) serve() {
	fs, r := rq.fs, rq.r
	if err := fs.f.Rec.Admit(); err != nil {
		rq.unheard = true // the log says it is full or too fast, once
		rq.refuse(http.StatusServiceUnavailable, "audit", "the audit log cannot take this request's record now ("+err.Error()+")", "")
		return
	}
	// The name checks, on every request.
	if host, ok := fs.checkHost(r); !ok {
		rq.refuse(http.StatusForbidden, "", fmt.Sprintf("HTTP Host %q disagrees with %s, the name this connection is for (domain fronting)", clip(host), fs.f.Host), "")
		return
	}
	if r.TLS != nil && r.TLS.ServerName != "" && !sameName(r.TLS.ServerName, fs.f.Host) {
		rq.refuse(http.StatusForbidden, "", "TLS SNI disagrees with "+fs.f.Host, "")
		return
	}
	if r.Method == http.MethodConnect {
		rq.refuse(http.StatusForbidden, "", "CONNECT is not relayed: what goes through the tunnel could not be checked", "")
		return
	}
	if up := r.Header.Get("Upgrade"); up != "" && !strings.EqualFold(strings.TrimSpace(up), "websocket") {
		rq.refuse(http.StatusForbidden, "", fmt.Sprintf("Upgrade %q is not relayed: only websocket is", clip(up)), "")
		return
	}
	// Placeholders: in the request line and headers (trailers are not
	// sent on).
	if x := rq.strayInHead(); x != nil {
		rq.refuseStray(x)
		return
	}
	path := r.URL.EscapedPath()
	if r.RequestURI == "*" {
		path = "*" // OPTIONS *: no path, refused as not absolute
	}
	d := fs.tm.rules().DecideRequest(fs.f.Host, fs.f.Port, r.Method, path)
	if d.Allowed() {
		d = fs.gitService(r, d)
	}
	if d.Allowed() {
		d = fs.overrides(r, path, d)
	}
	if !d.Allowed() && fs.tm.cfg.Learn {
		d.Verdict, d.Rule, d.Reason = policy.Allow, "learn", "learn mode; enforce would deny: "+d.Reason
	}
	if !d.Allowed() {
		rq.refuse(http.StatusForbidden, d.Rule, d.Reason, d.Hint)
		return
	}
	rq.rec.Allowed, rq.rec.Rule, rq.rec.Reason = true, d.Rule, d.Reason
	// The body's first 64 KiB are read and scanned before a byte of it
	// goes on.
	body, err := rq.scanBody()
	if err != nil {
		var x *stray
		if errors.As(err, &x) {
			rq.refuseStray(x)
			return
		}
		var o *overridden
		if errors.As(err, &o) {
			rq.refuse(http.StatusForbidden, o.d.Rule, o.d.Reason, o.d.Hint)
			return
		}
		rq.rec.Allowed = false
		rq.rec.Reason = "the client's request body failed: " + err.Error()
		return
	}
	rq.body = &countReader{r: body}
	rq.proxy()
}

// gitService decides git's smart-HTTP discovery request, GET
// REPO/info/refs?service=git-receive-pack (or git-upload-pack), as the
// POST REPO/git-receive-pack it announces: git shows the body of a refused
// discovery ("remote: ..."), not of a refused RPC, so a push the rules deny
// is refused where git can say why. Only the query's service is read; it
// is not recorded.
func (fs *flowServer) gitService(r *http.Request, d policy.RequestDecision) policy.RequestDecision {
	p := r.URL.EscapedPath()
	if r.Method != http.MethodGet || !strings.HasSuffix(p, "/info/refs") {
		return d
	}
	svc := r.URL.Query().Get("service")
	if svc != "git-upload-pack" && svc != "git-receive-pack" {
		return d
	}
	rpc := strings.TrimSuffix(p, "/info/refs") + "/" + svc
	if rd := fs.tm.rules().DecideRequest(fs.f.Host, fs.f.Port, http.MethodPost, rpc); !rd.Allowed() {
		rd.Reason += " (git's " + svc + ", which this discovery request announces)"
		return rd
	}
	return d
}

// checkHost checks the request's Host (HTTP/1.1) or :authority (HTTP/2),
// or the host of an absolute-form target, against the flow's name; a port,
// if any, must be the flow's.
func (fs *flowServer) checkHost(r *http.Request) (string, bool) {
	h := r.Host
	if h == "" {
		return h, false
	}
	name, port := h, ""
	if host, p, err := net.SplitHostPort(h); err == nil {
		name, port = host, p
	}
	if port != "" && port != strconv.Itoa(int(fs.f.Port)) {
		return h, false
	}
	return h, sameName(name, fs.f.Host)
}

// scanBody reads up to ScanPrefix bytes of the body and scans them; it
// returns the body to send on (those bytes, then the rest, streamed).
func (rq *request) scanBody() (io.ReadCloser, error) {
	r := rq.r
	st := rq.fs.tm.cfg.Secrets
	form := isURLEncodedForm(r)
	parts := rq.fs.partsGuard(r)
	if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 || (st.Len() == 0 && !form && parts == nil) {
		return r.Body, nil
	}
	tm := rq.fs.tm
	select {
	case tm.scans <- struct{}{}:
	case <-r.Context().Done():
		return nil, r.Context().Err()
	}
	buf := tm.bufs.Get().(*[ScanPrefix]byte)
	release := func() {
		tm.bufs.Put(buf)
		<-tm.scans
	}
	n, err := io.ReadFull(r.Body, buf[:])
	if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
		release()
		return nil, err
	}
	if form {
		d := rq.fs.formOverride(r, buf[:n], r.ContentLength > ScanPrefix || (r.ContentLength < 0 && n == ScanPrefix))
		switch {
		case d.Allowed():
		case tm.cfg.Learn:
			rq.rec.Rule, rq.rec.Reason = "learn", "learn mode; enforce would deny: "+d.Reason
		default:
			release()
			return nil, &overridden{d}
		}
	}
	if parts != nil {
		// The prefix first, whole: a part it holds that the rules deny
		// is refused before anything goes on.
		more := r.ContentLength > ScanPrefix || (r.ContentLength < 0 && n == ScanPrefix)
		if _, err := parts.feed(buf[:n], !more); err != nil {
			var o *overridden
			switch {
			case !errors.As(err, &o):
			case tm.cfg.Learn:
				rq.rec.Rule, rq.rec.Reason = "learn", "learn mode; enforce would deny: "+o.d.Reason
			default:
				release()
				return nil, err
			}
		}
	}
	found, name, stale := st.Inspect(buf[:n])
	if stale {
		release()
		return nil, rq.stale(name, "the request body")
	}
	for _, s := range found {
		if x := rq.misplaced(s, "the request body", ""); x != nil {
			release()
			return nil, x
		}
	}
	var body io.ReadCloser = &prefixBody{buf: buf, n: n, rest: r.Body, release: release}
	if parts != nil && !tm.cfg.Learn {
		// Again as it streams, from the start, holding back what it must.
		parts.reset()
		body = &partsBody{r: body, fp: parts, pend: make([]byte, 0, partsWindow), denied: &rq.partsDenied}
	}
	return body, nil
}

// prefixBody returns the scanned prefix, then the rest of the body.
type prefixBody struct {
	buf     *[ScanPrefix]byte
	n, off  int
	rest    io.ReadCloser
	release func()
}

func (p *prefixBody) Read(b []byte) (int, error) {
	if p.buf != nil {
		if p.off < p.n {
			k := copy(b, p.buf[p.off:p.n])
			p.off += k
			return k, nil
		}
		p.free()
	}
	return p.rest.Read(b)
}

func (p *prefixBody) free() {
	if p.buf != nil {
		p.buf = nil
		p.release()
	}
}

func (p *prefixBody) Close() error {
	p.free()
	return p.rest.Close()
}

// proxy sends the request on and the response back.
func (rq *request) proxy() {
	fs := rq.fs
	scheme := "http"
	if fs.f.TLS {
		scheme = "https"
	}
	in := rq.r
	in.Body = rq.body
	// Every byte of the response goes to the client through mw, which
	// masks the injected values wherever the response carries them.
	rq.mw = &maskWriter{w: rq.w, note: rq.noteMasked}
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme = scheme
			pr.Out.URL.Host = fs.hostPort()
			pr.Out.Host = fs.hostPort()
			pr.Out.Trailer = nil // trailers are not scanned, so not sent
			rq.inject(pr.Out.Header)
			rq.mw.arm(rq.injected)
		},
		Transport:    guardTransport{mw: rq.mw, tr: fs.tr, reset: &rq.upReset},
		BufferPool:   &fs.tm.copy,
		ErrorLog:     discardLog,
		ErrorHandler: rq.upstreamError,
	}
	// The proxy ends a response whose body it could not finish reading
	// by panicking (http.ErrAbortHandler): finish, and a reset of the
	// server's passed on to the client, come either way.
	defer func() {
		rq.mw.finish()
		if rq.upReset.Load() {
			fs.resetClient()
		}
	}()
	rp.ServeHTTP(rq.mw, in)
}

// guardTransport refuses to send an upgrade (WebSocket) of a request that
// received a secret: what the server sends after switching protocols
// could not be masked (see maskWriter), so the request does not leave.
type guardTransport struct {
	mw    *maskWriter
	tr    http.RoundTripper
	reset *atomic.Bool // set when the server reset its connection mid-body
}

// resetBody is a response body that notes a reset of the server's
// connection while it is read.
type resetBody struct {
	io.ReadCloser
	reset *atomic.Bool
}

func (b resetBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil && (errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)) {
		b.reset.Store(true)
	}
	return n, err
}

func (g guardTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if g.mw.m != nil && r.Header.Get("Upgrade") != "" {
		if r.Body != nil {
			r.Body.Close()
		}
		return nil, errUpgradeWithSecret
	}
	resp, err := g.tr.RoundTrip(r)
	bodiless := r.Method == http.MethodHead || err == nil && (resp.StatusCode == http.StatusNoContent || resp.StatusCode == http.StatusNotModified)
	if err == nil && g.mw.m != nil && !bodiless && encoded(resp.Header) {
		// The request asked for identity; an answer encoded anyway (gzip,
		// br, ...) carries the value in bytes the masker cannot read,
		// which the client decodes. It does not reach the client.
		ce := resp.Header.Get("Content-Encoding")
		if resp.Body != nil {
			resp.Body.Close()
		}
		return nil, fmt.Errorf("%w (Content-Encoding: %s)", errEncodedWithSecret, clip(ce))
	}
	if err == nil && resp.Body != nil && g.reset != nil && resp.StatusCode != http.StatusSwitchingProtocols {
		resp.Body = resetBody{ReadCloser: resp.Body, reset: g.reset}
	}
	return resp, err
}

// errEncodedWithSecret refuses a response encoded (compressed) although
// the request that received a secret asked for identity.
var errEncodedWithSecret = errors.New("the server encoded its answer to a request that received a secret, which asked for identity, and the masker cannot read an encoded body")

// encoded reports whether h names a content coding other than identity.
func encoded(h http.Header) bool {
	for _, v := range h.Values("Content-Encoding") {
		for _, c := range strings.Split(v, ",") {
			if c = strings.TrimSpace(c); c != "" && !strings.EqualFold(c, "identity") {
				return true
			}
		}
	}
	return false
}

// inject puts the host's secrets into the outgoing headers, on a flow
// tunwall sends over TLS it verified and nowhere else: in place of their
// placeholders in the credential headers (plain form, Basic credentials
// included), or as the header a rule names (explicit form). A placeholder
// anywhere else never gets here (strayInHead, scanBody).
func (rq *request) inject(h http.Header) {
	st := rq.fs.tm.cfg.Secrets
	if st.Len() == 0 || len(rq.fs.view.Inject) == 0 {
		return
	}
	if !rq.fs.f.TLS {
		rq.notInjected()
		return
	}
	add := func(s *secrets.Secret) {
		for _, x := range rq.injected {
			if x == s {
				return
			}
		}
		rq.injected = append(rq.injected, s)
	}
	for _, in := range rq.fs.view.Inject {
		s, ok := st.Get(in.Secret)
		if !ok {
			continue
		}
		if in.Header != "" {
			h.Set(in.Header, strings.ReplaceAll(in.Value, "{}", s.Value().Reveal()))
			add(s)
			continue
		}
		for _, k := range credentialHeaders {
			for i, v := range h[k] {
				if nv, did := s.ReplaceIn(v); did {
					h[k][i] = nv
					add(s)
				}
			}
		}
	}
	if len(rq.injected) > 0 {
		// A server that reflects the request must not hand the value
		// back compressed, where masking cannot find it, nor a slice of
		// it (Range), shorter than the value and so no occurrence of it:
		// the answer comes whole, and is masked whole.
		h.Set("Accept-Encoding", "identity")
		h.Del("Range")
		h.Del("If-Range")
	}
}

func (rq *request) noteMasked(name string) {
	for _, n := range rq.masked {
		if n == name {
			return
		}
	}
	rq.masked = append(rq.masked, name)
}

// upstreamError answers a request the server could not be asked: 502
// with the reason, which the record keeps too.
func (rq *request) upstreamError(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(err, context.Canceled) && r.Context().Err() != nil {
		rq.rec.Reason += "; the client went away"
		return
	}
	if o := (*overridden)(nil); errors.As(err, &o) {
		rq.refuse(http.StatusForbidden, o.d.Rule, o.d.Reason, o.d.Hint)
		return
	}
	if errors.Is(err, errUpgradeWithSecret) {
		names := make([]string, 0, len(rq.injected))
		for _, s := range rq.injected {
			names = append(names, s.Name)
		}
		rq.injected = nil // the request was not sent
		rq.refuse(http.StatusForbidden, "credential-upgrade",
			fmt.Sprintf("%s upgrade of a request that receives %s is not relayed: what the server sends after switching protocols could not be masked", clip(r.Header.Get("Upgrade")), strings.Join(names, ", ")),
			"an upgrade is relayed only when the request receives no secret")
		return
	}
	var ve *tls.CertificateVerificationError
	var why string
	switch {
	case errors.As(err, &ve):
		roots := "the host's roots"
		if rq.fs.view.CA != "" {
			roots = "the rule's ca " + rq.fs.view.CA
		}
		why = fmt.Sprintf("upstream %s presented a certificate tunwall does not trust (%v); tunwall verifies it against %s, and never without", rq.fs.f.Host, ve.Err, roots)
	default:
		why = fmt.Sprintf("upstream %s: %v", rq.fs.f.Host, err)
	}
	// The transport's error may quote the response (a malformed status
	// line or header): masked like the response, here for the record too.
	if rq.mw != nil && rq.mw.m != nil {
		if masked, name := rq.mw.m.maskString(why); name != "" {
			why = masked
			rq.noteMasked(name)
		}
	}
	rq.rec.Reason = why
	rq.rec.UpstreamFailed = true
	body := "tunwall: " + rq.rec.Method + " " + rq.url() + " failed: " + why + "\n"
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(http.StatusBadGateway)
	io.WriteString(w, body)
}

// recordPath is the request's escaped path, without the query, bounded.
func recordPath(r *http.Request) string {
	p := r.URL.EscapedPath()
	if p == "" {
		p = r.RequestURI
		if i := strings.IndexByte(p, '?'); i >= 0 {
			p = p[:i]
		}
	}
	if len(p) > maxRecordedPath {
		p = p[:maxRecordedPath]
	}
	return p
}

// countWriter counts the response body bytes and keeps the status.
type countWriter struct {
	http.ResponseWriter
	status int
	n      int64
}

func (c *countWriter) WriteHeader(code int) {
	if c.status == 0 || c.status < 200 {
		c.status = code
	}
	c.ResponseWriter.WriteHeader(code)
}

func (c *countWriter) Write(p []byte) (int, error) {
	if c.status == 0 {
		c.status = http.StatusOK
	}
	n, err := c.ResponseWriter.Write(p)
	c.n += int64(n)
	return n, err
}

// Unwrap lets http.ResponseController reach Flush.
func (c *countWriter) Unwrap() http.ResponseWriter { return c.ResponseWriter }

// Hijack is the reverse proxy's way to answer 101 Switching Protocols: it
// writes the answer itself on the hijacked connection, without
// WriteHeader, so the status is kept here.
func (c *countWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	conn, brw, err := http.NewResponseController(c.ResponseWriter).Hijack()
	if err == nil && (c.status == 0 || c.status < 200) {
		c.status = http.StatusSwitchingProtocols
	}
	return conn, brw, err
}

// countReader counts the request body bytes sent on.
type countReader struct {
	r io.ReadCloser
	n int64
}

func (c *countReader) Read(p []byte) (int, error) {
	if c.r == nil {
		return 0, io.EOF
	}
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

func (c *countReader) Close() error {
	if c.r == nil {
		return nil
	}
	return c.r.Close()
}

// methodOverrides are the headers that frameworks (Rails, Laravel,
// Express's method-override, Spring's HiddenHttpMethodFilter, Google's
// APIs) read as the request's real method.
var methodOverrides = []string{"X-Http-Method-Override", "X-Http-Method", "X-Method-Override"}

// overrides decides the request again as each method it asks the server
// to take it for (a method-override header, or _method in the query): a
// POST that a server runs as DELETE is a DELETE. d is the decision for the
// method as sent; the first override denied denies the request.
func (fs *flowServer) overrides(r *http.Request, path string, d policy.RequestDecision) policy.RequestDecision {
	var named []string
	for _, h := range methodOverrides {
		for _, v := range r.Header.Values(h) {
			named = append(named, h+": "+v)
		}
	}
	if q, err := url.ParseQuery(r.URL.RawQuery); err == nil {
		for _, v := range q["_method"] {
			named = append(named, "_method="+v)
		}
	} else if strings.Contains(r.URL.RawQuery, "_method") {
		return policy.RequestDecision{Verdict: policy.Deny, Rule: policy.RuleDefaultDeny, Reason: "a query that does not parse names _method"}
	}
	return fs.decideNamed(path, named, d)
}

// decideNamed decides the request as each method named names ("Header:
// METHOD" or "_method=METHOD"); the first denied denies it, else d stands.
func (fs *flowServer) decideNamed(path string, named []string, d policy.RequestDecision) policy.RequestDecision {
	for _, n := range named {
		_, m, _ := strings.Cut(n, ": ")
		if strings.HasPrefix(n, "_method=") {
			m = strings.TrimPrefix(n, "_method=")
		}
		m = strings.TrimSpace(m)
		o := fs.tm.rules().DecideRequest(fs.f.Host, fs.f.Port, m, path)
		if !o.Allowed() {
			o.Reason = fmt.Sprintf("%s asks the server to take it as %s: %s", clip(n), clip(strings.ToUpper(m)), o.Reason)
			return o
		}
	}
	return d
}

// isURLEncodedForm says whether the body is a urlencoded form, where Rails
// (Rack::MethodOverride) and Laravel read _method.
func isURLEncodedForm(r *http.Request) bool {
	ct, _, _ := strings.Cut(r.Header.Get("Content-Type"), ";")
	return strings.EqualFold(strings.TrimSpace(ct), "application/x-www-form-urlencoded")
}

// overridden carries the denial of a method a form body names.
type overridden struct{ d policy.RequestDecision }

func (o *overridden) Error() string { return o.d.Reason }

// formMethods are the methods a form body longer than the scanned prefix
// could name past it: such a body is refused unless the rules allow each
// of them here, since what it names is not read.
var formMethods = []string{"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"}

// formOverride decides the request as each method the first bytes of its
// urlencoded form body name in _method (a POST that Rails runs as DELETE
// is a DELETE). more says the body goes on past prefix.
func (fs *flowServer) formOverride(r *http.Request, prefix []byte, more bool) policy.RequestDecision {
	path := r.URL.EscapedPath()
	allowed := policy.RequestDecision{Verdict: policy.Allow}
	if more {
		for _, m := range formMethods {
			if d := fs.tm.rules().DecideRequest(fs.f.Host, fs.f.Port, m, path); !d.Allowed() {
				return policy.RequestDecision{Verdict: policy.Deny, Rule: policy.RuleDefaultDeny,
					Reason: fmt.Sprintf("a form body over %d KiB could name _method=%s past what tunwall reads, and %s is not allowed here", ScanPrefix>>10, m, m)}
			}
		}
		return allowed
	}
	q, err := url.ParseQuery(string(prefix))
	if err != nil {
		if strings.Contains(string(prefix), "_method") || strings.Contains(strings.ToLower(string(prefix)), "%5fmethod") {
			return policy.RequestDecision{Verdict: policy.Deny, Rule: policy.RuleDefaultDeny, Reason: "a form body that does not parse names _method"}
		}
		return allowed
	}
	var named []string
	for _, v := range q["_method"] {
		named = append(named, "_method="+v)
	}
	return fs.decideNamed(path, named, allowed)
}
