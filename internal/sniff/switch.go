package sniff

// maxInterim bounds the bytes Switch reads before it has an answer.
const maxInterim = 64 << 10

// Switch reads the start of a server's response stream to an Upgrade
// request and tells whether the server switched protocols: informational
// responses (1xx other than 101, e.g. 100 Continue, 103 Early Hints) are
// skipped, then the next status decides: 101 is a switch, anything else is
// not. It looks only at status lines and at where interim heads end, so it
// copies and allocates nothing. A stream that does not start with a
// well-formed status line ("HTTP/1.x NNN", lines ending in CRLF), or that
// holds over 64 KiB of interim responses, is refused (NotThis); callers
// treat that as "not switched".
type Switch struct {
	st    switchState
	pos   int  // bytes of "HTTP/1.x NNN" matched in the current status line
	code  int  // the status code so far
	empty bool // the header line being skipped is empty so far
	seen  int  // bytes consumed
}

type switchState uint8

const (
	swStatus switchState = iota // in "HTTP/1.x NNN"
	swLine                      // skipping the rest of a line of an interim head
	swLF                        // after a CR in an interim head
	swDone
	swBad
)

// statusStart is what every status line starts with; then come the minor
// version digit, a space and three digits.
const statusStart = "HTTP/1."

// Feed consumes response bytes from the start of p. It returns how many it
// consumed and NeedMore (all of p consumed, no answer yet), Done (the answer
// is switched; the bytes after n were not looked at) or NotThis. Once Done
// or NotThis, Feed returns the same answer and consumes nothing.
func (s *Switch) Feed(p []byte) (n int, st Status, switched bool) {
	for ; n < len(p) && s.st < swDone; n++ {
		if s.seen++; s.seen > maxInterim {
			s.st = swBad
			break
		}
		c := p[n]
		switch s.st {
		case swStatus:
			ok := true
			switch k := s.pos; {
			case k < len(statusStart):
				ok = c == statusStart[k]
			case k == len(statusStart):
				ok = c == '0' || c == '1'
			case k == len(statusStart)+1:
				ok = c == ' '
			default:
				ok = c >= '0' && c <= '9'
				s.code = s.code*10 + int(c-'0')
			}
			s.pos++
			switch {
			case !ok:
				s.st = swBad
			case s.pos == len(statusStart)+5:
				if s.code == 101 || s.code < 100 || s.code >= 200 {
					s.st = swDone
				} else {
					s.st, s.empty = swLine, false
				}
			}
		case swLine:
			switch c {
			case '\r':
				s.st = swLF
			case '\n':
				s.st = swBad
			default:
				s.empty = false
			}
		case swLF:
			switch {
			case c != '\n':
				s.st = swBad
			case s.empty:
				// The empty line that ends an interim response.
				s.st, s.pos, s.code = swStatus, 0, 0
			default:
				s.st, s.empty = swLine, true
			}
		}
	}
	switch s.st {
	case swDone:
		return n, Done, s.code == 101
	case swBad:
		return n, NotThis, false
	}
	return n, NeedMore, false
}
