package audit

import (
	"bytes"
	"fmt"
	"net/netip"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"
)

// fakeClock is the time a Writer goes by in these tests (Options.clock),
// and its ticker (Options.tick): advance moves the time and returns once the
// writer goroutine has taken the tick, so that everything Committed before
// is decided before the tick and everything after, after it.
type fakeClock struct {
	mu   sync.Mutex
	t    time.Time
	tick chan time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{t: t0, tick: make(chan time.Time)} }

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	t := c.t
	c.mu.Unlock()
	c.tick <- t
}

// openClocked opens a Writer on the fake clock c.
func openClocked(t *testing.T, c *fakeClock, o Options) *Writer {
	t.Helper()
	o.clock, o.tick = c.now, c.tick
	return openTest(t, o)
}

// commit queues r stamped with the fake time and waits until the writer
// has decided it.
func commit(t *testing.T, w *Writer, c *fakeClock, r Record) {
	t.Helper()
	r.TS = c.now()
	if err := <-w.Commit(r); err != nil {
		t.Fatalf("Commit: %v", err)
	}
}

func deniedFlow(dst string, host string) Record {
	reason := "no rule allows it"
	if host == "" {
		reason = "raw IP " + dst + " with no cidr rule"
	}
	return Record{
		Kind: KindFlow, Proto: ProtoTCP, Src: netip.MustParseAddrPort("198.18.0.2:40000"), Dst: netip.MustParseAddrPort(dst),
		Host: host, HostFrom: HostFromDNS, Port: netip.MustParseAddrPort(dst).Port(), Verdict: VerdictDeny, Rule: "default-deny",
		Reason: reason, PID: 7, Comm: "python3",
	}
}

// longLabel is 60 characters, the most but 3 a DNS label may hold.
func longLabel(i int) string { return fmt.Sprintf("%060d", i) }

