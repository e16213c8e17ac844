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
	"net/http/httptrace"
	"net/textproto"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tunwall/tunwall/internal/secrets"
	"github.com/tunwall/tunwall/internal/testworld"
	"github.com/tunwall/tunwall/policy"
)

const reflectPolicy = `version: 1
secrets:
  GITHUB_TOKEN: {env: GH}
phases:
  exec:
    allow:
      - host: api.test
        inject: [GITHUB_TOKEN]
        http: [{methods: [GET, POST], paths: ["/**"]}]
`

// reflectUpstream hands the request's Authorization back in the place the
// path names; hits counts the requests it got.
func reflectUpstream(t *testing.T, ca *testworld.CA, h2 bool, hits *atomic.Int64) net.Listener {
	t.Helper()
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		auth := r.Header.Get("Authorization")
		_, cred, _ := strings.Cut(auth, " ")
		cred = strings.TrimRight(cred, "=") // a name cannot hold base64's padding
		flush := func() { http.NewResponseController(w).Flush() }
		switch r.URL.Path {
		case "/header":
			w.Header().Set("X-Echo", auth)
		case "/header-name":
			w.Header().Set("X-"+cred, "reflected")
		case "/early-hints":
			w.Header().Set("Link", "</s.css?t="+cred+">; rel=preload")
			w.Header().Set("X-Hint", auth)
			w.WriteHeader(http.StatusEarlyHints)
			clear(w.Header())
		case "/continue":
			// A 100 Continue of the server's own, carrying it.
			w.Header().Set("X-Continue", auth)
			w.WriteHeader(http.StatusContinue)
			clear(w.Header())
			io.Copy(io.Discard, r.Body)
		case "/trailer":
			w.Header().Set("Trailer", "X-Echo-Trailer, X-"+cred)
			io.WriteString(w, "body\n")
			flush()
			w.Header().Set("X-Echo-Trailer", auth)
			w.Header().Set("X-"+cred, "in a declared trailer's name")
		case "/undeclared":
			io.WriteString(w, "body\n")
			flush()
			w.Header().Set(http.TrailerPrefix+"X-Undeclared", auth)
			w.Header().Set(http.TrailerPrefix+"X-"+cred, "in an undeclared trailer's name")
		case "/body-split":
			// The value in pieces, each flushed on its own.
			io.WriteString(w, "before ")
			for i := 0; i < len(auth); i += 3 {
				io.WriteString(w, auth[i:min(i+3, len(auth))])
				flush()
			}
			io.WriteString(w, " after\n")
		case "/events":
			// Server-sent events: the next one only once the client has
			// read the first.
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, "data: one\n\n")
			flush()
			select {
			case <-eventRead:
			case <-time.After(10 * time.Second):
			}
			io.WriteString(w, "data: two "+auth+"\n\n")
			return
		case "/malformed", "/upgrade":
			if r.URL.Path == "/upgrade" && !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
				http.Error(w, "upgrade wanted", http.StatusUpgradeRequired)
				return
			}
			c, brw, err := http.NewResponseController(w).Hijack()
			if err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			defer c.Close()
			if r.URL.Path == "/malformed" {
				fmt.Fprintf(brw, "HTTP/1.1 200 OK\r\n%s\r\n\r\n", cred)
			} else {
				fmt.Fprintf(brw, "HTTP/1.1 101 %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nX-Echo: %s\r\n\r\nafter: %s\n", cred, auth, auth)
			}
			brw.Flush()
			return
		}
		io.WriteString(w, "final\n")
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h, ErrorLog: discardLog, TLSConfig: &tls.Config{GetCertificate: ca.GetCertificate, NextProtos: []string{"http/1.1"}}}
	if h2 {
		srv.TLSConfig.NextProtos = []string{"h2", "http/1.1"}
	}
	go srv.ServeTLS(ln, "", "")
	t.Cleanup(func() { srv.Close() })
	return ln
}

// eventRead tells reflectUpstream's /events that the client read the
// first event.
var eventRead = make(chan struct{}, 1)

func newReflectFixture(t *testing.T, upH2 bool, hits *atomic.Int64) *fixture {
	t.Helper()
	p, err := policy.Parse("p.yaml", []byte(reflectPolicy))
	if err != nil {
		t.Fatal(err)
	}
	rs, err := policy.Select(p, "", nil, policy.Guard{})
	if err != nil {
		t.Fatal(err)
	}
	st, err := secrets.Load(p.Secrets(), secrets.Options{LookupEnv: func(string) (string, bool) { return tokenValue, true }})
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
	ln := reflectUpstream(t, wca, upH2, hits)
	return &fixture{t: t, tm: g, ca: ca, store: st, rec: &recorder{}, worldCA: wca, up: &upstream{ln: ln}, results: make(chan Result, 16)}
}

