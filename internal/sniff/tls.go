package sniff

// Size bounds for Hello.Parse.
const (
	// MaxHelloLen is the largest ClientHello handshake message (4-byte
	// handshake header included) Hello.Parse will wait for: 16 KiB.
	MaxHelloLen = 16 << 10
	// MaxHelloWire bounds the record stream Hello.Parse will wait for: the
	// ClientHello plus its record headers must end within the first 32 KiB.
	// That admits any ClientHello up to MaxHelloLen in ordinary records and a
	// ClientHello of up to about 5 KiB cut into 1-byte records.
	MaxHelloWire = 32 << 10
)

const (
	recordTypeHandshake      = 0x16
	recordHeaderLen          = 5
	maxRecordLen             = 1 << 14 // TLSPlaintext.length limit (RFC 8446 5.1)
	handshakeTypeClientHello = 1

	extServerName = 0x0000
	extALPN       = 0x0010
	extECH        = 0xfe0d
)

// Hello is a TLS ClientHello's interesting fields. Parse fills it.
//
// ServerName and ALPN alias the bytes passed to Parse, without copying or
// allocating. The one exception is a field that the sender split across TLS
// records: it is not contiguous in the input, so Parse copies it into a new
// slice (the only allocation Parse ever makes; real clients send a
// ClientHello in one record and never trigger it). Copy the fields to keep
// them after the input buffer is reused.
type Hello struct {
	// ServerName is the host_name from the server_name extension, exactly as
	// sent (it may be an invalid name: check it with flow.ValidHostname). nil if
	// the extension is absent or holds no host_name.
	ServerName []byte
	// ALPN is the raw application_layer_protocol_negotiation extension body
	// (the 2-byte list length, then length-prefixed protocol names), for logs.
	// nil if absent.
	ALPN []byte
	// HasECH reports an encrypted_client_hello extension (0xfe0d). The
	// ServerName is then the outer, public name; the real one is encrypted.
	// Clients also send this extension as GREASE, so it does not prove ECH.
	HasECH bool
	// Bad says why Parse returned NotThis, in words, e.g. "an empty TLS
	// record". It is "" after NeedMore and Done.
	Bad string
}

// Parse parses b, a prefix of a TLS record stream (handshake records of any
// version 3.x: servers accept SSL 3.0's and unassigned minors in the record
// layer) that starts with a ClientHello. The ClientHello may be split across
// any number of records and any number of reads; Parse returns NeedMore
// until the whole handshake message is in b, then Done.
//
// It returns NotThis, saying why in Bad, as soon as b cannot start such a
// stream: another record type first (an alert or a change_cipher_spec that a
// server would skip), a record version that is not 3.x, an empty or
// oversized record, an SSL 2.0-compatible ClientHello, another handshake
// message, lengths that do not add up (at any nesting level), a duplicate
// server_name, ALPN or ECH extension, more than one host_name, a ClientHello
// longer than MaxHelloLen, or one that would not end within the first
// MaxHelloWire bytes of b. Parse keeps no state between calls: each call
// parses b from the start.
func (h *Hello) Parse(b []byte) Status {
	*h = Hello{}
	if len(b) > 0 && b[0] >= 0x80 {
		h.Bad = "an SSL 2.0-compatible ClientHello (it cannot carry a server name)"
		return NotThis
	}
	r := hsReader{b: b, lim: 4, st: Done}
	st := h.parse(&r)
	if st != Done {
		*h = Hello{}
		if st == NotThis {
			h.Bad = r.why
		}
	}
	return st
}

