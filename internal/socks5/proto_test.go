package socks5

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"syscall"
	"testing"

	"github.com/things-go/go-socks5/statute"
)

func TestParseReply(t *testing.T) {
	tests := []struct {
		name     string
		in       []byte
		want     sockAddr
		wantN    int
		wantCode byte // non-zero: a *ReplyError with this code
		wantErr  bool // a malformed-message error
	}{
		{name: "a success reply with an IPv4 BND decodes", in: []byte{5, 0, 0, 1, 192, 0, 2, 1, 0x04, 0x38, 'x'},
			want: sockAddr{ip: netip.MustParseAddr("192.0.2.1"), port: 1080}, wantN: 10},
		{name: "a success reply with an IPv6 BND decodes", in: append(append([]byte{5, 0, 0, 4}, netip.MustParseAddr("2001:db8::1").AsSlice()...), 0, 53),
			want: sockAddr{ip: netip.MustParseAddr("2001:db8::1"), port: 53}, wantN: 22},
		{name: "a success reply with a domain BND decodes", in: []byte{5, 0, 0, 3, 3, 'a', '.', 'b', 0, 80},
			want: sockAddr{host: "a.b", port: 80}, wantN: 10},
		{name: "a failure code becomes a ReplyError", in: []byte{5, 5, 0, 1, 0, 0, 0, 0, 0, 0}, wantCode: 5, wantN: 10},
		{name: "a SOCKS4 version byte is malformed", in: []byte{4, 0, 0, 1, 0, 0, 0, 0, 0, 0}, wantErr: true},
		{name: "an unknown address type is malformed", in: []byte{5, 0, 0, 2, 0, 0, 0, 0, 0, 0}, wantErr: true},
		{name: "an empty domain is malformed", in: []byte{5, 0, 0, 3, 0, 0, 80}, wantErr: true},
		{name: "a truncated IPv4 BND is malformed", in: []byte{5, 0, 0, 1, 192, 0, 2, 1, 0}, wantErr: true},
		{name: "a truncated domain is malformed", in: []byte{5, 0, 0, 3, 5, 'a', 'b', 0, 80}, wantErr: true},
		{name: "three bytes are malformed", in: []byte{5, 0, 0}, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, n, err := parseReply(tt.in)
			var re *ReplyError
			switch {
			case tt.wantErr:
				if !errors.Is(err, errMalformed) {
					t.Fatalf("parseReply error = %v, want malformed", err)
				}
				return
			case tt.wantCode != 0:
				if !errors.As(err, &re) || re.Code != tt.wantCode {
					t.Fatalf("parseReply error = %v, want ReplyError code %d", err, tt.wantCode)
				}
			case err != nil:
				t.Fatalf("parseReply: %v", err)
			case got != tt.want:
				t.Fatalf("parseReply = %+v, want %+v", got, tt.want)
			}
			if n != tt.wantN {
				t.Fatalf("parseReply consumed %d bytes, want %d", n, tt.wantN)
			}
			// readReply must agree and stop exactly at the end of the reply.
			r := bytes.NewReader(tt.in)
			got2, err2 := readReply(r)
			if (err == nil) != (err2 == nil) || got2 != got {
				t.Fatalf("readReply = %+v, %v; parseReply = %+v, %v", got2, err2, got, err)
			}
			if consumed := len(tt.in) - r.Len(); consumed != tt.wantN {
				t.Fatalf("readReply consumed %d bytes, want %d", consumed, tt.wantN)
			}
		})
	}
}

