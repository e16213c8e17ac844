package audit

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
)

// maxStreamRuns bounds the runs VerifyStream tracks in one capture, and
// maxStreams the streams (node agent starts) it tells apart; a capture
// holding more fails with a clear error rather than growing without end.
const (
	maxStreamRuns = 1 << 18
	maxStreams    = 4096
)

// StreamRun is what VerifyStream found of one run of a capture.
type StreamRun struct {
	Run    string
	Stream string // its header's stream id and seq ("" and 0 without a header)
	Seq    int
	Labels Labels // its header's labels
	Header int    // the capture line of its header; 0 if it has none
	// Lines, Records, Lost, Last and Complete are as VerifyResult's for the
	// run's own lines: its chain, as far as it verified.
	Lines    int
	Records  int
	Lost     int
	Last     string
	Complete bool
	// Err is nil when the run's chain is intact and ends with its
	// trailer. Its Line is a line of the capture; its Msg counts the run's
	// own lines ("its line 3"). Err.Incomplete is set when all that is
	// wrong is a missing trailer (the run was going on, its agent was
	// killed, or its tail was cut: the capture cannot tell which).
	Err *VerifyError
}

// StreamResult is what VerifyStream found in a capture.
type StreamResult struct {
	Lines   int         // lines read
	Streams []string    // the stream ids, in the order their first header appears
	Runs    []StreamRun // in the order their first line appears
	// Problems are what is wrong with the capture beyond one run's chain:
	// lines that are no record of any run, runs missing from a stream.
	Problems []*VerifyError
}

// Bad returns how many runs failed (not counting those only incomplete)
// and how many are incomplete.
func (r *StreamResult) Bad() (failed, incomplete int) {
	for _, run := range r.Runs {
		switch {
		case run.Err == nil:
		case run.Err.Incomplete:
			incomplete++
		default:
			failed++
		}
	}
	return failed, incomplete
}

// IsStream reports whether the log r is a capture of a Stream (an
// --audit-stdout capture, to be checked with VerifyStream): whether its
// first header carries a stream id. It reads up to that header, at most 16
// MiB. Either answer is safe: a capture checked as a file, or a file as a
// capture, fails.
func IsStream(r io.Reader) (bool, error) {
	lr := newLineReader(io.LimitReader(r, 16<<20))
	var l anyLine
	for {
		b, _, err := lr.next()
		switch {
		case err == io.EOF:
			return false, nil
		case errors.Is(err, errLineTooLong):
			continue
		case err != nil:
			return false, fmt.Errorf("audit: read: %w", err)
		}
		if decodeLine(b, &l) == nil && l.Kind == KindHeader {
			return l.Stream != "", nil
		}
	}
}

// VerifyStream checks a capture of a Stream (the standard output of
// `tunwall node --audit-stdout`, as a log shipper keeps it): the lines of
// many runs interleaved, each run a chain of its own told apart by its run
// id. Each run must be a header (prev 64 zeros, a stream id and seq)
// followed by its records and its trailer, chained and counted as Verify
// checks a file; and each stream's headers must appear in seq order from
// 1 with none missing, so that a whole run removed from the capture is
// found when a later run of its stream remains. A record of a run with no
// header before it, a second header of a run, a line after a run's
// trailer, a line that is no record, a header without a stream id: each
// fails the capture.
//
// The error is nil when every run is intact and complete; otherwise a
// *VerifyError naming the first bad line, with Incomplete set when the only
// fault is runs without a trailer; it wraps an I/O error of r otherwise.
// The result says per run what was found (StreamResult.Runs).
//
// What no chain without a key can show: a run removed whole when it was
// the last its stream started, or the tail of a run that was still going
// when the capture ended (reported as incomplete, not as intact).
func VerifyStream(r io.Reader) (StreamResult, error) {
	var sv streamVerifier
	err := scan(r, func(b []byte, terminated bool, l *anyLine, perr error) bool {
		sv.feed(b, terminated, l, perr)
		return true
	})
	if err != nil {
		return sv.res, err
	}
	return sv.finish()
}

// streamRun is VerifyStream's state of one run.
type streamRun struct {
	out  StreamRun
	v    *verifier // nil once the run is decided (ended, or failed)
	ring [4]int    // capture lines of the run's last 4 lines: local n at ring[n%4]
	brk  [4]int    // capture lines of the run's lines brk.line-2 .. brk.line+1
}

