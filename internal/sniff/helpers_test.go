package sniff

import (
	"bytes"
	"crypto/ecdh"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"net"
	"testing"
	"time"
	"unsafe"
)

// pipeConn is a net.Conn whose reads come from in (then io.EOF) and whose
// writes are recorded in out. It lets a crypto/tls client or server run one
// flight against fixed bytes, with no sockets.
type pipeConn struct {
	in  *bytes.Reader
	out bytes.Buffer
}

func (c *pipeConn) Read(p []byte) (int, error)       { return c.in.Read(p) }
func (c *pipeConn) Write(p []byte) (int, error)      { return c.out.Write(p) }
func (c *pipeConn) Close() error                     { return nil }
func (c *pipeConn) LocalAddr() net.Addr              { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1} }
func (c *pipeConn) RemoteAddr() net.Addr             { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 2} }
func (c *pipeConn) SetDeadline(time.Time) error      { return nil }
func (c *pipeConn) SetReadDeadline(time.Time) error  { return nil }
func (c *pipeConn) SetWriteDeadline(time.Time) error { return nil }

// goClientHello returns the bytes crypto/tls writes as a client's first
// flight with cfg: the ClientHello in TLS records.
func goClientHello(t testing.TB, cfg *tls.Config) []byte {
	t.Helper()
	c := &pipeConn{in: bytes.NewReader(nil)}
	err := tls.Client(c, cfg).Handshake()
	if err == nil {
		t.Fatal("handshake against EOF succeeded")
	}
	if c.out.Len() == 0 {
		t.Fatalf("crypto/tls wrote no ClientHello: %v", err)
	}
	return c.out.Bytes()
}

var errSeen = errors.New("client hello seen")

// goServerView feeds wire to a crypto/tls server and returns the
// ClientHelloInfo it parsed, or ok=false if it rejected the ClientHello.
// It is the independent oracle for what a real TLS stack reads from wire.
func goServerView(t testing.TB, wire []byte) (info tls.ClientHelloInfo, ok bool) {
	t.Helper()
	c := &pipeConn{in: bytes.NewReader(wire)}
	cfg := &tls.Config{GetConfigForClient: func(chi *tls.ClientHelloInfo) (*tls.Config, error) {
		info, ok = *chi, true
		return nil, errSeen
	}}
	_ = tls.Server(c, cfg).Handshake()
	return info, ok
}

// echConfigList returns an ECHConfigList (draft-ietf-tls-esni, version
// 0xfe0d) for a fresh X25519 key, naming publicName as the outer SNI.
func echConfigList(t testing.TB, publicName string) []byte {
	t.Helper()
	key, err := ecdh.X25519().GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	var c []byte
	c = append(c, 7)                      // config_id
	c = be16(c, 0x0020)                   // DHKEM(X25519, HKDF-SHA256)
	c = vec16(c, key.PublicKey().Bytes()) // public_key
	c = vec16(c, []byte{0, 1, 0, 1})      // HKDF-SHA256, AES-128-GCM
	c = append(c, 0)                      // maximum_name_length
	c = append(c, byte(len(publicName)))  // public_name
	c = append(c, publicName...)          //
	c = be16(c, 0)                        // extensions
	cfg := vec16(be16(nil, 0xfe0d), c)    // ECHConfig
	return vec16(nil, cfg)                // ECHConfigList
}

func be16(b []byte, v int) []byte { return append(b, byte(v>>8), byte(v)) }
func be24(b []byte, v int) []byte { return append(b, byte(v>>16), byte(v>>8), byte(v)) }
func vec16(b, body []byte) []byte { return append(be16(b, len(body)), body...) }

// ext is one raw ClientHello extension.
type ext struct {
	typ  int
	body []byte
}

// sniExt builds a server_name extension with one host_name entry per name.
func sniExt(names ...string) ext {
	var list []byte
	for _, n := range names {
		list = append(list, 0)
		list = vec16(list, []byte(n))
	}
	return ext{extServerName, vec16(nil, list)}
}

// alpnExt builds an ALPN extension body for protos.
func alpnExt(protos ...string) ext {
	return ext{extALPN, alpnBody(protos...)}
}

func alpnBody(protos ...string) []byte {
	var list []byte
	for _, p := range protos {
		list = append(list, byte(len(p)))
		list = append(list, p...)
	}
	return vec16(nil, list)
}

// helloBody builds a ClientHello body (no handshake header) with a 32-byte
// session id, two cipher suites, null compression and exts. With noExts the
// extensions block is left out entirely, as TLS 1.0-1.2 clients may.
func helloBody(noExts bool, exts ...ext) []byte {
	var b []byte
	b = be16(b, 0x0303)
	b = append(b, make([]byte, 32)...) // random
	b = append(b, 32)
	b = append(b, bytes.Repeat([]byte{0xab}, 32)...) // session id
	b = vec16(b, []byte{0x13, 0x01, 0xc0, 0x2f})
	b = append(b, 1, 0) // compression: null
	if noExts {
		return b
	}
	var e []byte
	for _, x := range exts {
		e = be16(e, x.typ)
		e = vec16(e, x.body)
	}
	return vec16(b, e)
}

// handshake wraps a ClientHello body in its 4-byte handshake header.
func handshake(body []byte) []byte {
	return append(be24([]byte{handshakeTypeClientHello}, len(body)), body...)
}

