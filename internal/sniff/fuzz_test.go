package sniff

import (
	"bytes"
	"crypto/tls"
	"testing"
)

// overlaps reports whether s shares any memory with b.
func overlaps(s, b []byte) bool {
	if len(s) == 0 || len(b) == 0 {
		return false
	}
	return within(s[:1], b) || within(s[len(s)-1:], b) || within(b[:1], s)
}

func sameHello(a, b *Hello) bool {
	return bytes.Equal(a.ServerName, b.ServerName) && (a.ServerName == nil) == (b.ServerName == nil) &&
		bytes.Equal(a.ALPN, b.ALPN) && (a.ALPN == nil) == (b.ALPN == nil) && a.HasECH == b.HasECH
}

// FuzzHelloParse checks that Hello.Parse never panics, agrees with the
// allocating reference parser, returns fields that alias the input (or are
// fresh copies of split fields), and that feeding the input in two chunks
// gives the same final answer as feeding it whole.
func FuzzHelloParse(f *testing.F) {
	for _, cfg := range []*tls.Config{
		{ServerName: "example.com", NextProtos: []string{"h2", "http/1.1"}},
		{ServerName: "www.example.org", MaxVersion: tls.VersionTLS12},
		{InsecureSkipVerify: true},
		{ServerName: "secret.example.com", MinVersion: tls.VersionTLS13, EncryptedClientHelloConfigList: echConfigList(f, "public.example.net")},
	} {
		wire := goClientHello(f, cfg)
		msg := defrag(f, wire)
		f.Add(wire, uint16(len(wire)/2))
		f.Add(records(msg, 4, 100), uint16(9))
		f.Add(records(msg, bytes.Index(msg, []byte(".example"))), uint16(200))
	}
	f.Add(everyN(handshake(helloBody(false, sniExt("a.example"), alpnExt("h2"))), 3), uint16(40))
	f.Add(records(handshake(helloBody(true))), uint16(0))
	f.Add(records(handshake(helloBody(false, sniExt("a.example", "b.example")))), uint16(1))
	f.Add([]byte{0x16, 3, 1, 0, 0}, uint16(3))
	f.Add(append([]byte{0x15, 3, 1, 0, 2, 1, 90}, records(handshake(helloBody(false, sniExt("a.example"))))...), uint16(9))
	f.Add(append([]byte{0x16, 3, 0}, records(handshake(helloBody(false, sniExt("a.example"))))[3:]...), uint16(4))
	f.Add([]byte{0x80, 0x2e, 1, 3, 1}, uint16(2))
	f.Add([]byte("GET / HTTP/1.1\r\n\r\n"), uint16(3))

	f.Fuzz(func(t *testing.T, b []byte, cut uint16) {
		var whole Hello
		st := whole.Parse(b)
		if st != NeedMore && st != Done && st != NotThis {
			t.Fatalf("Parse returned %v", st)
		}
		if st != Done && (whole.ServerName != nil || whole.ALPN != nil || whole.HasECH) {
			t.Fatalf("Parse = %v but fields are set: %+v", st, whole)
		}
		if (st == NotThis) != (whole.Bad != "") {
			t.Fatalf("Parse = %v with Bad %q", st, whole.Bad)
		}
		if k, _, ok := Classify(b); st == Done && (!ok || k != TLS) {
			t.Fatalf("Parse = Done but Classify says %v, %v", k, ok)
		}
		for _, field := range [][]byte{whole.ServerName, whole.ALPN} {
			if !within(field, b) && overlaps(field, b) {
				t.Fatalf("field %q partly overlaps the input", field)
			}
		}

		complete, refSt, sni, alpn, ech := helloRef(b)
		switch {
		case complete && st != refSt:
			t.Fatalf("Parse = %v, reference = %v", st, refSt)
		case !complete && st == Done:
			t.Fatalf("Parse = Done but the reference needs more bytes")
		case st == Done:
			ref := Hello{ServerName: sni, ALPN: alpn, HasECH: ech}
			if !sameHello(&whole, &ref) {
				t.Fatalf("Parse fields %+v, reference %+v", whole, ref)
			}
		}

		k := int(cut) % (len(b) + 1)
		var h Hello
		st1 := h.Parse(b[:k])
		if st1 == NeedMore {
			st1 = h.Parse(b)
		}
		if st1 != st || !sameHello(&h, &whole) {
			t.Fatalf("in two chunks (cut at %d): %v %+v; whole: %v %+v", k, st1, h, st, whole)
		}
	})
}

func sameRequest(a, b *Request) bool {
	return bytes.Equal(a.Method, b.Method) && bytes.Equal(a.Target, b.Target) &&
		bytes.Equal(a.Host, b.Host) && (a.Host == nil) == (b.Host == nil) && a.HostPort == b.HostPort &&
		a.Minor == b.Minor && a.HeadLen == b.HeadLen && a.ContentLength == b.ContentLength &&
		a.Chunked == b.Chunked && bytes.Equal(a.Upgrade, b.Upgrade) && (a.Upgrade == nil) == (b.Upgrade == nil) &&
		a.Bad == b.Bad
}

