package audit

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
)

// maxLine bounds one line of a log; a header with a huge argv is the
// longest line tunwall writes, far below this.
const maxLine = 4 << 20

// VerifyError names the first bad line of a log.
type VerifyError struct {
	Line int    // 1-based
	Msg  string // what is wrong, in words
	// Incomplete is set when nothing is wrong with lines 1..Line but the
	// last run has no trailer: tunwall was killed, the run is still going,
	// or the tail of the log was cut (only a hash kept elsewhere tells).
	Incomplete bool
}

func (e *VerifyError) Error() string { return fmt.Sprintf("audit: line %d: %s", e.Line, e.Msg) }

// AnchorError is Verify's error when an otherwise intact log holds no line
// whose SHA-256 is an expected hash (VerifyOptions.Expect): the log was
// rewritten, or cut, before the line the hash was taken from.
type AnchorError struct {
	Hash  string // the expected hash, as given
	Lines int    // lines in the log
}

func (e *AnchorError) Error() string {
	return fmt.Sprintf("audit: none of the %d lines has the expected SHA-256 %s: the log was rewritten, or cut, before the line it was taken from", e.Lines, e.Hash)
}

// UnfinishedRun is a run that ended without a trailer and was followed by
// another run whose header chains to its last line: what a killed tunwall
// leaves before the next run appends to the same file.
type UnfinishedRun struct {
	Run         string // its run id ("" if even its header is incomplete)
	First, Last int    // its lines
	// Torn is set when its last line is incomplete (a write cut short by
	// the kill) and was ended by the next run.
	Torn bool
}

func (u UnfinishedRun) String() string {
	s := fmt.Sprintf("run %s (lines %d..%d) ended without a trailer (tunwall was killed?)", u.Run, u.First, u.Last)
	if u.Torn {
		s += fmt.Sprintf("; its last line %d is incomplete (a write cut short)", u.Last)
	}
	return s
}

// VerifyResult describes what Verify read. On error it describes the lines
// before the one the error names.
type VerifyResult struct {
	Run      string // run id of the last run in the file
	Runs     int    // runs (headers) in the file
	Records  int    // lines other than header and trailer lines
	Lost     int    // sum of the trailers' lost counts
	Last     string // hex SHA-256 of the last good line; for a complete log, its trailer's
	Lines    int    // lines read
	Complete bool   // the last run ends with its trailer
	// Unfinished lists the runs before the last that ended without a
	// trailer; the chain runs through them.
	Unfinished []UnfinishedRun
	// Anchors holds, for each VerifyOptions.Expect hash, the line whose
	// SHA-256 it is, or 0.
	Anchors []int
}

// VerifyOptions adds checks to Verify.
type VerifyOptions struct {
	// Expect lists hex SHA-256 hashes (any case) that must each be the hash
	// of a line of the log: hashes a run's end printed (Summary.Last) and
	// that were kept elsewhere. Since every line chains to the one before,
	// such an anchor pins every line up to it.
	Expect []string
}

// Verify checks the hash chain and structure of a log: each run is a header
// followed by flow, start, dns and limit lines of the same run id and ends
// with a trailer whose count and last match; every line's prev is the
// SHA-256 of the line before it, a header's included (64 zeros for the
// first line of the file), so the runs of a file form one chain. The error,
// for a bad log, is a *VerifyError naming the first bad line; it wraps an
// I/O error of r otherwise.
//
// When a line's prev does not match, Verify looks one line ahead and at the
// trailer's count to tell which line is to blame: an edited line, a line
// removed before it, an inserted line, or two lines swapped.
//
// A run that ends without a trailer is accepted when the next run's header
// chains to its last line (tunwall was killed; see VerifyResult.Unfinished);
// even its last line may then be incomplete. When it is the last run, the
// error is a *VerifyError with Incomplete set.
func Verify(r io.Reader) (VerifyResult, error) {
	return VerifyWith(r, VerifyOptions{})
}

