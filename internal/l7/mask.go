package l7

import (
	"bytes"
	"encoding/base64"
	"io"

	"github.com/tunwall/tunwall/internal/secrets"
)

// Masking. A server that reflects its request (an echo endpoint, an error
// page quoting headers) would hand an injected value to the sandbox. The
// response to a request that received a secret is therefore searched for
// that value, as is and base64-encoded at each of the three alignments
// (Basic credentials echoed back), and each occurrence is overwritten with
// '*' of the same length, so lengths and framing stay as they were. The
// request is sent upstream with Accept-Encoding: identity, so an honest
// server answers in the clear.

// maskChunk is how much a maskReader reads at a time.
const maskChunk = 32 << 10

type pattern struct {
	b    []byte
	name string
}

type masker struct {
	pats []pattern
	max  int
}

func newMasker(list []*secrets.Secret) *masker {
	m := &masker{}
	for _, s := range list {
		v := []byte(s.Value().Reveal())
		m.add(v, s.Name)
		for a := 0; a < 3; a++ {
			for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.URLEncoding} {
				e := enc.EncodeToString(append(make([]byte, a), v...))
				// Drop the group holding the alignment bytes and the last
				// group, which depends on what follows.
				if a > 0 {
					e = e[4:]
				}
				if len(e) > 4 {
					e = e[:len(e)-4]
				}
				if len(e) >= 8 {
					m.add([]byte(e), s.Name)
				}
			}
		}
	}
	return m
}

func (m *masker) add(b []byte, name string) {
	for _, p := range m.pats {
		if bytes.Equal(p.b, b) {
			return
		}
	}
	m.pats = append(m.pats, pattern{b: b, name: name})
	m.max = max(m.max, len(b))
}

// mask overwrites every pattern in b and returns the name of one found.
func (m *masker) mask(b []byte) string {
	found := ""
	for _, p := range m.pats {
		for off := 0; ; {
			i := bytes.Index(b[off:], p.b)
			if i < 0 {
				break
			}
			for j := off + i; j < off+i+len(p.b); j++ {
				b[j] = '*'
			}
			off += i + len(p.b)
			found = p.name
		}
	}
	return found
}

func (m *masker) maskString(s string) (string, string) {
	b := []byte(s)
	if name := m.mask(b); name != "" {
		return string(b), name
	}
	return s, ""
}

// maskReader masks a response body as it streams: it holds back the last
// max-1 bytes until it knows they do not begin a value.
type maskReader struct {
	r      io.ReadCloser
	m      *masker
	onMask func(string)
	buf    []byte // buf[start:end] is read and masked, not yet returned
	start  int
	ready  int // buf[start:ready] may be returned
	end    int
	err    error
}

func (mr *maskReader) Read(p []byte) (int, error) {
	for mr.ready == mr.start {
		if mr.err != nil {
			if mr.end == mr.start {
				return 0, mr.err
			}
			mr.ready = mr.end
			break
		}
		if mr.buf == nil {
			mr.buf = make([]byte, maskChunk+mr.m.max)
		}
		// Keep the held-back tail at the front, read after it.
		mr.end = copy(mr.buf, mr.buf[mr.start:mr.end])
		mr.start, mr.ready = 0, 0
		n, err := mr.r.Read(mr.buf[mr.end:])
		if n > 0 {
			// Search the new bytes and the tail before them.
			from := max(mr.end-(mr.m.max-1), 0)
			mr.end += n
			if name := mr.m.mask(mr.buf[from:mr.end]); name != "" && mr.onMask != nil {
				mr.onMask(name)
			}
		}
		mr.err = err
		if err == nil {
			mr.ready = max(mr.end-(mr.m.max-1), 0)
		}
	}
	n := copy(p, mr.buf[mr.start:mr.ready])
	mr.start += n
	return n, nil
}

func (mr *maskReader) Close() error { return mr.r.Close() }
