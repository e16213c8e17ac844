package sniff

import (
	"bytes"
	"crypto/tls"
	"slices"
	"strings"
	"testing"
)

// wantHello is the expected outcome of Hello.Parse.
type wantHello struct {
	st   Status
	sni  string // "" means ServerName must be nil
	alpn []byte
	ech  bool
}

func checkHello(t *testing.T, wire []byte, w wantHello) *Hello {
	t.Helper()
	var h Hello
	st := h.Parse(wire)
	if st != w.st {
		t.Fatalf("Parse = %v, want %v", st, w.st)
	}
	if w.sni == "" && h.ServerName != nil {
		t.Errorf("ServerName = %q, want nil", h.ServerName)
	}
	if string(h.ServerName) != w.sni {
		t.Errorf("ServerName = %q, want %q", h.ServerName, w.sni)
	}
	if !bytes.Equal(h.ALPN, w.alpn) || (w.alpn == nil) != (h.ALPN == nil) {
		t.Errorf("ALPN = % x, want % x", h.ALPN, w.alpn)
	}
	if h.HasECH != w.ech {
		t.Errorf("HasECH = %v, want %v", h.HasECH, w.ech)
	}
	return &h
}

// checkPrefixesNeedMore asserts that every strict prefix of a complete
// ClientHello stream is NeedMore with zeroed fields.
func checkPrefixesNeedMore(t *testing.T, wire []byte) {
	t.Helper()
	var h Hello
	for n := range len(wire) {
		if st := h.Parse(wire[:n]); st != NeedMore || h.ServerName != nil || h.ALPN != nil || h.HasECH {
			t.Fatalf("Parse(first %d of %d bytes) = %v with %+v, want NeedMore and zero fields", n, len(wire), st, h)
		}
	}
}

func TestHelloParseRealClientHellos(t *testing.T) {
	h2 := alpnBody("h2", "http/1.1")
	tests := []struct {
		name string
		cfg  *tls.Config
		want wantHello
	}{
		{"a TLS 1.3 hello carries its server name and ALPN",
			&tls.Config{ServerName: "example.com", NextProtos: []string{"h2", "http/1.1"}},
			wantHello{st: Done, sni: "example.com", alpn: h2}},
		{"a TLS 1.2-only hello carries its server name",
			&tls.Config{ServerName: "www.example.org", MaxVersion: tls.VersionTLS12},
			wantHello{st: Done, sni: "www.example.org"}},
		{"a TLS 1.2-only hello with ALPN carries both",
			&tls.Config{ServerName: "a.example.net", MaxVersion: tls.VersionTLS12, NextProtos: []string{"http/1.1"}},
			wantHello{st: Done, sni: "a.example.net", alpn: alpnBody("http/1.1")}},
		{"a hello without a server name has no SNI",
			&tls.Config{InsecureSkipVerify: true},
			wantHello{st: Done}},
		{"an IPv4 literal server name is left out of the hello by Go",
			&tls.Config{ServerName: "192.0.2.10"},
			wantHello{st: Done}},
		{"an IPv6 literal server name is left out of the hello by Go",
			&tls.Config{ServerName: "2001:db8::1", NextProtos: []string{"h2"}},
			wantHello{st: Done, alpn: alpnBody("h2")}},
		{"Go strips a trailing dot from the server name",
			&tls.Config{ServerName: "example.com."},
			wantHello{st: Done, sni: "example.com"}},
		{"a 253-byte server name is returned whole",
			&tls.Config{ServerName: longName(253)},
			wantHello{st: Done, sni: longName(253)}},
		{"an ECH hello shows the public name and the ECH flag",
			&tls.Config{ServerName: "secret.example.com", MinVersion: tls.VersionTLS13,
				EncryptedClientHelloConfigList: echConfigList(t, "public.example.net")},
			wantHello{st: Done, sni: "public.example.net", ech: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			wire := goClientHello(t, tt.cfg)
			h := checkHello(t, wire, tt.want)
			if len(h.ServerName) > 0 && !within(h.ServerName, wire) {
				t.Errorf("ServerName of a one-record hello is a copy, want it to alias the input")
			}
			checkPrefixesNeedMore(t, wire)

			// crypto/tls's own server must read the same hello.
			info, ok := goServerView(t, wire)
			if !ok {
				t.Fatal("crypto/tls server rejected the hello")
			}
			if info.ServerName != tt.want.sni {
				t.Errorf("crypto/tls server saw SNI %q, Parse %q", info.ServerName, h.ServerName)
			}

			// The same hello cut into records of various sizes (handshake
			// fragmentation) parses the same, and crypto/tls agrees it is valid.
			msg := defrag(t, wire)
			for _, frag := range []struct {
				name string
				wire []byte
			}{
				{"2 records cut after the handshake header", records(msg, 4)},
				{"2 records cut mid-body", records(msg, len(msg)/2)},
				{"3 records", records(msg, 100, 200)},
				{"7-byte records", everyN(msg, 7)},
				{"1-byte records", everyN(msg, 1)},
			} {
				info, ok := goServerView(t, frag.wire)
				if !ok || info.ServerName != tt.want.sni {
					t.Fatalf("%s: crypto/tls server saw (%q, %v), want (%q, true)", frag.name, info.ServerName, ok, tt.want.sni)
				}
				checkHello(t, frag.wire, tt.want)
				checkPrefixesNeedMore(t, frag.wire)
			}
			// Bytes after the hello (an application data record) are ignored.
			checkHello(t, append(slices.Clip(wire), 0x17, 3, 3, 0, 2, 'h', 'i'), tt.want)
		})
	}
}

