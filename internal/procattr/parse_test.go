package procattr

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/netip"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"
)

func TestMatchScoreDecidesWhichSocketOwnsAFlow(t *testing.T) {
	local := netip.MustParseAddrPort("10.0.0.2:40000")
	remote := netip.MustParseAddrPort("192.0.2.9:53")
	any4 := netip.AddrPortFrom(netip.IPv4Unspecified(), 0)
	any6 := netip.AddrPortFrom(netip.IPv6Unspecified(), 0)
	v6local := netip.MustParseAddrPort("[fd00::2]:40000")
	v6remote := netip.MustParseAddrPort("[2001:db8::9]:53")
	const est, listen = 1, tcpListen
	tests := []struct {
		name    string
		proto   uint8
		s       diagSock
		l, r    netip.AddrPort
		atLeast int // -1 means must not match
	}{
		{"an exact TCP 4-tuple matches best", unix.IPPROTO_TCP,
			diagSock{family: unix.AF_INET, state: est, local: local, remote: remote}, local, remote, 4},
		{"a TCP listener never owns an outgoing flow", unix.IPPROTO_TCP,
			diagSock{family: unix.AF_INET, state: listen, local: netip.AddrPortFrom(netip.IPv4Unspecified(), 40000), remote: any4}, local, remote, -1},
		{"a TCP socket to another peer does not match", unix.IPPROTO_TCP,
			diagSock{family: unix.AF_INET, state: est, local: local, remote: netip.MustParseAddrPort("192.0.2.9:54")}, local, remote, -1},
		{"a connected UDP socket matches its 4-tuple", unix.IPPROTO_UDP,
			diagSock{family: unix.AF_INET, local: local, remote: remote}, local, remote, 4},
		{"an unconnected UDP socket bound to the address matches", unix.IPPROTO_UDP,
			diagSock{family: unix.AF_INET, local: local, remote: any4}, local, remote, 2},
		{"an unconnected UDP socket bound to 0.0.0.0 matches least", unix.IPPROTO_UDP,
			diagSock{family: unix.AF_INET, local: netip.AddrPortFrom(netip.IPv4Unspecified(), 40000), remote: any4}, local, remote, 0},
		{"a UDP socket on another port does not match", unix.IPPROTO_UDP,
			diagSock{family: unix.AF_INET, local: netip.MustParseAddrPort("10.0.0.2:40001"), remote: any4}, local, remote, -1},
		{"a UDP socket bound to another address does not match", unix.IPPROTO_UDP,
			diagSock{family: unix.AF_INET, local: netip.MustParseAddrPort("10.0.0.3:40000"), remote: any4}, local, remote, -1},
		{"a dual-stack [::] UDP socket matches an IPv4 flow", unix.IPPROTO_UDP,
			diagSock{family: unix.AF_INET6, local: netip.AddrPortFrom(netip.IPv6Unspecified(), 40000), remote: any6}, local, remote, 0},
		{"a v6-only [::] UDP socket does not match an IPv4 flow", unix.IPPROTO_UDP,
			diagSock{family: unix.AF_INET6, v6only: true, local: netip.AddrPortFrom(netip.IPv6Unspecified(), 40000), remote: any6}, local, remote, -1},
		{"an AF_INET 0.0.0.0 socket does not match an IPv6 flow", unix.IPPROTO_UDP,
			diagSock{family: unix.AF_INET, local: netip.AddrPortFrom(netip.IPv4Unspecified(), 40000), remote: any4}, v6local, v6remote, -1},
		{"an IPv6 UDP socket matches an IPv6 flow exactly", unix.IPPROTO_UDP,
			diagSock{family: unix.AF_INET6, local: v6local, remote: v6remote}, v6local, v6remote, 4},
		{"a UDP socket connected elsewhere does not match", unix.IPPROTO_UDP,
			diagSock{family: unix.AF_INET, local: local, remote: netip.MustParseAddrPort("192.0.2.10:53")}, local, remote, -1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := matchScore(tt.proto, tt.s, tt.l, tt.r)
			if tt.atLeast < 0 && got >= 0 || tt.atLeast >= 0 && got != tt.atLeast {
				t.Fatalf("matchScore = %d, want %d", got, tt.atLeast)
			}
		})
	}
}

