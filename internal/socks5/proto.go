package socks5

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"syscall"

	"github.com/things-go/go-socks5/statute"
)

// The wire format is go-socks5's statute codec (the one the SOCKS5 server,
// tunwall socks, speaks); this file adapts it to the client's types.
const (
	// maxHeader is the longest SOCKS UDP header: RSV(2) FRAG(1) ATYP(1)
	// LEN(1) NAME(255) PORT(2).
	maxHeader = 4 + 1 + 255 + 2
	// maxDatagram is the largest UDP payload the kernel can hand us.
	maxDatagram = 65535
	// minDatagram is the shortest datagram statute.ParseDatagram reads:
	// an IPv4 header (see parseUDPHeader).
	minDatagram = 4 + 4 + 2
)

// Reply codes from RFC 1928 section 6.
const (
	// ReplyGeneralFailure is "general SOCKS server failure".
	ReplyGeneralFailure byte = 0x01
	// ReplyNotAllowed is "connection not allowed by ruleset".
	ReplyNotAllowed byte = 0x02
	// ReplyNetworkUnreachable is "network unreachable".
	ReplyNetworkUnreachable byte = 0x03
	// ReplyHostUnreachable is "host unreachable".
	ReplyHostUnreachable byte = 0x04
	// ReplyConnectionRefused is "connection refused".
	ReplyConnectionRefused byte = 0x05
	// ReplyTTLExpired is "TTL expired".
	ReplyTTLExpired byte = 0x06
	// ReplyCommandNotSupported is "command not supported".
	ReplyCommandNotSupported byte = 0x07
	// ReplyAddrTypeNotSupported is "address type not supported".
	ReplyAddrTypeNotSupported byte = 0x08
)

// ReplyError is a non-success reply code sent by the proxy in answer to a
// CONNECT or UDP ASSOCIATE request.
type ReplyError struct {
	Code byte // the REP field; never 0x00
}

func (e *ReplyError) Error() string {
	return fmt.Sprintf("socks5: proxy replied: %s (code %d)", replyText(e.Code), e.Code)
}

// Is reports a refusal, or an unreachable host or network, as the errno a
// direct connection would have failed with, so that callers decide on it
// with errors.Is(err, syscall.ECONNREFUSED) whether or not the flow went
// through a proxy.
func (e *ReplyError) Is(target error) bool {
	switch e.Code {
	case ReplyConnectionRefused:
		return target == syscall.ECONNREFUSED
	case ReplyHostUnreachable:
		return target == syscall.EHOSTUNREACH
	case ReplyNetworkUnreachable:
		return target == syscall.ENETUNREACH
	}
	return false
}

func replyText(code byte) string {
	switch code {
	case 0x00:
		return "succeeded"
	case ReplyGeneralFailure:
		return "general SOCKS server failure"
	case ReplyNotAllowed:
		return "connection not allowed by ruleset"
	case ReplyNetworkUnreachable:
		return "network unreachable"
	case ReplyHostUnreachable:
		return "host unreachable"
	case ReplyConnectionRefused:
		return "connection refused"
	case ReplyTTLExpired:
		return "TTL expired"
	case ReplyCommandNotSupported:
		return "command not supported"
	case ReplyAddrTypeNotSupported:
		return "address type not supported"
	default:
		return fmt.Sprintf("unassigned reply code 0x%02x", code)
	}
}

// errMalformed is wrapped by every decoding error of data sent by the proxy.
var errMalformed = errors.New("socks5: malformed message from proxy")

// sockAddr is a SOCKS address: exactly one of host (a name, sent as ATYP
// 0x03) or ip (sent as ATYP 0x01 or 0x04) is set.
type sockAddr struct {
	host string
	ip   netip.Addr
	port uint16
}

func (a sockAddr) String() string {
	if a.host != "" {
		return net.JoinHostPort(a.host, strconv.Itoa(int(a.port)))
	}
	return netip.AddrPortFrom(a.ip, a.port).String()
}

// parseTarget turns "host:port" or "ip:port" into a sockAddr without any
// name resolution. An IPv4-mapped IPv6 literal is sent as IPv4.
func parseTarget(addr string) (sockAddr, error) {
	host, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		return sockAddr{}, fmt.Errorf("socks5: target %q: %w", addr, err)
	}
	port, err := strconv.ParseUint(portStr, 10, 16)
	if err != nil {
		return sockAddr{}, fmt.Errorf("socks5: target %q: bad port %q", addr, portStr)
	}
	if host == "" {
		return sockAddr{}, fmt.Errorf("socks5: target %q: empty host", addr)
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		if ip.Zone() != "" {
			return sockAddr{}, fmt.Errorf("socks5: target %q: zoned IPv6 addresses cannot be proxied", addr)
		}
		return sockAddr{ip: ip.Unmap(), port: uint16(port)}, nil
	}
	if len(host) > 255 {
		return sockAddr{}, fmt.Errorf("socks5: target %q: hostname longer than 255 bytes", addr)
	}
	return sockAddr{host: host, port: uint16(port)}, nil
}

// spec is a's statute form.
func spec(a sockAddr) statute.AddrSpec {
	switch {
	case a.host != "":
		return statute.AddrSpec{AddrType: statute.ATYPDomain, FQDN: a.host, Port: int(a.port)}
	case a.ip.Is4():
		return statute.AddrSpec{AddrType: statute.ATYPIPv4, IP: a.ip.AsSlice(), Port: int(a.port)}
	default:
		return statute.AddrSpec{AddrType: statute.ATYPIPv6, IP: a.ip.AsSlice(), Port: int(a.port)}
	}
}

