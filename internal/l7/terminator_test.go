package l7

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tunwall/tunwall/internal/secrets"
	"github.com/tunwall/tunwall/internal/testworld"
	"github.com/tunwall/tunwall/policy"
)

const (
	tokenValue = "ghp_theRealTokenNobodyInTheSandboxSees01"
	npmValue   = "npm_anotherRealValueKeptOutside42"
)

const testPolicy = `version: 1
secrets:
  GITHUB_TOKEN: {env: GH}
  NPM_TOKEN: {env: NPM}
phases:
  exec:
    allow:
      - host: api.test
        inject: [GITHUB_TOKEN]
        http:
          - {methods: [GET, HEAD], paths: ["/repos/acme/**", "/echo", "/ws"]}
          - {methods: [POST], paths: ["/repos/acme/widget/pulls"]}
      - host: npm.test
        inject: [{secret: NPM_TOKEN, header: Authorization, value: "Bearer {}"}]
      - host: gist.test
        http: [{methods: ["*"], paths: ["/**"]}]
      - host: bad.test
        inject: [GITHUB_TOKEN]
`

// upstream is one fake server: it records the Authorization it gets.
type upstream struct {
	mu     sync.Mutex
	auths  []string
	bodies []string
	ln     net.Listener
}

func (u *upstream) last() string {
	u.mu.Lock()
	defer u.mu.Unlock()
	if len(u.auths) == 0 {
		return "<none>"
	}
	return u.auths[len(u.auths)-1]
}

func startUpstream(t *testing.T, ca *testworld.CA, h2 bool) *upstream {
	t.Helper()
	u := &upstream{}
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		u.mu.Lock()
		u.auths = append(u.auths, r.Header.Get("Authorization"))
		u.bodies = append(u.bodies, string(b))
		u.mu.Unlock()
		fmt.Fprintf(w, "ok %s %s %s %s\n", r.Proto, r.Method, r.Host, r.URL.Path)
	})
	mux.HandleFunc("/echo", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Echo", r.Header.Get("Authorization"))
		for k, v := range r.Header {
			fmt.Fprintf(w, "%s: %s\n", k, strings.Join(v, ","))
		}
	})
	mux.HandleFunc("/ws", func(w http.ResponseWriter, r *http.Request) {
		c, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer c.Close()
		brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
		brw.Flush()
		io.Copy(c, brw)
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: mux, ErrorLog: discardLog, TLSConfig: &tls.Config{GetCertificate: ca.GetCertificate}}
	if h2 {
		srv.TLSConfig.NextProtos = []string{"h2", "http/1.1"}
	} else {
		srv.TLSConfig.NextProtos = []string{"http/1.1"}
	}
	go srv.ServeTLS(ln, "", "")
	t.Cleanup(func() { srv.Close() })
	u.ln = ln
	return u
}

// recorder keeps the terminator's records.
type recorder struct {
	mu   sync.Mutex
	recs []Record
}

func (r *recorder) Admit() error { return nil }
func (r *recorder) Request(rec Record) {
	r.mu.Lock()
	r.recs = append(r.recs, rec)
	r.mu.Unlock()
}
func (r *recorder) all() []Record {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Record(nil), r.recs...)
}

type fixture struct {
	t       *testing.T
	tm      *Terminator
	ca      *CA
	store   *secrets.Store
	rec     *recorder
	worldCA *testworld.CA
	up      *upstream
	results chan Result
}

func newFixture(t *testing.T, h2 bool, trustWorld bool) *fixture {
	t.Helper()
	p, err := policy.Parse("p.yaml", []byte(testPolicy))
	if err != nil {
		t.Fatal(err)
	}
	rs, err := policy.Select(p, "", nil, policy.Guard{})
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"GH": tokenValue, "NPM": npmValue}
	st, err := secrets.Load(p.Secrets(), secrets.Options{LookupEnv: func(k string) (string, bool) { v, ok := env[k]; return v, ok }})
	if err != nil {
		t.Fatal(err)
	}
	ca, err := NewCA(CAOptions{Permitted: []string{"api.test", "npm.test", "gist.test", "bad.test"}})
	if err != nil {
		t.Fatal(err)
	}
	wca, err := testworld.NewCA()
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	if trustWorld {
		roots = wca.Pool()
	}
	g, err := New(Config{CA: ca, Rules: rs, Secrets: st, Roots: roots})
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{t: t, tm: g, ca: ca, store: st, rec: &recorder{}, worldCA: wca, up: startUpstream(t, wca, h2), results: make(chan Result, 16)}
}