// TestHelloParseEveryCutPoint cuts a real hello into two records at every
// possible point, so every field (including the server name) gets split.
func TestHelloParseEveryCutPoint(t *testing.T) {
	wire := goClientHello(t, &tls.Config{ServerName: "split.example.com", NextProtos: []string{"h2", "http/1.1"}})
	msg := defrag(t, wire)
	want := wantHello{st: Done, sni: "split.example.com", alpn: alpnBody("h2", "http/1.1")}
	for cut := 1; cut < len(msg); cut++ {
		checkHello(t, records(msg, cut), want)
	}
}

func longName(n int) string {
	var b strings.Builder
	for b.Len() < n {
		if b.Len() > 0 {
			b.WriteByte('.')
		}
		b.WriteString(strings.Repeat("a", min(63, n-b.Len())))
	}
	s := b.String()
	if s[len(s)-1] == '.' {
		s = s[:len(s)-1] + "b"
	}
	return s
}

func TestHelloParseHandBuilt(t *testing.T) {
	sni := sniExt("example.com")
	one := func(body []byte) []byte { return records(handshake(body)) }
	// patch returns a copy of wire with b[i] = v.
	patch := func(wire []byte, i int, v byte) []byte {
		w := slices.Clone(wire)
		w[i] = v
		return w
	}
	good := one(helloBody(false, sni))
	// Offsets in good: record header 0..4, handshake header 5..8, version
	// 9..10, random 11..42, session id length 43.
	const sidLen = 43

	tests := []struct {
		name string
		wire []byte
		want wantHello
	}{
		{"a minimal hello with one server name is Done", good, wantHello{st: Done, sni: "example.com"}},
		{"a server name with a trailing dot is returned as sent",
			one(helloBody(false, sniExt("example.com."))), wantHello{st: Done, sni: "example.com."}},
		{"a hello with no extensions block is Done with no fields",
			one(helloBody(true)), wantHello{st: Done}},
		{"a hello with an empty extensions block is Done with no fields",
			one(helloBody(false)), wantHello{st: Done}},
		{"an ECH extension sets HasECH",
			one(helloBody(false, ext{0x0a0a, nil}, sni, ext{extECH, []byte{0, 1, 2}})), wantHello{st: Done, sni: "example.com", ech: true}},
		{"an unknown name type before the host_name is skipped",
			one(helloBody(false, ext{extServerName, vec16(nil, append([]byte{7, 0, 1, 'x', 0}, vec16(nil, []byte("example.com"))...))})),
			wantHello{st: Done, sni: "example.com"}},
		{"a server_name extension with only another name type gives no SNI",
			one(helloBody(false, ext{extServerName, vec16(nil, []byte{7, 0, 1, 'x'})})), wantHello{st: Done}},
		{"record versions 0x0301 to 0x0304 are all accepted",
			slices.Concat(patch(records(handshake(helloBody(false, sni)), 10), 2, 4), nil), wantHello{st: Done, sni: "example.com"}},

		{"an application data record is not a hello", patch(good, 0, 0x17), wantHello{st: NotThis}},
		{"record version 3.0 is accepted", patch(good, 2, 0), wantHello{st: Done, sni: "example.com"}},
		{"record version 3.5 is accepted (servers do)", patch(good, 2, 5), wantHello{st: Done, sni: "example.com"}},
		{"records of differing 3.x versions are accepted",
			patch(patch(records(handshake(helloBody(false, sni)), 10), 2, 0), 17, 7), wantHello{st: Done, sni: "example.com"}},
		{"record major version 2 is not accepted", patch(good, 1, 2), wantHello{st: NotThis}},
		{"an empty record is refused", []byte{0x16, 3, 1, 0, 0, 1, 0, 0}, wantHello{st: NotThis}},
		{"a record longer than 16 KiB is refused", []byte{0x16, 3, 1, 0x40, 0x01, 1}, wantHello{st: NotThis}},
		{"a ServerHello is not a ClientHello", patch(good, 5, 2), wantHello{st: NotThis}},
		{"a handshake message over 16 KiB is refused from its header alone",
			[]byte{0x16, 3, 1, 0x40, 0, 1, 0, 0x40, 0x00}, wantHello{st: NotThis}},
		{"legacy version 3.0 is accepted", patch(good, 10, 0), wantHello{st: Done, sni: "example.com"}},
		{"legacy version 2.0 is refused", patch(good, 9, 2), wantHello{st: NotThis}},
		{"an alert record before the hello is refused", slices.Concat([]byte{0x15, 3, 1, 0, 2, 1, 90}, good), wantHello{st: NotThis}},
		{"a change_cipher_spec record before the hello is refused", slices.Concat([]byte{0x14, 3, 1, 0, 1, 1}, good), wantHello{st: NotThis}},
		{"an empty record before the hello is refused", slices.Concat([]byte{0x16, 3, 1, 0, 0}, good), wantHello{st: NotThis}},
		{"an empty record inside the hello is refused",
			slices.Concat(records(handshake(helloBody(false, sni)), 10)[:15], []byte{0x16, 3, 1, 0, 0}, records(handshake(helloBody(false, sni)), 10)[15:]),
			wantHello{st: NotThis}},
		{"a session id over 32 bytes is refused", patch(good, sidLen, 33), wantHello{st: NotThis}},
		{"an odd cipher suites length is refused", patch(good, sidLen+33+1, 3), wantHello{st: NotThis}},
		{"an empty compression list is refused",
			one(slices.Concat(helloBody(true)[:len(helloBody(true))-2], []byte{0})), wantHello{st: NotThis}},
		{"an extensions length short of the message is refused",
			one(slices.Concat(helloBody(false, sni), []byte{0})), wantHello{st: NotThis}},
		{"an extension longer than the extensions block is refused",
			one(slices.Concat(helloBody(true), []byte{0, 4, 0, 0, 0, 9})), wantHello{st: NotThis}},
		{"a truncated extension header is refused",
			one(slices.Concat(helloBody(true), []byte{0, 3, 0, 0, 0})), wantHello{st: NotThis}},
		{"a handshake length shorter than its fields is refused",
			records(slices.Concat([]byte{1, 0, 0, 20}, helloBody(false, sni))), wantHello{st: NotThis}},
		{"a server name list length that disagrees with the extension is refused",
			one(helloBody(false, ext{extServerName, slices.Concat([]byte{0, 20}, sniExt("example.com").body[2:])})), wantHello{st: NotThis}},
		{"a host name longer than its list is refused",
			one(helloBody(false, ext{extServerName, []byte{0, 4, 0, 0, 9, 'a'}})), wantHello{st: NotThis}},
		{"an empty server name list is refused",
			one(helloBody(false, ext{extServerName, []byte{0, 0}})), wantHello{st: NotThis}},
		{"an empty server_name extension is refused",
			one(helloBody(false, ext{extServerName, nil})), wantHello{st: NotThis}},
		{"an empty host name is refused",
			one(helloBody(false, sniExt(""))), wantHello{st: NotThis}},
		{"two host names are refused", one(helloBody(false, sniExt("a.example", "b.example"))), wantHello{st: NotThis}},
		{"two server_name extensions are refused", one(helloBody(false, sni, sniExt("b.example"))), wantHello{st: NotThis}},
		{"two ALPN extensions are refused", one(helloBody(false, alpnExt("h2"), alpnExt("h2"))), wantHello{st: NotThis}},
		{"two ECH extensions are refused", one(helloBody(false, ext{extECH, nil}, ext{extECH, nil})), wantHello{st: NotThis}},
		{"an ALPN list with an empty protocol is refused",
			one(helloBody(false, ext{extALPN, []byte{0, 2, 0, 'x'}})), wantHello{st: NotThis}},
		{"an ALPN list length that disagrees with the extension is refused",
			one(helloBody(false, ext{extALPN, []byte{0, 9, 1, 'x'}})), wantHello{st: NotThis}},
		{"an ALPN protocol running past the list is refused",
			one(helloBody(false, ext{extALPN, []byte{0, 2, 5, 'x'}})), wantHello{st: NotThis}},
		{"a non-handshake record inside a fragmented hello is refused",
			patch(records(handshake(helloBody(false, sni)), 20), 25, 0x17), wantHello{st: NotThis}},
		{"a host name of 300 bytes in one record is returned for the caller to reject",
			one(helloBody(false, sniExt(strings.Repeat("x", 300)))), wantHello{st: Done, sni: strings.Repeat("x", 300)}},
		{"a host name of 300 bytes split across records is reassembled whole",
			records(handshake(helloBody(false, sniExt(strings.Repeat("x", 300)))), 150), wantHello{st: Done, sni: strings.Repeat("x", 300)}},
		{"a 200-byte ALPN body split across records is reassembled whole",
			records(handshake(helloBody(false, alpnExt(strings.Repeat("p", 100), strings.Repeat("q", 97)))), 150),
			wantHello{st: Done, alpn: alpnBody(strings.Repeat("p", 100), strings.Repeat("q", 97))}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkHello(t, tt.wire, tt.want)
			if tt.want.st == Done {
				checkPrefixesNeedMore(t, tt.wire)
			}
			ok, st, _, _, _ := helloRef(tt.wire)
			if !ok || st != tt.want.st {
				t.Errorf("reference parser says (%v, %v), want (true, %v)", ok, st, tt.want.st)
			}
		})
	}
}