func (h *Hello) parse(r *hsReader) Status {
	if r.u8() != handshakeTypeClientHello {
		r.bad("the first handshake message is not a ClientHello")
	}
	n := r.u24()
	if !r.ok() {
		return r.st
	}
	if n > MaxHelloLen-4 {
		r.bad("a ClientHello over 16 KiB")
		return r.st
	}
	r.lim = n

	if v := r.u16(); v>>8 != 3 { // legacy_version
		r.bad("a ClientHello version that is not 3.x")
	}
	r.skip(32) // random
	if sid := r.u8(); sid > 32 {
		r.bad("a session id over 32 bytes")
	} else {
		r.skip(sid)
	}
	if cs := r.u16(); cs < 2 || cs%2 != 0 {
		r.bad("a malformed cipher suite list")
	} else {
		r.skip(cs)
	}
	if cm := r.u8(); cm < 1 {
		r.bad("an empty compression method list")
	} else {
		r.skip(cm)
	}
	if !r.ok() || r.lim == 0 { // no extensions is legal before TLS 1.3
		return r.st
	}
	if extLen := r.u16(); extLen != r.lim {
		r.bad("an extensions length that disagrees with the ClientHello's")
	}
	var seen uint8
	for r.ok() && r.lim > 0 {
		typ, l := r.u16(), r.u16()
		if !r.ok() {
			break
		}
		if l > r.lim {
			r.bad("an extension longer than the extensions block")
			return r.st
		}
		var bit uint8
		switch typ {
		case extServerName:
			bit = 1
		case extALPN:
			bit = 2
		case extECH:
			bit = 4
		}
		if seen&bit != 0 {
			r.bad("a duplicate server_name, ALPN or ECH extension")
			return r.st
		}
		seen |= bit
		switch typ {
		case extServerName:
			h.parseServerName(r, l)
		case extALPN:
			h.parseALPN(r, l)
		case extECH:
			h.HasECH = true
			r.skip(l)
		default:
			r.skip(l)
		}
	}
	return r.st
}

// parseServerName parses a server_name extension body of l bytes (RFC 6066 3).
func (h *Hello) parseServerName(r *hsReader, l int) {
	const malformed = "a malformed server_name extension"
	if l < 2 {
		r.bad(malformed)
		return
	}
	list := r.u16()
	if list != l-2 || list == 0 {
		r.bad(malformed)
		return
	}
	for rem := list; r.ok() && rem > 0; {
		if rem < 3 {
			r.bad(malformed)
			return
		}
		typ, n := r.u8(), r.u16()
		rem -= 3
		if !r.ok() {
			return
		}
		if n > rem {
			r.bad(malformed)
			return
		}
		rem -= n
		if typ != 0 { // not host_name: no other type is defined; skip it
			r.skip(n)
			continue
		}
		switch {
		case n == 0:
			r.bad("an empty host name in server_name")
			return
		case h.ServerName != nil:
			r.bad("two host names in server_name")
			return
		}
		h.ServerName = r.bytes(n)
	}
}

// parseALPN records and validates an ALPN extension body of l bytes (RFC 7301 3.1).
func (h *Hello) parseALPN(r *hsReader, l int) {
	const malformed = "a malformed ALPN extension"
	if l < 2 {
		r.bad(malformed)
		return
	}
	start := *r
	body := r.bytes(l)
	if !r.ok() {
		return
	}
	*r = start // validate the structure by walking it again
	list := r.u16()
	if list != l-2 || list < 2 {
		r.bad(malformed)
		return
	}
	for rem := list; r.ok() && rem > 0; {
		n := r.u8()
		rem--
		if !r.ok() {
			return
		}
		if n == 0 || n > rem {
			r.bad(malformed)
			return
		}
		rem -= n
		r.skip(n)
	}
	if r.ok() {
		h.ALPN = body
	}
}

// hsReader reads the bytes of one handshake message in order from a prefix
// of a TLS record stream, stepping over record headers. Errors are sticky:
// after the first failure every read returns zero and st keeps that first
// failure, so callers check ok() only where they must stop.
type hsReader struct {
	b   []byte
	pos int    // offset in b of the next payload byte
	end int    // offset in b where the current record's payload ends (may exceed len(b))
	lim int    // bytes the handshake message still holds
	st  Status // Done while nothing has failed, else NeedMore or NotThis
	why string // after NotThis: why
}

func (r *hsReader) ok() bool { return r.st == Done }