// VerifyWith is Verify with the checks of o. An expected hash that is no
// line's hash fails an otherwise intact log with an *AnchorError.
func VerifyWith(r io.Reader, o VerifyOptions) (VerifyResult, error) {
	return VerifyEach(r, o, nil, nil)
}

// VerifyEach is VerifyWith that also reads the log's headers and records in
// the same pass, so that a reader who wants only what verifies need not
// read the log twice. header (when not nil) is called with each run's header
// and record (when not nil) with each record, with their line numbers, as
// they are read: before the lines after them are checked. Keep what they
// were given only when VerifyEach returns no error, and only up to the line
// the caller trusts (VerifyResult.Lines, the last of VerifyResult.Anchors,
// or the line before a *VerifyError's); a line that cannot be parsed is not
// passed on (it is a *VerifyError).
func VerifyEach(r io.Reader, o VerifyOptions, header func(line int, h Header), record func(line int, rec Record)) (VerifyResult, error) {
	var v verifier
	for _, e := range o.Expect {
		var h [sha256.Size]byte
		if len(e) != hex.EncodedLen(sha256.Size) {
			return v.res, fmt.Errorf("audit: expected hash %q is not 64 hex digits", e)
		}
		if _, err := hex.Decode(h[:], []byte(e)); err != nil {
			return v.res, fmt.Errorf("audit: expected hash %q is not 64 hex digits", e)
		}
		v.expect = append(v.expect, h)
	}
	v.res.Anchors = make([]int, len(v.expect))
	if len(v.expect) == 0 {
		v.res.Anchors = nil
	}
	n := 0
	err := scan(r, func(b []byte, terminated bool, l *anyLine, perr error) bool {
		n++
		if perr == nil {
			switch l.Kind {
			case KindHeader:
				if header != nil {
					header(n, Header{Run: l.Run, Phase: l.Phase, Version: l.Version, Policy: l.Policy,
						PolicySHA256: l.PolicySHA256, Argv: l.Argv, Config: l.Config, Labels: Labels(l.Labels), Stream: l.Stream, Seq: l.Seq})
				}
			case KindTrailer:
			default:
				if record != nil {
					record(n, l.record())
				}
			}
		}
		v.feed(b, terminated, l, perr)
		return true
	})
	if err != nil {
		return v.res, err
	}
	res, err := v.finish()
	if err != nil {
		return res, err
	}
	for i, line := range res.Anchors {
		if line == 0 {
			return res, &AnchorError{Hash: o.Expect[i], Lines: res.Lines}
		}
	}
	return res, nil
}

// scan reads r line by line, decodes each line and calls fn with the line,
// whether it ended with a newline, the decoded line and the decoding error,
// until fn returns false. It returns I/O errors of r.
func scan(r io.Reader, fn func(b []byte, terminated bool, l *anyLine, perr error) bool) error {
	lr := newLineReader(r)
	var l anyLine
	for {
		b, terminated, err := lr.next()
		if err == io.EOF {
			return nil
		}
		if err != nil && !errors.Is(err, errLineTooLong) {
			return fmt.Errorf("audit: read: %w", err)
		}
		if err == nil {
			err = decodeLine(b, &l)
		} else {
			l = anyLine{}
		}
		if !fn(b, terminated, &l, err) {
			return nil
		}
	}
}

// errLineTooLong is a line reader error that does not stop reading.
var errLineTooLong = errors.New("line longer than 4 MiB")

// lineReader splits a stream into lines, dropping the newline.
type lineReader struct {
	br  *bufio.Reader
	buf []byte
}

func newLineReader(r io.Reader) *lineReader {
	return &lineReader{br: bufio.NewReaderSize(r, 64<<10)}
}

