package sniff

import "bytes"

// MaxRequestHead is the largest HTTP request head (request line, headers and
// the empty line that ends them) Request.Parse will wait for: 16 KiB.
const MaxRequestHead = 16 << 10

// methods are the request methods Request.Parse and Classify accept
// (RFC 9110 9.3, WebDAV RFC 4918, CalDAV, and PURGE, common in caches).
// Read only.
var methods = [...]string{
	"GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH",
	"PROPFIND", "PROPPATCH", "MKCOL", "COPY", "MOVE", "LOCK", "UNLOCK",
	"REPORT", "SEARCH", "MKCALENDAR", "PURGE",
}

// maxMethodLen is the length of the longest entry in methods.
const maxMethodLen = 10

// Request is an HTTP/1.x request head's interesting fields. Parse fills it;
// the byte-slice fields alias the bytes passed to Parse.
type Request struct {
	// Method is the request method, one of a fixed list of known methods.
	Method []byte
	// Target is the request target exactly as sent: origin-form ("/x"),
	// absolute-form ("http://h/x"), authority-form ("h:443", CONNECT only)
	// or "*".
	Target []byte
	// Host is the host the request names, without port or IPv6 brackets
	// ("[::1]:80" gives "::1"), exactly as sent otherwise: check it with
	// ValidHostname or net/netip. It comes from the request target when that
	// is absolute-form or authority-form (the target wins per RFC 9112
	// 3.2.2; a Host header that disagrees with it makes Parse return
	// NotThis), else from the Host header. nil when neither names a host.
	Host []byte
	// HostPort is the port given with Host, else 0.
	HostPort uint16
}

// Parse parses b, a prefix of a connection's bytes, as an HTTP/1.0 or
// HTTP/1.1 request line and headers. It returns NeedMore until the empty
// line ending the head ("\r\n\r\n"; bare "\n" line ends are accepted too),
// then Done; bytes after the head (a body, pipelined requests) are ignored.
//
// It returns NotThis as soon as the first bytes cannot begin a known method
// followed by a space (usually after 1 byte, at most 11), when the request
// line is malformed (not exactly "METHOD SP target SP HTTP/1.x", control
// bytes, a bare CR), a header line is malformed (no colon, space before the
// colon, control bytes), the Host header is folded, malformed or present
// twice with different values, it disagrees with an absolute-form or
// authority-form target, or the head would exceed MaxRequestHead bytes.
// Header names are matched case-insensitively. Folded (obs-fold)
// continuation lines of other headers are accepted and ignored. Parse keeps
// no state between calls: each call parses b from the start.
func (r *Request) Parse(b []byte) Status {
	*r = Request{}
	st := r.parse(b)
	if st != Done {
		*r = Request{}
	}
	return st
}

func (r *Request) parse(b []byte) Status {
	head := b
	if len(head) > MaxRequestHead {
		head = head[:MaxRequestHead]
	}
	// incomplete reports the answer for a head with no end in sight yet.
	incomplete := func() Status {
		if len(b) >= MaxRequestHead {
			return NotThis
		}
		return NeedMore
	}

	i := bytes.IndexByte(head, '\n')
	if i < 0 {
		if _, _, st := requestLine(head, false); st == NotThis {
			return NotThis
		}
		return incomplete()
	}
	method, target, st := requestLine(head[:i], true)
	if st != Done {
		return st
	}
	r.Method, r.Target = method, target

	var (
		hostVal   []byte // the Host header's value, OWS trimmed
		hostSeen  bool
		lastHost  bool // the previous header line was Host
		anyHeader bool
	)
	pos := i + 1
	for {
		j := bytes.IndexByte(head[pos:], '\n')
		if j < 0 {
			return incomplete()
		}
		line := trimCR(head[pos : pos+j])
		pos += j + 1
		if len(line) == 0 {
			break
		}
		if bytes.IndexByte(line, '\r') >= 0 {
			return NotThis
		}
		if line[0] == ' ' || line[0] == '\t' { // obs-fold continuation
			if !anyHeader || lastHost || !validValue(line) {
				return NotThis
			}
			continue
		}
		colon := bytes.IndexByte(line, ':')
		if colon <= 0 || !isToken(line[:colon]) {
			return NotThis
		}
		value := trimOWS(line[colon+1:])
		if !validValue(value) {
			return NotThis
		}
		anyHeader = true
		lastHost = equalFold(line[:colon], "host")
		if lastHost {
			if hostSeen {
				if !bytes.EqualFold(value, hostVal) {
					return NotThis
				}
				continue
			}
			hostSeen, hostVal = true, value
		}
	}

	if len(hostVal) > 0 {
		h, p, ok := splitHostPort(hostVal)
		if !ok {
			return NotThis
		}
		r.Host, r.HostPort = h, p
	}
	auth, defPort, ok := targetAuthority(method, target)
	if !ok {
		return NotThis
	}
	if auth == nil {
		return Done
	}
	h, p, ok := splitHostPort(auth)
	if !ok {
		return NotThis
	}
	if r.Host != nil && (!bytes.EqualFold(h, r.Host) || !samePort(p, r.HostPort, defPort)) {
		return NotThis
	}
	r.Host, r.HostPort = h, p
	return Done
}