// fromSpec is the sockAddr of what statute decoded. An IPv4 address is
// IPv4 (statute hands it over in 16 bytes); an IPv6 one, even v4-mapped,
// stays IPv6, as it was sent. An empty name is malformed (RFC 1928 gives
// no meaning to it).
func fromSpec(a statute.AddrSpec) (sockAddr, error) {
	out := sockAddr{port: uint16(a.Port)}
	switch a.AddrType {
	case statute.ATYPIPv4:
		out.ip = netip.AddrFrom4([4]byte(a.IP.To4()))
	case statute.ATYPIPv6:
		out.ip = netip.AddrFrom16([16]byte(a.IP.To16()))
	case statute.ATYPDomain:
		if a.FQDN == "" {
			return sockAddr{}, fmt.Errorf("%w: empty domain name", errMalformed)
		}
		out.host = a.FQDN
	default:
		return sockAddr{}, fmt.Errorf("%w: unknown address type 0x%02x", errMalformed, a.AddrType)
	}
	return out, nil
}

// request is a CONNECT or UDP ASSOCIATE request for dst.
func request(cmd byte, dst sockAddr) []byte {
	return statute.Request{Version: statute.VersionSocks5, Command: cmd, DstAddr: spec(dst)}.Bytes()
}

// ioReader remembers the first I/O error of its reader: statute's parsers
// flatten an error into text, and the caller decides on its type (a
// timeout, a closed connection).
type ioReader struct {
	r   io.Reader
	err error
}

func (r *ioReader) Read(b []byte) (int, error) {
	n, err := r.r.Read(b)
	if err != nil && r.err == nil {
		r.err = err
	}
	return n, err
}

// readReply reads exactly one CONNECT/ASSOCIATE reply
// (VER REP RSV ATYP BND.ADDR BND.PORT) from r, never more, so no bytes of
// the proxied stream that follow it are consumed. A non-zero REP yields a
// *ReplyError once the whole message has been read and validated.
func readReply(r io.Reader) (sockAddr, error) {
	ir := &ioReader{r: r}
	rep, err := statute.ParseReply(ir)
	if err != nil {
		if ir.err != nil {
			if ir.err == io.EOF {
				ir.err = io.ErrUnexpectedEOF
			}
			return sockAddr{}, fmt.Errorf("socks5: reading reply: %w", ir.err)
		}
		return sockAddr{}, fmt.Errorf("%w: %v", errMalformed, err)
	}
	bnd, err := fromSpec(rep.BndAddr)
	if err != nil {
		return sockAddr{}, err
	}
	if rep.Response != statute.RepSuccess {
		return sockAddr{}, &ReplyError{Code: rep.Response}
	}
	return bnd, nil
}

// parseReply decodes a complete reply at the start of b and returns the
// bytes it takes.
func parseReply(b []byte) (bnd sockAddr, n int, err error) {
	r := bytes.NewReader(b)
	bnd, err = readReply(r)
	var re *ReplyError
	if err != nil && !errors.As(err, &re) {
		if errors.Is(err, io.ErrUnexpectedEOF) {
			err = fmt.Errorf("%w: truncated reply", errMalformed)
		}
		return sockAddr{}, 0, err
	}
	return bnd, len(b) - r.Len(), err
}

// datagramHeader is the SOCKS UDP request header (RSV RSV FRAG=0 and the
// destination address) that goes before every datagram to dst.
func datagramHeader(dst sockAddr) []byte {
	d := statute.Datagram{DstAddr: spec(dst)}
	return d.Header()
}

// parseUDPHeader decodes the SOCKS UDP header at the start of a datagram
// and returns the source/destination address, FRAG and payload.
//
// statute.ParseDatagram refuses a datagram shorter than an IPv4 header
// (10 bytes: a one-letter name with a short payload), and one whose
// payload is empty unless its header is IPv4; both are valid datagrams.
// So it is given b with some bytes more (b's own spare capacity when it
// has some, as the relay's buffer does, or else a copy), which it never
// reads as header bytes: its header must then end within b, and the
// payload is what follows it in b.
func parseUDPHeader(b []byte) (addr sockAddr, frag byte, payload []byte, err error) {
	if len(b) < 4 {
		return sockAddr{}, 0, nil, fmt.Errorf("%w: datagram shorter than header", errMalformed)
	}
	padded := b[:cap(b)]
	if need := max(len(b)+1, minDatagram); cap(b) < need {
		padded = make([]byte, need)
		copy(padded, b)
	}
	padded = padded[:max(len(b)+1, minDatagram)]
	d, err := statute.ParseDatagram(padded)
	if err != nil {
		return sockAddr{}, 0, nil, fmt.Errorf("%w: %v", errMalformed, err)
	}
	hdr := len(padded) - len(d.Data)
	if hdr > len(b) {
		return sockAddr{}, 0, nil, fmt.Errorf("%w: truncated address", errMalformed)
	}
	if addr, err = fromSpec(d.DstAddr); err != nil {
		return sockAddr{}, 0, nil, err
	}
	return addr, d.Frag, b[hdr:], nil
}
