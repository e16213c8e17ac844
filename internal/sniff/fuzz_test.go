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
		bytes.Equal(a.Host, b.Host) && (a.Host == nil) == (b.Host == nil) && a.HostPort == b.HostPort
}

// FuzzRequestParse checks that Request.Parse never panics, that Done
// means a head ends within MaxRequestHead and its fields alias the input,
// that the head alone gives the same answer, and that feeding the input in
// two chunks gives the same final answer as feeding it whole.
func FuzzRequestParse(f *testing.F) {
	for _, s := range []string{
		"GET / HTTP/1.1\r\nHost: example.com\r\n\r\n",
		"GET http://example.com:8080/x HTTP/1.1\r\nHost: example.com:8080\r\n\r\n",
		"CONNECT [2001:db8::1]:443 HTTP/1.1\r\nHost: [2001:db8::1]:443\r\n\r\n",
		"POST /x HTTP/1.0\nhost: a.example\nX: 1\n  2\n\nbody",
		"GET / HTTP/1.1\r\nHost: a\r\nHost: A\r\n\r\nGET / HTTP/1.1\r\n\r\n",
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
			if whole.Method != nil || whole.Target != nil || whole.Host != nil || whole.HostPort != 0 {
				t.Fatalf("Parse = %v but fields are set: %+v", st, whole)
			}
		case Done:
			for _, field := range [][]byte{whole.Method, whole.Target, whole.Host} {
				if !within(field, b) {
					t.Fatalf("field %q does not alias the input", field)
				}
			}
			if full, _ := matchMethod(whole.Method); !full {
				t.Fatalf("Method %q is not a known method", whole.Method)
			}
			end := headEnd(b)
			if end < 0 || end > MaxRequestHead {
				t.Fatalf("Done, but the head ends at %d", end)
			}
			var r Request
			if r.Parse(b[:end]) != Done || !sameRequest(&r, &whole) {
				t.Fatalf("the head alone parses as %+v, the whole input as %+v", r, whole)
			}
			if st := r.Parse(b[:end-1]); st != NeedMore {
				t.Fatalf("the head without its last byte parses as %v, want NeedMore", st)
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
		if st1 != st || !sameRequest(&r, &whole) {
			t.Fatalf("in two chunks (cut at %d): %v %+v; whole: %v %+v", k, st1, r, st, whole)
		}
	})
}
