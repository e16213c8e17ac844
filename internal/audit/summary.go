package audit

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"
)

// runSummary gathers one run's lines for Summarize.
type runSummary struct {
	id, phase               string
	by                      string   // the label key the group is by ("": a run)
	labels                  Labels   // the run's labels, from its header or records
	runs                    []string // the runs of a group by label
	trailers                int      // of them, those that ended with their trailer
	version, policy, polSHA string
	haveHeader, haveTrailer bool
	first, last             time.Time
	lost                    int
	tally                   tally
	open                    map[flowKey]Record // started, not (yet) ended; at most maxOpen
	openMore                int                // started and not ended beyond maxOpen
	folded, occurrences     int                // records with a count, and what they stand for
	byDomain                int                // of them, records folding denials by domain (with samples)
	limits                  []string           // the limit records' rules and reasons
	approvals               int                // approval records (--ask)
	http                    map[httpKey]*httpTotals
	httpMore                int // http records beyond maxHTTPKeys
}

// httpKey groups the http records of a run: one host, one method.
type httpKey struct{ host, method string }

// httpTotals counts the requests of one host and method.
type httpTotals struct {
	allowed, denied   int
	bytesOut, bytesIn int64
	statuses          map[int]int
	secrets           []string
	denyReason        string
}

// maxHTTPKeys bounds the host-and-method groups Summarize keeps per run.
const maxHTTPKeys = 4096

func (s *runSummary) addHTTP(r *Record) {
	k := httpKey{strings.ToLower(r.Host), r.Method}
	h := s.http[k]
	if h == nil {
		if len(s.http) >= maxHTTPKeys {
			s.httpMore += max(r.Count, 1)
			return
		}
		if s.http == nil {
			s.http = map[httpKey]*httpTotals{}
		}
		h = &httpTotals{statuses: map[int]int{}}
		s.http[k] = h
	}
	n := max(r.Count, 1)
	if r.Verdict == VerdictAllow {
		h.allowed += n
	} else {
		h.denied += n
		if h.denyReason == "" {
			h.denyReason = r.Reason
		}
	}
	h.bytesOut += r.BytesOut
	h.bytesIn += r.BytesIn
	if len(h.statuses) < 16 {
		h.statuses[r.Status] += n
	}
	for _, name := range strings.Split(r.Secrets, ",") {
		if name != "" && !slices.Contains(h.secrets, name) && len(h.secrets) < 8 {
			h.secrets = append(h.secrets, name)
		}
	}
}

// flowKey pairs a flow's start record with its flow record: both carry the
// time the flow started, its protocol, source and destination.
type flowKey struct {
	ts       string
	proto    string
	src, dst netip.AddrPort
}

// maxOpen bounds the open flows Summarize remembers per run.
const maxOpen = 10000

func (s *runSummary) see(ts time.Time) {
	if s.first.IsZero() || ts.Before(s.first) {
		s.first = ts
	}
	if ts.After(s.last) {
		s.last = ts
	}
}

// Summarize writes a readable report of a log to w: for each run its id,
// phase, version, policy, time span and totals (flows and DNS queries
// allowed and denied, bytes), then a table of hosts, denials first, then by
// flow count: verdicts, flows, DNS queries, bytes out and in, processes, and
// the rule and reason of the first denial. It ends with the result of Verify
// on the same bytes. A damaged log is summarised as far as it can be read;
// the error is for I/O errors on r or w only.
func Summarize(r io.Reader, w io.Writer) error {
	return SummarizeBy(r, w, "")
}

// SummarizeBy is Summarize with the lines grouped by the value of the
// label key in place of by run ("" groups by run): each group, in the
// order first seen, gets the report a run does, over every run whose lines
// carry that value; lines without the label make the group "(none)".
func SummarizeBy(r io.Reader, w io.Writer, key string) error {
	return summarize(r, w, key, false)
}

// SummarizeStreamBy is SummarizeBy for a capture of a Stream (IsStream):
// many runs' lines interleaved, each run grouped by its run id (or by the
// label key's value), and the integrity check is VerifyStream's.
func SummarizeStreamBy(r io.Reader, w io.Writer, key string) error {
	return summarize(r, w, key, true)
}