// FuzzRequestParse checks that Request.Parse never panics; that Done means
// a head of HeadLen bytes within MaxRequestHead whose fields alias the
// input, that the head alone gives the same answer and one byte less
// NeedMore, and that Classify calls it HTTP; that NotThis always says why;
// and that feeding the input in two chunks gives the same final answer as
// feeding it whole.
func FuzzRequestParse(f *testing.F) {
	for _, s := range []string{
		"GET / HTTP/1.1\r\nHost: example.com\r\n\r\n",
		"GET http://example.com:8080/x HTTP/1.1\r\nHost: example.com:8080\r\n\r\n",
		"CONNECT [2001:db8::1]:443 HTTP/1.1\r\nHost: [2001:db8::1]:443\r\n\r\n",
		"POST /x HTTP/1.0\nhost: a.example\nX: 1\n  2\n\nbody",
		"GET / HTTP/1.1\r\nHost: a\r\nHost: A\r\n\r\nGET / HTTP/1.1\r\n\r\n",
		"\r\n\r\nget / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabc",
		"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nUpgrade: websocket\r\n\r\n0\r\n\r\n",
		"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
		"OPTIONS * HTTP/1.1\r\n\r\n",
		"\x16\x03\x01\x00",
	} {
		f.Add([]byte(s), uint16(7))
	}

	f.Fuzz(func(t *testing.T, b []byte, cut uint16) {
		var whole Request
		st := whole.Parse(b)
		switch st {
		case NeedMore, NotThis:
			if whole.Method != nil || whole.Target != nil || whole.Host != nil || whole.HostPort != 0 ||
				whole.HeadLen != 0 || whole.ContentLength != -1 || whole.Chunked || whole.Upgrade != nil {
				t.Fatalf("Parse = %v but fields are set: %+v", st, whole)
			}
			if (st == NotThis) != (whole.Bad != "") {
				t.Fatalf("Parse = %v with Bad %q", st, whole.Bad)
			}
			if whole.BadValue != nil && !within(whole.BadValue, b) {
				t.Fatalf("BadValue %q does not alias the input", whole.BadValue)
			}
		case Done:
			for _, field := range [][]byte{whole.Method, whole.Target, whole.Host, whole.Upgrade} {
				if !within(field, b) {
					t.Fatalf("field %q does not alias the input", field)
				}
			}
			if !isToken(whole.Method) || whole.Bad != "" {
				t.Fatalf("Done with method %q, Bad %q", whole.Method, whole.Bad)
			}
			if whole.Chunked && whole.ContentLength >= 0 {
				t.Fatalf("Done with both Content-Length and chunked")
			}
			end := whole.HeadLen
			if end <= 0 || end > MaxRequestHead || end > len(b) || (b[end-1] != '\n') {
				t.Fatalf("Done, but the head ends at %d", end)
			}
			var r Request
			if r.Parse(b[:end]) != Done || !sameRequest(&r, &whole) {
				t.Fatalf("the head alone parses as %+v, the whole input as %+v", r, whole)
			}
			if st := r.Parse(b[:end-1]); st != NeedMore {
				t.Fatalf("the head without its last byte parses as %v, want NeedMore", st)
			}
			if k, _, ok := Classify(b); !ok || k != HTTP {
				t.Fatalf("Parse = Done, but Classify says %v, %v", k, ok)
			}
		default:
			t.Fatalf("Parse returned %v", st)
		}

		k := int(cut) % (len(b) + 1)
		var r Request
		st1 := r.Parse(b[:k])
		if st1 == NeedMore {
			st1 = r.Parse(b)
		}
		if st1 != st || (st == Done && !sameRequest(&r, &whole)) {
			t.Fatalf("in two chunks (cut at %d): %v %+v; whole: %v %+v", k, st1, r, st, whole)
		}
	})
}

