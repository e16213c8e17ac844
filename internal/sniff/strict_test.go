package sniff

import (
	"bytes"
	"strings"
	"testing"
)

// TestRequestParseRefusesWhatServersReadDifferently covers each way an
// HTTP request can name a host that a checker and a server might not agree
// on (the fronting variants of the hardening issue): each is refused with a
// reason that names it.
func TestRequestParseRefusesWhatServersReadDifferently(t *testing.T) {
	tests := []struct {
		name, in, bad, value string
	}{
		{"two Host headers", "GET / HTTP/1.1\r\nHost: allowed.example\r\nHost: evil.example\r\n\r\n", "two Host headers", "evil.example"},
		{"two identical Host headers", "GET / HTTP/1.1\r\nHost: a.example\r\nHost: a.example\r\n\r\n", "two Host headers", "a.example"},
		{"an absolute-form target naming another host", "GET http://evil.example/ HTTP/1.1\r\nHost: allowed.example\r\n\r\n",
			"a request target that names another host than Host", "evil.example"},
		{"an HTTP/2 preface (h2c prior knowledge)", "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", "an HTTP/2 request line (h2c with prior knowledge)", "PRI * HTTP/2.0"},
		{"a head over 16 KiB", "GET / HTTP/1.1\r\nHost: evil.example\r\nX: " + strings.Repeat("p", MaxRequestHead) + "\r\n\r\n", "a request head over 16 KiB", ""},
		{"obs-fold", "GET / HTTP/1.1\r\nHost: allowed.example\r\n evil.example\r\n\r\n", "a folded header line (obs-fold)", " evil.example"},
		{"a Host with userinfo", "GET / HTTP/1.1\r\nHost: allowed.example@evil.example\r\n\r\n", "a malformed Host", "allowed.example@evil.example"},
		{"a NUL in a Host", "GET / HTTP/1.1\r\nHost: evil.example\x00allowed.example\r\n\r\n", "a control byte in a header", "Host"},
		{"a NUL in another header", "GET / HTTP/1.1\r\nX: \x00\r\nHost: a.example\r\n\r\n", "a control byte in a header", "X"},
		{"a bare CR in a header line", "GET / HTTP/1.1\r\nX: a\rHost: evil.example\r\nHost: a\r\n\r\n", "a bare CR", "X: a\rHost: evil.example"},
		{"a bare CR before the request", "\rGET / HTTP/1.1\r\nHost: a\r\n\r\n", "a bare CR", ""},
		{"two spaces in the request line", "GET  / HTTP/1.1\r\nHost: a\r\n\r\n", "a malformed request line", "GET  / HTTP/1.1"},
		{"Content-Length and Transfer-Encoding", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
			"both Content-Length and Transfer-Encoding", ""},
		{"a Transfer-Encoding list", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", "a Transfer-Encoding other than chunked", "gzip, chunked"},
		{"two Transfer-Encoding headers", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
			"two Transfer-Encoding headers", "chunked"},
		{"a Transfer-Encoding in HTTP/1.0", "POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n", "a Transfer-Encoding in an HTTP/1.0 request", ""},
		{"two Content-Length headers", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\n", "two Content-Length headers", "1"},
		{"a signed Content-Length", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: +1\r\n\r\n", "a malformed Content-Length", "+1"},
		{"a Content-Length list", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1, 1\r\n\r\n", "a malformed Content-Length", "1, 1"},
		{"a 19-digit Content-Length", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1234567890123456789\r\n\r\n", "a malformed Content-Length", "1234567890123456789"},
		{"two Upgrade headers", "GET / HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nUpgrade: h2c\r\n\r\n", "two Upgrade headers", "h2c"},
		{"HTTP/1.1 with no Host", "GET / HTTP/1.1\r\n\r\n", "an HTTP/1.1 request without Host", ""},
		{"a PROXY v1 header", "PROXY TCP4 192.0.2.1 192.0.2.2 1 2\r\nGET / HTTP/1.1\r\nHost: evil\r\n\r\n", "a PROXY protocol header", "PROXY TCP4 192.0.2.1 192.0.2.2 1 2"},
		{"a PROXY v2 header", "\r\n\r\n\x00\r\nQUIT\n\x21\x11\x00\x0c", "a PROXY protocol header", ""},
		{"white space before the request line", " GET / HTTP/1.1\r\nHost: a\r\n\r\n", "a malformed request line", " GET / HTTP/1.1"},
		{"a header name with a space", "GET / HTTP/1.1\r\nHost : a\r\n\r\n", "a malformed header line", "Host : a"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var r Request
			if st := r.Parse([]byte(tt.in)); st != NotThis {
				t.Fatalf("Parse = %v, want NotThis", st)
			}
			if r.Bad != tt.bad || string(r.BadValue) != tt.value {
				t.Errorf("Bad, BadValue = %q, %q; want %q, %q", r.Bad, r.BadValue, tt.bad, tt.value)
			}
		})
	}
}

func TestRequestParseFraming(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		minor   uint8
		length  int64
		chunked bool
		upgrade string
		headLen int
	}{
		{"no body", "GET / HTTP/1.1\r\nHost: a\r\n\r\nGET", 1, -1, false, "", 27},
		{"a Content-Length body", "POST / HTTP/1.0\r\nContent-Length: 0012\r\n\r\n", 0, 12, false, "", 41},
		{"a chunked body", "POST / HTTP/1.1\r\nHost: a\r\ntransfer-encoding: Chunked\r\n\r\n", 1, -1, true, "", 56},
		{"an upgrade", "GET /ws HTTP/1.1\r\nHost: a\r\nUpgrade:  websocket \r\nConnection: Upgrade\r\n\r\n", 1, -1, false, "websocket", 72},
		{"empty lines first", "\r\n\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n", 1, -1, false, "", 31},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var r Request
			if st := r.Parse([]byte(tt.in)); st != Done {
				t.Fatalf("Parse = %v (%s), want Done", st, r.Bad)
			}
			if r.Minor != tt.minor || r.ContentLength != tt.length || r.Chunked != tt.chunked ||
				string(r.Upgrade) != tt.upgrade || (tt.upgrade == "") != (r.Upgrade == nil) || r.HeadLen != tt.headLen {
				t.Errorf("got minor %d, length %d, chunked %v, upgrade %q, head %d; want %d, %d, %v, %q, %d",
					r.Minor, r.ContentLength, r.Chunked, r.Upgrade, r.HeadLen, tt.minor, tt.length, tt.chunked, tt.upgrade, tt.headLen)
			}
		})
	}
}

// feedAll feeds in to a body set up for r, one byte at a time when
// bytewise is set, and returns what Feed said in the end.
func feedAll(r *Request, in []byte, bytewise bool) (int, Status, string) {
	var b Body
	b.Start(r)
	if !bytewise {
		n, st := b.Feed(in)
		return n, st, b.Bad
	}
	n := 0
	for i := range in {
		k, st := b.Feed(in[i : i+1])
		n += k
		if st != NeedMore {
			return n, st, b.Bad
		}
	}
	return n, NeedMore, b.Bad
}

func TestBodyFollowsFramingStrictly(t *testing.T) {
	chunked := &Request{Chunked: true, ContentLength: -1}
	tests := []struct {
		name string
		r    *Request
		in   string
		n    int // bytes of the body
		st   Status
		bad  string
	}{
		{"a length body ends at its length", &Request{ContentLength: 5}, "helloGET /", 5, Done, ""},
		{"a length body waits for the rest", &Request{ContentLength: 50}, "hello", 5, NeedMore, ""},
		{"no body is done at once", &Request{ContentLength: -1}, "GET /", 0, Done, ""},
		{"chunks end at the last chunk and empty line", chunked, "5\r\nhello\r\nA\r\n0123456789\r\n0\r\n\r\nGET /", 30, Done, ""},
		{"a request inside a chunk is data", chunked, "12\r\nGET / HTTP/1.1\r\n\r\n\r\n0\r\n\r\nX", 29, Done, ""},
		{"chunk extensions and trailers are skipped", chunked, "5;a=b;c=\"d\"\r\nhello\r\n0;x\r\nX-T: 1\r\nY: 2\r\n\r\nX", 41, Done, ""},
		{"upper- and lower-case hex sizes", chunked, "a\r\n0123456789\r\nA\r\n0123456789\r\n0\r\n\r\n", 35, Done, ""},
		{"a bare LF after a size is refused", chunked, "5\nhello\r\n0\r\n\r\n", 1, NotThis, "a malformed chunk size"},
		{"chunk data without its CRLF is refused", chunked, "5\r\nhelloX\r\n0\r\n\r\n", 8, NotThis, "chunk data not followed by CRLF"},
		{"a size with a space is refused", chunked, "5 \r\nhello\r\n", 1, NotThis, "a malformed chunk size"},
		{"a signed size is refused", chunked, "+5\r\nhello\r\n", 0, NotThis, "a malformed chunk size"},
		{"a 0x prefix is refused", chunked, "0x5\r\nhello\r\n", 1, NotThis, "a malformed chunk size"},
		{"a 16-digit size is refused", chunked, "1000000000000000\r\n", 15, NotThis, "a chunk size over 15 hex digits"},
		{"an empty size is refused", chunked, "\r\n", 0, NotThis, "a malformed chunk size"},
		{"a control byte in an extension is refused", chunked, "5;\x00\r\n", 2, NotThis, "a control byte in a chunk extension"},
		{"a folded trailer is refused", chunked, "0\r\n X: 1\r\n\r\n", 3, NotThis, "a malformed trailer line"},
		{"a trailer without a colon is refused", chunked, "0\r\nX 1\r\n\r\n", 4, NotThis, "a malformed trailer line"},
		{"a bare LF ending the body is refused", chunked, "0\r\n\n", 3, NotThis, "a malformed trailer line"},
		{"an unfinished body waits", chunked, "5\r\nhel", 6, NeedMore, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, bytewise := range []bool{false, true} {
				n, st, bad := feedAll(tt.r, []byte(tt.in), bytewise)
				if n != tt.n || st != tt.st || bad != tt.bad {
					t.Errorf("bytewise=%v: Feed = %d, %v, %q; want %d, %v, %q", bytewise, n, st, bad, tt.n, tt.st, tt.bad)
				}
			}
		})
	}
	t.Run("a chunk-size line over 4 KiB is refused", func(t *testing.T) {
		_, st, bad := feedAll(chunked, []byte("5;"+strings.Repeat("x", 5000)), false)
		if st != NotThis || bad != "a chunk-size line over 4 KiB" {
			t.Errorf("Feed = %v, %q", st, bad)
		}
	})
	t.Run("a trailer section over 16 KiB is refused", func(t *testing.T) {
		_, st, bad := feedAll(chunked, []byte("0\r\n"+strings.Repeat("X: 1\r\n", 3000)), false)
		if st != NotThis || bad != "a trailer section over 16 KiB" {
			t.Errorf("Feed = %v, %q", st, bad)
		}
	})
	in := []byte("5\r\nhello\r\n0\r\n\r\n")
	if n := testing.AllocsPerRun(100, func() { var b Body; b.Start(chunked); b.Feed(in) }); n != 0 {
		t.Errorf("Body.Feed allocs = %v, want 0", n)
	}
}

