package socks5

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
)

// Wire constants from RFC 1928 and RFC 1929.
const (
	socksVersion = 0x05

	methodNoAuth       = 0x00
	methodUserPass     = 0x02
	methodNoAcceptable = 0xff

	userPassVersion = 0x01

	cmdConnect   = 0x01
	cmdAssociate = 0x03

	atypIPv4   = 0x01
	atypDomain = 0x03
	atypIPv6   = 0x04

	// maxHeader is the longest SOCKS UDP header: RSV(2) FRAG(1) ATYP(1)
	// LEN(1) NAME(255) PORT(2).
	maxHeader = 4 + 1 + 255 + 2
	// maxDatagram is the largest UDP payload the kernel can hand us.
	maxDatagram = 65535
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

// appendAddr appends ATYP, ADDR and PORT. a must be valid (as produced by
// parseTarget or parseAddr).
func appendAddr(b []byte, a sockAddr) []byte {
	switch {
	case a.host != "":
		b = append(b, atypDomain, byte(len(a.host)))
		b = append(b, a.host...)
	case a.ip.Is4():
		b = append(b, atypIPv4)
		b = append(b, a.ip.AsSlice()...)
	default:
		b = append(b, atypIPv6)
		b = append(b, a.ip.AsSlice()...)
	}
	return binary.BigEndian.AppendUint16(b, a.port)
}

// addrLen returns how many bytes the address starting at b[0] (the ATYP
// byte) occupies, reading at most b[0] and b[1]. need > 0 means the length
// cannot be known until len(b) >= need.
func addrLen(b []byte) (n, need int, err error) {
	if len(b) < 1 {
		return 0, 1, nil
	}
	switch b[0] {
	case atypIPv4:
		return 1 + 4 + 2, 0, nil
	case atypIPv6:
		return 1 + 16 + 2, 0, nil
	case atypDomain:
		if len(b) < 2 {
			return 0, 2, nil
		}
		if b[1] == 0 {
			return 0, 0, fmt.Errorf("%w: empty domain name", errMalformed)
		}
		return 2 + int(b[1]) + 2, 0, nil
	default:
		return 0, 0, fmt.Errorf("%w: unknown address type 0x%02x", errMalformed, b[0])
	}
}

// parseAddr decodes ATYP, ADDR and PORT at the start of b and returns the
// number of bytes consumed.
func parseAddr(b []byte) (sockAddr, int, error) {
	n, need, err := addrLen(b)
	if err != nil {
		return sockAddr{}, 0, err
	}
	if need > 0 || len(b) < n {
		return sockAddr{}, 0, fmt.Errorf("%w: truncated address", errMalformed)
	}
	var a sockAddr
	a.port = binary.BigEndian.Uint16(b[n-2 : n])
	switch b[0] {
	case atypIPv4:
		a.ip = netip.AddrFrom4([4]byte(b[1:5]))
	case atypIPv6:
		a.ip = netip.AddrFrom16([16]byte(b[1:17]))
	case atypDomain:
		a.host = string(b[2 : 2+int(b[1])])
	}
	return a, n, nil
}

// parseReply decodes a complete CONNECT/ASSOCIATE reply
// (VER REP RSV ATYP BND.ADDR BND.PORT). A non-zero REP yields a *ReplyError
// once the message has been validated. It returns the bytes consumed.
func parseReply(b []byte) (bnd sockAddr, n int, err error) {
	if len(b) < 4 {
		return sockAddr{}, 0, fmt.Errorf("%w: truncated reply", errMalformed)
	}
	if b[0] != socksVersion {
		return sockAddr{}, 0, fmt.Errorf("%w: reply version %d, want 5", errMalformed, b[0])
	}
	bnd, n, err = parseAddr(b[3:])
	if err != nil {
		return sockAddr{}, 0, err
	}
	if b[1] != 0x00 {
		return sockAddr{}, 3 + n, &ReplyError{Code: b[1]}
	}
	return bnd, 3 + n, nil
}

// readReply reads exactly one reply from r, never more, so no bytes of the
// proxied stream that follow it are consumed.
func readReply(r io.Reader) (sockAddr, error) {
	var buf [3 + 2 + 255 + 2]byte
	// VER REP RSV ATYP and, for a domain, its length byte.
	if _, err := io.ReadFull(r, buf[:5]); err != nil {
		return sockAddr{}, fmt.Errorf("socks5: reading reply: %w", err)
	}
	if buf[0] != socksVersion {
		return sockAddr{}, fmt.Errorf("%w: reply version %d, want 5", errMalformed, buf[0])
	}
	n, _, err := addrLen(buf[3:5])
	if err != nil {
		return sockAddr{}, err
	}
	if _, err := io.ReadFull(r, buf[5:3+n]); err != nil {
		return sockAddr{}, fmt.Errorf("socks5: reading reply: %w", err)
	}
	bnd, _, err := parseReply(buf[:3+n])
	return bnd, err
}

// appendUDPHeader appends RSV RSV FRAG=0 and the destination address.
func appendUDPHeader(b []byte, dst sockAddr) []byte {
	return appendAddr(append(b, 0, 0, 0), dst)
}

// parseUDPHeader decodes the SOCKS UDP request header at the start of a
// datagram and returns the source/destination address, FRAG and payload.
func parseUDPHeader(b []byte) (addr sockAddr, frag byte, payload []byte, err error) {
	if len(b) < 4 {
		return sockAddr{}, 0, nil, fmt.Errorf("%w: datagram shorter than header", errMalformed)
	}
	addr, n, err := parseAddr(b[3:])
	if err != nil {
		return sockAddr{}, 0, nil, err
	}
	return addr, b[2], b[3+n:], nil
}
