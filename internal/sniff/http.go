package sniff

import "bytes"

// MaxRequestHead is the largest HTTP request head (empty lines before it,
// request line, headers and the empty line that ends them) Request.Parse
// will wait for: 16 KiB.
const MaxRequestHead = 16 << 10

// methods are well-known request methods (RFC 9110 9.3, WebDAV RFC 4918,
// CalDAV, and PURGE, common in caches). Classify takes any of them, in any
// case, for the start of a request; Request.Parse accepts any token as a
// method. Read only.
var methods = [...]string{
	"GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH",
	"PROPFIND", "PROPPATCH", "MKCOL", "COPY", "MOVE", "LOCK", "UNLOCK",
	"REPORT", "SEARCH", "MKCALENDAR", "PURGE", "QUERY", "PRI",
}

// Request is an HTTP/1.x request head's interesting fields. Parse fills it;
// the byte-slice fields alias the bytes passed to Parse.
type Request struct {
	// Method is the request method, any token, exactly as sent.
	Method []byte
	// Target is the request target exactly as sent: origin-form ("/x"),
	// absolute-form ("http://h/x"), authority-form ("h:443", CONNECT only)
	// or "*".
	Target []byte
	// Minor is the minor version: 0 for HTTP/1.0, 1 for HTTP/1.1.
	Minor uint8
	// Host is the host the request names, without port or IPv6 brackets
	// ("[::1]:80" gives "::1"), exactly as sent otherwise: check it with
	// flow.ValidHostname or net/netip. It comes from the Host header, or from
	// the request target when that is absolute-form or authority-form (the
	// two must then agree). nil when neither names a host (an HTTP/1.0
	// request with no Host, or an empty Host).
	Host []byte
	// HostPort is the port given with Host, else 0.
	HostPort uint16
	// HeadLen is how many bytes of the input the head took, from the
	// first byte (empty lines before the request line included) to the end
	// of the empty line that ends it. The body, if any, starts there.
	HeadLen int
	// ContentLength is the Content-Length header's value, or -1 when there
	// is none.
	ContentLength int64
	// Chunked reports "Transfer-Encoding: chunked".
	Chunked bool
	// Upgrade is the Upgrade header's value (OWS trimmed), nil when absent.
	Upgrade []byte
	// Bad says why Parse returned NotThis, in words, e.g. "two Host
	// headers". It is "" after NeedMore and Done.
	Bad string
	// BadValue is the offending part of the input after NotThis when
	// there is one (the second Host value, the malformed line, ...),
	// aliasing the input; nil otherwise.
	BadValue []byte
}

// Parse parses b, a prefix of a connection's bytes (or the bytes after the
// previous request), as one HTTP/1.0 or HTTP/1.1 request head, strictly:
// what it accepts, every lenient server reads the same way. It returns
// NeedMore until the empty line ending the head, then Done; bytes after the
// head (the body, pipelined requests) are not looked at.
//
// It returns NotThis, saying why in Bad, for anything else: a request line
// that is not exactly "token SP target SP HTTP/1.x" (an HTTP/2 request
// line such as the h2c preface "PRI * HTTP/2.0" included), a bare CR or a control byte anywhere, a header line that is
// not "token: value" or is folded (obs-fold), two Host, Content-Length,
// Transfer-Encoding or Upgrade headers, an HTTP/1.1 request with no Host, a
// Host that is not host[:port] (userinfo included), an absolute-form target
// that names another host than Host, a Content-Length that is not a number,
// a Transfer-Encoding other than "chunked" or one with Content-Length or in
// HTTP/1.0, or a head that would exceed MaxRequestHead bytes. Header names
// are matched case-insensitively; lines may end in CRLF or LF. Empty lines
// (CRLF or LF) before the request line are skipped, as servers do. Parse
// keeps no state between calls: each call parses b from the start.
func (r *Request) Parse(b []byte) Status {
	*r = Request{ContentLength: -1}
	st := r.parse(b)
	if st != Done {
		bad, val := r.Bad, r.BadValue
		*r = Request{ContentLength: -1}
		if st == NotThis {
			r.Bad, r.BadValue = bad, val
		}
	}
	return st
}

// fail records why the parse failed and returns NotThis.
func (r *Request) fail(why string, val []byte) Status {
	r.Bad, r.BadValue = why, val
	return NotThis
}