// TestADenialFloodIsHeldToTheDenialBudget floods a Writer with 500 denials a
// second for a minute of fake time, in the shapes a sandbox can choose,
// with one allowed flow a second among them. The denials take at most the
// denial budget's lines (its burst, then DenyRate a second) plus one count
// a second; the counts add up to every denial; every allowed flow has its
// own record.
func TestADenialFloodIsHeldToTheDenialBudget(t *testing.T) {
	const secs, perSec, ticks = 30, 400, 4
	for _, c := range []struct {
		name   string
		record func(i int) Record
		folded string // a domain that must have a fold with samples; "" for none
	}{
		{"distinct long names under one domain", func(i int) Record {
			return deniedQuery(fmt.Sprintf("%s.%s.%s.flood.test", longLabel(i), longLabel(i), longLabel(i)), 7)
		}, "flood.test"},
		{"distinct long names under a new domain each", func(i int) Record {
			return deniedQuery(fmt.Sprintf("%s.%s.%s.d%d.test", longLabel(i), longLabel(i), longLabel(i), i), 7)
		}, ""},
		{"names under 61 domains and a new domain in four", func(i int) Record {
			if i%4 == 3 {
				return deniedQuery(fmt.Sprintf("%s.z%d.test", longLabel(i), i), 7)
			}
			return deniedQuery(fmt.Sprintf("%s.d%d-flood.test", longLabel(i), i%61), 7)
		}, "d0-flood.test"},
		{"names at DNS's 253-byte limit under 61 domains", func(i int) Record {
			l := strings.Repeat("x", 63)
			return deniedQuery(fmt.Sprintf("%063d.%s.%s.%056d.test", i, l, l, i%61), 7)
		}, fmt.Sprintf("%056d.test", 7)},
		{"5000 names repeated", func(i int) Record {
			return deniedQuery(fmt.Sprintf("n%d.d%d.test", i%5000, i%7), 7+i%3)
		}, "d3.test"},
		{"denied flows to raw addresses", func(i int) Record {
			return deniedFlow(fmt.Sprintf("203.0.113.%d:%d", i%256, 1+i%60000), "")
		}, ""},
		{"denied flows to names", func(i int) Record {
			return deniedFlow(fmt.Sprintf("198.18.%d.%d:443", i/250%256, 1+i%250), fmt.Sprintf("x%d.exfil.test", i))
		}, "exfil.test"},
	} {
		t.Run(c.name, func(t *testing.T) {
			clock := newFakeClock()
			path := filepath.Join(t.TempDir(), "flood.jsonl")
			w := openClocked(t, clock, Options{Path: path, Header: fixedHeader("")})
			allowed := fixedRecords()[1]
			for s := range secs {
				for q := range ticks {
					for i := range perSec / ticks {
						commit(t, w, clock, c.record(s*perSec+q*perSec/ticks+i))
					}
					clock.advance(time.Second / ticks)
				}
				commit(t, w, clock, allowed)
			}
			if _, err := w.Close(); err != nil {
				t.Fatal(err)
			}
			recs, res, b := readLog(t, path)
			var budgeted, counts, allowedLines, sampled int
			for _, r := range recs {
				switch {
				case r.Verdict == VerdictAllow:
					allowedLines++
					if r.Count != 0 {
						t.Errorf("an allowed flow was folded: %+v", r)
					}
				case r.Rule == RuleOverflow:
					counts++
				case r.Kind != KindLimit:
					budgeted++
				}
				if r.Samples != [MaxSamples]string{} {
					sampled++
					if r.Host == c.folded {
						c.folded = ""
					}
					for _, s := range r.Samples {
						if len(s) > MaxSampleLen {
							t.Errorf("sample %q is %d bytes, over %d", s, len(s), MaxSampleLen)
						}
					}
				}
			}
			deny := DefaultDenyRate
			if max := deny*BurstSeconds + deny*secs; budgeted > max {
				t.Errorf("%d denial lines in %ds of fake time; the budget allows %d", budgeted, secs, max)
			}
			if max := secs + 2; counts > max {
				t.Errorf("%d count lines in %ds, want at most one a second", counts, secs)
			}
			if allowedLines != secs {
				t.Errorf("%d allowed flow records, want %d", allowedLines, secs)
			}
			if _, n := occurrences(recs, func(r Record) bool { return r.Verdict == VerdictDeny }); n != secs*perSec {
				t.Errorf("the log stands for %d denials, want %d", n, secs*perSec)
			}
			if tot, want := Tally(recs), w.Totals(); tot.DNSDenied != want.DNSDenied || tot.FlowsDenied != want.FlowsDenied || tot.FlowsAllowed != secs {
				t.Errorf("the log tallies %d denied queries and %d denied, %d allowed flows; the writer counted %d, %d and %d",
					tot.DNSDenied, tot.FlowsDenied, tot.FlowsAllowed, want.DNSDenied, want.FlowsDenied, want.FlowsAllowed)
			}
			if c.folded != "" {
				t.Errorf("no record folds the denials under %s", c.folded)
			}
			// The README's figure: under 1.5 MiB a minute, after a first
			// burst of at most about 250 KiB.
			if limit := 250<<10 + (3<<20)/2*secs/60; len(b) > limit {
				t.Errorf("%d bytes in %ds, over the %d the README states", len(b), secs, limit)
			}
			t.Logf("%d denials in %ds: %d lines (%d of the budget, %d counts, %d with samples), %d bytes: %.2f MiB a minute",
				secs*perSec, secs, res.Lines, budgeted, counts, sampled, len(b), float64(len(b))/secs*60/(1<<20))
		})
	}
}

// TestDenialsWithinTheBudgetAreWrittenOneByOne: fewer distinct denials
// than half the burst are all written as they are, with their names.
func TestDenialsWithinTheBudgetAreWrittenOneByOne(t *testing.T) {
	clock := newFakeClock()
	path := filepath.Join(t.TempDir(), "few.jsonl")
	w := openClocked(t, clock, Options{Path: path, Header: fixedHeader("")})
	const n = DefaultDenyRate * BurstSeconds / 2
	for i := range n {
		commit(t, w, clock, deniedQuery(fmt.Sprintf("host%d.example", i), 7))
	}
	if _, err := w.Close(); err != nil {
		t.Fatal(err)
	}
	recs, _, _ := readLog(t, path)
	for i, r := range recs {
		if want := fmt.Sprintf("host%d.example", i); r.Qname != want || r.Count != 0 || r.Samples != [MaxSamples]string{} {
			t.Fatalf("record %d: %+v, want %s alone", i, r, want)
		}
	}
	if len(recs) != n {
		t.Errorf("%d records for %d denials", len(recs), n)
	}
}