func summarize(r io.Reader, w io.Writer, key string, stream bool) error {
	var (
		v    verifier
		sv   *streamVerifier // a Stream's capture
		runs []*runSummary
		byID = map[string]*runSummary{}
	)
	get := func(id string) *runSummary {
		s := byID[id]
		if s == nil {
			s = &runSummary{id: id}
			byID[id] = s
			runs = append(runs, s)
		}
		return s
	}
	if stream {
		sv = &streamVerifier{}
	}
	err := scan(r, func(b []byte, terminated bool, l *anyLine, perr error) bool {
		if sv != nil {
			sv.feed(b, terminated, l, perr)
		} else {
			v.feed(b, terminated, l, perr)
		}
		if perr != nil {
			return true
		}
		id := l.Run
		if key != "" {
			id = "(none)"
			if v, ok := Labels(l.Labels).Get(key); ok {
				id = v
			}
		}
		s := get(id)
		s.by = key
		s.add(l)
		return true
	})
	if err != nil {
		return err
	}
	ew := &errWriter{w: w}
	for i, s := range runs {
		if i > 0 {
			fmt.Fprintln(ew)
		}
		writeRun(ew, s)
	}
	if len(runs) > 0 {
		fmt.Fprintln(ew)
	}
	if sv != nil {
		res, verr := sv.finish()
		writeStreamIntegrity(ew, res, verr)
	} else {
		res, verr := v.finish()
		writeIntegrity(ew, res, verr)
	}
	return ew.err
}

// add counts line l, which decoded, into its run's summary.
func (s *runSummary) add(l *anyLine) {
	s.see(l.ts)
	if len(l.Labels) > 0 {
		s.labels = Labels(l.Labels)
	}
	if !slices.Contains(s.runs, l.Run) {
		s.runs = append(s.runs, l.Run)
	}
	switch l.Kind {
	case KindHeader:
		s.haveHeader = true
		s.phase, s.version, s.policy, s.polSHA = l.Phase, l.Version, l.Policy, l.PolicySHA256
	case KindTrailer:
		s.haveTrailer = true
		s.trailers++
		s.lost += l.Lost
	case KindStart:
		if s.open == nil {
			s.open = map[flowKey]Record{}
		}
		if len(s.open) < maxOpen {
			s.open[flowKey{l.TS, l.Proto, l.Src, l.Dst}] = l.record()
		} else {
			s.openMore++
		}
	case KindApproval:
		s.approvals++
	case KindLimit:
		if len(s.limits) < 8 {
			s.limits = append(s.limits, l.Rule+": "+l.Reason)
		}
	default:
		if s.phase == "" {
			s.phase = l.Phase
		}
		rec := l.record()
		s.tally.add(&rec)
		if l.Kind == KindHTTP {
			s.addHTTP(&rec)
		}
		if l.Kind == KindFlow {
			delete(s.open, flowKey{l.TS, l.Proto, l.Src, l.Dst})
		}
		if rec.Count > 0 {
			s.folded++
			s.occurrences += rec.Count
		}
		if rec.Samples != [MaxSamples]string{} {
			s.byDomain++
		}
	}
}

// writeIntegrity writes the summary's last lines: the runs Verify found
// unfinished, and its verdict.
func writeIntegrity(w io.Writer, res VerifyResult, verr error) {
	for _, u := range res.Unfinished {
		fmt.Fprintf(w, "integrity  note: %s\n", tabSafe(u.String()))
	}
	var ve *VerifyError
	switch {
	case errors.As(verr, &ve) && ve.Incomplete:
		fmt.Fprintf(w, "integrity  INCOMPLETE: %s\n", tabSafe(strings.TrimPrefix(verr.Error(), "audit: ")))
	case verr != nil:
		fmt.Fprintf(w, "integrity  FAILED: %s\n", tabSafe(strings.TrimPrefix(verr.Error(), "audit: ")))
	default:
		fmt.Fprintf(w, "integrity  ok: %d run(s), %d records, complete\n", res.Runs, res.Records)
		fmt.Fprintf(w, "last       sha256 %s\n", res.Last)
	}
}

// writeStreamIntegrity ends the summary of a Stream's capture with what
// VerifyStream found: one line for the capture, and one per run that is
// not intact and complete.
func writeStreamIntegrity(w io.Writer, res StreamResult, verr error) {
	records := 0
	for _, r := range res.Runs {
		records += r.Records
	}
	var ve *VerifyError
	switch {
	case errors.As(verr, &ve) && ve.Incomplete:
		fmt.Fprintf(w, "integrity  INCOMPLETE: %s\n", tabSafe(strings.TrimPrefix(verr.Error(), "audit: ")))
	case verr != nil:
		fmt.Fprintf(w, "integrity  FAILED: %s\n", tabSafe(strings.TrimPrefix(verr.Error(), "audit: ")))
	default:
		fmt.Fprintf(w, "integrity  ok: %d run(s) interleaved from %d stream(s), %d records, each run's chain intact and complete\n",
			len(res.Runs), len(res.Streams), records)
		return
	}
	for _, r := range res.Runs {
		if r.Err != nil {
			fmt.Fprintf(w, "           run %s: line %d: %s\n", tabSafe(r.Run), r.Err.Line, tabSafe(r.Err.Msg))
		}
	}
	for _, p := range res.Problems {
		fmt.Fprintf(w, "           line %d: %s\n", p.Line, tabSafe(p.Msg))
	}
}

