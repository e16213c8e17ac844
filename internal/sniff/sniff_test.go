package sniff

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

func TestClassify(t *testing.T) {
	long := func(n int) string { return strings.Repeat("x", n) }
	tests := []struct {
		name string
		in   string
		kind Kind
		safe int
		ok   bool
	}{
		{"no bytes cannot be classified yet", "", Unknown, 0, false},
		{"a handshake record byte is TLS at once", "\x16", TLS, 0, true},
		{"a TLS 1.2 record header is TLS", "\x16\x03\x03\x00", TLS, 0, true},
		{"record version 3.0 is TLS", "\x16\x03\x00", TLS, 0, true},
		{"record version 0.0 is TLS (Go's server reads it)", "\x16\x00\x00", TLS, 0, true},
		{"an alert record first is TLS (servers skip warnings)", "\x15\x03\x03", TLS, 0, true},
		{"a change_cipher_spec record first is TLS", "\x14\x03\x03", TLS, 0, true},
		{"an SSL 2.0 ClientHello for TLS is TLS", "\x80\x2e\x01\x03\x01", TLS, 0, true},
		{"an SSL 2.0 ClientHello for SSL 2.0 is TLS", "\x80\x2e\x01\x00\x02", TLS, 0, true},
		{"a high first byte waits, and may pass", "\x80\x2e\x01", Unknown, 3, false},
		{"a high first byte that is no SSL 2.0 hello is unknown", "\x80\x01\x00\x01", Unknown, 0, true},
		{"a method and space is HTTP", "GET ", HTTP, 0, true},
		{"a lower-case method is HTTP", "get ", HTTP, 0, true},
		{"a mixed-case method is HTTP", "pOsT /", HTTP, 0, true},
		{"a long method and space is HTTP", "MKCALENDAR /", HTTP, 0, true},
		{"a method and a tab is HTTP", "GET\t/", HTTP, 0, true},
		{"a method and a bare CR is HTTP", "GET\r/", HTTP, 0, true},
		{"empty lines before a method are HTTP", "\r\n\r\nPOST ", HTTP, 0, true},
		{"empty lines alone wait, and may pass", "\r\n\n", Unknown, 3, false},
		{"any token with an HTTP version is HTTP", "FROB /x HTTP/1.1", HTTP, 0, true},
		{"odd spacing and a lower-case version is HTTP", "FROB  /x\thttp/1.1", HTTP, 0, true},
		{"HTTP/2 prior knowledge is HTTP", "PRI * HTTP/2.0", HTTP, 0, true},
		{"a first word waits, and may pass", "OPTI", Unknown, 4, false},
		{"an unknown word waits, and may pass", "Z", Unknown, 1, false},
		{"a word and a CR waits for the LF", "PING\r", Unknown, 4, false},
		{"a word that ends its line is unknown", "PING\r\n", Unknown, 0, true},
		{"a method that ends its line is unknown", "GET\r\n", Unknown, 0, true},
		{"a token, space and more waits for a version, passing the token", "FROB /x HT", Unknown, 4, false},
		{"a line without a version is unknown", "FROB /x\r\n", Unknown, 0, true},
		{"a NUL before a version is unknown (git://)", "0032git-upload-pack /p\x00host=a\x00", Unknown, 0, true},
		{"an SSH banner is unknown at its line end", "SSH-2.0-OpenSSH_9.6\r\n", Unknown, 0, true},
		{"a RESP command is unknown", "*1\r\n$4\r\nPING\r\n", Unknown, 0, true},
		{"a word ending in a non-token byte is unknown", "AMQP\x00\x00\x09\x01", Unknown, 0, true},
		{"a binary first byte is unknown", "\x00\x00\x00\x08", Unknown, 0, true},
		{"white space before a method is HTTP", " GET /", HTTP, 0, true},
		{"a PROXY v1 header is HTTP (a request may follow)", "PROXY TCP4 192.0.2.1 192.0.2.2 1 2\r\n", HTTP, 0, true},
		{"a PROXY v2 header is HTTP (a request may follow)", "\r\n\r\n\x00\r\nQUIT\n\x21", HTTP, 0, true},
		{"the start of a PROXY v2 signature waits, passing the empty lines", "\r\n\r\n\x00\r", Unknown, 4, false},
		{"a word of MaxRequestHead bytes is HTTP (it might be a method)", long(MaxRequestHead), HTTP, 0, true},
		{"a word one byte shorter waits", long(MaxRequestHead - 1), Unknown, MaxRequestHead - 1, false},
		{"an undecided line of MaxRequestHead bytes is HTTP", "FROB /" + long(MaxRequestHead), HTTP, 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k, safe, ok := Classify([]byte(tt.in))
			if k != tt.kind || safe != tt.safe || ok != tt.ok {
				t.Fatalf("Classify(%.40q) = %v, %d, %v; want %v, %d, %v", tt.in, k, safe, ok, tt.kind, tt.safe, tt.ok)
			}
		})
	}
	if n := testing.AllocsPerRun(100, func() { Classify([]byte("FROB /x HTTP/1.1\r\n")) }); n != 0 {
		t.Errorf("Classify allocs = %v, want 0", n)
	}
}