func TestSwitchSeesOnlyA101(t *testing.T) {
	tests := []struct {
		name     string
		in       string
		n        int
		st       Status
		switched bool
	}{
		{"101 is a switch", "HTTP/1.1 101 Switching Protocols\r\n\r\nframes", 12, Done, true},
		{"interim responses are skipped", "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\nHTTP/1.1 101 OK\r\n\r\n", 77, Done, true},
		{"200 is no switch", "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", 12, Done, false},
		{"a 1xx then 200 is no switch", "HTTP/1.1 102 Processing\r\n\r\nHTTP/1.0 200 OK\r\n", 39, Done, false},
		{"an incomplete status line waits", "HTTP/1.1 10", 11, NeedMore, false},
		{"an interim head waits", "HTTP/1.1 100 Continue\r\nX: y", 27, NeedMore, false},
		{"HTTP/2 is refused", "HTTP/2 101\r\n\r\n", 6, NotThis, false},
		{"a lower-case status line is refused", "http/1.1 101 x\r\n\r\n", 1, NotThis, false},
		{"a bare LF in an interim head is refused", "HTTP/1.1 100 Continue\n\nHTTP/1.1 101 x\r\n\r\n", 22, NotThis, false},
		{"anything else is refused", "SSH-2.0-x\r\n", 1, NotThis, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var s Switch
			n, st, sw := s.Feed([]byte(tt.in))
			if n != tt.n || st != tt.st || sw != tt.switched {
				t.Errorf("Feed = %d, %v, %v; want %d, %v, %v", n, st, sw, tt.n, tt.st, tt.switched)
			}
			// Byte by byte, the same answer.
			var b Switch
			total, st1, sw1 := 0, NeedMore, false
			for i := 0; i < len(tt.in) && st1 == NeedMore; i++ {
				var k int
				k, st1, sw1 = b.Feed([]byte(tt.in[i : i+1]))
				total += k
			}
			if st1 != tt.st || sw1 != tt.switched || (tt.st == Done && total != tt.n) {
				t.Errorf("bytewise Feed = %d, %v, %v; want %d, %v, %v", total, st1, sw1, tt.n, tt.st, tt.switched)
			}
		})
	}
	t.Run("over 64 KiB of interim responses is refused", func(t *testing.T) {
		var s Switch
		in := bytes.Repeat([]byte("HTTP/1.1 100 Continue\r\n\r\n"), 3000)
		if _, st, _ := s.Feed(in); st != NotThis {
			t.Errorf("Feed = %v, want NotThis", st)
		}
	})
	in := []byte("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 101 OK\r\n\r\n")
	if n := testing.AllocsPerRun(100, func() { var s Switch; s.Feed(in) }); n != 0 {
		t.Errorf("Switch.Feed allocs = %v, want 0", n)
	}
}