// writeRun writes run s's summary: its header fields, totals, open flows,
// limits, trailer, and then its table of hosts and its HTTP requests.
func writeRun(w io.Writer, s *runSummary) {
	t := s.tally.totals()
	if s.by != "" {
		fmt.Fprintf(w, "%-10s %s\n", tabSafe(cutTo(s.by, 10, false)), tabSafe(s.id))
		fmt.Fprintf(w, "runs       %s\n", tabSafe(cutTo(strings.Join(s.runs, ", "), SummaryWidth-11, false)))
		s.haveTrailer = s.trailers == len(s.runs)
	} else {
		fmt.Fprintf(w, "run        %s\n", tabSafe(orDash(s.id)))
	}
	if m := s.labels.Map(); len(m) > 0 && s.by == "" {
		var kv []string
		for _, k := range slices.Sorted(maps.Keys(m)) {
			kv = append(kv, k+"="+m[k])
		}
		fmt.Fprintf(w, "labels     %s\n", tabSafe(cutTo(strings.Join(kv, " "), SummaryWidth-11, false)))
	}
	fmt.Fprintf(w, "phase      %s\n", tabSafe(orDash(s.phase)))
	if s.haveHeader {
		fmt.Fprintf(w, "version    %s\n", tabSafe(orDash(s.version)))
		if s.policy != "" || s.polSHA != "" {
			fmt.Fprintf(w, "policy     %s\n", tabSafe(cutTo(orDash(s.policy), SummaryWidth-11, true)))
			fmt.Fprintf(w, "           sha256 %s\n", tabSafe(orDash(s.polSHA)))
		} else {
			fmt.Fprintf(w, "policy     (none)\n")
		}
	} else {
		fmt.Fprintf(w, "header     missing\n")
	}
	fmt.Fprintf(w, "span       %s .. %s (%v)\n",
		s.first.UTC().Format(time.RFC3339Nano), s.last.UTC().Format(time.RFC3339Nano), s.last.Sub(s.first))
	fmt.Fprintf(w, "flows      %d allowed, %d denied\n", t.FlowsAllowed, t.FlowsDenied)
	fmt.Fprintf(w, "dns        %d allowed, %d denied\n", t.DNSAllowed, t.DNSDenied)
	fmt.Fprintf(w, "bytes      %d out, %d in\n", t.BytesOut, t.BytesIn)
	if s.folded > 0 {
		byDomain := ""
		if s.byDomain > 0 {
			byDomain = fmt.Sprintf(" (%d of them fold denials of distinct names by domain)", s.byDomain)
		}
		fmt.Fprintf(w, "folded     %d records stand for %d repeated queries and denials%s\n", s.folded, s.occurrences, byDomain)
	}
	if s.approvals > 0 {
		fmt.Fprintf(w, "approvals  %d records (requests held by --ask and their answers)\n", s.approvals)
	}
	writeOpen(w, s)
	for _, l := range s.limits {
		fmt.Fprintf(w, "limit      %s\n", tabSafe(l))
	}
	if s.haveTrailer {
		fmt.Fprintf(w, "lost       %d\n", s.lost)
	} else {
		fmt.Fprintf(w, "trailer    missing: tunwall was killed, the run is still going, or the tail was cut\n")
	}
	if t.HTTPAllowed+t.HTTPDenied > 0 {
		fmt.Fprintf(w, "http       %d requests allowed, %d denied (on terminated flows)\n", t.HTTPAllowed, t.HTTPDenied)
	}
	fmt.Fprintln(w)
	defer writeHTTP(w, s)
	if len(t.Hosts) == 0 {
		fmt.Fprintln(w, "(no flows or DNS queries)")
		return
	}
	tb := table{shrink: []shrinkCol{{col: 0, min: 24, middle: true}, {col: 6, min: 12}, {col: 7, min: 12}}}
	tb.add("HOST", "VERDICT", "FLOWS", "DNS", "OUT", "IN", "PROCESSES", "RULE")
	var why []string
	for _, h := range t.Hosts {
		procs := strings.Join(h.Comms, ",")
		if h.MoreComms {
			procs += ",..."
		}
		rule := "-"
		if h.DeniedOrWould() {
			rule = orDash(h.DenyRule)
			if h.DenyReason != "" {
				what, reason := "denied    ", h.DenyReason
				if h.DenyRule == RuleLearn {
					what, reason = "would deny", strings.TrimPrefix(reason, "learn mode; enforce would deny: ")
				}
				why = append(why, cutTo(fmt.Sprintf("%s %s: %s", what, tabSafe(h.Host), tabSafe(reason)), SummaryWidth, false))
			}
		}
		tb.add(tabSafe(h.Host), h.Verdicts(), strconv.Itoa(h.Flows()), strconv.Itoa(h.DNS()), humanBytes(h.BytesOut), humanBytes(h.BytesIn),
			tabSafe(orDash(procs)), tabSafe(rule))
	}
	tb.write(w)
	// Each host's first denial (or what enforce would have denied), one
	// a line: too long for a column.
	if len(why) > 0 {
		fmt.Fprintln(w)
	}
	for _, l := range why {
		fmt.Fprintln(w, l)
	}
}

