package l7

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/tunwall/tunwall/internal/secrets"
)

// Masking. A server that reflects its request (an echo endpoint, an error
// page quoting headers) would hand an injected value to the sandbox. The
// response to a request that received a secret is therefore searched for
// that value, as is and base64-encoded at each of the three alignments
// (Basic credentials echoed back), without regard to ASCII letter case (a
// server that quotes its request lower- or upper-cased would otherwise
// hand back the value but for the case of its letters, which a few
// guesses settle; base64 forms so match more than they are, which only
// masks more), and each occurrence is overwritten with
// '*' of the same length, so lengths and framing stay as they were. The
// request is sent upstream with Accept-Encoding: identity, so an honest
// server answers in the clear.
//
// Every byte of such a response reaches the client through one
// maskWriter, the ResponseWriter the reverse proxy is given (see its
// comment for each place a response carries bytes).

// maskChunk is how much a maskStream masks at a time.
const maskChunk = 32 << 10

type pattern struct {
	b     []byte
	lower []byte // b in ASCII lower case, for header names and values
	name  string
}

type masker struct {
	pats []pattern
	max  int
	hits []span // scratch of mask
}

type span struct{ from, to int }

func newMasker(list []*secrets.Secret) *masker {
	m := &masker{}
	for _, s := range list {
		m.addValue([]byte(s.Value().Reveal()), s.Name)
	}
	return m
}

// addValue adds v and its base64 forms as name's patterns.
func (m *masker) addValue(v []byte, name string) {
	m.add(v, name)
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
				m.add([]byte(e), name)
			}
		}
	}
}

func (m *masker) add(b []byte, name string) {
	if len(b) == 0 {
		return
	}
	for _, p := range m.pats {
		if bytes.Equal(p.b, b) {
			return
		}
	}
	m.pats = append(m.pats, pattern{b: b, lower: asciiLower(b), name: name})
	m.max = max(m.max, len(b))
}

// mask overwrites every occurrence of a pattern in b, in any ASCII case,
// overlapping ones included, and returns the name of one found.
func (m *masker) mask(b []byte) string {
	found := m.find(asciiLower(b), true, 0)
	for _, h := range m.hits {
		star(b, h.from, h.to)
	}
	return found
}

// find sets m.hits to where the patterns occur in hay (compared in lower
// case when fold), overlapping occurrences included, and returns the name
// of one found; only occurrences that end past hay[after] count (those
// before were found already). All are found before any is overwritten, so
// that masking one cannot hide another that overlaps it.
func (m *masker) find(hay []byte, fold bool, after int) string {
	found := ""
	m.hits = m.hits[:0]
	for _, p := range m.pats {
		pb := p.b
		if fold {
			pb = p.lower
		}
		for off := max(after-len(pb)+1, 0); off < len(hay); {
			i := bytes.Index(hay[off:], pb)
			if i < 0 {
				break
			}
			m.hits = append(m.hits, span{off + i, off + i + len(pb)})
			off += i + 1
			found = p.name
		}
	}
	return found
}

func star(b []byte, from, to int) {
	for j := from; j < to; j++ {
		b[j] = '*'
	}
}

// maskString masks s without regard to ASCII case: it is a header's name
// or value, and Go's canonical form changes the case of a name (so a value
// reflected in a name, or a name listed in Trailer, would come back
// case-folded).
func (m *masker) maskString(s string) (string, string) {
	name := m.find(asciiLower([]byte(s)), true, 0)
	if name == "" {
		return s, ""
	}
	b := []byte(s)
	for _, h := range m.hits {
		star(b, h.from, h.to)
	}
	return string(b), name
}

// maskHeader masks every name and value of h in place; a name that
// carried a value is replaced by its masked form (values of names that
// mask alike are merged). note is told each secret found.
func (m *masker) maskHeader(h http.Header, note func(string)) {
	var renamed map[string][]string
	for k, vs := range h {
		for i, v := range vs {
			if nv, name := m.maskString(v); name != "" {
				vs[i] = nv
				note(name)
			}
		}
		if nk, name := m.maskString(k); name != "" {
			note(name)
			delete(h, k)
			if renamed == nil {
				renamed = map[string][]string{}
			}
			renamed[nk] = append(renamed[nk], vs...)
		}
	}
	for k, vs := range renamed {
		h[k] = append(h[k], vs...)
	}
}