func TestEncodeDiagRequestLayout(t *testing.T) {
	src := netip.MustParseAddrPort("10.1.2.3:258")
	dst := netip.MustParseAddrPort("192.0.2.4:772")
	b := encodeDiagRequest(nil, 99, unix.NLM_F_REQUEST, unix.AF_INET, unix.IPPROTO_UDP, src, dst)
	if len(b) != 72 {
		t.Fatalf("request is %d bytes, want 72 (nlmsghdr 16 + inet_diag_req_v2 56)", len(b))
	}
	// Ports are big-endian on the wire; addresses are in network order.
	wantID := []byte{1, 2, 3, 4, 10, 1, 2, 3}
	if got := b[24 : 24+8]; !bytes.Equal(got, wantID) {
		t.Fatalf("sport,dport,src = % x, want % x", got, wantID)
	}
	if got := b[24+20 : 24+24]; !bytes.Equal(got, []byte{192, 0, 2, 4}) {
		t.Fatalf("dst = % x", got)
	}
	q, err := decodeDiagRequest(b)
	if err != nil {
		t.Fatal(err)
	}
	if q.seq != 99 || q.src != src || q.dst != dst || q.proto != unix.IPPROTO_UDP || q.states != allStates {
		t.Fatalf("decoded %+v", q)
	}
	b6 := encodeDiagRequest(nil, 1, unix.NLM_F_REQUEST, unix.AF_INET6, unix.IPPROTO_TCP, src, dst)
	mapped := netip.AddrFrom4(src.Addr().As4()).As16()
	if got := b6[24+4 : 24+20]; !bytes.Equal(got, mapped[:]) {
		t.Fatalf("IPv4 in an AF_INET6 request = % x, want v4-mapped % x", got, mapped)
	}
}

func TestParseDiagMsgRejectsShortAndForeignMessages(t *testing.T) {
	good := encodeDiagMsg(1, 0, diagSock{family: unix.AF_INET, local: netip.MustParseAddrPort("10.0.0.1:1"), remote: netip.MustParseAddrPort("10.0.0.2:2"), inode: 5})
	tests := []struct {
		name    string
		payload []byte
		ok      bool
	}{
		{"a full inet_diag_msg parses", good[sizeofNlMsghdr:], true},
		{"a truncated inet_diag_msg is an error", good[sizeofNlMsghdr : len(good)-1], false},
		{"an AF_UNIX family is an error", append([]byte{unix.AF_UNIX}, good[sizeofNlMsghdr+1:]...), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parseDiagMsg(tt.payload)
			if (err == nil) != tt.ok {
				t.Fatalf("parseDiagMsg error = %v, want ok=%v", err, tt.ok)
			}
		})
	}
}

func TestParseNSpidTakesTheInnermostPID(t *testing.T) {
	tests := []struct {
		name   string
		status string
		want   int
	}{
		{"a process in the initial pid namespace has one field", "Name:\tx\nNSpid:\t42\n", 42},
		{"a nested process reports its innermost pid", "Name:\tx\nNSpid:\t4242\t17\t1\nNSpgid:\t1\n", 1},
		{"a missing NSpid line is 0", "Name:\tx\nPid:\t5\n", 0},
		{"an empty NSpid line is 0", "NSpid:\n", 0},
		{"garbage in NSpid is 0", "NSpid:\tabc\n", 0},
		{"a last line without newline parses", "Name:\tx\nNSpid:\t8\t3", 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := parseNSpid([]byte(tt.status)); got != tt.want {
				t.Fatalf("parseNSpid = %d, want %d", got, tt.want)
			}
		})
	}
}

