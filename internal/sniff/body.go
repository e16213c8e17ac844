package sniff

// Bounds for Body.
const (
	// maxChunkLine bounds a chunk-size line (size and extensions).
	maxChunkLine = 4 << 10
	// maxChunkDigits bounds a chunk size: 15 hex digits (under 2^60).
	maxChunkDigits = 15
)

// Body follows the framing of one request body (RFC 9112 6.3, 7.1) so that
// the caller finds where the next request head starts. A request with
// neither Content-Length nor Transfer-Encoding has no body. Chunked framing
// is parsed strictly: lines end in CRLF, chunk sizes are bare hex digits
// (extensions after ';' are allowed), trailer lines are "token: value".
// Anything else is refused: where framings disagree, requests are smuggled.
// Body copies nothing and allocates nothing.
type Body struct {
	st     bodyState
	remain int64 // bytes left: of the body (length), of the chunk (chunk data)
	line   int   // bytes of the current chunk-size or trailer line so far
	digits int   // hex digits of the current chunk size
	trail  int   // bytes of the trailer section so far
	// Bad says why Feed returned NotThis, in words.
	Bad string
}

type bodyState uint8

const (
	bodyDone     bodyState = iota // no body, or the body has ended
	bodyLength                    // remain bytes of a Content-Length body
	chunkSize                     // in a chunk-size
	chunkExt                      // in a chunk extension
	chunkSizeLF                   // after the chunk-size line's CR
	chunkData                     // remain bytes of chunk data
	chunkDataCR                   // expecting the CR after chunk data
	chunkDataLF                   // expecting the LF after chunk data
	trailerStart                  // at the start of a trailer line (or the final CRLF)
	trailerName                   // in a trailer field name
	trailerValue                  // in a trailer field value
	trailerLF                     // after a trailer line's CR
	trailerEndLF                  // after the final CR
	bodyBad                       // refused
)

// Start sets b up for the body of the request r describes (r from a Done
// Request.Parse).
func (b *Body) Start(r *Request) {
	*b = Body{}
	switch {
	case r.Chunked:
		b.st = chunkSize
	case r.ContentLength > 0:
		b.st, b.remain = bodyLength, r.ContentLength
	}
}

// Done reports whether the body has ended (or there was none).
func (b *Body) Done() bool { return b.st == bodyDone }

// Feed consumes body bytes from the start of p. It returns how many bytes
// of p belong to the body and:
//   - NeedMore when all of p was body and the body goes on;
//   - Done when the body ended after n bytes (p[n:] is what follows it);
//   - NotThis when the framing is malformed (Bad says how; n is then how
//     many bytes before the fault were valid body).
//
// Feed on an ended body returns 0, Done.
func (b *Body) Feed(p []byte) (n int, st Status) {
	for n < len(p) {
		switch b.st {
		case bodyDone:
			return n, Done
		case bodyBad:
			return n, NotThis
		case bodyLength, chunkData:
			k := int64(len(p) - n)
			if k > b.remain {
				k = b.remain
			}
			n += int(k)
			b.remain -= k
			if b.remain == 0 {
				if b.st == bodyLength {
					b.st = bodyDone
				} else {
					b.st = chunkDataCR
				}
			}
			continue
		}
		c := p[n]
		if !b.step(c) {
			return n, NotThis
		}
		n++
	}
	if b.st == bodyDone {
		return n, Done
	}
	return n, NeedMore
}

// step advances the chunked framing by one byte; false means refused.
func (b *Body) step(c byte) bool {
	fail := func(why string) bool {
		b.st, b.Bad = bodyBad, why
		return false
	}
	switch b.st {
	case chunkSize:
		switch {
		case IsHex(c):
			if b.digits++; b.digits > maxChunkDigits {
				return fail("a chunk size over 15 hex digits")
			}
			b.remain = b.remain<<4 | int64(Unhex(c))
		case c == ';' && b.digits > 0:
			b.st = chunkExt
		case c == '\r' && b.digits > 0:
			b.st = chunkSizeLF
		default:
			return fail("a malformed chunk size")
		}
	case chunkExt:
		switch {
		case c == '\r':
			b.st = chunkSizeLF
		case (c < ' ' && c != '\t') || c == 0x7f:
			return fail("a control byte in a chunk extension")
		}
	case chunkSizeLF:
		if c != '\n' {
			return fail("a chunk-size line not ended by CRLF")
		}
		b.line, b.digits = 0, 0
		if b.remain == 0 {
			b.st = trailerStart
		} else {
			b.st = chunkData
		}
		return true
	case chunkDataCR:
		if c != '\r' {
			return fail("chunk data not followed by CRLF")
		}
		b.st = chunkDataLF
	case chunkDataLF:
		if c != '\n' {
			return fail("chunk data not followed by CRLF")
		}
		b.st, b.line, b.digits, b.remain = chunkSize, 0, 0, 0
		return true
	case trailerStart:
		switch {
		case c == '\r':
			b.st = trailerEndLF
		case isTchar(c):
			b.st = trailerName
		default:
			return fail("a malformed trailer line")
		}
	case trailerName:
		switch {
		case c == ':':
			b.st = trailerValue
		case !isTchar(c):
			return fail("a malformed trailer line")
		}
	case trailerValue:
		switch {
		case c == '\r':
			b.st = trailerLF
		case (c < ' ' && c != '\t') || c == 0x7f:
			return fail("a control byte in a trailer")
		}
	case trailerLF:
		if c != '\n' {
			return fail("a trailer line not ended by CRLF")
		}
		b.st, b.line = trailerStart, 0
	case trailerEndLF:
		if c != '\n' {
			return fail("a chunked body not ended by CRLF")
		}
		b.st = bodyDone
		return true
	}
	if b.st >= trailerStart && b.st <= trailerEndLF {
		if b.trail++; b.trail > MaxRequestHead {
			return fail("a trailer section over 16 KiB")
		}
	}
	if b.st == chunkSize || b.st == chunkExt || b.st == chunkSizeLF {
		if b.line++; b.line > maxChunkLine {
			return fail("a chunk-size line over 4 KiB")
		}
	}
	return true
}