// requestLine parses a request line without its '\n'. When complete is
// false, line is what has arrived of it so far, and the answer is NeedMore
// unless the prefix is already malformed.
func requestLine(line []byte, complete bool) (method, target []byte, st Status) {
	if len(line) > 0 && line[len(line)-1] == '\r' {
		line = line[:len(line)-1]
	}
	sp := bytes.IndexByte(line, ' ')
	if sp < 0 {
		if full, partial := matchMethod(line); !complete && (full || partial) {
			return nil, nil, NeedMore
		}
		return nil, nil, NotThis
	}
	if full, _ := matchMethod(line[:sp]); !full {
		return nil, nil, NotThis
	}
	method, rest := line[:sp], line[sp+1:]
	sp = bytes.IndexByte(rest, ' ')
	target = rest
	if sp >= 0 {
		target = rest[:sp]
	}
	for _, c := range target {
		if c <= ' ' || c >= 0x7f {
			return nil, nil, NotThis
		}
	}
	if sp < 0 {
		if complete {
			return nil, nil, NotThis
		}
		return nil, nil, NeedMore
	}
	if len(target) == 0 {
		return nil, nil, NotThis
	}
	version := rest[sp+1:]
	const v = "HTTP/1."
	switch {
	case len(version) > len(v)+1:
		return nil, nil, NotThis
	case len(version) == len(v)+1:
		if string(version[:len(v)]) != v || (version[len(v)] != '0' && version[len(v)] != '1') {
			return nil, nil, NotThis
		}
	case complete || string(version) != v[:len(version)]:
		return nil, nil, NotThis
	default:
		return nil, nil, NeedMore
	}
	if !complete {
		return nil, nil, NeedMore
	}
	return method, target, Done
}

// targetAuthority returns the authority an absolute-form or authority-form
// target names (nil for origin-form and "*"), and the port its scheme
// implies (0 when none). ok is false for a malformed target.
func targetAuthority(method, target []byte) (auth []byte, defPort uint16, ok bool) {
	if string(method) == "CONNECT" {
		return target, 0, target[0] != '/' && target[0] != '*'
	}
	switch {
	case target[0] == '/' || string(target) == "*":
		return nil, 0, true
	case hasPrefixFold(target, "http://"):
		target, defPort = target[len("http://"):], 80
	case hasPrefixFold(target, "https://"):
		target, defPort = target[len("https://"):], 443
	default:
		return nil, 0, false
	}
	if k := bytes.IndexAny(target, "/?#"); k >= 0 {
		target = target[:k]
	}
	// Userinfo ("http://a@b/") is deprecated for http(s) (RFC 9110 4.2.4)
	// and parsers disagree on where it ends: refuse it.
	if len(target) == 0 || bytes.IndexByte(target, '@') >= 0 {
		return nil, 0, false
	}
	return target, defPort, true
}

// samePort reports whether two ports given for one host agree, counting an
// absent port (0) as the scheme's default port def.
func samePort(a, b, def uint16) bool {
	if a == 0 {
		a = def
	}
	if b == 0 {
		b = def
	}
	return a == b
}

