package sniff

import (
	"bufio"
	"bytes"
	"net/http"
	"strings"
	"testing"
)

type wantRequest struct {
	st             Status
	method, target string
	host           string // "" means Host must be nil
	port           uint16
}

func checkRequest(t *testing.T, in []byte, w wantRequest) {
	t.Helper()
	var r Request
	st := r.Parse(in)
	if st != w.st {
		t.Fatalf("Parse(%q) = %v, want %v", in, st, w.st)
	}
	if string(r.Method) != w.method || string(r.Target) != w.target {
		t.Errorf("Method, Target = %q, %q; want %q, %q", r.Method, r.Target, w.method, w.target)
	}
	if string(r.Host) != w.host || (w.host == "") != (r.Host == nil) || r.HostPort != w.port {
		t.Errorf("Host, HostPort = %q, %d; want %q, %d", r.Host, r.HostPort, w.host, w.port)
	}
	for _, f := range [][]byte{r.Method, r.Target, r.Host} {
		if !within(f, in) {
			t.Errorf("field %q does not alias the input", f)
		}
	}
}

func TestRequestParse(t *testing.T) {
	done := func(method, target, host string, port uint16) wantRequest {
		return wantRequest{Done, method, target, host, port}
	}
	notThis := wantRequest{st: NotThis}
	tests := []struct {
		name string
		in   string
		want wantRequest
	}{
		{"a plain GET yields its Host", "GET / HTTP/1.1\r\nHost: example.com\r\n\r\n", done("GET", "/", "example.com", 0)},
		{"a Host with a port is split", "GET /x?y=1 HTTP/1.1\r\nHost: example.com:8080\r\n\r\n", done("GET", "/x?y=1", "example.com", 8080)},
		{"an IPv6 literal Host loses its brackets and port", "GET / HTTP/1.1\r\nHost: [::1]:80\r\n\r\n", done("GET", "/", "::1", 80)},
		{"an IPv6 literal Host without a port loses its brackets", "HEAD / HTTP/1.1\r\nHost: [2001:db8::1]\r\n\r\n", done("HEAD", "/", "2001:db8::1", 0)},
		{"an IPv4 literal Host is returned for the caller to judge", "GET / HTTP/1.1\r\nHost: 192.0.2.7:81\r\n\r\n", done("GET", "/", "192.0.2.7", 81)},
		{"an empty port is no port", "GET / HTTP/1.1\r\nHost: example.com:\r\n\r\n", done("GET", "/", "example.com", 0)},
		{"a lower-case header name matches", "GET / HTTP/1.1\r\nhost: example.com\r\n\r\n", done("GET", "/", "example.com", 0)},
		{"an upper-case header name matches", "GET / HTTP/1.1\r\nHOST: example.com\r\n\r\n", done("GET", "/", "example.com", 0)},
		{"optional whitespace around the Host value is trimmed", "GET / HTTP/1.1\r\nHost:\t example.com \t\r\n\r\n", done("GET", "/", "example.com", 0)},
		{"other headers are skipped", "POST /up HTTP/1.1\r\nUser-Agent: t/1\r\nContent-Length: 3\r\nHost: example.com\r\nAccept: */*\r\n\r\nabc", done("POST", "/up", "example.com", 0)},
		{"an absolute-form target supplies the host when HTTP/1.0 has no Host", "GET http://example.com/x HTTP/1.0\r\n\r\n", done("GET", "http://example.com/x", "example.com", 0)},
		{"an absolute-form target with a port supplies both", "GET http://example.com:8080 HTTP/1.0\r\nAccept: */*\r\n\r\n", done("GET", "http://example.com:8080", "example.com", 8080)},
		{"an https absolute-form target with an IPv6 literal supplies it", "GET https://[2001:db8::5]:8443/?q HTTP/1.0\r\n\r\n", done("GET", "https://[2001:db8::5]:8443/?q", "2001:db8::5", 8443)},
		{"an absolute-form target and an agreeing Host with port", "GET http://example.com:8080/ HTTP/1.1\r\nHost: example.com:8080\r\n\r\n", done("GET", "http://example.com:8080/", "example.com", 8080)},
		{"an absolute-form target wins over an agreeing Host", "GET HTTP://Example.com/x HTTP/1.1\r\nHost: example.COM\r\n\r\n", done("GET", "HTTP://Example.com/x", "Example.com", 0)},
		{"a default port on one side only still agrees", "GET http://example.com/ HTTP/1.1\r\nHost: example.com:80\r\n\r\n", done("GET", "http://example.com/", "example.com", 0)},
		{"an absolute-form target and a Host that differ are refused", "GET http://allowed.example/ HTTP/1.1\r\nHost: evil.example\r\n\r\n", notThis},
		{"an absolute-form target and a Host port that differ are refused", "GET http://example.com/ HTTP/1.1\r\nHost: example.com:8080\r\n\r\n", notThis},
		{"CONNECT takes the host from its authority-form target", "CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n", done("CONNECT", "example.com:443", "example.com", 443)},
		{"CONNECT with an origin-form target is refused", "CONNECT / HTTP/1.1\r\n\r\n", notThis},
		{"OPTIONS * over HTTP/1.0 without a Host is Done with no host", "OPTIONS * HTTP/1.0\r\n\r\n", done("OPTIONS", "*", "", 0)},
		{"HTTP/1.1 without a Host is refused", "OPTIONS * HTTP/1.1\r\n\r\n", notThis},
		{"HTTP/1.0 without a Host is Done with no host", "GET / HTTP/1.0\r\n\r\n", done("GET", "/", "", 0)},
		{"an empty Host is no host", "GET / HTTP/1.1\r\nHost:\r\n\r\n", done("GET", "/", "", 0)},
		{"bare LF line ends are accepted", "GET / HTTP/1.1\nHost: example.com\n\n", done("GET", "/", "example.com", 0)},
		{"mixed line ends are accepted", "GET / HTTP/1.1\r\nHost: example.com\n\r\n", done("GET", "/", "example.com", 0)},
		{"pipelined data after the head is ignored", "GET /a HTTP/1.1\r\nHost: a.example\r\n\r\nGET /b HTTP/1.1\r\nHost: b.example\r\n\r\n", done("GET", "/a", "a.example", 0)},
		{"a body that looks like headers is ignored", "POST / HTTP/1.1\r\nHost: a.example\r\n\r\nHost: b.example\r\n\r\n", done("POST", "/", "a.example", 0)},
		{"two identical Host headers are refused", "GET / HTTP/1.1\r\nHost: example.com\r\nX: 1\r\nhost: EXAMPLE.com\r\n\r\n", notThis},
		{"two different Host headers are refused", "GET / HTTP/1.1\r\nHost: allowed.example\r\nHost: evil.example\r\n\r\n", notThis},
		{"an empty and a non-empty Host header are refused", "GET / HTTP/1.1\r\nHost:\r\nHost: evil.example\r\n\r\n", notThis},
		{"a folded header other than Host is refused", "GET / HTTP/1.1\r\nX-Long: a\r\n  b\r\n\tc\r\nHost: example.com\r\n\r\n", notThis},
		{"a folded line that hides a Host is refused", "GET / HTTP/1.1\r\nX-A: 1\r\n Host: evil.example\r\nHost: example.com\r\n\r\n", notThis},
		{"a folded Host header is refused", "GET / HTTP/1.1\r\nHost: allowed.example\r\n evil.example\r\n\r\n", notThis},
		{"a fold before any header is refused", "GET / HTTP/1.1\r\n Host: example.com\r\n\r\n", notThis},
		{"WebDAV methods are known", "PROPFIND /dav HTTP/1.1\r\nHost: dav.example\r\n\r\n", done("PROPFIND", "/dav", "dav.example", 0)},

		{"a space before the colon is refused", "GET / HTTP/1.1\r\nHost : example.com\r\n\r\n", notThis},
		{"a header without a colon is refused", "GET / HTTP/1.1\r\nHost example.com\r\n\r\n", notThis},
		{"a NUL in a header value is refused", "GET / HTTP/1.1\r\nHost: example.com\x00.evil\r\n\r\n", notThis},
		{"a bare CR inside a header line is refused", "GET / HTTP/1.1\r\nX: a\rHost: evil.example\r\n\r\n", notThis},
		{"a Host with two colons is refused", "GET / HTTP/1.1\r\nHost: a:1:2\r\n\r\n", notThis},
		{"a Host with a port above 65535 is refused", "GET / HTTP/1.1\r\nHost: example.com:65536\r\n\r\n", notThis},
		{"a Host with a non-numeric port is refused", "GET / HTTP/1.1\r\nHost: example.com:8o\r\n\r\n", notThis},
		{"a Host with userinfo is refused", "GET / HTTP/1.1\r\nHost: allowed.example@evil.example\r\n\r\n", notThis},
		{"a Host with a path is refused", "GET / HTTP/1.1\r\nHost: example.com/x\r\n\r\n", notThis},
		{"a Host with a space inside is refused", "GET / HTTP/1.1\r\nHost: example .com\r\n\r\n", notThis},
		{"an unclosed IPv6 literal is refused", "GET / HTTP/1.1\r\nHost: [::1\r\n\r\n", notThis},
		{"an IPv6 literal with a zone is refused", "GET / HTTP/1.1\r\nHost: [fe80::1%25eth0]\r\n\r\n", notThis},
		{"an absolute-form target with userinfo is refused", "GET http://allowed.example@evil.example/ HTTP/1.1\r\n\r\n", notThis},
		{"an absolute-form target with no authority is refused", "GET http:///x HTTP/1.1\r\n\r\n", notThis},
		{"an absolute-form target of another scheme is refused", "GET ftp://example.com/ HTTP/1.1\r\n\r\n", notThis},
		{"a relative target is refused", "GET example.com HTTP/1.1\r\n\r\n", notThis},
		{"two spaces in the request line are refused", "GET  / HTTP/1.1\r\nHost: example.com\r\n\r\n", notThis},
		{"HTTP/2 prior knowledge is not HTTP/1", "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", notThis},
		{"an HTTP/0.9 request line is refused", "GET /\r\n\r\n", notThis},
		{"HTTP/1.2 is refused", "GET / HTTP/1.2\r\n\r\n", notThis},
		{"a lower-case method is a method", "get / HTTP/1.1\r\nHost: example.com\r\n\r\n", done("get", "/", "example.com", 0)},
		{"an unknown method is a method", "BREW /pot HTTP/1.1\r\nHost: example.com\r\n\r\n", done("BREW", "/pot", "example.com", 0)},
		{"empty lines before the request line are skipped", "\r\n\nGET / HTTP/1.1\r\nHost: example.com\r\n\r\n", done("GET", "/", "example.com", 0)},
		{"a bare CR before the request line is refused", "\rGET / HTTP/1.1\r\nHost: example.com\r\n\r\n", notThis},
		{"a method that is not a token is refused", "G(T / HTTP/1.1\r\nHost: example.com\r\n\r\n", notThis},
		{"a tab between the parts of the request line is refused", "GET\t/ HTTP/1.1\r\nHost: example.com\r\n\r\n", notThis},
		{"a lower-case version is refused", "GET / http/1.1\r\nHost: example.com\r\n\r\n", notThis},
		{"a control byte in the target is refused", "GET /\x01 HTTP/1.1\r\n\r\n", notThis},
		{"a TLS record is refused", "\x16\x03\x01\x02\x00\x01", notThis},
	}
	oracled := 0 // cases net/http also accepted and compared
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := []byte(tt.in)
			checkRequest(t, in, tt.want)
			if tt.want.st != Done {
				return
			}
			// Fed byte by byte, every prefix before the end of the head is
			// NeedMore, and the answer then never changes.
			var r Request
			r.Parse(in)
			end := r.HeadLen
			start := bytes.IndexFunc(in, func(c rune) bool { return c != '\r' && c != '\n' })
			if want := start + headEnd(in[start:]); end != want {
				t.Fatalf("HeadLen = %d, want %d", end, want)
			}
			for n := range len(in) + 1 {
				st := r.Parse(in[:n])
				if n < end && (st != NeedMore || r.Method != nil || r.Host != nil) {
					t.Fatalf("Parse(first %d of %d bytes) = %v with %+v, want NeedMore and zero fields", n, end, st, r)
				}
				if n >= end {
					checkRequest(t, in[:n], tt.want)
				}
			}
			// net/http reads the same host from the same head (it keeps the port).
			if req, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(in))); err == nil {
				oracled++
				h := req.Host
				if hh, _, ok := strings.Cut(strings.TrimPrefix(h, "["), "]"); ok && strings.HasPrefix(h, "[") {
					h = hh
				} else if i := strings.LastIndexByte(h, ':'); i >= 0 {
					h = h[:i]
				}
				if !strings.EqualFold(h, tt.want.host) {
					t.Errorf("net/http read host %q, Parse %q", req.Host, tt.want.host)
				}
			}
		})
	}
	if oracled < 20 {
		t.Errorf("net/http cross-checked only %d cases, want at least 20", oracled)
	}
}

