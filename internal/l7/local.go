package l7

import (
	"bytes"
	"crypto/tls"
	"encoding/binary"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// net/http answers some requests itself, before any handler sees them: an
// HTTP/1 head it cannot parse (400), one over the size limit (431), an
// unknown version (505), an Expect it does not support (417), a transfer
// coding it does not know (501); HTTP/2's server answers a header list over
// the limit (431) and connection-specific headers (400) with handlers of
// its own, and resets streams it refuses. None of these requests is sent
// on, but the log must still hold each: localConn watches the connection
// the server reads and writes for them.

// localHeadBytes bounds what is kept of a request head answered locally:
// enough for its request line.
const localHeadBytes = 512

// localConn is the client connection as an HTTP/1 server sees it. Between
// the start of a request (armed) and a handler taking it, it keeps the
// first bytes read and written; a write there is net/http answering the
// request itself.
type localConn struct {
	net.Conn
	fs *flowServer

	mu    sync.Mutex
	armed bool
	in    []byte // the first bytes of the request read since armed
	out   []byte // the first bytes written since armed: the answer's status line
	start time.Time
}

func (c *localConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.mu.Lock()
		if c.armed && len(c.in) < localHeadBytes {
			c.in = append(c.in, p[:min(n, localHeadBytes-len(c.in))]...)
		}
		c.mu.Unlock()
	}
	return n, err
}

func (c *localConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	if c.armed && len(c.out) < localHeadBytes {
		c.out = append(c.out, p[:min(len(p), localHeadBytes-len(c.out))]...)
	}
	c.mu.Unlock()
	return c.Conn.Write(p)
}

// CloseWrite half-closes when the connection can (net/http does after a
// 431, so the client reads the answer).
func (c *localConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// arm starts watching: the server is about to read a request.
func (c *localConn) arm() {
	c.mu.Lock()
	c.armed, c.in, c.out, c.start = true, c.in[:0], c.out[:0], time.Now()
	c.mu.Unlock()
}

// taken says a handler has the request: what follows is its answer.
func (c *localConn) taken() {
	c.mu.Lock()
	c.armed = false
	c.mu.Unlock()
}

// closed records the request the server answered itself, if it did.
func (c *localConn) closed() {
	c.mu.Lock()
	armed, in, out, start := c.armed, c.in, c.out, c.start
	c.armed = false
	c.mu.Unlock()
	if !armed || len(out) == 0 {
		return // no request, or one the client left unfinished: no answer
	}
	line, _, _ := bytes.Cut(out, []byte("\r\n"))
	status := 0
	if f := bytes.Fields(line); len(f) >= 2 {
		status, _ = strconv.Atoi(string(f[1]))
	}
	method, path, proto := requestLine(in)
	rec := Record{
		Start:    start,
		Duration: time.Since(start),
		Method:   method,
		Host:     c.fs.f.Host,
		Path:     path,
		Proto:    proto,
		Status:   status,
		Rule:     "default-deny",
		Reason:   fmt.Sprintf("tunwall's HTTP server answered the request itself (%s): its head is malformed or beyond what is served; it was not sent on", clip(printable(line))),
	}
	c.fs.local(rec)
}

// requestLine reads the method, the path (escaped, without the query) and
// the version of a request head's first line, as far as they parse.
func requestLine(head []byte) (method, path, proto string) {
	line, _, _ := bytes.Cut(head, []byte("\r\n"))
	line, _, _ = bytes.Cut(line, []byte("\n"))
	f := bytes.Fields(line)
	if len(f) == 0 {
		return "", "", ""
	}
	method = clip(printable(f[0]))
	if len(f) >= 2 {
		target, _, _ := bytes.Cut(f[1], []byte("?"))
		if u, err := url.ParseRequestURI(string(target)); err == nil {
			path = u.EscapedPath()
		} else {
			path = url.PathEscape(string(target))
		}
		if len(path) > maxRecordedPath {
			path = path[:maxRecordedPath]
		}
	}
	if len(f) >= 3 {
		proto = clip(printable(f[2]))
	}
	return method, path, proto
}

// printable keeps the printable ASCII of b, and a '?' for each other byte.
func printable(b []byte) string {
	out := make([]byte, len(b))
	for i, c := range b {
		if c < 0x20 || c > 0x7e {
			c = '?'
		}
		out[i] = c
	}
	return string(out)
}

// local records a request the flow's server answered itself, if the log
// can take it.
func (fs *flowServer) local(rec Record) {
	if fs.f.Rec.Admit() != nil {
		return
	}
	fs.locals.Add(1)
	rec.URL = (&request{fs: fs, rec: rec}).url()
	fs.f.Rec.Request(rec)
}

// h2Streams counts the streams an HTTP/2 client opens, from the frame
// headers it sends (HEADERS frames on a new stream); the streams the
// handler never saw were answered or refused by the HTTP/2 server itself.
type h2Streams struct {
	net.Conn
	preface int // bytes of the client preface still to skip
	hdr     [9]byte
	nh      int    // bytes of hdr filled
	skip    uint32 // payload bytes still to skip
	last    uint32 // the highest stream the client opened
	opened  atomic.Int64
}

// frameHeaders is HTTP/2's HEADERS frame type.
const frameHeaders = 0x1

func newH2Streams(c net.Conn) *h2Streams {
	return &h2Streams{Conn: c, preface: len("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")}
}

func (s *h2Streams) Read(p []byte) (int, error) {
	n, err := s.Conn.Read(p)
	s.scan(p[:n])
	return n, err
}

// scan follows the frames in b, the next bytes the client sent.
func (s *h2Streams) scan(b []byte) {
	for len(b) > 0 {
		switch {
		case s.preface > 0:
			k := min(s.preface, len(b))
			s.preface -= k
			b = b[k:]
		case s.skip > 0:
			k := int(min(s.skip, uint32(len(b))))
			s.skip -= uint32(k)
			b = b[k:]
		default:
			k := copy(s.hdr[s.nh:], b)
			s.nh += k
			b = b[k:]
			if s.nh < len(s.hdr) {
				return
			}
			s.nh = 0
			s.skip = uint32(s.hdr[0])<<16 | uint32(s.hdr[1])<<8 | uint32(s.hdr[2])
			id := binary.BigEndian.Uint32(s.hdr[5:]) & 0x7fffffff
			if s.hdr[3] == frameHeaders && id%2 == 1 && id > s.last {
				s.last = id
				s.opened.Add(1)
			}
		}
	}
}

// ConnectionState is the TLS connection's (HTTP/2 reads it).
func (s *h2Streams) ConnectionState() tls.ConnectionState {
	return s.Conn.(interface{ ConnectionState() tls.ConnectionState }).ConnectionState()
}

// unseen records, as one, the requests of an HTTP/2 connection that its
// server answered or refused itself.
func (fs *flowServer) unseen(s *h2Streams, start time.Time) {
	n := s.opened.Load() - fs.requests.Load()
	if n <= 0 {
		return
	}
	fs.local(Record{
		Start:    start,
		Duration: time.Since(start),
		Host:     fs.f.Host,
		Proto:    "HTTP/2.0",
		Rule:     "default-deny",
		Reason:   fmt.Sprintf("tunwall's HTTP/2 server answered %d request(s) of this connection itself (a header list over the limit gets 431, a connection-specific header 400, a malformed or excess stream a reset): none was sent on", n),
	})
}