// splitHostPort splits a Host value or URI authority into host and port:
// "h", "h:80", "h:" (empty port), "[v6]", "[v6]:80". ok is false for anything
// else, including bytes a reg-name cannot hold and ports above 65535.
func splitHostPort(v []byte) (host []byte, port uint16, ok bool) {
	var rest []byte
	if len(v) > 0 && v[0] == '[' {
		k := bytes.IndexByte(v, ']')
		if k < 0 {
			return nil, 0, false
		}
		host, rest = v[1:k], v[k+1:]
		if !validIPv6Chars(host) {
			return nil, 0, false
		}
	} else {
		host = v
		if k := bytes.IndexByte(v, ':'); k >= 0 {
			host, rest = v[:k], v[k:]
		}
		if !validRegName(host) {
			return nil, 0, false
		}
	}
	if len(rest) == 0 {
		return host, 0, true
	}
	if rest[0] != ':' || len(rest) > 6 {
		return nil, 0, false
	}
	n := 0
	for _, c := range rest[1:] {
		if c < '0' || c > '9' {
			return nil, 0, false
		}
		n = n*10 + int(c-'0')
	}
	if n > 65535 {
		return nil, 0, false
	}
	return host, uint16(n), true
}

// validIPv6Chars reports whether b is non-empty, holds a colon and only the
// bytes an IPv6 literal can (hex digits, ':' and '.' for an embedded IPv4).
// Zones and IPvFuture are refused. Full validation is left to net/netip.
func validIPv6Chars(b []byte) bool {
	if bytes.IndexByte(b, ':') < 0 {
		return false
	}
	for _, c := range b {
		if !isHex(c) && c != ':' && c != '.' {
			return false
		}
	}
	return true
}

// validRegName reports whether b is a non-empty reg-name or IPv4 literal
// (RFC 3986 3.2.2: unreserved, pct-encoded and sub-delims bytes).
func validRegName(b []byte) bool {
	if len(b) == 0 {
		return false
	}
	for _, c := range b {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case c == '-' || c == '.' || c == '_' || c == '~' || c == '%' || c == '!' || c == '$' || c == '&' ||
			c == '\'' || c == '(' || c == ')' || c == '*' || c == '+' || c == ',' || c == ';' || c == '=':
		default:
			return false
		}
	}
	return true
}

// matchMethod reports whether p is a known method (full) or a proper prefix
// of one (partial).
func matchMethod(p []byte) (full, partial bool) {
	for _, m := range methods {
		if len(p) <= len(m) && string(p) == m[:len(p)] {
			if len(p) == len(m) {
				full = true
			} else {
				partial = true
			}
		}
	}
	return full, partial
}

// isToken reports whether b is a non-empty RFC 9110 token (a header name).
func isToken(b []byte) bool {
	if len(b) == 0 {
		return false
	}
	for _, c := range b {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case c == '-' || c == '.' || c == '_' || c == '!' || c == '#' || c == '$' || c == '%' || c == '&' ||
			c == '\'' || c == '*' || c == '+' || c == '^' || c == '`' || c == '|' || c == '~':
		default:
			return false
		}
	}
	return true
}

// validValue reports whether a header value (or continuation line) holds no
// control bytes other than HTAB. Bytes >= 0x80 (obs-text) are allowed.
func validValue(b []byte) bool {
	for _, c := range b {
		if (c < ' ' && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}

func trimCR(b []byte) []byte {
	if len(b) > 0 && b[len(b)-1] == '\r' {
		return b[:len(b)-1]
	}
	return b
}

func trimOWS(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t') {
		b = b[1:]
	}
	for len(b) > 0 && (b[len(b)-1] == ' ' || b[len(b)-1] == '\t') {
		b = b[:len(b)-1]
	}
	return b
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

// equalFold reports whether b equals the lower-case ASCII string s, ignoring case.
func equalFold(b []byte, s string) bool {
	if len(b) != len(s) {
		return false
	}
	for i := range len(b) {
		c := b[i]
		if c >= 'A' && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != s[i] {
			return false
		}
	}
	return true
}

// hasPrefixFold reports whether b starts with the lower-case ASCII string s, ignoring case.
func hasPrefixFold(b []byte, s string) bool {
	return len(b) >= len(s) && equalFold(b[:len(s)], s)
}