func TestParseUDPHeader(t *testing.T) {
	tests := []struct {
		name     string
		in       []byte
		want     sockAddr
		wantFrag byte
		wantData string
		wantErr  bool
	}{
		{name: "an IPv4 header is stripped from the payload", in: []byte{0, 0, 0, 1, 198, 51, 100, 7, 0, 53, 'h', 'i'},
			want: sockAddr{ip: netip.MustParseAddr("198.51.100.7"), port: 53}, wantData: "hi"},
		{name: "a domain header keeps the name as sent", in: []byte{0, 0, 0, 3, 4, 'E', '.', 't', 'x', 1, 0, 'p'},
			want: sockAddr{host: "E.tx", port: 256}, wantData: "p"},
		{name: "the FRAG byte is reported", in: []byte{0, 0, 7, 1, 198, 51, 100, 7, 0, 53},
			want: sockAddr{ip: netip.MustParseAddr("198.51.100.7"), port: 53}, wantFrag: 7},
		{name: "an empty payload is allowed", in: append(append([]byte{0, 0, 0, 4}, netip.MustParseAddr("2001:db8::9").AsSlice()...), 0, 1),
			want: sockAddr{ip: netip.MustParseAddr("2001:db8::9"), port: 1}},
		{name: "a header cut inside the address is malformed", in: []byte{0, 0, 0, 4, 1, 2, 3}, wantErr: true},
		{name: "an unknown address type is malformed", in: []byte{0, 0, 0, 9, 1, 2, 3, 4, 0, 1}, wantErr: true},
		{name: "three bytes are malformed", in: []byte{0, 0, 0}, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, frag, data, err := parseUDPHeader(tt.in)
			if tt.wantErr {
				if !errors.Is(err, errMalformed) {
					t.Fatalf("parseUDPHeader error = %v, want malformed", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("parseUDPHeader: %v", err)
			}
			if got != tt.want || frag != tt.wantFrag || string(data) != tt.wantData {
				t.Fatalf("parseUDPHeader = %+v frag %d %q, want %+v frag %d %q", got, frag, data, tt.want, tt.wantFrag, tt.wantData)
			}
		})
	}
}

func TestParseTarget(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want sockAddr
	}{
		{name: "a hostname stays a hostname", in: "Example.test:443", want: sockAddr{host: "Example.test", port: 443}},
		{name: "an IPv4 literal becomes an IP", in: "192.0.2.1:80", want: sockAddr{ip: netip.MustParseAddr("192.0.2.1"), port: 80}},
		{name: "an IPv6 literal becomes an IP", in: "[2001:db8::1]:80", want: sockAddr{ip: netip.MustParseAddr("2001:db8::1"), port: 80}},
		{name: "an IPv4-mapped literal is unmapped", in: "[::ffff:192.0.2.1]:80", want: sockAddr{ip: netip.MustParseAddr("192.0.2.1"), port: 80}},
		{name: "a 255-byte hostname fits", in: strings.Repeat("h", 255) + ":1", want: sockAddr{host: strings.Repeat("h", 255), port: 1}},
		{name: "port 0 is passed through", in: "192.0.2.1:0", want: sockAddr{ip: netip.MustParseAddr("192.0.2.1")}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseTarget(tt.in)
			if err != nil {
				t.Fatalf("parseTarget(%q): %v", tt.in, err)
			}
			if got != tt.want {
				t.Fatalf("parseTarget(%q) = %+v, want %+v", tt.in, got, tt.want)
			}
		})
	}
}

func TestUDPHeaderIsBuiltAsRFC1928Says(t *testing.T) {
	tests := []struct {
		name string
		dst  string
		want []byte
	}{
		{name: "a hostname destination uses ATYP 3", dst: "ns.test:53", want: []byte{0, 0, 0, 3, 7, 'n', 's', '.', 't', 'e', 's', 't', 0, 53}},
		{name: "an IPv4 destination uses ATYP 1", dst: "203.0.113.4:123", want: []byte{0, 0, 0, 1, 203, 0, 113, 4, 0, 123}},
		{name: "an IPv6 destination uses ATYP 4", dst: "[2001:db8::2]:443",
			want: append(append([]byte{0, 0, 0, 4}, netip.MustParseAddr("2001:db8::2").AsSlice()...), 1, 0xbb)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, err := parseTarget(tt.dst)
			if err != nil {
				t.Fatal(err)
			}
			if got := datagramHeader(a); !bytes.Equal(got, tt.want) {
				t.Fatalf("header = % x, want % x", got, tt.want)
			}
		})
	}
}

func FuzzParseReply(f *testing.F) {
	f.Add([]byte{5, 0, 0, 1, 192, 0, 2, 1, 0x04, 0x38})
	f.Add([]byte{5, 7, 0, 3, 3, 'a', '.', 'b', 0, 80, 9, 9})
	f.Add(append(append([]byte{5, 0, 0, 4}, make([]byte, 16)...), 0, 1))
	f.Add([]byte{5, 0, 0, 3, 0})
	f.Add([]byte{5, 0, 0, 3, 255})
	f.Fuzz(func(t *testing.T, b []byte) {
		bnd, n, err := parseReply(b)
		var re *ReplyError
		isReply := errors.As(err, &re)
		if err != nil && !isReply && !errors.Is(err, errMalformed) {
			t.Fatalf("parseReply error %v is neither a ReplyError nor malformed", err)
		}
		if err == nil || isReply {
			if n < 4 || n > len(b) {
				t.Fatalf("parseReply consumed %d of %d bytes", n, len(b))
			}
		}
		if isReply && re.Code == 0 {
			t.Fatal("ReplyError with code 0")
		}
		if err == nil {
			// Re-encoding the decoded BND reproduces the consumed bytes.
			if enc := encodeReply(b[:3], bnd); !bytes.Equal(enc, b[:n]) {
				t.Fatalf("re-encoded % x, consumed % x", enc, b[:n])
			}
		}
		// The streaming reader agrees and never reads past the reply.
		r := bytes.NewReader(b)
		bnd2, err2 := readReply(r)
		if (err == nil) != (err2 == nil) || bnd2 != bnd {
			t.Fatalf("readReply = %+v, %v; parseReply = %+v, %v", bnd2, err2, bnd, err)
		}
		if (err == nil || isReply) && len(b)-r.Len() != n {
			t.Fatalf("readReply consumed %d bytes, parseReply %d", len(b)-r.Len(), n)
		}
	})
}