func asciiLower(b []byte) []byte {
	out := make([]byte, len(b))
	lowerInto(out, b)
	return out
}

// lowerInto writes src in ASCII lower case to dst, as long: eight bytes
// at a time (each byte's high bit says whether it is in 'A'..'Z', and
// 0x20 is added to those), as a masked body goes through it whole.
func lowerInto(dst, src []byte) {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	dst = dst[:len(src)]
	i := 0
	for ; i+8 <= len(src); i += 8 {
		w := binary.LittleEndian.Uint64(src[i:])
		h := w &^ highs
		ge := h + (0x80-'A')*ones   // high bit: byte >= 'A'
		gt := h + (0x80-'Z'-1)*ones // high bit: byte > 'Z'
		upper := ge &^ gt &^ w & highs
		binary.LittleEndian.PutUint64(dst[i:], w|upper>>2)
	}
	for ; i < len(src); i++ {
		c := src[i]
		if c-'A' < 'Z'-'A'+1 {
			c += 'a' - 'A'
		}
		dst[i] = c
	}
}

// maskStream masks a byte stream written to it in pieces of any size on
// its way to w. Of what it was given it holds back the last max-1 bytes
// (max: the longest pattern), whatever they are, until the next bytes say
// whether a value begins there, or until flushTail or Close writes them.
// What it holds back never depends on the bytes: holding back only a tail
// that is a prefix of a value would tell a sandbox that streams its
// guesses through an echo which of them begin the secret. The held-back
// bytes are kept as they came, with the spans of them already known to be
// masked, so that an occurrence that overlaps a masked one is still found
// whole: the pieces do not change what comes out.
type maskStream struct {
	w       io.Writer
	m       *masker
	onMask  func(string)
	buf     []byte // as written, not yet passed on: fewer than max bytes between Writes
	low     []byte // buf in ASCII lower case, searched (scratch)
	pending []span // spans of buf to mask before they go
}

func (s *maskStream) Write(p []byte) (int, error) {
	if s.buf == nil {
		s.buf = make([]byte, 0, maskChunk+s.m.max)
		s.low = make([]byte, maskChunk+s.m.max)
	}
	n := 0
	for len(p) > 0 {
		// The held-back tail, then as much of p as fits; searched for
		// values that end in the new bytes (they may begin in the tail),
		// in any letter case.
		tail := len(s.buf)
		k := copy(s.buf[tail:cap(s.buf)], p)
		s.buf = s.buf[:tail+k]
		p = p[k:]
		n += k
		lowerInto(s.low, s.buf)
		if name := s.m.find(s.low[:len(s.buf)], true, tail); name != "" {
			s.pending = append(s.pending, s.m.hits...)
			if s.onMask != nil {
				s.onMask(name)
			}
		}
		ready := len(s.buf) - min(len(s.buf), s.m.max-1)
		if ready <= 0 {
			continue
		}
		// Mask what goes now; keep, shifted, the spans that reach into
		// the tail.
		kept := s.pending[:0]
		for _, h := range s.pending {
			star(s.buf, h.from, min(h.to, ready))
			if h.to > ready {
				kept = append(kept, span{max(h.from-ready, 0), h.to - ready})
			}
		}
		s.pending = kept
		if _, err := s.w.Write(s.buf[:ready]); err != nil {
			return n, err
		}
		s.buf = s.buf[:copy(s.buf, s.buf[ready:])]
	}
	return n, nil
}

// held reports whether bytes are held back.
func (s *maskStream) held() bool { return len(s.buf) > 0 }

// Close writes the held-back tail: the stream has ended, so no value can
// begin in it that was not found. flushTail is Close mid-stream: after a
// quiet interval (maskIdle), the tail goes, whatever it is; a value the
// server had begun and completes later is then not found whole.
func (s *maskStream) flushTail() error { return s.Close() }

func (s *maskStream) Close() error {
	for _, h := range s.pending {
		star(s.buf, h.from, h.to)
	}
	s.pending = s.pending[:0]
	if len(s.buf) == 0 {
		return nil
	}
	_, err := s.w.Write(s.buf)
	s.buf = s.buf[:0]
	return err
}

// errUpgradeWithSecret refuses to switch protocols for a request that
// received a secret.
var errUpgradeWithSecret = errors.New("the request received a secret, and what the server sends after switching protocols could not be masked")