// TestHelloParseRefusesEarly checks that garbage is refused on its first
// bad byte, without waiting for more.
func TestHelloParseRefusesEarly(t *testing.T) {
	tests := []struct {
		name string
		in   []byte
	}{
		{"an HTTP request is refused on its first byte", []byte("G")},
		{"an SSH banner is refused on its first byte", []byte("S")},
		{"an SSLv2 hello is refused on its first byte", []byte{0x80}},
		{"a record major version other than 3 is refused on its second byte", []byte{0x16, 2}},
		{"an SSL 2.0 hello is refused on its first byte", []byte{0x80, 0x2e, 1, 3, 1}},
		{"a non-hello handshake is refused on its sixth byte", []byte{0x16, 3, 1, 0, 50, 2}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var h Hello
			if st := h.Parse(tt.in); st != NotThis {
				t.Fatalf("Parse(% x) = %v, want NotThis", tt.in, st)
			}
		})
	}
}

func TestHelloParseSplitFieldsAreReassembled(t *testing.T) {
	alpn := alpnBody("h2", "http/1.1")
	msg := handshake(helloBody(false, sniExt("reassembled.example.com"), ext{extALPN, alpn}))
	sniAt := bytes.Index(msg, []byte("reassembled"))
	alpnAt := bytes.Index(msg, alpn)
	// Cut inside the name and inside the ALPN body.
	wire := records(msg, sniAt+5, alpnAt+3-(sniAt+5))
	h := checkHello(t, wire, wantHello{st: Done, sni: "reassembled.example.com", alpn: alpn})
	if within(h.ServerName, wire) || within(h.ALPN, wire) {
		t.Error("split fields should be reassembled into new slices, not alias the input")
	}
	checkPrefixesNeedMore(t, wire)

	// Fields that sit in one record alias the input, even when other
	// parts of the hello are split.
	wire = records(msg, sniAt-3)
	h = checkHello(t, wire, wantHello{st: Done, sni: "reassembled.example.com", alpn: alpn})
	if !within(h.ServerName, wire) || !within(h.ALPN, wire) {
		t.Error("contiguous fields should alias the input")
	}
}