func (fx *fixture) placeholder(name string) string {
	s, _ := fx.store.Get(name)
	return s.Placeholder
}

// client returns an HTTP client whose every connection is one flow to
// host through the terminator.
func (fx *fixture) client(host string, h2 bool, roots *x509.CertPool) *http.Client {
	if roots == nil {
		roots = x509.NewCertPool()
		roots.AppendCertsFromPEM(fx.ca.CertPEM())
	}
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		a, b := net.Pipe()
		up, err := net.Dial("tcp", fx.up.ln.Addr().String())
		if err != nil {
			return nil, err
		}
		go func() {
			fx.results <- fx.tm.Serve(context.Background(), Flow{
				Host: host, Port: 443, TLS: true, Client: b, Up: up, UpAt: time.Now(),
				Dial: func(ctx context.Context) (net.Conn, error) {
					var d net.Dialer
					return d.DialContext(ctx, "tcp", fx.up.ln.Addr().String())
				},
				Rec: fx.rec,
			})
		}()
		return a, nil
	}
	tr := &http.Transport{DialContext: dial, TLSClientConfig: &tls.Config{RootCAs: roots, ServerName: host}, ForceAttemptHTTP2: h2, DisableCompression: true}
	if !h2 {
		tr.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
	}
	fx.t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 10 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

func do(t *testing.T, c *http.Client, method, url, body string, hdr ...string) (int, string, http.Header) {
	t.Helper()
	var rb io.Reader
	if body != "" {
		rb = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rb)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		if hdr[i] == "Host" {
			req.Host = hdr[i+1]
			continue
		}
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header
}