// headEnd returns the length of the request head in a, up to and including
// the empty line.
func headEnd(a []byte) int {
	for i := 0; i < len(a); i++ {
		if a[i] != '\n' {
			continue
		}
		if i+1 < len(a) && a[i+1] == '\n' {
			return i + 2
		}
		if i+2 < len(a) && a[i+1] == '\r' && a[i+2] == '\n' {
			return i + 3
		}
	}
	return -1
}

// TestRequestParseRefusesEarly checks that callers learn quickly that a
// stream is not HTTP.
func TestRequestParseRefusesEarly(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want Status
	}{
		{"a TLS record is refused on its first byte", "\x16", NotThis},
		{"a word that is no token is refused", "SS(", NotThis},
		{"a method prefix waits for more", "PROP", NeedMore},
		{"any token may be a method: it waits", "GETS", NeedMore},
		{"a space in the version is refused before the line ends", "GET / HTTP/1.1 ", NotThis},
		{"a bad version is refused before the line ends", "GET / HTTX", NotThis},
		{"an HTTP/2 request line is refused before the line ends", "PRI * HTTP/2", NotThis},
		{"a control byte in the target is refused before the line ends", "GET /\x7f", NotThis},
		{"a request line waiting for its LF waits", "GET / HTTP/1.1\r", NeedMore},
		{"a CR followed by anything but LF is refused", "GET\r ", NotThis},
		{"empty lines wait", "\r\n\r\n", NeedMore},
		{"an empty input waits", "", NeedMore},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var r Request
			if st := r.Parse([]byte(tt.in)); st != tt.want {
				t.Fatalf("Parse(%q) = %v, want %v", tt.in, st, tt.want)
			}
		})
	}
}