func TestParseBracketInode(t *testing.T) {
	tests := []struct {
		name string
		link string
		kind string
		want uint64
		ok   bool
	}{
		{"a socket link parses", "socket:[12345]", "socket", 12345, true},
		{"a netns link parses", "net:[4026531840]", "net", 4026531840, true},
		{"another kind does not parse", "pipe:[12]", "socket", 0, false},
		{"a path does not parse", "/dev/null", "socket", 0, false},
		{"an empty number does not parse", "net:[]", "net", 0, false},
		{"a missing bracket does not parse", "net:[12", "net", 0, false},
		{"a signed number does not parse", "net:[-1]", "net", 0, false},
		{"an overflowing number does not parse", "net:[18446744073709551616]", "net", 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := parseBracketInode([]byte(tt.link), tt.kind)
			if got != tt.want || ok != tt.ok {
				t.Fatalf("parseBracketInode(%q) = %d,%v; want %d,%v", tt.link, got, ok, tt.want, tt.ok)
			}
		})
	}
}

// FuzzHandleDatagram feeds arbitrary bytes to the reply parser: it must never
// panic, and every socket it yields must carry valid addresses.
func FuzzHandleDatagram(f *testing.F) {
	s := diagSock{family: unix.AF_INET6, local: netip.MustParseAddrPort("[2001:db8::1]:80"), remote: netip.MustParseAddrPort("[2001:db8::2]:81"), inode: 9, v6only: true}
	f.Add(encodeDiagMsg(7, 0, s), uint32(7), false)
	f.Add(append(encodeDiagMsg(7, unix.NLM_F_MULTI, s), encodeDone(7)...), uint32(7), true)
	f.Add(encodeNlError(7, unix.ENOENT), uint32(7), false)
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 20, 0, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0}, uint32(7), true)
	f.Fuzz(func(t *testing.T, b []byte, seq uint32, dump bool) {
		n := 0
		_, _ = handleDatagram(b, seq, dump, func(s diagSock) bool {
			n++
			if !s.local.IsValid() || !s.remote.IsValid() || s.local.Addr().Is4In6() || s.remote.Addr().Is4In6() {
				t.Fatalf("parsed socket with bad addresses: %+v", s)
			}
			return true
		})
		if n > len(b)/sizeofNlMsghdr {
			t.Fatalf("%d sockets from %d bytes", n, len(b))
		}
	})
}

// FuzzDiagMsgRoundTrip checks that what encodeDiagMsg writes, parseDiagMsg
// reads back.
func FuzzDiagMsgRoundTrip(f *testing.F) {
	f.Add(true, []byte{10, 0, 0, 1}, uint16(1), []byte{192, 0, 2, 1}, uint16(2), uint32(0), uint32(1), uint8(1), false)
	f.Add(false, bytes.Repeat([]byte{0x20}, 16), uint16(443), make([]byte, 16), uint16(0), uint32(1000), ^uint32(0), uint8(10), true)
	f.Fuzz(func(t *testing.T, v4 bool, la []byte, lp uint16, ra []byte, rp uint16, uid, inode uint32, state uint8, v6only bool) {
		mk := func(b []byte) (netip.Addr, bool) {
			if v4 {
				if len(b) < 4 {
					return netip.Addr{}, false
				}
				return netip.AddrFrom4([4]byte(b[:4])), true
			}
			if len(b) < 16 {
				return netip.Addr{}, false
			}
			return netip.AddrFrom16([16]byte(b[:16])).Unmap(), true
		}
		l, ok1 := mk(la)
		r, ok2 := mk(ra)
		if !ok1 || !ok2 {
			return
		}
		fam := uint8(unix.AF_INET6)
		if v4 {
			fam, v6only = unix.AF_INET, false
		}
		in := diagSock{family: fam, state: state, local: netip.AddrPortFrom(l, lp), remote: netip.AddrPortFrom(r, rp), uid: uid, inode: uint64(inode), v6only: v6only}
		msg := encodeDiagMsg(3, 0, in)
		var out diagSock
		finished, err := handleDatagram(msg, 3, false, func(s diagSock) bool { out = s; return false })
		if err != nil || !finished {
			t.Fatalf("handleDatagram: finished=%v err=%v", finished, err)
		}
		if out != in {
			t.Fatalf("round trip:\n in  %+v\n out %+v", in, out)
		}
	})
}