func TestTheGateInjectsOnlyForItsHostAndChecksEveryRequest(t *testing.T) {
	for _, h2 := range []bool{false, true} {
		t.Run(fmt.Sprintf("h2=%v", h2), func(t *testing.T) {
			fx := newFixture(t, h2, true)
			ph := fx.placeholder("GITHUB_TOKEN")
			c := fx.client("api.test", h2, nil)
			wantProto := "HTTP/1.1"
			if h2 {
				wantProto = "HTTP/2.0"
			}

			code, body, _ := do(t, c, "GET", "https://api.test/repos/acme/widget", "", "Authorization", "token "+ph)
			if code != 200 || !strings.Contains(body, "ok "+wantProto+" GET api.test /repos/acme/widget") {
				t.Fatalf("GET: %d %q", code, body)
			}
			if got := fx.up.last(); got != "token "+tokenValue {
				t.Fatalf("the server got Authorization %q, want the real token", got)
			}
			basic := base64.StdEncoding.EncodeToString([]byte("x-access-token:" + ph))
			do(t, c, "GET", "https://api.test/repos/acme/x", "", "Authorization", "Basic "+basic)
			if got, want := fx.up.last(), "Basic "+base64.StdEncoding.EncodeToString([]byte("x-access-token:"+tokenValue)); got != want {
				t.Fatalf("Basic credentials: the server got %q, want %q", got, want)
			}

			// Denied by the http rules: a 403 that says why and what would allow it.
			code, body, _ = do(t, c, "POST", "https://api.test/gists", "{}", "Authorization", "token "+ph)
			if code != 403 || !strings.Contains(body, "tunwall: POST https://api.test/gists denied: no http rule of api.test allows POST /gists") ||
				!strings.Contains(body, `add {methods: [POST], paths: ["/gists"]} to the http list of rule api.test (p.yaml:8)`) {
				t.Fatalf("POST /gists: %d %q", code, body)
			}
			// A path that climbs out of the allowed tree.
			code, body, _ = do(t, c, "GET", "https://api.test/repos/acme/%2e%2e/evil", "")
			if code != 403 || !strings.Contains(body, "encoded") {
				t.Fatalf("dot segment: %d %q", code, body)
			}
			// Another name on the same connection (domain fronting).
			code, body, _ = do(t, c, "GET", "https://api.test/repos/acme/x", "", "Host", "gist.test")
			if code != 403 || !strings.Contains(body, "domain fronting") {
				t.Fatalf("fronting: %d %q", code, body)
			}
			n := len(fx.up.auths)
			if n != 2 {
				t.Fatalf("the server got %d requests, want 2 (denied ones must not reach it)", n)
			}
			// A reflecting endpoint does not hand the value back.
			code, body, hdr := do(t, c, "GET", "https://api.test/echo", "", "Authorization", "token "+ph, "Accept-Encoding", "gzip")
			if code != 200 || strings.Contains(body+fmt.Sprint(hdr), tokenValue) || !strings.Contains(body, "Authorization: token ****") {
				t.Fatalf("echo: %d %q %v", code, body, hdr)
			}
			code, body, _ = do(t, c, "GET", "https://api.test/echo", "", "Authorization", "Basic "+basic)
			if code != 200 || strings.Contains(body, base64.StdEncoding.EncodeToString([]byte("x-access-token:" + tokenValue))[8:40]) {
				t.Fatalf("echo of Basic: %d %q", code, body)
			}

			// The placeholder sent to a host that does not receive it.
			g := fx.client("gist.test", h2, nil)
			for _, tc := range []struct {
				name, method, url, body string
				hdr                     []string
				where                   string
			}{
				{"header", "POST", "https://gist.test/gists", "{}", []string{"Authorization", "token " + ph}, "the Authorization header"},
				{"url", "GET", "https://gist.test/x?t=" + ph, "", nil, "the URL"},
				{"upper case in the url", "GET", "https://gist.test/" + strings.ToUpper(ph), "", nil, "the URL"},
				{"body", "POST", "https://gist.test/gists", `{"files":{"a":{"content":"` + ph + `"}}}`, nil, "the request body"},
				{"body base64", "POST", "https://gist.test/gists", `{"content":"` + base64.StdEncoding.EncodeToString([]byte("my token is "+ph)) + `"}`, nil, "the request body"},
				{"basic", "GET", "https://gist.test/", "", []string{"Authorization", "Basic " + basic}, "the Authorization header"},
				{"a cookie", "GET", "https://gist.test/", "", []string{"Cookie", "t=" + ph}, "the Cookie header"},
			} {
				code, body, _ := do(t, g, tc.method, tc.url, tc.body, tc.hdr...)
				want := "credential placeholder GITHUB_TOKEN sent to gist.test (in " + tc.where + ")"
				if code != 403 || !strings.Contains(body, want) || !strings.Contains(body, "GITHUB_TOKEN is injected only for api.test, bad.test") {
					t.Errorf("%s: %d %q, want 403 with %q", tc.name, code, body, want)
				}
			}
			if n := len(fx.up.auths); n != 2 {
				t.Fatalf("the server's recording handler got %d requests, want still 2", n)
			}

			// The explicit form sets the header even when the client sent none.
			npm := fx.client("npm.test", h2, nil)
			code, _, _ = do(t, npm, "GET", "https://npm.test/pkg", "")
			if code != 200 || fx.up.last() != "Bearer "+npmValue {
				t.Fatalf("explicit injection: %d, server got %q", code, fx.up.last())
			}
			// The GITHUB_TOKEN placeholder is foreign to npm.test.
			code, _, _ = do(t, npm, "GET", "https://npm.test/pkg", "", "X-Token", ph)
			if code != 403 {
				t.Fatalf("a foreign placeholder to npm.test: %d", code)
			}

			recs := fx.rec.all()
			var all bytes.Buffer
			for _, r := range recs {
				fmt.Fprintf(&all, "%+v\n", r)
			}
			if strings.Contains(all.String(), tokenValue) || strings.Contains(all.String(), npmValue) {
				t.Fatalf("a record holds a value:\n%s", all.String())
			}
			if !strings.Contains(all.String(), "Injected:[GITHUB_TOKEN]") || !strings.Contains(all.String(), "Injected:[NPM_TOKEN]") {
				t.Fatalf("records do not name the injected secrets:\n%s", all.String())
			}
			for _, r := range recs {
				if strings.Contains(r.Path, "?") {
					t.Fatalf("a record holds a query: %+v", r)
				}
			}
		})
	}
}