// maskWriter is the ResponseWriter the reverse proxy writes a response
// through, so the one way a response reaches the client. Once the request
// has received a secret (armed), it masks every place a response carries
// bytes to the client:
//
//   - the headers of the response, names and values, at WriteHeader or the
//     first Write or Flush;
//   - the headers of each 1xx response (103 Early Hints, 100 Continue),
//     which the proxy writes through WriteHeader before the answer;
//   - the body, as a stream (maskStream), the tail at finish;
//   - the trailers, declared or not (http.TrailerPrefix), which the proxy
//     puts in the header map after the body: at finish, after the proxy
//     returns and before the server sends them;
//   - tunwall's own 502 (upstreamError), which quotes the transport's
//     error, and with it bytes of a malformed response.
//
// It refuses to be hijacked: after a 101 the bytes are a protocol tunwall
// does not read (WebSocket frames, compressed with permessage-deflate at
// the server's choice), so they can be neither masked reliably nor held
// back without stalling it; the proxy's transport refuses such a request
// before it is sent (guardTransport), and this is the second lock. Without
// a secret in the request, everything passes through untouched.
type maskWriter struct {
	w     http.ResponseWriter
	m     *masker // nil: not armed
	note  func(string)
	body  maskStream
	wrote bool // the final header is written

	// Once armed, mu serializes the proxy's calls and the idle timer's,
	// which writes the held-back tail when the upstream has been quiet
	// for maskIdle (a stream that pauses is not left short of its end).
	mu   sync.Mutex
	idle *time.Timer
	done bool // finish ran: nothing more is written
}

// maskIdle is how long the held-back tail of a masked response waits for
// more bytes before it goes anyway. The same for every byte: when bytes go
// says nothing of what they are.
const maskIdle = 100 * time.Millisecond

// arm starts masking the values of list.
func (mw *maskWriter) arm(list []*secrets.Secret) {
	if len(list) == 0 {
		return
	}
	mw.m = newMasker(list)
	mw.body = maskStream{w: mw.w, m: mw.m, onMask: mw.note}
}

func (mw *maskWriter) Header() http.Header { return mw.w.Header() }

// head masks the header before the server writes it.
func (mw *maskWriter) head(code int) {
	if mw.m == nil || mw.wrote {
		return
	}
	mw.m.maskHeader(mw.w.Header(), mw.note)
	if code < 100 || code > 199 || code == http.StatusSwitchingProtocols {
		mw.wrote = true
	}
}

func (mw *maskWriter) WriteHeader(code int) {
	if mw.m != nil {
		mw.mu.Lock()
		defer mw.mu.Unlock()
	}
	mw.head(code)
	mw.w.WriteHeader(code)
}

func (mw *maskWriter) Write(p []byte) (int, error) {
	if mw.m == nil {
		return mw.w.Write(p)
	}
	mw.mu.Lock()
	defer mw.mu.Unlock()
	mw.head(http.StatusOK)
	n, err := mw.body.Write(p)
	if mw.body.held() && !mw.done {
		if mw.idle == nil {
			mw.idle = time.AfterFunc(maskIdle, mw.onIdle)
		} else {
			mw.idle.Reset(maskIdle)
		}
	}
	return n, err
}

// onIdle writes the held-back tail once the upstream has been quiet for
// maskIdle, and flushes it to the client.
func (mw *maskWriter) onIdle() {
	mw.mu.Lock()
	defer mw.mu.Unlock()
	if mw.done || !mw.body.held() {
		return
	}
	if mw.body.flushTail() == nil {
		http.NewResponseController(mw.w).Flush()
	}
}

// FlushError flushes what is masked; bytes held back stay (they may begin
// a value the next bytes complete) until more come or maskIdle passes.
func (mw *maskWriter) FlushError() error {
	if mw.m != nil {
		mw.mu.Lock()
		defer mw.mu.Unlock()
	}
	mw.head(http.StatusOK)
	return http.NewResponseController(mw.w).Flush()
}

func (mw *maskWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	if mw.m != nil {
		return nil, nil, errUpgradeWithSecret
	}
	return http.NewResponseController(mw.w).Hijack()
}

// finish writes the body's tail and masks the trailers, once the proxy
// has returned.
func (mw *maskWriter) finish() {
	if mw.m == nil {
		return
	}
	mw.mu.Lock()
	defer mw.mu.Unlock()
	mw.done = true
	if mw.idle != nil {
		mw.idle.Stop()
	}
	mw.body.Close()
	mw.m.maskHeader(mw.w.Header(), mw.note)
}
