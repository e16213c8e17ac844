package audit

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// readLog reads, verifies and decodes a closed log.
func readLog(t *testing.T, path string) ([]Record, VerifyResult, []byte) {
	t.Helper()
	b, res := readVerify(t, path)
	var recs []Record
	for r, err := range Records(bytes.NewReader(b)) {
		if err != nil {
			t.Fatal(err)
		}
		recs = append(recs, r)
	}
	return recs, res, b
}

func deniedQuery(name string, pid int) Record {
	return Record{
		Kind: KindDNS, Proto: ProtoUDP, Src: netip.MustParseAddrPort("198.18.0.2:40000"), Dst: netip.MustParseAddrPort("198.18.0.1:53"),
		Host: name, HostFrom: HostFromDNS, Port: 53, Verdict: VerdictDeny, Rule: "default-deny", Reason: "no rule allows " + name,
		PID: pid, Comm: "dig", Qname: name, Qtype: "A", Rcode: "NXDOMAIN",
	}
}

// occurrences sums what the records of a log stand for.
func occurrences(recs []Record, match func(Record) bool) (lines, n int) {
	for _, r := range recs {
		if match(r) {
			lines++
			n += max(r.Count, 1)
		}
	}
	return lines, n
}

func TestRepeatsAreFoldedIntoOneRecordPerWindow(t *testing.T) {
	path := filepath.Join(t.TempDir(), "fold.jsonl")
	w := openTest(t, Options{Path: path, Header: fixedHeader(""), FoldWindow: time.Hour})
	base := time.Now()
	for i := range 1000 {
		r := deniedQuery("same.evil.test", 7+i%2) // two processes
		r.TS = base.Add(time.Duration(i) * time.Millisecond)
		r.Src = netip.MustParseAddrPort(fmt.Sprintf("198.18.0.2:%d", 30000+i)) // a new source port each time
		w.Write(r)
	}
	single := deniedQuery("once.evil.test", 9)
	w.Write(single)
	allowed := fixedRecords()[1] // an allowed flow: never folded
	for range 3 {
		w.Write(allowed)
	}
	if _, err := w.Close(); err != nil {
		t.Fatal(err)
	}
	recs, _, _ := readLog(t, path)
	same := func(r Record) bool { return r.Qname == "same.evil.test" }
	if lines, n := occurrences(recs, same); lines != 2 || n != 1000 {
		t.Fatalf("the repeated query is in %d records standing for %d, want 2 (the first, then the repeats) for 1000", lines, n)
	}
	var first, folded Record
	for _, r := range recs {
		if same(r) && r.Count == 0 {
			first = r
		} else if same(r) {
			folded = r
		}
	}
	if first.PID != 7 || folded.Count != 999 || !folded.TS.Equal(base.Add(time.Millisecond)) ||
		!folded.Until.Equal(base.Add(999*time.Millisecond)) || folded.PID != 0 || folded.Owner != "several processes" {
		t.Errorf("first %+v\nfolded %+v\nwant the first as it was, then count 999 from +1ms until +999ms, from several processes", first, folded)
	}
	if lines, n := occurrences(recs, func(r Record) bool { return r.Qname == "once.evil.test" }); lines != 1 || n != 1 {
		t.Errorf("a query seen once is in %d records standing for %d", lines, n)
	}
	if lines, n := occurrences(recs, func(r Record) bool { return r.Kind == KindFlow && r.Verdict == VerdictAllow }); lines != 3 || n != 3 {
		t.Errorf("allowed flows are in %d records standing for %d, want 3 each", lines, n)
	}
	if tot := w.Totals(); tot.DNSDenied != 1001 {
		t.Errorf("Totals counts %d denied queries, want 1001", tot.DNSDenied)
	}
}