// next returns the next line and whether it ended with '\n'. A line longer
// than maxLine is skipped and reported as errLineTooLong; io.EOF means there
// are no more lines.
func (lr *lineReader) next() (line []byte, terminated bool, err error) {
	lr.buf = lr.buf[:0]
	tooLong := false
	for {
		chunk, err := lr.br.ReadSlice('\n')
		if !tooLong {
			if len(lr.buf)+len(chunk) > maxLine+1 {
				tooLong = true
				lr.buf = lr.buf[:0]
			} else {
				lr.buf = append(lr.buf, chunk...)
			}
		}
		switch {
		case err == bufio.ErrBufferFull:
			continue
		case err == io.EOF:
			if tooLong {
				return nil, false, errLineTooLong
			}
			if len(lr.buf) == 0 {
				return nil, false, io.EOF
			}
			return lr.buf, false, nil
		case err != nil:
			return nil, false, err
		}
		if tooLong {
			return nil, true, errLineTooLong
		}
		return lr.buf[:len(lr.buf)-1], true, nil
	}
}

// verifier checks a log one line at a time. Its zero value is ready.
type verifier struct {
	n        int // lines fed
	inRun    bool
	run      string
	segStart int               // line number of the current run's header
	h1, h2   [sha256.Size]byte // hashes of lines n and n-1 (h2: within the run)
	res      VerifyResult
	before   VerifyResult // res before line n was accepted
	err      *VerifyError
	brk      *chainBreak
	torn     *tornLine
	expect   [][sha256.Size]byte // VerifyOptions.Expect
}

// tornLine is a line that does not parse, pending: it is excused only if
// the next line is a header chaining to it (a write cut short by a kill,
// ended by the next run).
type tornLine struct {
	line  int
	hash  [sha256.Size]byte
	msg   string
	inRun bool
	run   string
	first int // its run's first line
}

// chainBreak remembers the first line whose prev does not match, and what
// the following lines tell about it.
type chainBreak struct {
	line      int
	prev      [sha256.Size]byte // prev of the line
	hash      [sha256.Size]byte // hash of the line
	hm1, hm2  [sha256.Size]byte // hashes of lines line-1 and line-2
	haveM2    bool              // line-2 is in the same run
	before    VerifyResult      // result before line-1 was accepted
	atLine    VerifyResult      // result before the line itself
	haveNext  bool              // line+1 is a record or trailer of the same run
	nextPrev  [sha256.Size]byte
	nextHash  [sha256.Size]byte
	haveCount bool // a trailer of the run was seen at or after line
	count     int  // its count
	before2   int  // lines of the run before that trailer
}

func (v *verifier) fail(line int, format string, args ...any) {
	if v.err == nil {
		v.err = &VerifyError{Line: line, Msg: fmt.Sprintf(format, args...)}
	}
}

// feed checks the next line b, which decoded into l with error perr.
func (v *verifier) feed(b []byte, terminated bool, l *anyLine, perr error) {
	v.n++
	if v.err != nil {
		return
	}
	h := sha256.Sum256(b)
	for i, e := range v.expect {
		if e == h && v.res.Anchors[i] == 0 {
			v.res.Anchors[i] = v.n
		}
	}
	switch {
	case v.brk != nil:
		v.collect(h, l, perr)
	case v.torn != nil:
		v.afterTorn(h, l, perr)
	case perr != nil:
		v.unparsable(h, terminated, perr)
	case l.Kind == KindHeader:
		v.headerLine(h, l)
	default:
		v.runLine(h, l)
	}
}

// afterTorn checks the line after an unparsable one: only a header
// chaining to it makes that line a torn write (the run before was killed
// mid-write), not a failure.
func (v *verifier) afterTorn(h [32]byte, l *anyLine, perr error) {
	t := v.torn
	if perr != nil || l.Kind != KindHeader || l.prev != t.hash {
		v.fail(t.line, "%s", t.msg)
		return
	}
	// A header chaining to the torn line: the run before it was killed
	// mid-write, and this run ended its line.
	u := UnfinishedRun{Run: t.run, First: t.first, Last: t.line, Torn: true}
	if !t.inRun {
		u = UnfinishedRun{First: t.line, Last: t.line, Torn: true}
	}
	v.res.Unfinished = append(v.res.Unfinished, u)
	v.torn, v.inRun, v.h1 = nil, false, t.hash
	v.header(h, l)
}