func (r *Request) parse(b []byte) Status {
	head := b
	if len(head) > MaxRequestHead {
		head = head[:MaxRequestHead]
	}
	// incomplete is the answer for a head with no end in sight yet.
	incomplete := func() Status {
		if len(b) >= MaxRequestHead {
			return r.fail("a request head over 16 KiB", nil)
		}
		return NeedMore
	}
	pos := 0
	for pos < len(head) && (head[pos] == '\n' || head[pos] == '\r') {
		if head[pos] == '\r' && pos+1 < len(head) && head[pos+1] != '\n' {
			return r.fail("a bare CR", nil)
		}
		pos++
	}
	if n := min(len(head), len(proxyV2)); n > 4 && string(head[:n]) == proxyV2[:n] {
		return r.fail("a PROXY protocol header", nil)
	}
	i := bytes.IndexByte(head[pos:], '\n')
	if i < 0 {
		if st := requestLine(r, head[pos:], false); st == NotThis {
			return NotThis
		}
		return incomplete()
	}
	if st := requestLine(r, head[pos:pos+i], true); st != Done {
		return st
	}
	pos += i + 1

	var (
		hostVal                          []byte // the Host header's value, OWS trimmed
		hostSeen, clSeen, teSeen, upSeen bool
	)
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
			return r.fail("a bare CR", line)
		}
		if line[0] == ' ' || line[0] == '\t' {
			return r.fail("a folded header line (obs-fold)", line)
		}
		colon := bytes.IndexByte(line, ':')
		if colon <= 0 || !isToken(line[:colon]) {
			return r.fail("a malformed header line", line)
		}
		name, value := line[:colon], trimOWS(line[colon+1:])
		if !validValue(value) {
			return r.fail("a control byte in a header", name)
		}
		switch {
		case EqualFold(name, "host"):
			if hostSeen {
				return r.fail("two Host headers", value)
			}
			hostSeen, hostVal = true, value
		case EqualFold(name, "content-length"):
			if clSeen {
				return r.fail("two Content-Length headers", value)
			}
			clSeen = true
			n, ok := parseLength(value)
			if !ok {
				return r.fail("a malformed Content-Length", value)
			}
			r.ContentLength = n
		case EqualFold(name, "transfer-encoding"):
			if teSeen {
				return r.fail("two Transfer-Encoding headers", value)
			}
			teSeen = true
			if !EqualFold(value, "chunked") {
				return r.fail("a Transfer-Encoding other than chunked", value)
			}
			r.Chunked = true
		case EqualFold(name, "upgrade"):
			if upSeen {
				return r.fail("two Upgrade headers", value)
			}
			upSeen = true
			r.Upgrade = value
		}
	}
	r.HeadLen = pos

	switch {
	case clSeen && teSeen:
		return r.fail("both Content-Length and Transfer-Encoding", nil)
	case teSeen && r.Minor == 0:
		return r.fail("a Transfer-Encoding in an HTTP/1.0 request", nil)
	case !hostSeen && r.Minor == 1:
		return r.fail("an HTTP/1.1 request without Host", nil)
	}
	if len(hostVal) > 0 {
		h, p, ok := splitHostPort(hostVal)
		if !ok {
			return r.fail("a malformed Host", hostVal)
		}
		r.Host, r.HostPort = h, p
	}
	auth, defPort, ok := targetAuthority(r.Method, r.Target)
	if !ok {
		return r.fail("a malformed request target", r.Target)
	}
	if auth == nil {
		return Done
	}
	h, p, ok := splitHostPort(auth)
	if !ok {
		return r.fail("a malformed request target", r.Target)
	}
	if r.Host != nil && (!bytes.EqualFold(h, r.Host) || !samePort(p, r.HostPort, defPort)) {
		return r.fail("a request target that names another host than Host", auth)
	}
	r.Host, r.HostPort = h, p
	return Done
}

// requestLine parses a request line without its '\n' into r. When complete
// is false, line is what has arrived of it so far, and the answer is
// NeedMore unless the prefix is already malformed.
func requestLine(r *Request, line []byte, complete bool) Status {
	if len(line) > 0 && line[len(line)-1] == '\r' {
		line = line[:len(line)-1] // when incomplete, the LF may be next
	}
	if hasPrefixFold(line, "proxy ") {
		return r.fail("a PROXY protocol header", line)
	}
	bad := func() Status { return r.fail("a malformed request line", line) }
	sp := bytes.IndexByte(line, ' ')
	if sp < 0 {
		if !complete && (len(line) == 0 || isToken(line)) {
			return NeedMore
		}
		return bad()
	}
	method, rest := line[:sp], line[sp+1:]
	if !isToken(method) {
		return bad()
	}
	sp = bytes.IndexByte(rest, ' ')
	target := rest
	if sp >= 0 {
		target = rest[:sp]
	}
	for _, c := range target {
		if c <= ' ' || c >= 0x7f {
			return bad()
		}
	}
	if sp < 0 {
		if complete {
			return bad()
		}
		return NeedMore
	}
	if len(target) == 0 {
		return bad()
	}
	version := rest[sp+1:]
	const v = "HTTP/1."
	switch {
	case hasPrefixFold(version, "http/2") || hasPrefixFold(version, "http/3"):
		return r.fail("an HTTP/2 request line (h2c with prior knowledge)", line)
	case len(version) > len(v)+1:
		return bad()
	case len(version) == len(v)+1:
		if string(version[:len(v)]) != v || (version[len(v)] != '0' && version[len(v)] != '1') {
			return bad()
		}
	case complete || string(version) != v[:len(version)]:
		return bad()
	default:
		return NeedMore
	}
	if !complete {
		return NeedMore
	}
	r.Method, r.Target, r.Minor = method, target, version[len(v)]-'0'
	return Done
}