// received is everything a response handed the client: the status and
// headers of each 1xx, the status, headers, body and trailers of the
// answer, one "name: value" a line.
func received(t *testing.T, c *http.Client, method, url, body string, hdr ...string) (int, string) {
	t.Helper()
	var mu sync.Mutex
	var out strings.Builder
	dump := func(h http.Header) {
		keys := make([]string, 0, len(h))
		for k := range h {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			fmt.Fprintf(&out, "%s: %s\n", k, strings.Join(h[k], ", "))
		}
	}
	ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{
		Got1xxResponse: func(code int, h textproto.MIMEHeader) error {
			mu.Lock()
			defer mu.Unlock()
			fmt.Fprintf(&out, "== %d\n", code)
			dump(http.Header(h))
			return nil
		},
	})
	var rb io.Reader
	if body != "" {
		rb = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rb)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: body: %v", method, url, err)
	}
	mu.Lock()
	defer mu.Unlock()
	fmt.Fprintf(&out, "== %s\n", resp.Status)
	dump(resp.Header)
	fmt.Fprintf(&out, "== body\n%s== trailer\n", b)
	dump(resp.Trailer)
	return resp.StatusCode, out.String()
}

// TestAResponseHandsTheValueBackInNoPlace: a server that reflects the
// injected value in a header's value or name, a 103 or 100, a declared or
// undeclared trailer (value or name), a body written in pieces, or a
// malformed response the transport quotes, over HTTP/1.1 and HTTP/2 on
// each side, gets the client the value in none of them (compared without
// regard to case), each place masked with '*', and each record says so.
func TestAResponseHandsTheValueBackInNoPlace(t *testing.T) {
	stars := strings.Repeat("*", len(tokenValue))
	basic := "x-access-token:"
	cases := []struct {
		path   string
		want   []string // in what the client got, lower case
		upH1   bool     // only an HTTP/1.1 server can send it
		status int
	}{
		{path: "/header", want: []string{"x-echo: token " + stars}},
		{path: "/header-name", want: []string{"x-" + stars + ": reflected"}},
		{path: "/early-hints", want: []string{"== 103\n", "x-hint: token " + stars, "link: </s.css?t=" + stars + ">"}},
		{path: "/continue", want: []string{"== 100\n", "x-continue: token " + stars}},
		{path: "/trailer", want: []string{"== trailer\n", "x-echo-trailer: token " + stars, "x-" + stars + ": in a declared trailer's name"}},
		{path: "/undeclared", want: []string{"== trailer\n", "x-undeclared: token " + stars, "x-" + stars + ": in an undeclared trailer's name"}},
		{path: "/body-split", want: []string{"before token " + stars + " after\n"}},
		{path: "/malformed", want: []string{"malformed mime header: missing colon: \"" + stars}, upH1: true, status: 502},
	}
	for _, upH2 := range []bool{false, true} {
		for _, h2 := range []bool{false, true} {
			t.Run(fmt.Sprintf("client-h2=%v/server-h2=%v", h2, upH2), func(t *testing.T) {
				var hits atomic.Int64
				fx := newReflectFixture(t, upH2, &hits)
				ph := fx.placeholder("GITHUB_TOKEN")
				c := fx.client("api.test", h2, nil)
				for _, tc := range cases {
					if tc.upH1 && upH2 {
						continue
					}
					for _, auth := range []string{"token " + ph, "Basic " + base64.StdEncoding.EncodeToString([]byte(basic+ph))} {
						method, body, hdr := "GET", "", []string{"Authorization", auth}
						if tc.path == "/continue" {
							method, body = "POST", "a body"
						}
						code, got := received(t, c, method, "https://api.test"+tc.path, body, hdr...)
						lower := strings.ToLower(got)
						if strings.Contains(lower, strings.ToLower(tokenValue)) {
							t.Errorf("%s (%s): the value reached the client:\n%s", tc.path, auth[:5], got)
						}
						b64 := base64.StdEncoding.EncodeToString([]byte(basic + tokenValue))
						if strings.Contains(lower, strings.ToLower(b64[20:len(b64)-4])) {
							t.Errorf("%s (%s): the value's base64 reached the client:\n%s", tc.path, auth[:5], got)
						}
						if want := max(tc.status, 200); code != want {
							t.Errorf("%s: status %d, want %d\n%s", tc.path, code, want, got)
						}
						if !strings.HasPrefix(auth, "token ") {
							if !strings.Contains(got, "********") {
								t.Errorf("%s (Basic): nothing masked:\n%s", tc.path, got)
							}
							continue
						}
						for _, w := range tc.want {
							if !strings.Contains(lower, w) {
								t.Errorf("%s: %q is not in what the client got:\n%s", tc.path, w, got)
							}
						}
					}
				}
				recs := fx.rec.all()
				var masked int
				for _, r := range recs {
					if strings.Contains(r.Reason, tokenValue) {
						t.Errorf("a record holds the value: %+v", r)
					}
					if strings.Contains(r.Reason, "the response carried the value of GITHUB_TOKEN, masked before the client got it") {
						masked++
					}
				}
				if masked != len(recs) || len(recs) == 0 {
					for _, r := range recs {
						t.Logf("%s %d %s", r.Path, r.Status, r.Reason)
					}
					t.Errorf("%d of %d records say the value was masked", masked, len(recs))
				}
			})
		}
	}
}