// unparsable handles a line that did not decode: too long, or an
// unterminated last line, fails (incomplete if inside a run); any other
// is held as possibly torn until the next line says.
func (v *verifier) unparsable(h [32]byte, terminated bool, perr error) {
	switch {
	case errors.Is(perr, errLineTooLong):
		v.fail(v.n, "%v", perr)
	case !terminated && v.inRun:
		v.failIncomplete(v.n, "run %s ended without a trailer: its last line %d is incomplete (no newline): tunwall was killed mid-write, "+
			"the run is still going, or the tail was cut; lines 1..%d chain intact", v.run, v.n, v.n-1)
	case !terminated:
		v.fail(v.n, "incomplete last line (no newline): truncated, or the run is still going")
	default:
		msg := perr.Error()
		if v.n == 1 {
			msg = fmt.Sprintf("first line is not a header (%v): the head of the log was cut, or this is not an audit log", perr)
		}
		v.torn = &tornLine{line: v.n, hash: h, msg: msg, inRun: v.inRun, run: v.run, first: v.segStart}
	}
}

// headerLine checks a header's chaining (to zeros on line 1, to the line
// before otherwise), notes a run it ends without a trailer as
// unfinished, and starts its run.
func (v *verifier) headerLine(h [32]byte, l *anyLine) {
	switch {
	case v.n == 1 && l.prev != zeroHash:
		v.fail(v.n, "the first line is a header whose prev is not 64 zeros: the head of the log was cut (lines or whole runs before it were removed)")
	case v.n > 1 && l.prev != v.h1:
		v.fail(v.n, "the header of run %s does not chain to line %d (its prev is not that line's SHA-256): "+
			"lines or whole runs were removed before line %d, or runs were reordered, or line %d was changed", l.Run, v.n-1, v.n, v.n-1)
	}
	if v.err != nil {
		return
	}
	if v.inRun {
		v.res.Unfinished = append(v.res.Unfinished, UnfinishedRun{Run: v.run, First: v.segStart, Last: v.n - 1})
		v.inRun = false
	}
	v.header(h, l)
}

// runLine checks a record or trailer inside a run: its run id, its
// chaining (a break is collected to be explained), and a trailer's count.
func (v *verifier) runLine(h [32]byte, l *anyLine) {
	if !v.inRun {
		if v.n == 1 {
			v.fail(v.n, "first line is a %q line, not a header: the head of the log was cut", l.Kind)
		} else {
			v.fail(v.n, "a %q line follows the trailer of run %s; only a new header may", l.Kind, v.run)
		}
		return
	}
	if l.Run != v.run {
		v.fail(v.n, "run id %q differs from the header's %q", l.Run, v.run)
		return
	}
	if l.prev != v.h1 {
		if l.Kind == KindTrailer && l.Last != l.Prev {
			v.fail(v.n, "trailer's last %q differs from its prev: the trailer was edited", l.Last)
			return
		}
		v.brk = &chainBreak{
			line: v.n, prev: l.prev, hash: h, hm1: v.h1, hm2: v.h2,
			haveM2: v.n-2 >= v.segStart, before: v.before, atLine: v.res,
		}
		if l.Kind == KindTrailer {
			v.brk.haveCount, v.brk.count, v.brk.before2 = true, *l.Count, v.n-v.segStart
		}
		return
	}
	if l.Kind == KindTrailer {
		switch {
		case *l.Count != v.n-v.segStart:
			v.fail(v.n, "trailer counts %d lines before it but run %s has %d: lines were removed or inserted, or the trailer was edited",
				*l.Count, v.run, v.n-v.segStart)
		case l.Last != l.Prev:
			v.fail(v.n, "trailer's last %q differs from its prev: the trailer was edited", l.Last)
		case l.Lost < 0:
			v.fail(v.n, "trailer's lost %d is negative", l.Lost)
		}
		if v.err != nil {
			return
		}
	}
	v.before = v.res
	v.h2, v.h1 = v.h1, h
	v.res.Last = hex.EncodeToString(h[:])
	v.res.Lines = v.n
	if l.Kind == KindTrailer {
		v.inRun = false
		v.res.Complete = true
		v.res.Lost += l.Lost
	} else {
		v.res.Records++
	}
}