func TestAFoldIsWrittenWhenItsWindowEndsWhileTheRunGoesOn(t *testing.T) {
	path := filepath.Join(t.TempDir(), "window.jsonl")
	w := openTest(t, Options{Path: path, Header: fixedHeader(""), FoldWindow: 50 * time.Millisecond, SyncEvery: 10 * time.Millisecond})
	for range 5 {
		w.Write(deniedQuery("again.evil.test", 7))
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		b, _ := os.ReadFile(path)
		if bytes.Contains(b, []byte(`"count":4,`)) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the fold of 4 repeats was not written within 5s of a 50ms window:\n%s", b)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestDistinctRecordsBeyondTheFoldTableAreCountedNotLost(t *testing.T) {
	// With a fold table of 10 (and so 10 domains), the first 10 of 500
	// distinct denials are written one by one; the others are folded by
	// domain while there is room for the domain, and counted per kind
	// beyond it. Allowed queries beyond the table are counted per kind.
	for _, c := range []struct {
		name                 string
		qname                func(i int) string
		allow                bool
		maxRecords           int
		byDomain, overflowed int
		summaryHost          string
	}{
		{"denials under one domain", func(i int) string { return fmt.Sprintf("r%d.evil.test", i) }, false, 11, 490, 0, "evil.test"},
		{"denials under 500 domains", func(i int) string { return fmt.Sprintf("r.evil%d.test", i) }, false, 21, 10, 480, "(counted only)"},
		{"allowed queries", func(i int) string { return fmt.Sprintf("r%d.ok.test", i) }, true, 11, 0, 490, "(counted only)"},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "overflow.jsonl")
			w := openTest(t, Options{Path: path, Header: fixedHeader(""), FoldKeys: 10, FoldWindow: time.Hour})
			for i := range 500 {
				r := deniedQuery(c.qname(i), 7)
				if c.allow {
					r.Verdict, r.Rule, r.Reason, r.Rcode = VerdictAllow, "exec: host *.ok.test", "allowed name", "NOERROR"
				}
				w.Write(r)
			}
			if _, err := w.Close(); err != nil {
				t.Fatal(err)
			}
			recs, res, _ := readLog(t, path)
			if res.Records > c.maxRecords {
				t.Errorf("%d records for 500 distinct queries with a fold table of 10, want at most %d", res.Records, c.maxRecords)
			}
			if _, n := occurrences(recs, func(r Record) bool { return r.Kind == KindDNS }); n != 500 {
				t.Errorf("the log stands for %d queries, want 500", n)
			}
			var over, byDomain int
			for _, r := range recs {
				if r.Rule == RuleOverflow {
					over += r.Count
				}
				if r.Samples[0] != "" {
					byDomain += r.Count
				}
			}
			if over != c.overflowed || byDomain != c.byDomain {
				t.Errorf("overflow records count %d, domain folds %d; want %d and %d", over, byDomain, c.overflowed, c.byDomain)
			}
			tot := Tally(recs)
			if tot.DNSAllowed+tot.DNSDenied != 500 || !slices.ContainsFunc(tot.Hosts, func(h HostTotals) bool { return h.Host == c.summaryHost }) {
				t.Errorf("tally: %d allowed, %d denied queries, hosts %v; want 500 and a row for %s", tot.DNSAllowed, tot.DNSDenied, tot.Hosts, c.summaryHost)
			}
		})
	}
}

func TestTheSizeCapDeniesNewWorkAndTheRunStillEnds(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cap.jsonl")
	var limits []error
	const maxSize = 8 << 10
	w := openTest(t, Options{Path: path, Header: fixedHeader(""), MaxSize: maxSize, OnLimit: func(err error) { limits = append(limits, err) }})
	start := fixedRecords()[1]
	start.Kind = KindStart
	if err := <-w.Commit(start); err != nil {
		t.Fatalf("Commit of a start record before the cap: %v", err)
	}
	for i := range 1000 {
		w.Write(deniedQuery(fmt.Sprintf("r%d.evil.test", i), 7))
	}
	w.Write(fixedRecords()[1]) // the end of the flow that started: still written
	if err := <-w.Commit(start); !errors.Is(err, ErrSizeCap) {
		t.Fatalf("Commit of a start record after the cap = %v, want ErrSizeCap", err)
	}
	if err := w.Admit(); !errors.Is(err, ErrSizeCap) {
		t.Fatalf("Admit after the cap = %v, want ErrSizeCap", err)
	}
	sum, err := w.Close()
	if err != nil || sum.Lost != 0 {
		t.Fatalf("Close = %+v, %v", sum, err)
	}
	if len(limits) != 1 || !errors.Is(limits[0], ErrSizeCap) {
		t.Errorf("OnLimit calls: %v, want one ErrSizeCap", limits)
	}
	recs, res, b := readLog(t, path)
	// Over the cap by no more than the one flow record of the flow that
	// was open when it was reached.
	if len(b) > maxSize+600 {
		t.Errorf("the log is %d bytes, over its cap of %d", len(b), maxSize)
	}
	if !res.Complete {
		t.Error("the capped run has no trailer")
	}
	if _, n := occurrences(recs, func(r Record) bool { return r.Kind == KindDNS }); n != 1000 {
		t.Errorf("the capped log stands for %d queries, want 1000", n)
	}
	var limit, afterCap, flows, starts int
	for _, r := range recs {
		switch {
		case r.Kind == KindLimit && r.Rule == RuleMaxSize:
			limit++
		case r.Rule == RuleMaxSize:
			afterCap += r.Count
		case r.Kind == KindFlow:
			flows++
		case r.Kind == KindStart:
			starts++
		}
	}
	if limit != 1 || afterCap == 0 || flows != 1 || starts != 1 {
		t.Errorf("%d limit records, %d queries counted after the cap, %d flows, %d starts; want 1, some, 1, 1", limit, afterCap, flows, starts)
	}
}