// TestAnUpgradeOfARequestThatReceivedASecretIsRefused: what follows a 101
// cannot be masked, so such an upgrade is refused before it is sent (403,
// recorded, the server never asked); without a secret it passes.
func TestAnUpgradeOfARequestThatReceivedASecretIsRefused(t *testing.T) {
	var hits atomic.Int64
	fx := newReflectFixture(t, false, &hits)
	ph := fx.placeholder("GITHUB_TOKEN")
	upgrade := func(auth string) string {
		a, b := net.Pipe()
		up, err := net.Dial("tcp", fx.up.ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		go fx.tm.Serve(context.Background(), Flow{Host: "api.test", Port: 443, TLS: true, Client: b, Up: up, UpAt: time.Now(), Rec: fx.rec,
			Dial: func(ctx context.Context) (net.Conn, error) { return net.Dial("tcp", fx.up.ln.Addr().String()) }})
		roots := x509.NewCertPool()
		roots.AppendCertsFromPEM(fx.ca.CertPEM())
		tc := tls.Client(a, &tls.Config{RootCAs: roots, ServerName: "api.test", NextProtos: []string{"http/1.1"}})
		defer tc.Close()
		tc.SetDeadline(time.Now().Add(10 * time.Second))
		req := "GET /upgrade HTTP/1.1\r\nHost: api.test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
		if auth != "" {
			req += "Authorization: " + auth + "\r\n"
		}
		io.WriteString(tc, req+"\r\n")
		b2, _ := io.ReadAll(bufio.NewReader(tc)) // the server closes after its answer
		return string(b2)
	}
	got := upgrade("token " + ph)
	if !strings.HasPrefix(got, "HTTP/1.1 403 ") || !strings.Contains(got, "websocket upgrade of a request that receives GITHUB_TOKEN is not relayed") || strings.Contains(got, "after:") {
		t.Fatalf("the upgrade with a secret was not refused:\n%s", got)
	}
	if n := hits.Load(); n != 0 {
		t.Fatalf("the server got %d requests, want none", n)
	}
	recs := fx.rec.all()
	if len(recs) != 1 || recs[0].Allowed || recs[0].Rule != "credential-upgrade" || recs[0].Status != 403 || len(recs[0].Injected) != 0 {
		t.Fatalf("records %+v", recs)
	}
	got = upgrade("")
	if !strings.HasPrefix(got, "HTTP/1.1 101 ") || !strings.Contains(got, "after: \n") {
		t.Fatalf("the upgrade without a secret did not pass:\n%s", got)
	}
}

// TestAStreamedResponseIsNotHeldBack: an event the server flushed
// reaches the client before the server sends more, though the response is
// masked (only bytes that may begin the value wait), and the value in the
// next event is masked.
func TestAStreamedResponseIsNotHeldBack(t *testing.T) {
	for _, h2 := range []bool{false, true} {
		t.Run(fmt.Sprintf("h2=%v", h2), func(t *testing.T) {
			var hits atomic.Int64
			fx := newReflectFixture(t, h2, &hits)
			c := fx.client("api.test", h2, nil)
			req, _ := http.NewRequest("GET", "https://api.test/events", nil)
			req.Header.Set("Authorization", "token "+fx.placeholder("GITHUB_TOKEN"))
			resp, err := c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			br := bufio.NewReader(resp.Body)
			first := make(chan string, 1)
			go func() {
				l, _ := br.ReadString('\n')
				first <- l
			}()
			select {
			case l := <-first:
				if l != "data: one\n" {
					t.Fatalf("first event %q", l)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the first event was held back")
			}
			eventRead <- struct{}{}
			rest, _ := io.ReadAll(br)
			if want := "\ndata: two token " + strings.Repeat("*", len(tokenValue)) + "\n\n"; string(rest) != want {
				t.Fatalf("the rest: %q, want %q", rest, want)
			}
		})
	}
}

// TestMaskStreamHoldsBackTheSameWhateverTheBytes: what is held back is
// the last max-1 bytes, whatever they are: a tail that begins the value
// and one that does not are held alike (else a sandbox streaming guesses
// through an echo would learn which begin it); flushTail lets them go, and
// a value completed in the next bytes is still masked.
func TestMaskStreamHoldsBackTheSameWhateverTheBytes(t *testing.T) {
	m := testMasker(tokenValue)
	for n := 1; n <= len(tokenValue)+8; n++ {
		var outs [2]bytes.Buffer
		for i, tail := range []string{tokenValue[:min(n, len(tokenValue))], strings.Repeat("z", min(n, len(tokenValue)))} {
			s := &maskStream{w: &outs[i], m: m}
			io.WriteString(s, "data: {\"n\": 1}\n\n"+tail)
		}
		if outs[0].Len() != outs[1].Len() {
			t.Fatalf("%d bytes of the value: %d bytes went on, against %d for as many other bytes", n, outs[0].Len(), outs[1].Len())
		}
	}
	var out bytes.Buffer
	s := &maskStream{w: &out, m: m}
	io.WriteString(s, "data: {\"n\": 1}\n\n")
	if out.Len() != max(0, len("data: {\"n\": 1}\n\n")-(m.max-1)) {
		t.Fatalf("went on: %q", out.String())
	}
	s.flushTail()
	if out.String() != "data: {\"n\": 1}\n\n" {
		t.Fatalf("flushTail left %q", out.String())
	}
	io.WriteString(s, "token "+tokenValue[:10])
	io.WriteString(s, tokenValue[10:]+"\n")
	s.Close()
	if want := "data: {\"n\": 1}\n\ntoken " + strings.Repeat("*", len(tokenValue)) + "\n"; out.String() != want {
		t.Fatalf("%q, want %q", out.String(), want)
	}
}

// testMasker masks value (and its base64 forms) as "T".
func testMasker(value string) *masker {
	m := &masker{}
	m.addValue([]byte(value), "T")
	return m
}

// maskAll masks in through a maskStream, fed by a reader that returns the
// sizes in turn (cycling), and returns what came out.
func maskAll(t testing.TB, m *masker, in []byte, sizes []int) []byte {
	var out bytes.Buffer
	var found []string
	s := &maskStream{w: &out, m: m, onMask: func(n string) { found = append(found, n) }}
	r := &sizedReader{b: in, sizes: sizes}
	if _, err := io.CopyBuffer(s, r, make([]byte, 64<<10)); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	return out.Bytes()
}

// sizedReader returns sizes[i % len] bytes at its i-th Read.
type sizedReader struct {
	b     []byte
	sizes []int
	i     int
}

func (r *sizedReader) Read(p []byte) (int, error) {
	if len(r.b) == 0 {
		return 0, io.EOF
	}
	k := min(len(p), max(r.sizes[r.i%len(r.sizes)], 1), len(r.b))
	r.i++
	copy(p, r.b[:k])
	r.b = r.b[k:]
	return k, nil
}

// encodings are the forms of a value a response is searched for: as is,
// and base64 (standard and URL) at each alignment a (a bytes before it).
func encodings(value string, prefix string) map[string]string {
	out := map[string]string{"raw": prefix + value}
	for _, enc := range []struct {
		name string
		e    *base64.Encoding
	}{{"std", base64.StdEncoding}, {"url", base64.URLEncoding}} {
		for a := 0; a < 3; a++ {
			out[fmt.Sprintf("%s/%d", enc.name, a)] = enc.e.EncodeToString([]byte(strings.Repeat("u", a) + value + ":x"))
		}
	}
	return out
}

// checkMasked fails unless out is in with only bytes turned to '*', and
// neither the value nor any pattern of m survives in it.
func checkMasked(t testing.TB, m *masker, value string, in, out []byte, what string) {
	t.Helper()
	if len(out) != len(in) {
		t.Fatalf("%s: %d bytes out of %d", what, len(out), len(in))
	}
	for i := range in {
		if out[i] != in[i] && out[i] != '*' {
			t.Fatalf("%s: byte %d changed to %q", what, i, out[i])
		}
	}
	if bytes.Contains(out, []byte(value)) {
		t.Fatalf("%s: the value survived: %q", what, out)
	}
	for _, p := range m.pats {
		if bytes.Contains(out, p.b) {
			t.Fatalf("%s: pattern %q survived: %q", what, p.b, out)
		}
	}
}

// TestMaskStreamFindsAValueSplitAtEveryReadBoundary: the value, as is and
// base64 (standard and URL, each alignment), in a body cut at every byte
// of it, and read a byte at a time, is masked, and nothing else changes.
func TestMaskStreamFindsAValueSplitAtEveryReadBoundary(t *testing.T) {
	m := testMasker(tokenValue)
	for name, enc := range encodings(tokenValue, "token ") {
		in := []byte("a line before\n" + enc + "\nafter")
		b64 := name != "raw"
		for cut := 0; cut <= len(in); cut++ {
			for _, sizes := range [][]int{{cut, len(in)}, {cut, 1}} {
				if cut == 0 {
					sizes = []int{1}
				}
				out := maskAll(t, m, in, sizes)
				what := fmt.Sprintf("%s cut at %d (reads %v)", name, cut, sizes)
				checkMasked(t, m, tokenValue, in, out, what)
				if n := bytes.Count(out, []byte("*")); n < len(tokenValue) && !b64 || b64 && n < 4*len(tokenValue)/3-12 {
					t.Fatalf("%s: only %d bytes masked: %q", what, n, out)
				}
				if !bytes.Equal(out, maskAll(t, m, in, []int{len(in)})) {
					t.Fatalf("%s: masked otherwise than in one piece", what)
				}
			}
		}
	}
}

// TestMaskStreamMasksAcrossItsChunks: values past the stream's 32 KiB
// chunk, and across it, in reads of any size.
func TestMaskStreamMasksAcrossItsChunks(t *testing.T) {
	m := testMasker(tokenValue)
	b64 := base64.StdEncoding.EncodeToString([]byte("u:" + tokenValue))
	in := []byte(strings.Repeat("x", maskChunk-20) + tokenValue + strings.Repeat("y", 33000) + b64 + "z")
	for _, size := range []int{1, 7, 4096, maskChunk, 1 << 20} {
		out := maskAll(t, m, in, []int{size})
		checkMasked(t, m, tokenValue, in, out, fmt.Sprintf("reads of %d", size))
		if bytes.Contains(out, []byte(b64[4:40])) {
			t.Fatalf("reads of %d: the base64 survived", size)
		}
	}
}

// TestMaskingFindsOverlappingValues: two secrets that overlap in the text
// are both masked whole (masking one first must not hide the other).
func TestMaskingFindsOverlappingValues(t *testing.T) {
	m := &masker{}
	m.addValue([]byte("abcdefghij0123"), "A")
	m.addValue([]byte("0123klmnopqrst"), "B")
	in := []byte("..abcdefghij0123klmnopqrst..")
	out := maskAll(t, m, in, []int{3})
	if string(out) != ".."+strings.Repeat("*", 24)+".." {
		t.Fatalf("%q", out)
	}
}

// TestMaskHeaderMasksNamesAndValuesInAnyCase: Go's canonical form changes
// the case of a name; a value in a name or value is masked whatever its
// case, the name replaced by its masked form.
func TestMaskHeaderMasksNamesAndValuesInAnyCase(t *testing.T) {
	m := testMasker(tokenValue)
	h := http.Header{}
	h.Set("X-"+tokenValue, "1")
	h.Set("Trailer", "X-"+tokenValue+", X-Other")
	h.Set("X-Upper", strings.ToUpper(tokenValue))
	h.Set("X-Fine", "nothing")
	var notes []string
	m.maskHeader(h, func(n string) { notes = append(notes, n) })
	stars := strings.Repeat("*", len(tokenValue))
	want := http.Header{"X-" + stars: {"1"}, "Trailer": {"X-" + stars + ", X-Other"}, "X-Upper": {stars}, "X-Fine": {"nothing"}}
	if fmt.Sprint(h) != fmt.Sprint(want) || len(notes) != 3 {
		t.Fatalf("got %v (notes %v), want %v", h, notes, want)
	}
}

// FuzzMaskStream: the value (long enough to be a credential), as is or
// base64 at any alignment, anywhere in any bytes, read in any pieces, is
// masked, nothing but masked bytes change, and the pieces do not matter.
func FuzzMaskStream(f *testing.F) {
	f.Add([]byte("prefix "), tokenValue, []byte(" suffix"), uint8(0), []byte{1, 2, 3})
	f.Add([]byte{}, "0123456789abcdef", []byte{}, uint8(3), []byte{7})
	f.Add([]byte("token token "), "aaaaaaaaaaaaaaaa", []byte("aaaa"), uint8(5), []byte{0, 255, 1})
	f.Add(bytes.Repeat([]byte("x"), 3000), tokenValue, bytes.Repeat([]byte("y"), 1000), uint8(2), []byte{200, 13})
	f.Fuzz(func(t *testing.T, pre []byte, value string, post []byte, form uint8, sizes []byte) {
		if strings.Contains(value, "*") || len(value) < 12 || len(value) > 256 || len(sizes) == 0 || len(pre)+len(post) > 8<<10 {
			return
		}
		var enc string
		switch f := form % 7; f {
		case 0:
			enc = value
		default:
			e := base64.StdEncoding
			if f > 3 {
				e = base64.URLEncoding
			}
			a := int(f-1) % 3
			enc = e.EncodeToString(append([]byte(strings.Repeat("u", a)), value...))
		}
		in := append(append(append([]byte{}, pre...), enc...), post...)
		sz := make([]int, len(sizes))
		for i, s := range sizes {
			sz[i] = int(s)
		}
		m := testMasker(value)
		out := maskAll(t, m, in, sz)
		checkMasked(t, m, value, in, out, "stream")
		whole := append([]byte{}, in...)
		m.mask(whole)
		if !bytes.Equal(out, whole) {
			t.Fatalf("masked in pieces %v otherwise than whole", sz)
		}
	})
}

// BenchmarkMaskStream is the cost of masking a response body that does
// not carry the value (one secret, 32 KiB writes, as the proxy makes).
func BenchmarkMaskStream(b *testing.B) {
	m := testMasker(tokenValue)
	chunk := bytes.Repeat([]byte("0123456789abcdef ghp_ x-access-token "), 32<<10/37)
	s := &maskStream{w: io.Discard, m: m}
	b.SetBytes(int64(len(chunk)))
	b.ResetTimer()
	for range b.N {
		if _, err := s.Write(chunk); err != nil {
			b.Fatal(err)
		}
	}
}

func TestLowerIntoLowersOnlyASCIILettersAtEveryPosition(t *testing.T) {
	src := make([]byte, 256+13)
	for i := range src {
		src[i] = byte(i * 7)
	}
	for off := 0; off < 9; off++ {
		in := src[off:]
		got := make([]byte, len(in))
		lowerInto(got, in)
		for i, c := range in {
			want := c
			if 'A' <= c && c <= 'Z' {
				want = c + 'a' - 'A'
			}
			if got[i] != want {
				t.Fatalf("offset %d: byte %#x became %#x, want %#x", off, c, got[i], want)
			}
		}
	}
}

func TestMaskStreamMasksTheValueInAnyLetterCaseAtEveryBoundary(t *testing.T) {
	m := testMasker(tokenValue)
	for _, v := range []string{strings.ToLower(tokenValue), strings.ToUpper(tokenValue)} {
		in := "reflect: " + v + "\n"
		for cut := 0; cut <= len(in); cut++ {
			var out bytes.Buffer
			s := &maskStream{w: &out, m: m}
			io.WriteString(s, in[:cut])
			io.WriteString(s, in[cut:])
			s.Close()
			if want := "reflect: " + strings.Repeat("*", len(v)) + "\n"; out.String() != want {
				t.Fatalf("cut at %d: %q, want %q", cut, out.String(), want)
			}
		}
	}
}

func TestEncodedIsAnyContentCodingButIdentity(t *testing.T) {
	for _, c := range []struct {
		vals []string
		want bool
	}{
		{nil, false},
		{[]string{"identity"}, false},
		{[]string{"Identity, "}, false},
		{[]string{"gzip"}, true},
		{[]string{"identity", "br"}, true},
		{[]string{"identity, deflate"}, true},
	} {
		h := http.Header{"Content-Encoding": c.vals}
		if got := encoded(h); got != c.want {
			t.Errorf("Content-Encoding %q: encoded %v, want %v", c.vals, got, c.want)
		}
	}
}