// header accepts line v.n, a header that chains, as the start of a run.
func (v *verifier) header(h [sha256.Size]byte, l *anyLine) {
	if l.Run == "" {
		v.fail(v.n, "header has no run id")
		return
	}
	v.before = v.res
	v.inRun, v.run, v.segStart = true, l.Run, v.n
	v.h1 = h
	v.res.Runs++
	v.res.Run = l.Run
	v.res.Complete = false
	v.res.Last = hex.EncodeToString(h[:])
	v.res.Lines = v.n
}

func (v *verifier) failIncomplete(line int, format string, args ...any) {
	v.fail(line, format, args...)
	v.err.Incomplete = true
}

// collect gathers what the lines after a chain break say about it.
func (v *verifier) collect(h [sha256.Size]byte, l *anyLine, perr error) {
	b := v.brk
	sameRun := perr == nil && l.Kind != KindHeader && l.Run == v.run
	if v.n == b.line+1 && sameRun {
		b.haveNext, b.nextPrev, b.nextHash = true, l.prev, h
	}
	if !b.haveCount && sameRun && l.Kind == KindTrailer {
		b.haveCount, b.count, b.before2 = true, *l.Count, v.n-v.segStart
	}
}

// blame decides which line a chain break is about.
func (v *verifier) blame() {
	b := v.brk
	i := b.line
	switch {
	case b.haveM2 && b.prev == b.hm2 && !(b.haveCount && b.count >= b.before2):
		// With no extra line, this is line i's prev edited: the cases below.
		v.res = b.before
		v.fail(i-1, "line %d was inserted: line %d's prev is the hash of line %d", i-1, i, i-2)
	case b.haveNext && b.prev == b.nextHash:
		v.res = b.atLine
		v.fail(i, "lines %d and %d are swapped: line %d's prev is the hash of line %d", i, i+1, i, i+1)
	case b.haveNext && b.nextPrev != b.hash && b.nextPrev == b.hm1:
		v.res = b.atLine
		v.fail(i, "line %d was inserted: line %d's prev is the hash of line %d", i, i+1, i-1)
	case b.haveNext && b.nextPrev != b.hash:
		v.res = b.atLine
		v.fail(i, "line %d does not fit the chain: its prev is not the hash of line %d, and line %d's prev is not its hash (inserted, or its prev edited)", i, i-1, i+1)
	case b.haveCount && b.count > b.before2:
		v.res = b.atLine
		v.fail(i, "%d line(s) missing before line %d: the trailer counts %d lines before it, the run has %d",
			b.count-b.before2, i, b.count, b.before2)
	case b.haveCount:
		v.res = b.before
		v.fail(i-1, "line %d was changed: its SHA-256 is not the prev stored in line %d", i-1, i)
	default:
		v.res = b.before
		v.fail(i-1, "line %d was changed, or lines after it were removed: its SHA-256 is not the prev stored in line %d", i-1, i)
	}
}

// finish ends the check at the end of the input.
func (v *verifier) finish() (VerifyResult, error) {
	if v.brk != nil && v.err == nil {
		v.blame()
	}
	if v.err == nil && v.torn != nil {
		v.fail(v.torn.line, "%s", v.torn.msg)
	}
	if v.err == nil {
		switch {
		case v.n == 0:
			v.fail(1, "log is empty: no header")
		case v.inRun:
			v.failIncomplete(v.n, "run %s ended without a trailer at line %d (tunwall was killed, the run is still going, or the tail was cut); lines 1..%d chain intact",
				v.run, v.n, v.n)
		}
	}
	if v.err != nil {
		return v.res, v.err
	}
	return v.res, nil
}