func TestTheRateBoundRefusesStartsAndSparesDenials(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rate.jsonl")
	var limits atomic.Int32
	w := openTest(t, Options{Path: path, Header: fixedHeader(""), MaxRate: 2, OnLimit: func(err error) {
		if errors.Is(err, ErrRateLimited) {
			limits.Add(1)
		}
	}}) // a burst of 20 lines
	// A flood of distinct denials uses at most half the burst...
	for i := range 100 {
		w.Write(deniedQuery(fmt.Sprintf("r%d.evil.test", i), 7))
	}
	if err := w.Admit(); err != nil {
		t.Fatalf("Admit after a flood of denials = %v: denials must not starve new flows", err)
	}
	// ...then flows take the rest, and are refused.
	start := fixedRecords()[1]
	start.Kind = KindStart
	ok, refused := 0, 0
	for range 30 {
		if err := <-w.Commit(start); err == nil {
			ok++
		} else if errors.Is(err, ErrRateLimited) {
			refused++
		} else {
			t.Fatal(err)
		}
	}
	if ok < 8 || ok > 12 || refused == 0 {
		t.Errorf("%d starts written, %d refused; want about half the burst of 20 written", ok, refused)
	}
	if err := w.Admit(); !errors.Is(err, ErrRateLimited) {
		t.Errorf("Admit with no budget = %v, want ErrRateLimited", err)
	}
	if _, err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if n := limits.Load(); n != 1 {
		t.Errorf("OnLimit said the rate bound %d times, want once", n)
	}
	recs, _, _ := readLog(t, path)
	if _, n := occurrences(recs, func(r Record) bool { return r.Kind == KindDNS }); n != 100 {
		t.Errorf("the log stands for %d queries, want 100", n)
	}
	if lines, _ := occurrences(recs, func(r Record) bool { return r.Kind == KindLimit && r.Rule == RuleMaxRate }); lines != 1 {
		t.Errorf("%d rate limit records, want 1", lines)
	}
}

// TestCommitReturnsOnceTheLineIsInTheFile reads the file while the Writer
// is still open.
func TestCommitReturnsOnceTheLineIsInTheFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "commit.jsonl")
	w := openTest(t, Options{Path: path, Header: fixedHeader(""), SyncEvery: time.Hour})
	for i := range 50 {
		r := fixedRecords()[1]
		r.Kind, r.Reason = KindStart, fmt.Sprintf("start %d", i)
		if err := <-w.Commit(r); err != nil {
			t.Fatal(err)
		}
		if b := mustRead(t, path); !bytes.Contains(b, []byte(fmt.Sprintf(`"reason":"start %d"`, i))) {
			t.Fatalf("Commit returned before start %d reached the file", i)
		}
	}
	w.Close()
	if err := <-w.Commit(fixedRecords()[1]); !errors.Is(err, ErrClosed) {
		t.Fatalf("Commit after Close = %v, want ErrClosed", err)
	}
}

func TestSummarizeReportsStartsWithoutAnEndFoldsAndLimits(t *testing.T) {
	recs := fixedRecords()
	open := recs[1]
	open.Kind, open.Dst, open.Port, open.Host = KindStart, netip.MustParseAddrPort("198.51.100.7:7"), 7, "echo.test"
	ended := recs[1]
	ended.Kind = KindStart
	folded := recs[2]
	folded.Count, folded.Until = 41, folded.TS.Add(time.Second)
	limit := Record{TS: t0.Add(4 * time.Second), Kind: KindLimit, Verdict: VerdictDeny, Rule: RuleMaxSize, Reason: "cap reached"}
	log := buildLog(t, fixedHeader(testRun), []Record{open, ended, recs[1], folded, limit}, false)
	var out bytes.Buffer
	if err := Summarize(bytes.NewReader(log), &out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"open       1 flow started and never ended (tunwall was killed?)",
		"tcp 198.51.100.2:40000 -> echo.test port 7 by pip (pid 41)",
		"folded     1 records stand for 41 repeated queries and denials",
		"dns        0 allowed, 41 denied",
		"limit      audit-max-size: cap reached",
		"integrity  INCOMPLETE: line 6: run " + testRun + " ended without a trailer",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("summary lacks %q:\n%s", want, out.String())
		}
	}
}

// TestTheEndOfARunKeepsTheRateBound floods distinct denials that the rate
// bound leaves waiting in the fold table, then closes: the records flushed
// at the end obey the same bound as those written during the run, and none
// is lost from the counts.
func TestTheEndOfARunKeepsTheRateBound(t *testing.T) {
	path := filepath.Join(t.TempDir(), "closerate.jsonl")
	const rate, burst = 2, 20 // BurstSeconds of rate
	start := time.Now()
	w := openTest(t, Options{Path: path, Header: fixedHeader(""), MaxRate: rate, FoldWindow: time.Hour})
	const n = 1000
	for i := range n {
		w.Write(deniedQuery(fmt.Sprintf("r%d.evil.test", i), 7))
	}
	if _, err := w.Close(); err != nil {
		t.Fatal(err)
	}
	elapsed := time.Since(start)
	recs, res, _ := readLog(t, path)
	// Repeatable records take no more than the upper half of the burst and
	// what refilled while the run lasted; one count per kind and verdict,
	// the header and the trailer come on top.
	bound := burst/2 + int(elapsed.Seconds()*rate) + 1 + 3
	if res.Lines > bound {
		t.Errorf("%d lines for %d distinct denials in %v; the rate bound allows %d", res.Lines, n, elapsed, bound)
	}
	if _, got := occurrences(recs, func(r Record) bool { return r.Kind == KindDNS }); got != n {
		t.Errorf("the log stands for %d queries, want %d", got, n)
	}
}