func FuzzParseUDPHeader(f *testing.F) {
	f.Add([]byte{0, 0, 0, 1, 198, 51, 100, 7, 0, 53, 'h', 'i'})
	f.Add([]byte{0, 0, 1, 3, 4, 'E', '.', 't', 'x', 1, 0, 'p'})
	f.Add(append(append([]byte{0, 0, 0, 4}, make([]byte, 16)...), 0, 1))
	f.Add([]byte{0, 0, 0, 3, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		addr, frag, payload, err := parseUDPHeader(b)
		if err != nil {
			if !errors.Is(err, errMalformed) {
				t.Fatalf("parseUDPHeader error %v is not malformed", err)
			}
			return
		}
		if frag != b[2] {
			t.Fatalf("frag = %d, want %d", frag, b[2])
		}
		if addr.host != "" && (len(addr.host) > 255 || addr.ip.IsValid()) {
			t.Fatalf("bad decoded address %+v", addr)
		}
		enc := encodeReply(b[:3], addr)
		enc = append(enc, payload...)
		if !bytes.Equal(enc, b) {
			t.Fatalf("re-encoded % x, input % x", enc, b)
		}
	})
}

func FuzzTargetRoundTrip(f *testing.F) {
	f.Add("example.test:443")
	f.Add("[2001:db8::1]:53")
	f.Add("192.0.2.1:0")
	f.Add("[::ffff:192.0.2.1]:80")
	f.Fuzz(func(t *testing.T, s string) {
		a, err := parseTarget(s)
		if err != nil {
			return
		}
		b := datagramHeader(a)
		got, frag, payload, err := parseUDPHeader(b)
		if err != nil || frag != 0 || len(payload) != 0 || got != a {
			t.Fatalf("parseTarget(%q) = %+v encodes to % x, which decodes to %+v, %d, %q, %v", s, a, b, got, frag, payload, err)
		}
	})
}

// encodeReply is the three bytes head and a encoded by statute (a reply, or
// with RSV RSV FRAG a datagram's header).
func encodeReply(head []byte, a sockAddr) []byte {
	return statute.Reply{Version: head[0], Response: head[1], Reserved: head[2], BndAddr: spec(a)}.Bytes()
}

func TestShortAndEmptyDatagramsAreRead(t *testing.T) {
	// statute.ParseDatagram alone refuses these valid datagrams (see
	// parseUDPHeader); the relay's reads must not.
	tests := []struct {
		name string
		in   []byte
		want sockAddr
		data string
	}{
		{"a one-letter name with a one-byte payload (9 bytes)", []byte{0, 0, 0, 3, 1, 'a', 0, 53, 'x'}, sockAddr{host: "a", port: 53}, "x"},
		{"a name with an empty payload", []byte{0, 0, 0, 3, 3, 'a', '.', 'b', 0, 53}, sockAddr{host: "a.b", port: 53}, ""},
		{"an IPv4 header with an empty payload", []byte{0, 0, 0, 1, 192, 0, 2, 1, 0, 53}, sockAddr{ip: netip.MustParseAddr("192.0.2.1"), port: 53}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, spare := range []int{0, 64} {
				b := make([]byte, len(tt.in), len(tt.in)+spare)
				copy(b, tt.in)
				got, frag, data, err := parseUDPHeader(b)
				if err != nil || frag != 0 || got != tt.want || string(data) != tt.data {
					t.Fatalf("spare %d: parseUDPHeader = %+v %d %q %v, want %+v %q", spare, got, frag, data, err, tt.want, tt.data)
				}
			}
			// One byte short of its header is malformed, spare capacity
			// or not.
			hdr := len(tt.in) - len(tt.data)
			for _, spare := range []int{0, 64} {
				b := make([]byte, hdr-1, hdr-1+spare)
				copy(b, tt.in)
				if _, _, _, err := parseUDPHeader(b); !errors.Is(err, errMalformed) {
					t.Fatalf("a header cut by one byte (spare %d): err %v, want malformed", spare, err)
				}
			}
		})
	}
}

func TestAProxysRefusalIsTheErrnoOfADirectOne(t *testing.T) {
	for code, want := range map[byte]error{
		ReplyConnectionRefused:  syscall.ECONNREFUSED,
		ReplyHostUnreachable:    syscall.EHOSTUNREACH,
		ReplyNetworkUnreachable: syscall.ENETUNREACH,
	} {
		err := fmt.Errorf("dial: %w", &ReplyError{Code: code})
		if !errors.Is(err, want) {
			t.Errorf("reply %d is not %v", code, want)
		}
	}
	if errors.Is(&ReplyError{Code: ReplyNotAllowed}, syscall.ECONNREFUSED) {
		t.Error("a refusal by the proxy's rules is a refused connection")
	}
}