// TestARecordFoldedByDomain checks what a fold by domain says: the
// domain, the count, the time of the last, up to three distinct samples
// cut to length, the reason without the name, and several processes.
func TestARecordFoldedByDomain(t *testing.T) {
	clock := newFakeClock()
	path := filepath.Join(t.TempDir(), "domain.jsonl")
	// DenyRate 1: a burst of 10 lines, the first 5 for denials one by one.
	w := openClocked(t, clock, Options{Path: path, Header: fixedHeader(""), DenyRate: 1})
	for i := range 5 {
		commit(t, w, clock, deniedQuery(fmt.Sprintf("first%d.other.test", i), 7))
	}
	long := strings.Repeat("é", 40) + ".evil.test" // 90 bytes
	names := []string{long, "a.evil.test", long, "b.x.EVIL.test.", "c.evil.test", "d.evil.test"}
	var last time.Time
	for i, name := range names {
		r := deniedQuery(name, 7+i%2)
		r.Reason = "no rule allows " + strings.TrimSuffix(name, ".")
		commit(t, w, clock, r)
		last = clock.now()
		clock.mu.Lock()
		clock.t = clock.t.Add(time.Millisecond)
		clock.mu.Unlock()
	}
	clock.advance(time.Second)
	if _, err := w.Close(); err != nil {
		t.Fatal(err)
	}
	recs, _, _ := readLog(t, path)
	if len(recs) != 6 {
		t.Fatalf("%d records, want the 5 written one by one and one fold:\n%+v", len(recs), recs)
	}
	f := recs[5]
	cut := strings.Repeat("é", 30) + "..."
	want := [MaxSamples]string{cut, "a.evil.test", "b.x.EVIL.test."}
	if f.Host != "evil.test" || f.Qname != "" || f.Count != len(names) || !f.TS.Equal(t0) || !f.Until.Equal(last) ||
		f.Samples != want || f.Reason != "no rule allows "+NameInReason || f.PID != 0 || f.Owner != "several processes" ||
		f.Rule != "default-deny" || f.Kind != KindDNS || f.Verdict != VerdictDeny || f.Qtype != "A" {
		t.Errorf("fold %+v\nwant host evil.test, count %d from %v until %v, samples %q, reason with %s, several processes",
			f, len(names), t0, last, want, NameInReason)
	}
	if !utf8.ValidString(f.Samples[0]) || len(f.Samples[0]) > MaxSampleLen {
		t.Errorf("sample %q is not valid UTF-8 or is over %d bytes", f.Samples[0], MaxSampleLen)
	}
	// audit summary counts the fold as the denials it stands for, under
	// its domain, and says it folds by domain.
	var sum bytes.Buffer
	if err := Summarize(bytes.NewReader(mustRead(t, path)), &sum); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"dns        0 allowed, 11 denied", "(1 of them fold denials of distinct names by domain)", "\nevil.test ", "integrity  ok"} {
		if !strings.Contains(sum.String(), want) {
			t.Errorf("summary lacks %q:\n%s", want, sum.String())
		}
	}
}