// humanBytes writes n bytes with a binary unit (B, KiB, MiB, GiB).
func humanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit && exp < 2; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMG"[exp])
}

// writeOpen writes the flows of run s that started and never ended (the
// first five by time), if any.
func writeOpen(w io.Writer, s *runSummary) {
	n := len(s.open) + s.openMore
	if n == 0 {
		return
	}
	what := "1 flow started and never ended"
	if n > 1 {
		what = fmt.Sprintf("%d flows started and never ended", n)
	}
	if s.haveTrailer {
		fmt.Fprintf(w, "open       %s\n", what)
	} else {
		fmt.Fprintf(w, "open       %s (tunwall was killed?)\n", what)
	}
	keys := slices.SortedFunc(maps.Keys(s.open), func(a, b flowKey) int { return strings.Compare(a.ts, b.ts) })
	for i, k := range keys {
		if i == 5 {
			fmt.Fprintf(w, "           ... and %d more\n", n-5)
			break
		}
		r := s.open[k]
		who := orDash(r.Comm)
		if r.PID > 0 {
			who = fmt.Sprintf("%s (pid %d)", who, r.PID)
		}
		fmt.Fprintf(w, "           %s %s %s -> %s port %d by %s\n", k.ts, r.Proto, r.Src, tabSafe(orDash(hostKey(&r))), r.Port, tabSafe(who))
	}
}

// writeHTTP writes the run's requests on terminated flows, by host and
// method, denials first, then the first denial of each.
func writeHTTP(w io.Writer, s *runSummary) {
	if len(s.http) == 0 {
		return
	}
	keys := slices.SortedFunc(maps.Keys(s.http), func(a, b httpKey) int {
		ha, hb := s.http[a], s.http[b]
		if (ha.denied > 0) != (hb.denied > 0) {
			if ha.denied > 0 {
				return -1
			}
			return 1
		}
		if c := strings.Compare(a.host, b.host); c != 0 {
			return c
		}
		return strings.Compare(a.method, b.method)
	})
	fmt.Fprintln(w)
	tb := table{shrink: []shrinkCol{{col: 0, min: 24, middle: true}, {col: 7, min: 12}, {col: 4, min: 10}}}
	tb.add("HTTP HOST", "METHOD", "ALLOWED", "DENIED", "STATUSES", "OUT", "IN", "SECRETS")
	var denials []string
	for _, k := range keys {
		h := s.http[k]
		codes := slices.Sorted(maps.Keys(h.statuses))
		var st []string
		for _, c := range codes {
			st = append(st, fmt.Sprintf("%d:%d", c, h.statuses[c]))
		}
		tb.add(tabSafe(k.host), tabSafe(orDash(k.method)), strconv.Itoa(h.allowed), strconv.Itoa(h.denied),
			orDash(strings.Join(st, ",")), humanBytes(h.bytesOut), humanBytes(h.bytesIn), tabSafe(orDash(strings.Join(h.secrets, ","))))
		if h.denied > 0 && h.denyReason != "" {
			denials = append(denials, cutTo(fmt.Sprintf("denied     %s %s: %s", tabSafe(k.host), tabSafe(orDash(k.method)), tabSafe(h.denyReason)), SummaryWidth, false))
		}
	}
	if s.httpMore > 0 {
		tb.add("...", "", fmt.Sprintf("%d more requests", s.httpMore), "", "", "", "", "")
	}
	tb.write(w)
	// The first denial of each host and method, one a line: too long
	// for a column.
	for _, d := range denials {
		fmt.Fprintln(w, d)
	}
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// tabSafe replaces control characters, so that names from the sandbox can
// neither break the table's layout nor send escape sequences to a terminal.
func tabSafe(s string) string {
	return strings.Map(func(r rune) rune {
		if r < ' ' || (r >= 0x7f && r <= 0x9f) {
			return '?'
		}
		return r
	}, s)
}

// errWriter remembers the first write error and then writes nothing.
type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) Write(p []byte) (int, error) {
	if e.err != nil {
		return 0, e.err
	}
	n, err := e.w.Write(p)
	if err != nil {
		e.err = fmt.Errorf("audit: write summary: %w", err)
	}
	return n, err
}
