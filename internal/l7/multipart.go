package l7

import (
	"bytes"
	"errors"
	"io"
	"mime"
	"net/http"
	"strings"
	"sync/atomic"

	"github.com/tunwall/tunwall/policy"
)

// Rails (Rack::MethodOverride), Laravel and Spring read _method from a
// multipart/form-data body as they do from a urlencoded one: a POST whose
// form has a part named _method saying DELETE is a DELETE. Such a body may
// be an upload of any size, so it is followed as it streams rather than
// read whole: formParts holds back each part's headers until they are
// complete, and the value of a part named _method until it ends, and
// decides that value before a byte of the part goes on. A part the rules
// deny ends the body there: the server never gets the part, nor the end of
// the body it needs to act on the request.

// Bounds of what is held back of a multipart body.
const (
	maxPartHead   = 16 << 10 // a part's delimiter line and headers
	maxMethodPart = 256      // the value of a part named _method
)

// partsState is where formParts is in the body.
type partsState uint8

const (
	partsContent  partsState = iota // the preamble, or a part's content
	partsHead                       // a delimiter, its part's headers
	partsMethod                     // the value of a part named _method
	partsEpilogue                   // after the close delimiter
)

// formParts follows a multipart/form-data body. It does no I/O: feed hands
// it the bytes not yet settled, and it says how many of them may go on.
type formParts struct {
	delim  []byte // "\n--" and the boundary
	state  partsState
	start  bool // nothing settled yet: the body may open with the delimiter
	decide func(method string) policy.RequestDecision
}

func newFormParts(boundary string, decide func(string) policy.RequestDecision) *formParts {
	return &formParts{delim: []byte("\n--" + boundary), start: true, decide: decide}
}

// errPartsRefused carries the denial of a part naming _method.
func partsDenied(reason string) *overridden {
	return &overridden{policy.RequestDecision{Verdict: policy.Deny, Rule: policy.RuleDefaultDeny, Reason: reason}}
}

// feed settles what it can of pend, the body's bytes not yet settled (eof:
// there are no more), and returns how many of its first bytes may go on,
// or the denial of a part.
func (fp *formParts) feed(pend []byte, eof bool) (int, error) {
	done := 0
	for {
		b := pend[done:]
		switch fp.state {
		case partsEpilogue:
			return len(pend), nil
		case partsContent:
			if fp.start && done == 0 {
				// The first delimiter may open the body, without the
				// line break before it.
				open := fp.delim[1:]
				if len(b) < len(open) && bytes.HasPrefix(open, b) && !eof {
					return 0, nil
				}
				if bytes.HasPrefix(b, open) {
					fp.start = false
					fp.state = partsHead
					continue
				}
			}
			fp.start = false
			i := bytes.Index(b, fp.delim)
			if i < 0 {
				if eof {
					return len(pend), nil
				}
				// Keep what could begin a delimiter.
				keep := min(len(b), len(fp.delim)-1)
				return done + len(b) - keep, nil
			}
			done += i
			fp.state = partsHead
		case partsHead:
			n, named, close, err := fp.head(b, eof)
			if err != nil || n == 0 {
				return done, err
			}
			switch {
			case close:
				fp.state = partsEpilogue
			case named:
				// The part's value is held with its headers, and both
				// go on once it is decided.
				v, end, err := fp.value(b[n:], eof)
				if err != nil || !end {
					return done, err
				}
				if d := fp.decide(v); !d.Allowed() {
					return done, &overridden{d}
				}
				n += len(v)
				fp.state = partsContent
			default:
				fp.state = partsContent
			}
			done += n
		}
	}
}

// head reads the delimiter and part headers at the start of b. n is 0
// while they are incomplete; named says the part is named _method; close
// that the delimiter is the last.
func (fp *formParts) head(b []byte, eof bool) (n int, named, close bool, err error) {
	// The delimiter, and what follows it on its line.
	d := len(fp.delim)
	if b[0] != '\n' {
		d-- // the opening delimiter, without its line break
	}
	if len(b) < d+2 {
		if eof {
			return len(b), false, true, nil
		}
		return 0, false, false, nil
	}
	if b[d] == '-' && b[d+1] == '-' {
		return d + 2, false, true, nil
	}
	end := bytes.Index(b[d:], []byte("\n\r\n"))
	if e := bytes.Index(b[d:], []byte("\n\n")); e >= 0 && (end < 0 || e < end) {
		end = e
	}
	if end < 0 || d+end > maxPartHead {
		switch {
		case len(b) > maxPartHead:
			return 0, false, false, partsDenied("a multipart part's headers run over 16 KiB: a part named _method there could not be read")
		case eof:
			if mentionsMethod(b) {
				return 0, false, false, partsDenied("a multipart body ends in the headers of a part that names _method")
			}
			return len(b), false, false, nil
		}
		return 0, false, false, nil
	}
	n = d + end + 2
	if b[d+end+1] == '\r' {
		n++
	}
	named, err = partNamed(b[d:n])
	return n, named, false, err
}