// FuzzParseNSpid: never panics; a well-formed line yields its last field.
func FuzzParseNSpid(f *testing.F) {
	f.Add([]byte("Name:\tbash\nNSpid:\t100\t1\n"), uint32(100), uint32(7))
	f.Add([]byte("NSpid:"), uint32(1), uint32(1))
	f.Fuzz(func(t *testing.T, status []byte, outer, inner uint32) {
		if got := parseNSpid(status); got < 0 {
			t.Fatalf("parseNSpid(%q) = %d", status, got)
		}
		outer, inner = outer%(1<<22)+1, inner%(1<<22)+1
		prefix := bytes.ReplaceAll(status, []byte("NSpid:"), []byte("nspid:"))
		doc := fmt.Appendf(append(append([]byte{}, prefix...), '\n'), "NSpid:\t%d\t%d\nNSpgid:\t1\n", outer, inner)
		if got := parseNSpid(doc); got != int(inner) {
			t.Fatalf("parseNSpid(%q) = %d, want %d", doc, got, inner)
		}
	})
}

// FuzzParseBracketInode: never panics, and a parsed link re-encodes to itself.
func FuzzParseBracketInode(f *testing.F) {
	f.Add([]byte("socket:[123]"))
	f.Add([]byte("net:[4026531840]"))
	f.Add([]byte("socket:[00]"))
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, kind := range []string{"socket", "net"} {
			n, ok := parseBracketInode(b, kind)
			if !ok {
				continue
			}
			digits := b[len(kind)+2 : len(b)-1]
			v, err := strconv.ParseUint(string(digits), 10, 64)
			if err != nil || v != n {
				t.Fatalf("parseBracketInode(%q) = %d, but digits say %d (%v)", b, n, v, err)
			}
			if string(b[:len(kind)]) != kind {
				t.Fatalf("parseBracketInode(%q) accepted kind %q", b, kind)
			}
			if enc := appendBracketInode(nil, kind, n); len(digits) > 0 && digits[0] != '0' && !bytes.Equal(enc, b) {
				t.Fatalf("re-encoded %q as %q", b, enc)
			}
		}
	})
}

// FuzzForEachDirent: arbitrary getdents buffers never panic or yield NULs.
func FuzzForEachDirent(f *testing.F) {
	rec := func(name string) []byte {
		l := (19 + len(name) + 1 + 7) &^ 7
		b := make([]byte, l)
		binary.NativeEndian.PutUint16(b[16:], uint16(l))
		copy(b[19:], name)
		return b
	}
	f.Add(append(append(rec("."), rec("..")...), rec("1234")...))
	f.Fuzz(func(t *testing.T, b []byte) {
		forEachDirent(b, func(name []byte) {
			if bytes.IndexByte(name, 0) >= 0 || string(name) == "." || string(name) == ".." {
				t.Fatalf("bad name %q", name)
			}
		})
	})
}

// FuzzParseFD checks the descriptor-name parser of the fd index: decimal
// names up to 9 digits round-trip; anything else is refused, never negative.
func FuzzParseFD(f *testing.F) {
	f.Add([]byte("0"), uint32(3))
	f.Add([]byte("999999999"), uint32(999999999))
	f.Add([]byte("1234567890"), uint32(1<<31-1))
	f.Add([]byte("-1"), uint32(0))
	f.Fuzz(func(t *testing.T, name []byte, n uint32) {
		if fd, ok := parseFD(name); ok {
			if v, err := strconv.ParseInt(string(name), 10, 64); err != nil || v != int64(fd) || fd < 0 {
				t.Fatalf("parseFD(%q) = %d", name, fd)
			}
		}
		n %= 1_000_000_000
		if fd, ok := parseFD([]byte(strconv.Itoa(int(n)))); !ok || fd != int32(n) {
			t.Fatalf("parseFD(%d) = %d, %v", n, fd, ok)
		}
	})
}