func TestRequestParseSizeBound(t *testing.T) {
	// head returns a request head of exactly n bytes.
	head := func(n int) []byte {
		const pre, post = "GET / HTTP/1.1\r\nHost: example.com\r\nX-Pad: ", "\r\n\r\n"
		return []byte(pre + strings.Repeat("p", n-len(pre)-len(post)) + post)
	}
	tests := []struct {
		name string
		in   []byte
		want Status
	}{
		{"a head of exactly MaxRequestHead bytes is accepted", head(MaxRequestHead), Done},
		{"a head one byte over MaxRequestHead is refused", head(MaxRequestHead + 1), NotThis},
		{"an unfinished head of MaxRequestHead-1 bytes waits", head(MaxRequestHead + 10)[:MaxRequestHead-1], NeedMore},
		{"an unfinished head of MaxRequestHead bytes is refused", head(MaxRequestHead + 10)[:MaxRequestHead], NotThis},
		{"a request line longer than MaxRequestHead is refused", []byte("GET /" + strings.Repeat("a", MaxRequestHead)), NotThis},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var r Request
			if st := r.Parse(tt.in); st != tt.want {
				t.Fatalf("Parse(%d bytes) = %v, want %v", len(tt.in), st, tt.want)
			}
		})
	}
}

func TestRequestParseAllocatesNothing(t *testing.T) {
	tests := []struct {
		name string
		in   string
	}{
		{"an origin-form request", "GET /index.html HTTP/1.1\r\nHost: example.com:8080\r\nUser-Agent: curl/8\r\nAccept: */*\r\n\r\n"},
		{"an absolute-form request", "GET http://[2001:db8::1]:80/ HTTP/1.1\r\nhost: [2001:db8::1]:80\r\n\r\n"},
		{"an incomplete request", "GET / HTTP/1.1\r\nHost: exa"},
		{"a refused request", "GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := []byte(tt.in)
			if n := testing.AllocsPerRun(100, func() { var r Request; r.Parse(in) }); n != 0 {
				t.Errorf("Request.Parse allocs = %v, want 0", n)
			}
		})
	}
}

func BenchmarkRequestParse(b *testing.B) {
	in := []byte("GET /index.html HTTP/1.1\r\nUser-Agent: curl/8.5.0\r\nAccept: */*\r\nAccept-Encoding: gzip\r\nHost: example.com:8080\r\nConnection: keep-alive\r\n\r\n")
	b.SetBytes(int64(len(in)))
	b.ReportAllocs()
	var r Request
	for b.Loop() {
		if r.Parse(in) != Done {
			b.Fatal("not Done")
		}
	}
}