// partNamed says whether the part whose header lines are hdr is named
// _method. A Content-Disposition that mentions _method in a form this does
// not read as a name is refused: a server may read it as one.
func partNamed(hdr []byte) (bool, error) {
	for line := range strings.Lines(string(hdr)) {
		k, v, ok := strings.Cut(line, ":")
		if !ok || !strings.EqualFold(strings.TrimSpace(k), "Content-Disposition") {
			continue
		}
		_, params, err := mime.ParseMediaType(strings.TrimSpace(v))
		name := params["name"]
		switch {
		case err == nil && strings.EqualFold(name, "_method"):
			return true, nil
		case mentionsMethod([]byte(v)):
			return false, partsDenied("a multipart part's Content-Disposition mentions _method in a form tunwall does not read as its name (" + clip(strings.TrimSpace(v)) + ")")
		}
	}
	if mentionsMethod(hdr) {
		return false, partsDenied("a multipart part's headers mention _method outside its Content-Disposition")
	}
	return false, nil
}

// mentionsMethod says whether b holds _method, in any case, or %5f for
// its underscore.
func mentionsMethod(b []byte) bool {
	l := bytes.ToLower(b)
	return bytes.Contains(l, []byte("_method")) || bytes.Contains(l, []byte("%5fmethod"))
}

// value is the value of a part named _method at the start of b, up to the
// next delimiter; end says it is complete.
func (fp *formParts) value(b []byte, eof bool) (string, bool, error) {
	i := bytes.Index(b, fp.delim)
	switch {
	case i > maxMethodPart || (i < 0 && len(b) > maxMethodPart):
		return "", false, partsDenied("a multipart part named _method is longer than any method")
	case i < 0 && !eof:
		return "", false, nil
	case i < 0:
		i = len(b)
	}
	return string(b[:i]), true, nil
}

// partsWindow is what partsBody reads into: more than it ever holds back.
const partsWindow = 32 << 10

// reset starts over at the body's first byte.
func (fp *formParts) reset() { fp.state, fp.start = partsContent, true }

// partsGuard follows the request's body for parts named _method if it is
// multipart/form-data and the rules do not allow every method a part could
// name here; else nil.
func (fs *flowServer) partsGuard(r *http.Request) *formParts {
	boundary := multipartBoundary(r)
	if boundary == "" {
		return nil
	}
	path := r.URL.EscapedPath()
	strict := false
	for _, m := range formMethods {
		if !fs.tm.rules().DecideRequest(fs.f.Host, fs.f.Port, m, path).Allowed() {
			strict = true
			break
		}
	}
	if !strict {
		return nil
	}
	allowed := policy.RequestDecision{Verdict: policy.Allow}
	return newFormParts(boundary, func(v string) policy.RequestDecision {
		return fs.decideNamed(path, []string{"_method=" + strings.TrimSpace(v)}, allowed)
	})
}

// partsBody is a multipart/form-data request body whose bytes go on as
// formParts settles them.
type partsBody struct {
	r       io.ReadCloser
	fp      *formParts
	pend    []byte // read, not yet handed on
	settled int    // how many of pend may go
	err     error
	denied  *atomic.Pointer[policy.RequestDecision]
}

func (p *partsBody) Read(b []byte) (int, error) {
	for p.settled == 0 {
		if p.err != nil {
			return 0, p.err
		}
		if len(p.pend) == cap(p.pend) {
			// formParts holds back less than the window: never here.
			p.err = partsDenied("a multipart body held back more than tunwall reads ahead")
			return 0, p.err
		}
		n, err := p.r.Read(p.pend[len(p.pend):cap(p.pend)])
		p.pend = p.pend[:len(p.pend)+n]
		eof := errors.Is(err, io.EOF)
		k, derr := p.fp.feed(p.pend, eof)
		p.settled = k
		switch {
		case derr != nil:
			var o *overridden
			if errors.As(derr, &o) {
				p.denied.Store(&o.d)
			}
			p.err = derr
			p.pend, p.settled = nil, 0
			return 0, derr
		case err != nil:
			p.err = err
			if eof && p.settled < len(p.pend) {
				p.settled = len(p.pend)
			}
		}
	}
	n := copy(b, p.pend[:p.settled])
	p.pend = p.pend[:copy(p.pend, p.pend[n:])]
	p.settled -= n
	return n, nil
}

func (p *partsBody) Close() error { return p.r.Close() }

// multipartBoundary is the boundary of a multipart/form-data request body,
// or "" when it is not one.
func multipartBoundary(r *http.Request) string {
	mt, params, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil || !strings.EqualFold(mt, "multipart/form-data") {
		return ""
	}
	return params["boundary"]
}