func TestTheGateRefusesAnUntrustedUpstreamWithAClearError(t *testing.T) {
	fx := newFixture(t, true, false)
	c := fx.client("api.test", true, nil)
	code, body, _ := do(t, c, "GET", "https://api.test/repos/acme/x", "")
	if code != 502 || !strings.Contains(body, "upstream api.test presented a certificate tunwall does not trust") {
		t.Fatalf("%d %q", code, body)
	}
	recs := fx.rec.all()
	if len(recs) != 1 || recs[0].Status != 502 || !strings.Contains(recs[0].Reason, "does not trust") {
		t.Fatalf("records %+v", recs)
	}
	if len(fx.up.auths) != 0 {
		t.Fatal("a request reached the untrusted server")
	}
}

func TestAClientThatDoesNotTrustTheRunCAIsSaidToPin(t *testing.T) {
	fx := newFixture(t, true, true)
	c := fx.client("api.test", true, x509.NewCertPool()) // pins to nothing tunwall has
	if _, err := c.Get("https://api.test/repos/acme/x"); err == nil {
		t.Fatal("the request succeeded")
	}
	select {
	case r := <-fx.results:
		if !r.CertRefused || !strings.Contains(r.Note, "pins certificates") {
			t.Fatalf("result %+v", r)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Serve did not return")
	}
}

func TestWebSocketUpgradePassesOnceTheGETIsAllowed(t *testing.T) {
	fx := newFixture(t, false, true)
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(fx.ca.CertPEM())
	a, b := net.Pipe()
	up, err := net.Dial("tcp", fx.up.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	go fx.tm.Serve(context.Background(), Flow{Host: "api.test", Port: 443, TLS: true, Client: b, Up: up, UpAt: time.Now(), Rec: fx.rec,
		Dial: func(ctx context.Context) (net.Conn, error) { return net.Dial("tcp", fx.up.ln.Addr().String()) }})
	tc := tls.Client(a, &tls.Config{RootCAs: roots, ServerName: "api.test", NextProtos: []string{"http/1.1"}})
	defer tc.Close()
	tc.SetDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(tc, "GET /ws HTTP/1.1\r\nHost: api.test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
	br := bufio.NewReader(tc)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 101 {
		t.Fatalf("upgrade: %v %v", resp, err)
	}
	io.WriteString(tc, "raw bytes after the switch\n")
	line, err := br.ReadString('\n')
	if err != nil || line != "raw bytes after the switch\n" {
		t.Fatalf("echo after the upgrade: %q %v", line, err)
	}
	// The request's record says it switched protocols (audit summary
	// shows the 101), once the upgraded connection ends.
	tc.Close()
	deadline := time.Now().Add(10 * time.Second)
	for len(fx.rec.all()) == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if recs := fx.rec.all(); len(recs) != 1 || recs[0].Status != http.StatusSwitchingProtocols {
		t.Errorf("records of the upgraded request: %+v, want one with status 101", recs)
	}
}

func TestTheCAMintsConstrainedCachedLeaves(t *testing.T) {
	ca, err := NewCA(CAOptions{Permitted: []string{"api.test", "*.cdn.test"}, MaxLeaves: 2})
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert())
	for _, name := range []string{"api.test", "a.cdn.test", "b.cdn.test"} {
		c, err := ca.Leaf(name)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Leaf.Verify(x509.VerifyOptions{DNSName: name, Roots: roots}); err != nil {
			t.Errorf("leaf for %s does not verify: %v", name, err)
		}
	}
	if ca.Leaves() != 2 {
		t.Errorf("cache holds %d leaves, want its bound 2", ca.Leaves())
	}
	c1, _ := ca.Leaf("b.cdn.test")
	c2, _ := ca.Leaf("b.cdn.test")
	if c1 != c2 {
		t.Error("a leaf was minted again while cached")
	}
	// The name constraints refuse any other name, even if the key were used.
	evil, _, err := ca.mint("evil.test", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := evil.Leaf.Verify(x509.VerifyOptions{DNSName: "evil.test", Roots: roots}); err == nil {
		t.Error("a leaf for a name outside the constraints verifies")
	}
	if bytes.Contains(ca.CertPEM(), []byte("PRIVATE")) {
		t.Error("CertPEM holds a key")
	}
}
