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
	tests := []struct {
		name string
		in   string
		kind Kind
		ok   bool
	}{
		{"no bytes cannot be classified yet", "", Unknown, false},
		{"a handshake byte alone waits for the version", "\x16", Unknown, false},
		{"a handshake byte and major version wait for the minor", "\x16\x03", Unknown, false},
		{"a TLS 1.0 record header is TLS", "\x16\x03\x01", TLS, true},
		{"a TLS 1.2 record header is TLS", "\x16\x03\x03\x00", TLS, true},
		{"record version 3.0 is not TLS we parse", "\x16\x03\x00", Unknown, true},
		{"a handshake byte with major version 2 is unknown", "\x16\x02", Unknown, true},
		{"an alert record is unknown", "\x15\x03\x03", Unknown, true},
		{"a method and space is HTTP", "GET ", HTTP, true},
		{"a long method and space is HTTP", "MKCALENDAR /", HTTP, true},
		{"a method prefix waits", "OPTI", Unknown, false},
		{"a full method waits for its space", "POST", Unknown, false},
		{"a method followed by a letter is unknown", "POSTS", Unknown, true},
		{"a lower-case method is unknown", "get ", Unknown, true},
		{"an unknown word is unknown after one byte", "Z", Unknown, true},
		{"an SSH banner is unknown", "SSH-2.0-OpenSSH", Unknown, true},
		{"HTTP/2 prior knowledge is unknown", "PRI * HTTP/2.0", Unknown, true},
		{"eleven letters with no space is unknown", "MKCALENDARS", Unknown, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k, ok := Classify([]byte(tt.in))
			if k != tt.kind || ok != tt.ok {
				t.Fatalf("Classify(%q) = %v, %v; want %v, %v", tt.in, k, ok, tt.kind, tt.ok)
			}
		})
	}
}

// TestClassifyAgreesWithParsers: whatever Classify decides is consistent
// with what the parsers say about the same bytes.
func TestClassifyAgreesWithParsers(t *testing.T) {
	inputs := []string{
		"GET / HTTP/1.1\r\nHost: example.com\r\n\r\n",
		"CONNECT example.com:443 HTTP/1.1\r\n\r\n",
		"\x16\x03\x01\x00\x05\x01\x00\x00\x01\x00",
		"SSH-2.0-x\r\n",
		"\x00\x01\x02",
	}
	for _, in := range inputs {
		for n := range len(in) + 1 {
			b := []byte(in[:n])
			k, ok := Classify(b)
			var h Hello
			var r Request
			if ok && k != TLS && h.Parse(b) != NotThis {
				t.Errorf("Classify(%q) = %v but Hello.Parse does not refuse it", b, k)
			}
			if ok && k != HTTP && r.Parse(b) != NotThis {
				t.Errorf("Classify(%q) = %v but Request.Parse does not refuse it", b, k)
			}
		}
	}
}

func TestValidHostname(t *testing.T) {
	label63 := strings.Repeat("a", 63)
	name253 := strings.Join([]string{label63, label63, label63, strings.Repeat("b", 61)}, ".")
	tests := []struct {
		name string
		in   string
		want bool
	}{
		{"a simple name is valid", "example.com", true},
		{"a single label is valid", "localhost", true},
		{"a trailing dot is allowed", "example.com.", true},
		{"mixed case is valid", "WWW.Example.COM", true},
		{"digits and inner hyphens are valid", "a-1.b2-c.example", true},
		{"an all-digit inner label is valid", "123.example.com", true},
		{"an A-label is valid", "xn--bcher-kva.example", true},
		{"a 63-byte label is valid", label63 + ".com", true},
		{"a 253-byte name is valid", name253, true},
		{"a 253-byte name with a trailing dot is valid", name253 + ".", true},
		{"an empty name is invalid", "", false},
		{"a lone dot is invalid", ".", false},
		{"two trailing dots are invalid", "example.com..", false},
		{"a leading dot is invalid", ".example.com", false},
		{"an empty label is invalid", "a..b", false},
		{"a 64-byte label is invalid", label63 + "a.com", false},
		{"a 254-byte name is invalid", name253 + "b", false},
		{"a label starting with a hyphen is invalid", "-a.example", false},
		{"a label ending with a hyphen is invalid", "a-.example", false},
		{"a name ending with a hyphen is invalid", "example.com-", false},
		{"an underscore is invalid", "_dmarc.example.com", false},
		{"a space is invalid", "exa mple.com", false},
		{"a NUL is invalid", "example.com\x00.evil", false},
		{"a port is invalid", "example.com:443", false},
		{"an IPv4 literal is not a hostname", "192.0.2.1", false},
		{"an IPv6 literal is not a hostname", "2001:db8::1", false},
		{"a U-label is invalid", "bücher.example", false},
		{"a wildcard is invalid", "*.example.com", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := ValidHostname([]byte(tt.in)); got != tt.want {
				t.Fatalf("ValidHostname(%q) = %v, want %v", tt.in, got, tt.want)
			}
		})
	}
	if n := testing.AllocsPerRun(100, func() { ValidHostname([]byte(name253)) }); n != 0 {
		t.Errorf("ValidHostname allocs = %v, want 0", n)
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