// parseLength parses a Content-Length value: 1 to 18 decimal digits.
func parseLength(v []byte) (int64, bool) {
	if len(v) == 0 || len(v) > 18 {
		return 0, false
	}
	var n int64
	for _, c := range v {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	return n, true
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
		if !IsHex(c) && c != ':' && c != '.' {
			return false
		}
	}
	return true
}

// validRegName reports whether b is a non-empty reg-name or IPv4 literal
// (RFC 3986 3.2.2: unreserved, pct-encoded and sub-delims bytes).
//
// It is the URI grammar, not a hostname check, and wider on purpose: it
// decides only whether the request head is well formed (a Host the grammar
// refuses makes the request Malformed). Whether the host is a name tunwall
// will act on is decided after parsing, by the one hostname validator,
// flow.ValidHostname (an IPv4 literal, "a_b" or "a!b" parse here and are no
// hostname there).
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

// matchMethod reports whether p is one of methods (full) or a proper
// prefix of one (partial), ignoring ASCII case when fold is set.
func matchMethod(p []byte, fold bool) (full, partial bool) {
	for _, m := range methods {
		if len(p) > len(m) {
			continue
		}
		if fold && !equalFoldUpper(p, m[:len(p)]) || !fold && string(p) != m[:len(p)] {
			continue
		}
		if len(p) == len(m) {
			full = true
		} else {
			partial = true
		}
	}
	return full, partial
}

// equalFoldUpper reports whether b equals the upper-case ASCII string s,
// ignoring case.
func equalFoldUpper(b []byte, s string) bool {
	if len(b) != len(s) {
		return false
	}
	for i := range len(b) {
		c := b[i]
		if c >= 'a' && c <= 'z' {
			c -= 'a' - 'A'
		}
		if c != s[i] {
			return false
		}
	}
	return true
}

// isTchar reports whether c may appear in an RFC 9110 token.
func isTchar(c byte) bool {
	switch {
	case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		return true
	case c == '-' || c == '.' || c == '_' || c == '!' || c == '#' || c == '$' || c == '%' || c == '&' ||
		c == '\'' || c == '*' || c == '+' || c == '^' || c == '`' || c == '|' || c == '~':
		return true
	}
	return false
}

// isToken reports whether b is a non-empty RFC 9110 token (a method or
// header name).
func isToken(b []byte) bool {
	if len(b) == 0 {
		return false
	}
	for _, c := range b {
		if !isTchar(c) {
			return false
		}
	}
	return true
}

// validValue reports whether a header value holds no control bytes other
// than HTAB. Bytes >= 0x80 (obs-text) are allowed.
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

// IsHex reports whether c is a hexadecimal digit, either case.
func IsHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

// Unhex is the value of the hexadecimal digit c (which IsHex accepts).
func Unhex(c byte) byte {
	switch {
	case c >= '0' && c <= '9':
		return c - '0'
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10
	}
	return c - 'A' + 10
}

// EqualFold reports whether b equals the lower-case ASCII string s, ignoring case.
func EqualFold(b []byte, s string) bool {
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
	return len(b) >= len(s) && EqualFold(b[:len(s)], s)
}

// UpgradeTokens splits an Upgrade header's value into its protocol names
// (the part before any "/version"), at most 8.
func UpgradeTokens(v []byte) [][]byte {
	var out [][]byte
	for len(v) > 0 && len(out) < 8 {
		i := 0
		for i < len(v) && v[i] != ',' {
			i++
		}
		tok := trimOWS(v[:i])
		for j := range tok {
			if tok[j] == '/' {
				tok = tok[:j]
				break
			}
		}
		out = append(out, tok)
		if i == len(v) {
			break
		}
		v = v[i+1:]
	}
	return out
}