// records cuts msg into TLS handshake records whose payload sizes are
// sizes (the last record takes whatever is left; a size <= 0 is skipped).
func records(msg []byte, sizes ...int) []byte {
	var out []byte
	for len(msg) > 0 {
		n := len(msg)
		for len(sizes) > 0 {
			s := sizes[0]
			sizes = sizes[1:]
			if s > 0 {
				n = min(s, len(msg))
				break
			}
		}
		out = append(out, recordTypeHandshake, 3, 1)
		out = be16(out, n)
		out = append(out, msg[:n]...)
		msg = msg[n:]
	}
	return out
}

// everyN cuts msg into records of n payload bytes each.
func everyN(msg []byte, n int) []byte {
	sizes := make([]int, 0, len(msg)/n+1)
	for range len(msg)/n + 1 {
		sizes = append(sizes, n)
	}
	return records(msg, sizes...)
}

// defrag returns the handshake message carried by the records in wire.
func defrag(t testing.TB, wire []byte) []byte {
	t.Helper()
	var msg []byte
	for len(wire) > 0 {
		if len(wire) < 5 || wire[0] != recordTypeHandshake {
			t.Fatalf("defrag: bad record header % x", wire[:min(5, len(wire))])
		}
		n := int(wire[3])<<8 | int(wire[4])
		msg = append(msg, wire[5:5+n]...)
		wire = wire[5+n:]
	}
	if len(msg) < 4 || len(msg) != 4+(int(msg[1])<<16|int(msg[2])<<8|int(msg[3])) {
		t.Fatalf("defrag: %d bytes do not hold exactly one handshake message", len(msg))
	}
	return msg
}

// within reports whether s is a (possibly empty) subslice of b's memory.
func within(s, b []byte) bool {
	if len(s) == 0 {
		return true
	}
	if len(b) == 0 {
		return false
	}
	p := uintptr(unsafe.Pointer(unsafe.SliceData(s)))
	lo := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	return p >= lo && p+uintptr(len(s)) <= lo+uintptr(len(b))
}

// helloRef is an independent, allocating reference parser for Hello.Parse
// that reassembles the handshake message first and then parses it from one
// contiguous buffer. complete is false when wire is too short for it to
// know the answer; then Parse may say NeedMore or (having spotted an
// error early) NotThis, but never Done.
func helloRef(wire []byte) (complete bool, st Status, sni, alpn []byte, ech bool) {
	var msg []byte
	pos, end := 0, 0
	for {
		if len(msg) >= 1 && msg[0] != handshakeTypeClientHello {
			return true, NotThis, nil, nil, false
		}
		if len(msg) >= 4 {
			need := 4 + (int(msg[1])<<16 | int(msg[2])<<8 | int(msg[3]))
			if need > MaxHelloLen {
				return true, NotThis, nil, nil, false
			}
			if len(msg) == need {
				break
			}
		}
		if pos == end {
			if pos+5 > len(wire) {
				return false, NeedMore, nil, nil, false
			}
			h := wire[pos : pos+5]
			n := int(h[3])<<8 | int(h[4])
			if h[0] != 0x16 || h[1] != 3 || n == 0 || n > 1<<14 {
				return true, NotThis, nil, nil, false
			}
			pos += 5
			end = pos + n
		}
		if pos >= MaxHelloWire {
			return true, NotThis, nil, nil, false
		}
		if pos >= len(wire) {
			return false, NeedMore, nil, nil, false
		}
		msg = append(msg, wire[pos])
		pos++
	}
	bad := func() (bool, Status, []byte, []byte, bool) { return true, NotThis, nil, nil, false }
	s := msg[4:]
	next := func(n int) []byte {
		if n > len(s) {
			return nil
		}
		v := s[:n]
		s = s[n:]
		return v
	}
	num := func(n int) int {
		v := next(n)
		if v == nil {
			return -1
		}
		x := 0
		for _, c := range v {
			x = x<<8 | int(c)
		}
		return x
	}
	if v := num(2); v < 0 || v>>8 != 3 {
		return bad()
	}
	if next(32) == nil {
		return bad()
	}
	if n := num(1); n < 0 || n > 32 || next(n) == nil {
		return bad()
	}
	if n := num(2); n < 2 || n%2 != 0 || next(n) == nil {
		return bad()
	}
	if n := num(1); n < 1 || next(n) == nil {
		return bad()
	}
	if len(s) == 0 {
		return true, Done, nil, nil, false
	}
	if n := num(2); n != len(s) {
		return bad()
	}
	seen := map[int]bool{}
	for len(s) > 0 {
		typ, n := num(2), num(2)
		if typ < 0 || n < 0 || n > len(s) {
			return bad()
		}
		if (typ == extServerName || typ == extALPN || typ == extECH) && seen[typ] {
			return bad()
		}
		seen[typ] = true
		body := next(n)
		switch typ {
		case extECH:
			ech = true
		case extServerName:
			if len(body) < 2 || int(body[0])<<8|int(body[1]) != len(body)-2 || len(body) == 2 {
				return bad()
			}
			list := body[2:]
			for len(list) > 0 {
				if len(list) < 3 {
					return bad()
				}
				nt, nl := list[0], int(list[1])<<8|int(list[2])
				if nl > len(list)-3 {
					return bad()
				}
				if nt == 0 {
					if nl == 0 || sni != nil {
						return bad()
					}
					sni = list[3 : 3+nl]
				}
				list = list[3+nl:]
			}
		case extALPN:
			if len(body) < 2 || int(body[0])<<8|int(body[1]) != len(body)-2 || len(body) < 4 {
				return bad()
			}
			for list := body[2:]; len(list) > 0; {
				if list[0] == 0 || int(list[0]) > len(list)-1 {
					return bad()
				}
				list = list[1+int(list[0]):]
			}
			alpn = body
		}
	}
	return true, Done, sni, alpn, ech
}