// needMore records that the input ran out.
func (r *hsReader) needMore() {
	if r.st == Done {
		r.st = NeedMore
	}
}

// bad records a refusal and why.
func (r *hsReader) bad(why string) {
	if r.st == Done {
		r.st, r.why = NotThis, why
	}
}

// record makes sure pos is inside a record's payload, reading the next
// record header when the current record is used up.
func (r *hsReader) record() bool {
	if !r.ok() {
		return false
	}
	if r.pos < r.end {
		return true
	}
	hdr := r.b[r.pos:] // pos == end <= len(b): pos only moves over bytes present
	switch {
	case r.pos+recordHeaderLen+1 > MaxHelloWire:
		r.bad("a ClientHello that does not end within 32 KiB")
	case len(hdr) > 0 && hdr[0] != recordTypeHandshake:
		r.bad("a record that is not a handshake record before the end of the ClientHello")
	case len(hdr) > 1 && hdr[1] != 3:
		r.bad("a TLS record version that is not 3.x")
	case len(hdr) < recordHeaderLen:
		r.needMore()
	}
	if !r.ok() {
		return false
	}
	n := int(hdr[3])<<8 | int(hdr[4])
	switch {
	case n == 0: // forbidden (RFC 8446 5.1), yet some servers skip them
		r.bad("an empty TLS record")
		return false
	case n > maxRecordLen:
		r.bad("a TLS record over 16 KiB")
		return false
	}
	r.pos += recordHeaderLen
	r.end = r.pos + n
	return true
}

// take accounts for n bytes of the handshake message.
func (r *hsReader) take(n int) bool {
	if !r.ok() {
		return false
	}
	if n > r.lim {
		r.bad("lengths in the ClientHello that do not add up")
		return false
	}
	r.lim -= n
	return true
}

// walk moves over n payload bytes, crossing records, copying them to dst if
// dst is not nil. The caller has already taken them.
func (r *hsReader) walk(n int, dst []byte) {
	for done := 0; done < n; {
		if !r.record() {
			return
		}
		k := min(n-done, r.end-r.pos)
		if r.pos+k > MaxHelloWire {
			r.bad("a ClientHello that does not end within 32 KiB")
			return
		}
		if r.pos+k > len(r.b) {
			r.needMore()
			return
		}
		if dst != nil {
			copy(dst[done:], r.b[r.pos:r.pos+k])
		}
		r.pos += k
		done += k
	}
}

func (r *hsReader) u8() int {
	if !r.take(1) || !r.record() {
		return 0
	}
	if r.pos+1 > MaxHelloWire {
		r.bad("a ClientHello that does not end within 32 KiB")
		return 0
	}
	if r.pos >= len(r.b) {
		r.needMore()
		return 0
	}
	v := r.b[r.pos]
	r.pos++
	return int(v)
}

func (r *hsReader) u16() int { return r.u8()<<8 | r.u8() }

func (r *hsReader) u24() int { return r.u8()<<16 | r.u8()<<8 | r.u8() }

func (r *hsReader) skip(n int) {
	if r.take(n) {
		r.walk(n, nil)
	}
}

// bytes returns the next n (> 0) bytes: a subslice of b when they sit in one
// record, else a new copy. It returns nil on failure.
func (r *hsReader) bytes(n int) []byte {
	if !r.take(n) || !r.record() {
		return nil
	}
	if n <= r.end-r.pos {
		if r.pos+n > MaxHelloWire {
			r.bad("a ClientHello that does not end within 32 KiB")
			return nil
		}
		if r.pos+n > len(r.b) {
			r.needMore()
			return nil
		}
		s := r.b[r.pos : r.pos+n : r.pos+n]
		r.pos += n
		return s
	}
	// Split across records. Check the whole span is present before
	// allocating, so an incomplete stream costs nothing.
	probe := *r
	if probe.walk(n, nil); !probe.ok() {
		r.st, r.why = probe.st, probe.why
		return nil
	}
	dst := make([]byte, n)
	r.walk(n, dst)
	return dst
}