// TestClassifyAgreesWithParsers: whatever Classify decides is consistent
// with what the parsers say about the same bytes, prefix by prefix.
func TestClassifyAgreesWithParsers(t *testing.T) {
	inputs := []string{
		"GET / HTTP/1.1\r\nHost: example.com\r\n\r\n",
		"\r\nget /x HTTP/1.0\r\n\r\n",
		"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n",
		"\x16\x03\x01\x00\x05\x01\x00\x00\x01\x00",
		"SSH-2.0-x\r\n",
		"\x00\x01\x02",
	}
	for _, in := range inputs {
		for n := range len(in) + 1 {
			b := []byte(in[:n])
			k, _, ok := Classify(b)
			var h Hello
			var r Request
			if ok && k != TLS && h.Parse(b) != NotThis {
				t.Errorf("Classify(%q) = %v but Hello.Parse does not refuse it", b, k)
			}
			if ok && k != HTTP && r.Parse(b) != NotThis {
				t.Errorf("Classify(%q) = %v but Request.Parse does not refuse it", b, k)
			}
			if r.Parse(b) == Done && (!ok || k != HTTP) {
				t.Errorf("Request.Parse(%q) = Done but Classify says %v, %v", b, k, ok)
			}
		}
	}
}

func TestStringers(t *testing.T) {
	tests := []struct {
		name string
		got  string
		want string
	}{
		{"NeedMore names itself", NeedMore.String(), "NeedMore"},
		{"Done names itself", Done.String(), "Done"},
		{"NotThis names itself", NotThis.String(), "NotThis"},
		{"an unknown Status says so", Status(9).String(), "Status(?)"},
		{"Unknown names itself", Unknown.String(), "unknown"},
		{"TLS names itself", TLS.String(), "tls"},
		{"HTTP names itself", HTTP.String(), "http"},
		{"an unknown Kind says so", Kind(9).String(), "Kind(?)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.got != tt.want {
				t.Fatalf("got %q, want %q", tt.got, tt.want)
			}
		})
	}
}

// TestImportsOnlyPureStdlib keeps the package a pure leaf (STYLE 2.1): its
// non-test files import only these standard packages.
func TestImportsOnlyPureStdlib(t *testing.T) {
	allowed := map[string]bool{"bytes": true}
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	checked := 0
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		src, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		f, err := parser.ParseFile(fset, name, src, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range f.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			if !allowed[path] {
				t.Errorf("%s imports %q; sniff may import only %v", name, path, allowed)
			}
		}
		checked++
	}
	if checked == 0 {
		t.Fatal("found no source files to check")
	}
}