func TestHelloParseSizeBounds(t *testing.T) {
	// padded returns a hello message of exactly n bytes using a padding extension.
	padded := func(n int) []byte {
		base := len(handshake(helloBody(false, sniExt("example.com"), ext{21, nil})))
		return handshake(helloBody(false, sniExt("example.com"), ext{21, make([]byte, n-base)}))
	}
	tests := []struct {
		name string
		wire []byte
		want Status
	}{
		{"a hello of exactly MaxHelloLen bytes is accepted", records(padded(MaxHelloLen)), Done},
		{"a hello one byte over MaxHelloLen is refused", records(padded(MaxHelloLen+1), 16000), NotThis},
		{"a 5000-byte hello in 1-byte records fits the wire bound", everyN(padded(5000), 1), Done},
		{"a 6000-byte hello in 1-byte records exceeds the wire bound", everyN(padded(6000), 1), NotThis},
		{"a 16 KiB hello in 1 KiB records fits the wire bound", everyN(padded(MaxHelloLen), 1024), Done},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var h Hello
			if st := h.Parse(tt.wire); st != tt.want {
				t.Fatalf("Parse = %v, want %v", st, tt.want)
			}
			if tt.want == NotThis {
				// The refusal needs no bytes beyond the bound.
				if st := h.Parse(tt.wire[:min(len(tt.wire), MaxHelloWire)]); st != NotThis {
					t.Errorf("Parse(first MaxHelloWire bytes) = %v, want NotThis", st)
				}
			}
		})
	}
}