// FuzzClassify checks that Classify never panics, that its decision is
// final (a longer input keeps it) and its safe prefix never shrinks, that
// the safe prefix is never a request head, and that the parsers agree with
// it: a complete ClientHello is TLS, a complete request head is HTTP.
func FuzzClassify(f *testing.F) {
	for _, s := range []string{
		"GET / HTTP/1.1\r\nHost: a\r\n\r\n", "get / HTTP/1.1\r\n", "FROB  /x  http/1.1\r\n", "\r\n\r\nPOST ",
		"SSH-2.0-OpenSSH_9.6\r\n", "xxxxxxxx", "PRI * HTTP/2.0\r\n\r\n", "0032git-upload-pack /p\x00host=a\x00",
		"\x16\x03\x01\x00\x05", "\x15\x03\x03", "\x80\x2e\x01\x03\x01", "\x80\x01\x00\x01", "*1\r\n$4\r\nPING\r\n",
		"GET\r/ HTTP/1.1", "GET\r\n",
	} {
		f.Add([]byte(s), uint16(3))
	}
	f.Fuzz(func(t *testing.T, b []byte, cut uint16) {
		k, safe, ok := Classify(b)
		if !ok && (k != Unknown || safe < 0 || safe > len(b)) {
			t.Fatalf("undecided with %v, safe %d of %d", k, safe, len(b))
		}
		if ok && safe != 0 {
			t.Fatalf("decided %v with safe %d", k, safe)
		}
		n := int(cut) % (len(b) + 1)
		pk, psafe, pok := Classify(b[:n])
		switch {
		case pok && (!ok || pk != k):
			t.Fatalf("Classify(first %d bytes) = %v, but the whole input gives %v, %v", n, pk, k, ok)
		case !pok && !ok && psafe > safe:
			t.Fatalf("safe shrank from %d (first %d bytes) to %d", psafe, n, safe)
		}
		var h Hello
		if h.Parse(b) == Done && (!ok || k != TLS) {
			t.Fatalf("a complete ClientHello classified %v, %v", k, ok)
		}
		var r Request
		if r.Parse(b) == Done && (!ok || k != HTTP) {
			t.Fatalf("a complete request head classified %v, %v", k, ok)
		}
		if !ok && safe > 0 {
			// What may pass before the decision never holds a line end
			// after a request line, let alone a head.
			var r Request
			if r.Parse(b[:safe]) == Done {
				t.Fatalf("the safe prefix %q is a whole request head", b[:safe])
			}
		}
	})
}

// FuzzBody checks that Body.Feed never panics, never consumes more than it
// is given, says why when it refuses, and gives the same answer however
// the input is cut.
func FuzzBody(f *testing.F) {
	for _, s := range []string{
		"5\r\nhello\r\n0\r\n\r\nGET", "a;ext=1\r\n0123456789\r\n0\r\nX-T: 1\r\n\r\n", "0\r\n\r\n",
		"5\nhello\n0\n\n", "fffffffffffffffff\r\n", "0\r\n Folded: x\r\n\r\n",
	} {
		f.Add([]byte(s), true, int64(0), uint16(3))
	}
	f.Add([]byte("hello, worldGET / HTTP/1.1"), false, int64(12), uint16(5))
	f.Fuzz(func(t *testing.T, b []byte, chunked bool, length int64, cut uint16) {
		r := Request{Chunked: chunked, ContentLength: length}
		var whole Body
		whole.Start(&r)
		n, st := whole.Feed(b)
		if n < 0 || n > len(b) {
			t.Fatalf("Feed consumed %d of %d", n, len(b))
		}
		if (st == NotThis) != (whole.Bad != "") {
			t.Fatalf("Feed = %v with Bad %q", st, whole.Bad)
		}
		if st == NeedMore && n != len(b) {
			t.Fatalf("NeedMore after consuming %d of %d", n, len(b))
		}
		if !chunked && length > 0 && st != NotThis && int64(n) != min(length, int64(len(b))) {
			t.Fatalf("a %d-byte body consumed %d of %d", length, n, len(b))
		}
		k := int(cut) % (len(b) + 1)
		var two Body
		two.Start(&r)
		n1, st1 := two.Feed(b[:k])
		if st1 == NeedMore {
			n2, st2 := two.Feed(b[k:])
			n1, st1 = n1+n2, st2
		}
		if st1 != st || (st != NotThis && n1 != n) {
			t.Fatalf("in two chunks (cut at %d): %d %v; whole: %d %v", k, n1, st1, n, st)
		}
	})
}

// FuzzSwitch checks that Switch.Feed never panics, never consumes more
// than it is given, and gives the same answer however the input is cut.
func FuzzSwitch(f *testing.F) {
	for _, s := range []string{
		"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n",
		"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: x\r\n\r\nHTTP/1.1 101 OK\r\n\r\n",
		"HTTP/1.1 200 OK\r\n\r\n", "HTTP/1.0 404 Not Found\r\n", "HTTP/2 101\r\n", "HTTP/1.1 100 Continue\n\n",
	} {
		f.Add([]byte(s), uint16(9))
	}
	f.Fuzz(func(t *testing.T, b []byte, cut uint16) {
		var whole Switch
		n, st, sw := whole.Feed(b)
		if n < 0 || n > len(b) || (st == NeedMore && n != len(b)) || (sw && st != Done) {
			t.Fatalf("Feed = %d of %d, %v, %v", n, len(b), st, sw)
		}
		k := int(cut) % (len(b) + 1)
		var two Switch
		n1, st1, sw1 := two.Feed(b[:k])
		if st1 == NeedMore {
			n2, st2, sw2 := two.Feed(b[k:])
			n1, st1, sw1 = n1+n2, st2, sw2
		}
		if st1 != st || sw1 != sw || (st == Done && n1 != n) {
			t.Fatalf("in two chunks (cut at %d): %d %v %v; whole: %d %v %v", k, n1, st1, sw1, n, st, sw)
		}
	})
}