// TestTheLargestDomainFoldsAreWrittenFirst: when the budget left at the
// end of a window cannot write every domain's fold, the largest are
// written and the rest counted.
func TestTheLargestDomainFoldsAreWrittenFirst(t *testing.T) {
	clock := newFakeClock()
	path := filepath.Join(t.TempDir(), "largest.jsonl")
	w := openClocked(t, clock, Options{Path: path, Header: fixedHeader(""), DenyRate: 1})
	for i := range 5 { // the half of the burst for denials one by one
		commit(t, w, clock, deniedQuery(fmt.Sprintf("first%d.other.test", i), 7))
	}
	// 8 domains, d1 with 1 denial .. d8 with 8; 5 lines of budget are
	// left, and 1 more refills in the second the window lasts.
	for d := 1; d <= 8; d++ {
		for i := range d {
			commit(t, w, clock, deniedQuery(fmt.Sprintf("n%d.d%d.test", i, d), 7))
		}
	}
	clock.advance(time.Second)
	if _, err := w.Close(); err != nil {
		t.Fatal(err)
	}
	recs, _, _ := readLog(t, path)
	var got []string
	over := 0
	for _, r := range recs[5:] {
		switch {
		case r.Rule == RuleOverflow:
			over += r.Count
		default:
			got = append(got, fmt.Sprintf("%s:%d", r.Host, r.Count))
		}
	}
	if want := "d8.test:8 d7.test:7 d6.test:6 d5.test:5 d4.test:4 d3.test:3"; strings.Join(got, " ") != want || over != 3 {
		t.Errorf("folds written: %s, counted %d; want %s, and 3 counted", strings.Join(got, " "), over, want)
	}
}

// TestOptionsDomainIsWhatDenialsFoldBy: the caller's registrable domain
// (a public suffix list) replaces the approximation.
func TestOptionsDomainIsWhatDenialsFoldBy(t *testing.T) {
	clock := newFakeClock()
	path := filepath.Join(t.TempDir(), "psl.jsonl")
	psl := func(name string) string { // example.co.uk, as the list has it
		name = strings.ToLower(strings.TrimSuffix(name, "."))
		if strings.HasSuffix(name, ".co.uk") {
			labels := strings.Split(name, ".")
			return strings.Join(labels[len(labels)-3:], ".")
		}
		return RegistrableDomain(name)
	}
	w := openClocked(t, clock, Options{Path: path, Header: fixedHeader(""), DenyRate: 1, Domain: psl})
	for i := range 5 {
		commit(t, w, clock, deniedQuery(fmt.Sprintf("first%d.other.test", i), 7))
	}
	for i := range 4 {
		commit(t, w, clock, deniedQuery(fmt.Sprintf("n%d.one.co.uk", i), 7))
		commit(t, w, clock, deniedQuery(fmt.Sprintf("n%d.two.co.uk", i), 7))
	}
	clock.advance(time.Second)
	if _, err := w.Close(); err != nil {
		t.Fatal(err)
	}
	recs, _, _ := readLog(t, path)
	hosts := map[string]int{}
	for _, r := range recs[5:] {
		hosts[r.Host] += r.Count
	}
	if hosts["one.co.uk"] != 4 || hosts["two.co.uk"] != 4 || len(hosts) != 2 {
		t.Errorf("folded by %v, want one.co.uk and two.co.uk, 4 each", hosts)
	}
}

func TestRegistrableDomainApproximation(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"a.b.example.com", "example.com"},
		{"Example.COM.", "example.com"},
		{"example.com", "example.com"},
		{"localhost", "localhost"},
		{"x.example.co.uk", "co.uk"}, // the approximation: no suffix list
		{"192.0.2.1", "192.0.2.1"},
		{"2001:db8::1", "2001:db8::1"},
		{"", ""},
		{".", ""},
		{"a..b", ".b"},
	} {
		if got := RegistrableDomain(c.in); got != c.want {
			t.Errorf("RegistrableDomain(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestSampleOf(t *testing.T) {
	long := strings.Repeat("a", 100) + ".evil.test"
	for _, c := range []struct {
		r    Record
		want string
	}{
		{deniedQuery("x.evil.test", 1), "x.evil.test"},
		{deniedQuery(long, 1), strings.Repeat("a", MaxSampleLen-3) + "..."},
		{deniedFlow("198.18.0.9:8443", "x.exfil.test"), "x.exfil.test:8443"},
		{deniedFlow("[2001:db8::9]:22", ""), "[2001:db8::9]:22"},
		{Record{Kind: KindHTTP, Host: "api.test", Path: "/v1/x"}, "api.test/v1/x"},
		{Record{Kind: KindFlow}, ""},
	} {
		if got := sampleOf(&c.r); got != c.want {
			t.Errorf("sampleOf(%s %q %v) = %q, want %q", c.r.Kind, c.r.Host, c.r.Dst, got, c.want)
		}
	}
}