// capture returns the capture line of the run's local line n, if known.
func (s *streamRun) capture(n int) int {
	if s.v != nil && s.v.brk != nil {
		if d := n - (s.v.brk.line - 2); d >= 0 && d < len(s.brk) && s.brk[d] != 0 {
			return s.brk[d]
		}
	}
	if s.v != nil && n > s.v.n-len(s.ring) && n <= s.v.n && n > 0 {
		return s.ring[n%len(s.ring)]
	}
	return 0
}

// streamVerifier checks a capture one line at a time.
type streamVerifier struct {
	n       int
	runs    map[string]*streamRun
	order   []*streamRun
	streams map[string]int // last seq seen per stream
	res     StreamResult
	tooMany bool // maxStreamRuns was reached
}

func (sv *streamVerifier) problem(line int, format string, args ...any) {
	if len(sv.res.Problems) < 100 {
		sv.res.Problems = append(sv.res.Problems, &VerifyError{Line: line, Msg: fmt.Sprintf(format, args...)})
	}
}

func (sv *streamVerifier) feed(b []byte, terminated bool, l *anyLine, perr error) {
	sv.n++
	sv.res.Lines = sv.n
	if sv.runs == nil {
		sv.runs, sv.streams = map[string]*streamRun{}, map[string]int{}
	}
	switch {
	case perr != nil && !terminated:
		sv.problem(sv.n, "incomplete last line (no newline): the capture was cut mid-line")
		return
	case perr != nil:
		sv.problem(sv.n, "not a record of any run (%v): a stream writes whole lines only, so this line was forged or damaged", perr)
		return
	case l.Run == "":
		sv.problem(sv.n, "a %q line with no run id", l.Kind)
		return
	}
	s := sv.runs[l.Run]
	if s == nil {
		if len(sv.runs) >= maxStreamRuns {
			if !sv.tooMany {
				sv.tooMany = true
				sv.problem(sv.n, "more than %d runs in one capture: not checked beyond this line's run", maxStreamRuns)
			}
			return
		}
		s = &streamRun{out: StreamRun{Run: l.Run}}
		sv.runs[l.Run] = s
		sv.order = append(sv.order, s)
		if l.Kind != KindHeader {
			s.out.Err = &VerifyError{Line: sv.n, Msg: fmt.Sprintf("a %q line of run %s, which has no header before it: "+
				"its header was removed, or the line was forged or moved here", l.Kind, l.Run)}
			return
		}
		s.v = &verifier{}
		s.out.Header, s.out.Stream, s.out.Seq, s.out.Labels = sv.n, l.Stream, l.Seq, Labels(l.Labels)
		sv.header(l)
	} else if l.Kind == KindHeader {
		sv.fail(s, sv.n, false, "a second header of run %s (its first is line %d): forged, or another capture's line spliced in", l.Run, s.out.Header)
		return
	}
	if s.v == nil {
		if s.out.Err == nil {
			sv.fail(s, sv.n, false, "a %q line of run %s after its trailer: inserted", l.Kind, l.Run)
		}
		return
	}
	v := s.v
	hadBrk := v.brk != nil
	v.feed(b, terminated, l, perr)
	s.ring[v.n%len(s.ring)] = sv.n
	if !hadBrk && v.brk != nil {
		for i := range s.brk {
			if n := v.brk.line - 2 + i; n > v.n-len(s.ring) && n <= v.n && n > 0 {
				s.brk[i] = s.ring[n%len(s.ring)]
			}
		}
	} else if hadBrk && v.n == v.brk.line+1 {
		s.brk[3] = sv.n
	}
	switch {
	case v.err != nil:
		sv.decide(s)
	case v.brk == nil && !v.inRun && v.res.Complete:
		sv.decide(s) // ended with its trailer: nothing more may come
	}
}

