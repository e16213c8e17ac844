package l7

import (
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

const placePolicy = `version: 1
secrets:
  GITHUB_TOKEN: {env: GH}
  API_KEY: {env: KEY}
phases:
  exec:
    allow:
      - host: api.test
        ports: [80, 443]
        inject: [GITHUB_TOKEN, {secret: API_KEY, header: X-Api-Key}]
`

// placeFixture is a terminator for api.test (plain and explicit form, ports 80
// and 443) in front of one server that keeps every request's headers.
type placeFixture struct {
	tm      *Terminator
	store   *secrets.Store
	rec     *recorder
	tlsAddr string
	plain   string
	mu      sync.Mutex
	got     []http.Header
}

func newPlaceFixture(t *testing.T) *placeFixture {
	t.Helper()
	p, err := policy.Parse("p.yaml", []byte(placePolicy))
	if err != nil {
		t.Fatal(err)
	}
	rs, err := policy.Select(p, "", nil, policy.Guard{})
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"GH": tokenValue, "KEY": npmValue}
	st, err := secrets.Load(p.Secrets(), secrets.Options{LookupEnv: func(k string) (string, bool) { v, ok := env[k]; return v, ok }})
	if err != nil {
		t.Fatal(err)
	}
	ca, err := NewCA(CAOptions{Permitted: []string{"api.test"}})
	if err != nil {
		t.Fatal(err)
	}
	wca, err := testworld.NewCA()
	if err != nil {
		t.Fatal(err)
	}
	g, err := New(Config{CA: ca, Rules: rs, Secrets: st, Roots: wca.Pool()})
	if err != nil {
		t.Fatal(err)
	}
	fx := &placeFixture{tm: g, store: st, rec: &recorder{}}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fx.mu.Lock()
		fx.got = append(fx.got, r.Header.Clone())
		fx.mu.Unlock()
		io.Copy(io.Discard, r.Body)
		fmt.Fprintln(w, "ok")
	})
	for _, tlsOn := range []bool{true, false} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		srv := &http.Server{Handler: h, ErrorLog: discardLog}
		if tlsOn {
			srv.TLSConfig = &tls.Config{GetCertificate: wca.GetCertificate}
			go srv.ServeTLS(ln, "", "")
			fx.tlsAddr = ln.Addr().String()
		} else {
			go srv.Serve(ln)
			fx.plain = ln.Addr().String()
		}
		t.Cleanup(func() { srv.Close() })
	}
	return fx
}

// client returns a client whose every connection is one flow to api.test,
// over TLS (port 443) or plain HTTP (port 80).
func (fx *placeFixture) client(t *testing.T, tlsOn bool) *http.Client {
	addr, port := fx.tlsAddr, uint16(443)
	if !tlsOn {
		addr, port = fx.plain, 80
	}
	dial := func(ctx context.Context, network, _ string) (net.Conn, error) {
		a, b := net.Pipe()
		up, err := net.Dial("tcp", addr)
		if err != nil {
			return nil, err
		}
		go fx.tm.Serve(context.Background(), Flow{
			Host: "api.test", Port: port, TLS: tlsOn, Client: b, Up: up, UpAt: time.Now(),
			Dial: func(ctx context.Context) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, "tcp", addr)
			},
			Rec: fx.rec,
		})
		return a, nil
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(fx.tm.cfg.CA.CertPEM())
	tr := &http.Transport{DialContext: dial, DisableCompression: true}
	tr.TLSClientConfig = &tls.Config{RootCAs: roots, ServerName: "api.test"}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

func (fx *placeFixture) placeholder(name string) string {
	s, _ := fx.store.Get(name)
	return s.Placeholder
}

func (fx *placeFixture) requests() []http.Header {
	fx.mu.Lock()
	defer fx.mu.Unlock()
	return append([]http.Header(nil), fx.got...)
}