// TestHelloParseSaysWhy: every way a ClientHello stream is refused is named.
func TestHelloParseSaysWhy(t *testing.T) {
	sni := sniExt("example.com")
	good := records(handshake(helloBody(false, sni)))
	tests := []struct {
		name string
		wire []byte
		bad  string
	}{
		{"an alert first", append([]byte{0x15, 3, 1, 0, 2, 1, 90}, good...), "a record that is not a handshake record before the end of the ClientHello"},
		{"an empty record first", append([]byte{0x16, 3, 1, 0, 0}, good...), "an empty TLS record"},
		{"record version 0.0", append([]byte{0x16, 0, 0}, good[3:]...), "a TLS record version that is not 3.x"},
		{"an SSL 2.0 hello", []byte{0x80, 0x2e, 1, 3, 1}, "an SSL 2.0-compatible ClientHello (it cannot carry a server name)"},
		{"two host names", records(handshake(helloBody(false, sniExt("a.example", "b.example")))), "two host names in server_name"},
		{"two server_name extensions", records(handshake(helloBody(false, sni, sni))), "a duplicate server_name, ALPN or ECH extension"},
		{"a ServerHello", append(append([]byte{}, good[:5]...), append([]byte{2}, good[6:]...)...), "the first handshake message is not a ClientHello"},
		{"a hello over 16 KiB", []byte{0x16, 3, 1, 0x40, 0, 1, 0, 0x40, 0x00}, "a ClientHello over 16 KiB"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var h Hello
			if st := h.Parse(tt.wire); st != NotThis || h.Bad != tt.bad {
				t.Errorf("Parse = %v, %q; want NotThis, %q", st, h.Bad, tt.bad)
			}
		})
	}
	var h Hello
	if h.Parse(good) != Done || h.Bad != "" {
		t.Errorf("a good hello: Bad = %q", h.Bad)
	}
}