// header checks a run's header against its stream: a stream id, and the
// next seq of that stream.
func (sv *streamVerifier) header(l *anyLine) {
	if l.Stream == "" || l.Seq < 1 {
		sv.problem(sv.n, "the header of run %s has no stream id and seq: a run of a file spliced into a stream's capture", l.Run)
		return
	}
	last, seen := sv.streams[l.Stream]
	if !seen {
		if len(sv.streams) >= maxStreams {
			sv.problem(sv.n, "more than %d streams in one capture", maxStreams)
			return
		}
		sv.res.Streams = append(sv.res.Streams, l.Stream)
	}
	switch {
	case l.Seq <= last:
		sv.problem(sv.n, "run %s is run #%d of stream %s, but run #%d came before it: headers reordered or forged", l.Run, l.Seq, l.Stream, last)
	case l.Seq == last+2:
		sv.problem(sv.n, "run #%d of stream %s is missing before run %s (#%d): a whole run was removed from the capture%s",
			last+1, l.Stream, l.Run, l.Seq, startNote(seen))
	case l.Seq > last+2:
		sv.problem(sv.n, "runs #%d..#%d of stream %s are missing before run %s (#%d): whole runs were removed from the capture%s",
			last+1, l.Seq-1, l.Stream, l.Run, l.Seq, startNote(seen))
	}
	sv.streams[l.Stream] = max(last, l.Seq)
}

func startNote(seen bool) string {
	if seen {
		return ""
	}
	return ", or it starts after the stream began"
}

// fail decides run s as failed at capture line line.
func (sv *streamVerifier) fail(s *streamRun, line int, incomplete bool, format string, args ...any) {
	if s.out.Err == nil {
		s.out.Err = &VerifyError{Line: line, Msg: fmt.Sprintf(format, args...), Incomplete: incomplete}
	}
	if s.v != nil {
		sv.keep(s)
		s.v = nil
	}
}

// keep copies what the run's verifier found into its result.
func (sv *streamVerifier) keep(s *streamRun) {
	res := s.v.res
	s.out.Lines, s.out.Records, s.out.Lost, s.out.Last, s.out.Complete = res.Lines, res.Records, res.Lost, res.Last, res.Complete
}

// decide ends run s once its verifier has a verdict, or its trailer:
// its error, translated to the capture's lines, and what it found. The
// verifier is dropped, so a capture of many ended runs stays small.
func (sv *streamVerifier) decide(s *streamRun) {
	v := s.v
	if v.err != nil && s.out.Err == nil {
		line := s.capture(v.err.Line)
		s.out.Err = &VerifyError{Line: line, Incomplete: v.err.Incomplete,
			Msg: fmt.Sprintf("its line %d: %s (line numbers count run %s's own lines)", v.err.Line, v.err.Msg, s.out.Run)}
		if line == 0 {
			s.out.Err.Line = s.out.Header
		}
	}
	sv.keep(s)
	s.v = nil
}

func (sv *streamVerifier) finish() (StreamResult, error) {
	for _, s := range sv.order {
		if s.v != nil {
			s.v.finish()
			sv.decide(s)
		}
	}
	if sv.n == 0 {
		sv.problem(1, "capture is empty: no header")
	}
	sv.res.Runs = make([]StreamRun, len(sv.order))
	for i, s := range sv.order {
		sv.res.Runs[i] = s.out
	}
	// The first bad line, and whether everything wrong is a missing trailer.
	var first *VerifyError
	onlyIncomplete := len(sv.res.Problems) == 0
	errs := slices.Clone(sv.res.Problems)
	for _, run := range sv.res.Runs {
		if run.Err != nil {
			errs = append(errs, run.Err)
			onlyIncomplete = onlyIncomplete && run.Err.Incomplete
		}
	}
	for _, e := range errs {
		if first == nil || e.Line < first.Line {
			first = e
		}
	}
	if first == nil {
		return sv.res, nil
	}
	failed, incomplete := sv.res.Bad()
	var what []string
	if failed > 0 {
		what = append(what, fmt.Sprintf("%d of %d runs failed", failed, len(sv.res.Runs)))
	}
	if incomplete > 0 {
		what = append(what, fmt.Sprintf("%d of %d runs have no trailer", incomplete, len(sv.res.Runs)))
	}
	if n := len(sv.res.Problems); n > 0 {
		what = append(what, fmt.Sprintf("%d problem(s) beyond one run", n))
	}
	return sv.res, &VerifyError{Line: first.Line, Incomplete: onlyIncomplete,
		Msg: fmt.Sprintf("%s; first: %s", strings.Join(what, ", "), first.Msg)}
}
