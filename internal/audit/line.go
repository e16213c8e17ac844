package audit

import (
	"crypto/sha256"
	"encoding/hex"
	"math"
	"net/netip"
	"strconv"
	"unicode/utf8"
)

// appendLine appends r's line, as chain.record writes it, with prev as its
// prev and a newline: the bytes encoding/json writes for its flowLine (with
// HTML escaping off), without reflection. TestAppendLineIsJSON holds the
// two to the same bytes.
func appendLine(b []byte, r *Record, prev *[sha256.Size]byte) []byte {
	b = append(b, `{"ts":"`...)
	b = r.TS.UTC().AppendFormat(b, tsLayout)
	b = append(b, `","run":`...)
	b = appendJSONString(b, r.Run)
	b = append(b, `,"phase":`...)
	b = appendJSONString(b, r.Phase)
	b = append(b, `,"kind":`...)
	b = appendJSONString(b, r.Kind)
	b = append(b, `,"proto":`...)
	b = appendJSONString(b, r.Proto)
	b = append(b, `,"src":`...)
	b = appendAddrPort(b, r.Src)
	b = append(b, `,"dst":`...)
	b = appendAddrPort(b, r.Dst)
	b = append(b, `,"host":`...)
	b = appendJSONString(b, r.Host)
	b = append(b, `,"host_from":`...)
	b = appendJSONString(b, r.HostFrom)
	b = append(b, `,"port":`...)
	b = strconv.AppendUint(b, uint64(r.Port), 10)
	b = append(b, `,"verdict":`...)
	b = appendJSONString(b, r.Verdict)
	b = append(b, `,"rule":`...)
	b = appendJSONString(b, r.Rule)
	b = append(b, `,"reason":`...)
	b = appendJSONString(b, r.Reason)
	b = append(b, `,"pid":`...)
	b = strconv.AppendInt(b, int64(r.PID), 10)
	b = append(b, `,"comm":`...)
	b = appendJSONString(b, r.Comm)
	b = append(b, `,"exe":`...)
	b = appendJSONString(b, r.Exe)
	b = append(b, `,"owner":`...)
	b = appendJSONString(b, r.Owner)
	b = append(b, `,"bytes_out":`...)
	b = strconv.AppendInt(b, r.BytesOut, 10)
	b = append(b, `,"bytes_in":`...)
	b = strconv.AppendInt(b, r.BytesIn, 10)
	b = append(b, `,"duration_ms":`...)
	b = appendJSONFloat(b, r.DurationMS)
	b = append(b, `,"dial":`...)
	b = appendAddrPort(b, r.Dial)
	b = appendOmitEmpty(b, `,"dial_failed":`, r.DialFailed)
	b = appendOmitEmpty(b, `,"sni":`, r.SNI)
	b = appendOmitEmpty(b, `,"http_host":`, r.HTTPHost)
	b = appendOmitEmpty(b, `,"qname":`, r.Qname)
	b = appendOmitEmpty(b, `,"qtype":`, r.Qtype)
	b = appendOmitEmpty(b, `,"rcode":`, r.Rcode)
	b = appendOmitEmpty(b, `,"outcome":`, r.Outcome)
	b = appendOmitEmpty(b, `,"method":`, r.Method)
	b = appendOmitEmpty(b, `,"path":`, r.Path)
	if r.Status != 0 {
		b = append(b, `,"status":`...)
		b = strconv.AppendInt(b, int64(r.Status), 10)
	}
	b = appendOmitEmpty(b, `,"secrets":`, r.Secrets)
	if r.Count > 0 {
		b = append(b, `,"count":`...)
		b = strconv.AppendInt(b, int64(r.Count), 10)
	}
	if r.Samples != [MaxSamples]string{} {
		b = append(b, `,"samples":[`...)
		n := 0
		for _, s := range r.Samples {
			if s == "" {
				continue
			}
			if n > 0 {
				b = append(b, ',')
			}
			b = appendJSONString(b, s)
			n++
		}
		b = append(b, ']')
	}
	if !r.Until.IsZero() {
		b = append(b, `,"until":"`...)
		b = r.Until.UTC().AppendFormat(b, tsLayout)
		b = append(b, '"')
	}
	if r.Labels != "" {
		b = append(b, `,"labels":`...)
		b = append(b, r.Labels...)
	}
	b = append(b, `,"prev":"`...)
	b = hex.AppendEncode(b, prev[:])
	return append(b, "\"}\n"...)
}

func appendOmitEmpty(b []byte, key, s string) []byte {
	if s == "" {
		return b
	}
	return appendJSONString(append(b, key...), s)
}

// appendAddrPort appends p as encoding/json does (its MarshalText, quoted):
// "" for the zero AddrPort.
func appendAddrPort(b []byte, p netip.AddrPort) []byte {
	var scratch [64]byte
	return appendJSONString(b, string(p.AppendTo(scratch[:0])))
}

// appendJSONFloat appends f as encoding/json does a float64 (like ES6), and
// -1 for a NaN or an infinity, which JSON cannot hold.
func appendJSONFloat(b []byte, f float64) []byte {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		f = -1
	}
	format := byte('f')
	if abs := math.Abs(f); abs != 0 && (abs < 1e-6 || abs >= 1e21) {
		format = 'e'
	}
	b = strconv.AppendFloat(b, f, format, -1, 64)
	if format == 'e' {
		// e-09 is written e-9.
		if n := len(b); n >= 4 && b[n-4] == 'e' && b[n-3] == '-' && b[n-2] == '0' {
			b[n-2] = b[n-1]
			b = b[:n-1]
		}
	}
	return b
}

const hexDigits = "0123456789abcdef"

// appendJSONString appends s quoted as encoding/json does with HTML
// escaping off: ", \ and the control characters escaped (\b \f \n \r \t by
// their short forms), invalid UTF-8 as \ufffd, U+2028 and U+2029 escaped.
func appendJSONString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		if c := s[i]; c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '\\', '"':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xF])
			}
			i++
			start = i
			continue
		}
		c, size := utf8.DecodeRuneInString(s[i:])
		if c == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if c == '\u2028' || c == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[c&0xF])
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