func TestASecretGoesOnlyIntoTheHeadersItsRuleNames(t *testing.T) {
	fx := newPlaceFixture(t)
	c := fx.client(t, true)
	gh, key := fx.placeholder("GITHUB_TOKEN"), fx.placeholder("API_KEY")
	basic := "Basic " + base64.StdEncoding.EncodeToString([]byte("x-access-token:"+gh))

	// The places the rules cover.
	for _, tc := range []struct {
		name   string
		hdr    []string
		header string
		want   string
	}{
		{"Bearer", []string{"Authorization", "Bearer " + gh}, "Authorization", "Bearer " + tokenValue},
		{"Basic", []string{"Authorization", basic}, "Authorization", "Basic " + base64.StdEncoding.EncodeToString([]byte("x-access-token:"+tokenValue))},
		{"the explicit form's header, sent with the placeholder", []string{"X-Api-Key", key}, "X-Api-Key", npmValue},
		{"the explicit form's header, not sent", nil, "X-Api-Key", npmValue},
	} {
		code, body, _ := do(t, c, "GET", "https://api.test/x", "", tc.hdr...)
		reqs := fx.requests()
		if code != 200 || len(reqs) == 0 || reqs[len(reqs)-1].Get(tc.header) != tc.want {
			t.Errorf("%s: %d %q; the server's %s is not the value", tc.name, code, body, tc.header)
		}
	}
	before := len(fx.requests())

	// Anywhere else: refused, and the server sees nothing.
	for _, tc := range []struct {
		name, url, body string
		hdr             []string
		where           string
	}{
		{"User-Agent", "https://api.test/x", "", []string{"User-Agent", "tool (" + gh + ")"}, "the User-Agent header"},
		{"Referer", "https://api.test/x", "", []string{"Referer", "https://x.test/?t=" + gh}, "the Referer header"},
		{"an X- header", "https://api.test/x", "", []string{"X-Anything", gh}, "the X-Anything header"},
		{"Basic in another header", "https://api.test/x", "", []string{"X-Auth", basic}, "the X-Auth header"},
		{"a Cookie", "https://api.test/x", "", []string{"Cookie", "s=" + gh}, "the Cookie header"},
		{"a header name", "https://api.test/x", "", []string{"X-" + gh, "1"}, "a header name"},
		{"the URL", "https://api.test/x?t=" + gh, "", nil, "the URL"},
		{"the body", "https://api.test/x", `{"t":"` + gh + `"}`, nil, "the request body"},
		{"the explicit secret in Authorization", "https://api.test/x", "", []string{"Authorization", "Bearer " + key}, "the Authorization header"},
		{"the plain secret in the explicit header", "https://api.test/x", "", []string{"X-Api-Key", gh}, "the X-Api-Key header"},
	} {
		method := "GET"
		if tc.body != "" {
			method = "POST"
		}
		code, body, _ := do(t, c, method, tc.url, tc.body, tc.hdr...)
		if code != 403 || !strings.Contains(body, " in "+tc.where+" of a request to api.test, where its rule does not inject it") {
			t.Errorf("%s: %d %q, want 403 naming %s", tc.name, code, body, tc.where)
		}
	}
	if n := len(fx.requests()); n != before {
		t.Errorf("the server got %d refused requests", n-before)
	}
	// A placeholder of an earlier run.
	old := "twp_GITHUB_TOKEN_" + strings.Repeat("ab", 16)
	code, body, _ := do(t, c, "GET", "https://api.test/x", "", "Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte("x:"+old)))
	if code != 403 || !strings.Contains(body, "credential placeholder of GITHUB_TOKEN from an earlier run, sent to api.test (in the Authorization header)") ||
		!strings.Contains(body, "this run's placeholder of GITHUB_TOKEN is in $GITHUB_TOKEN") {
		t.Errorf("an earlier run's placeholder: %d %q", code, body)
	}
	for _, r := range fx.rec.all() {
		if !r.Allowed && r.Rule != "credential-placeholder" {
			t.Errorf("refusal recorded as %q: %+v", r.Rule, r)
		}
	}
}

func TestASecretNeverGoesOverPlainHTTP(t *testing.T) {
	fx := newPlaceFixture(t)
	c := fx.client(t, false)
	gh := fx.placeholder("GITHUB_TOKEN")
	for _, hdr := range [][]string{
		{"Authorization", "Bearer " + gh},
		{"Authorization", "Basic " + base64.StdEncoding.EncodeToString([]byte("x:"+gh))},
		{"X-Api-Key", fx.placeholder("API_KEY")},
	} {
		code, body, _ := do(t, c, "GET", "http://api.test/x", "", hdr...)
		if code != 403 || !strings.Contains(body, "in a plain HTTP request to api.test (in the "+hdr[0]+" header): tunwall injects secrets only over TLS it verified") {
			t.Errorf("%s over plain HTTP: %d %q", hdr[0], code, body)
		}
	}
	if n := len(fx.requests()); n != 0 {
		t.Fatalf("the server got %d requests carrying a placeholder over plain HTTP", n)
	}
	// Without a placeholder: sent on, and the explicit form sets nothing.
	code, _, _ := do(t, c, "GET", "http://api.test/y", "")
	reqs := fx.requests()
	if code != 200 || len(reqs) != 1 || reqs[0].Get("X-Api-Key") != "" || reqs[0].Get("Authorization") != "" {
		t.Fatalf("a plain request without a placeholder: %d, server got %v", code, reqs)
	}
	var noted bool
	for _, r := range fx.rec.all() {
		if r.Path == "/y" && len(r.Injected) == 0 && strings.Contains(r.Reason, "API_KEY not injected: plain HTTP") {
			noted = true
		}
	}
	if !noted {
		t.Errorf("the record does not say API_KEY was not injected: %+v", fx.rec.all())
	}
}