func TestHelloParseFieldsAreClearedBetweenCalls(t *testing.T) {
	wire := goClientHello(t, &tls.Config{ServerName: "example.com", NextProtos: []string{"h2"}})
	var h Hello
	if h.Parse(wire) != Done || h.ServerName == nil || h.ALPN == nil {
		t.Fatal("setup: expected a full parse")
	}
	if st := h.Parse(wire[:len(wire)-1]); st != NeedMore || h.ServerName != nil || h.ALPN != nil {
		t.Errorf("after a NeedMore parse, fields = %+v, want zero", h)
	}
	if st := h.Parse([]byte("GET / HTTP/1.1\r\n")); st != NotThis || h.ServerName != nil {
		t.Errorf("after a NotThis parse, ServerName = %q, want nil", h.ServerName)
	}
}

func TestHelloParseAllocatesNothing(t *testing.T) {
	wire := goClientHello(t, &tls.Config{ServerName: "example.com", NextProtos: []string{"h2", "http/1.1"}})
	msg := defrag(t, wire)
	nameAt := bytes.Index(msg, []byte("example"))
	tests := []struct {
		name string
		in   []byte
		want float64
	}{
		{"a real one-record hello costs nothing", wire, 0},
		{"a hello split into records away from its fields costs nothing", records(msg, nameAt-10), 0},
		{"a split name that has not fully arrived costs nothing", records(msg, nameAt+3)[:5+nameAt+3+5+2], 0},
		{"a name split across records costs one copy", records(msg, nameAt+3), 1},
		{"a hello in 1-byte records costs one copy per field", everyN(msg, 1), 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if n := testing.AllocsPerRun(100, func() { var h Hello; h.Parse(tt.in) }); n != tt.want {
				t.Errorf("Hello.Parse allocs = %v, want %v", n, tt.want)
			}
		})
	}
}

func BenchmarkHelloParse(b *testing.B) {
	wire := goClientHello(b, &tls.Config{ServerName: "example.com", NextProtos: []string{"h2", "http/1.1"}})
	b.SetBytes(int64(len(wire)))
	b.ReportAllocs()
	var h Hello
	for b.Loop() {
		if h.Parse(wire) != Done {
			b.Fatal("not Done")
		}
	}
}
