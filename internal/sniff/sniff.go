package sniff

import "bytes"

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
	// TLS is a TLS handshake record (0x16 0x03 0x01..0x04).
	TLS
	// HTTP is an HTTP/1.x request: a known method followed by a space.
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

// Classify classifies a connection's first bytes. ok is false while b is too
// short to decide (k is then Unknown): call again with more bytes. TLS needs
// 3 bytes; HTTP needs the method and the space after it (at most 11 bytes);
// anything else is usually decided on the first byte.
func Classify(b []byte) (k Kind, ok bool) {
	if len(b) == 0 {
		return Unknown, false
	}
	if b[0] == recordTypeHandshake {
		switch {
		case len(b) >= 2 && b[1] != 3:
			return Unknown, true
		case len(b) < 3:
			return Unknown, false
		case b[2] >= 1 && b[2] <= 4:
			return TLS, true
		}
		return Unknown, true
	}
	p := b
	if len(p) > maxMethodLen+1 {
		p = p[:maxMethodLen+1]
	}
	if sp := bytes.IndexByte(p, ' '); sp >= 0 {
		if full, _ := matchMethod(p[:sp]); full {
			return HTTP, true
		}
		return Unknown, true
	}
	if full, partial := matchMethod(p); full || partial {
		return Unknown, false
	}
	return Unknown, true
}

// ValidHostname reports whether b is a syntactically valid DNS hostname:
// LDH labels (letters, digits, hyphens not at either end of a label) of 1..63
// bytes, at most 253 bytes in all, with an optional trailing dot. As RFC 1123
// section 2.1 asks, the last label must not be all digits, so a dotted IPv4
// literal is not a hostname (parse those with net/netip instead). Case is not
// checked; policy compares names case-insensitively. Underscores and non-ASCII
// bytes (U-labels) are rejected; IDNs must arrive as A-labels (xn--).
func ValidHostname(b []byte) bool {
	if len(b) > 0 && b[len(b)-1] == '.' {
		b = b[:len(b)-1]
	}
	if len(b) == 0 || len(b) > 253 {
		return false
	}
	label := 0        // length of the current label so far
	allDigits := true // the current label is all digits so far
	prev := byte('.') // previous byte
	for _, c := range b {
		switch {
		case c == '.':
			if label == 0 || prev == '-' {
				return false
			}
			label, allDigits = 0, true
			prev = c
			continue
		case c >= '0' && c <= '9':
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z':
			allDigits = false
		case c == '-':
			if label == 0 {
				return false
			}
			allDigits = false
		default:
			return false
		}
		label++
		if label > 63 {
			return false
		}
		prev = c
	}
	return prev != '-' && !allDigits
}
