package sniff

// Status is the result of an incremental parse over the bytes received so far.
type Status uint8

const (
	// NeedMore means the message is incomplete: call again with the same
	// prefix plus more bytes. The parsed struct's fields are zero.
	NeedMore Status = iota
	// Done means the message is complete and the fields are valid. Bytes
	// after the message (pipelined data, early data) are ignored.
	Done
	// NotThis means the bytes are not this protocol, are malformed or exceed
	// the size bound. Give up on this parser; the fields are zero.
	NotThis
)

// String returns "NeedMore", "Done" or "NotThis".
func (s Status) String() string {
	switch s {
	case NeedMore:
		return "NeedMore"
	case Done:
		return "Done"
	case NotThis:
		return "NotThis"
	}
	return "Status(?)"
}

// Kind is the protocol a connection's first bytes belong to.
type Kind uint8

const (
	// Unknown is neither TLS nor HTTP/1.x.
	Unknown Kind = iota
	// TLS is a TLS record stream (or an SSL 2.0-compatible ClientHello).
	TLS
	// HTTP is, or may be, an HTTP/1.x request.
	HTTP
)

// String returns "unknown", "tls" or "http".
func (k Kind) String() string {
	switch k {
	case Unknown:
		return "unknown"
	case TLS:
		return "tls"
	case HTTP:
		return "http"
	}
	return "Kind(?)"
}

// Classify classifies a connection's first bytes, loosely: anything that a
// lenient TLS or HTTP server could take for a ClientHello or a request is
// TLS or HTTP, so that the caller parses it strictly and refuses what it
// cannot parse, rather than letting it past as "neither".
//
//   - TLS: a first byte that is a TLS record type (0x14..0x18: a server may
//     skip an alert or an empty record before the ClientHello, and some
//     accept any record version), or an SSL 2.0-compatible ClientHello.
//   - HTTP: after any empty lines or white space, a token (the method, in
//     any case) followed by white space, when the token is a known method in
//     any case or the rest of the first line holds a word starting "HTTP/"
//     (any case), or when the first line reaches MaxRequestHead bytes
//     undecided. A PROXY protocol header (v1 or v2), which a server may read
//     before a request, counts as HTTP too, so that it is refused.
//   - Unknown: anything else, e.g. a first line that ends, or holds a NUL,
//     before it could be a request line.
//
// ok is false while b is too short to decide; k is then Unknown and safe is
// how many leading bytes of b can be passed on before the decision whatever
// it turns out to be: empty lines and white space, the first word, or the
// start of what might be an SSL 2.0 record, none of which a server can act
// on alone.
// Once ok is true, a longer prefix of the same stream gets the same answer.
func Classify(b []byte) (k Kind, safe int, ok bool) {
	if len(b) == 0 {
		return Unknown, 0, false
	}
	switch c := b[0]; {
	case c >= 0x14 && c <= 0x18:
		return TLS, 0, true
	case c >= 0x80:
		// SSL 2.0 record header (2 bytes), then CLIENT-HELLO (1) and
		// its version: 0x0002, or 0x03xx for an SSLv3/TLS client.
		if len(b) < 4 || (b[2] == 1 && b[3] == 0 && len(b) < 5) {
			return Unknown, len(b), false
		}
		if b[2] == 1 && (b[3] == 3 || (b[3] == 0 && b[4] == 2)) {
			return TLS, 0, true
		}
		return Unknown, 0, true
	}
	if k, safe, ok := classifyProxyV2(b); k != Unknown || !ok {
		return k, safe, ok
	}
	i := 0
	for i < len(b) && (b[i] == '\r' || b[i] == '\n' || b[i] == ' ' || b[i] == '\t') {
		i++
	}
	if i >= MaxRequestHead {
		return HTTP, 0, true
	}
	if i == len(b) {
		return Unknown, len(b), false
	}
	j := i
	for j < len(b) && isTchar(b[j]) {
		j++
	}
	switch {
	case j == i:
		return Unknown, 0, true // not a token
	case j >= MaxRequestHead:
		return HTTP, 0, true
	case j == len(b):
		return Unknown, len(b), false
	case !isLWS(b[j]):
		return Unknown, 0, true // the first word ends in a byte no method holds
	}
	if b[j] == '\r' {
		switch {
		case j+1 == len(b):
			return Unknown, j, false
		case b[j+1] == '\n':
			return Unknown, 0, true // "WORD\r\n": a line that is no request line
		}
	}
	if known, _ := matchMethod(b[i:j], true); known || equalFoldUpper(b[i:j], "PROXY") {
		return HTTP, 0, true // PROXY: a PROXY protocol header, which HTTP may follow
	}
	for p := j; p < len(b); p++ {
		switch c := b[p]; {
		case c == '\n' || c == 0:
			// The line ended (or holds a NUL, past which no server
			// reads a request line) with no HTTP version in it.
			return Unknown, 0, true
		case isLWS(c) && hasPrefixFold(b[p+1:], "http/"):
			return HTTP, 0, true
		}
	}
	if len(b) >= MaxRequestHead {
		return HTTP, 0, true
	}
	return Unknown, j, false
}

// proxyV2 is the signature of a PROXY protocol version 2 header.
const proxyV2 = "\r\n\r\n\x00\r\nQUIT\n"

// classifyProxyV2 classifies b as HTTP when it starts with a PROXY
// protocol v2 header, which a server configured for it reads before the
// request. It returns Unknown, true when b cannot be one.
func classifyProxyV2(b []byte) (k Kind, safe int, ok bool) {
	n := min(len(b), len(proxyV2))
	if string(b[:n]) != proxyV2[:n] {
		return Unknown, 0, true
	}
	if n < len(proxyV2) {
		return Unknown, min(n, 4), false // the empty lines may pass
	}
	return HTTP, 0, true
}

// isLWS reports the bytes lenient HTTP parsers take for white space between
// the parts of a request line (RFC 9112 3: SP, HTAB, VT, FF, bare CR).
func isLWS(c byte) bool {
	return c == ' ' || c == '\t' || c == '\v' || c == '\f' || c == '\r'
}
