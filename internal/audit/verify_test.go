package audit

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

const testRun = "tw-00112233aabbccdd"

// TestVerifyAcceptsAnIntactLog checks the happy path on the fixed log.
func TestVerifyAcceptsAnIntactLog(t *testing.T) {
	log := buildLog(t, fixedHeader(testRun), fixedRecords(), true)
	res, err := Verify(bytes.NewReader(log))
	if err != nil {
		t.Fatalf("Verify: %v", err)
	}
	lines := splitLines(log)
	want := VerifyResult{
		Run: testRun, Runs: 1, Records: len(fixedRecords()), Complete: true,
		Last: sha256Hex(lines[len(lines)-1]), Lines: len(lines),
	}
	if !reflect.DeepEqual(res, want) {
		t.Fatalf("Verify = %+v, want %+v", res, want)
	}
}

func sha256Hex(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

// TestVerifyNamesTheFirstBadLine tampers with the fixed log (header, 8
// records, trailer: lines 1..10) in every way the spec lists.
func TestVerifyNamesTheFirstBadLine(t *testing.T) {
	base := splitLines(buildLog(t, fixedHeader(testRun), fixedRecords(), true))
	if len(base) != 10 {
		t.Fatalf("fixed log has %d lines, want 10", len(base))
	}
	replace := func(i int, old, new string) func([][]byte) [][]byte {
		return func(l [][]byte) [][]byte {
			if !bytes.Contains(l[i-1], []byte(old)) {
				t.Fatalf("line %d has no %q", i, old)
			}
			l[i-1] = bytes.Replace(l[i-1], []byte(old), []byte(new), 1)
			return l
		}
	}
	remove := func(i int) func([][]byte) [][]byte {
		return func(l [][]byte) [][]byte { return slices.Delete(l, i-1, i) }
	}
	insert := func(i int, line []byte) func([][]byte) [][]byte {
		return func(l [][]byte) [][]byte { return slices.Insert(l, i-1, line) }
	}
	swap := func(i int) func([][]byte) [][]byte {
		return func(l [][]byte) [][]byte { l[i-1], l[i] = l[i], l[i-1]; return l }
	}
	// A line a forger makes to fit after line 4: line 4 with its verdict
	// flipped and its prev set to the hash of line 4.
	forged := bytes.Replace(base[3], []byte(`"prev":"`+sha256Hex(base[2])+`"`),
		[]byte(`"prev":"`+sha256Hex(base[3])+`"`), 1)
	forged = bytes.Replace(forged, []byte(`"verdict":"deny"`), []byte(`"verdict":"allow"`), 1)
	if bytes.Equal(forged, base[3]) || !bytes.Contains(forged, []byte(sha256Hex(base[3]))) {
		t.Fatal("forged line was not built")
	}
	otherHeader := splitLines(buildLog(t, fixedHeader("tw-ffffffffffffffff"), nil, false))[0]

	tests := []struct {
		name     string
		mutate   func([][]byte) [][]byte
		wantLine int
		wantMsg  string
	}{
		{"a verdict edited in a middle record is blamed on that record", replace(4, `"verdict":"deny"`, `"verdict":"allow"`), 4, "line 4 was changed"},
		{"bytes edited in the last record before the trailer are blamed on it", replace(9, `"bytes_in":5000`, `"bytes_in":5`), 9, "line 9 was changed"},
		{"an edited header is blamed on line 1", replace(1, `"phase":"setup"`, `"phase":"exec"`), 1, "line 1 was changed"},
		{"a record whose prev was edited is blamed on itself", replace(6, sha256Hex(base[4]), strings.Repeat("ab", 32)), 6, "line 6 does not fit the chain"},
		{"a prev edited to skip a line is not mistaken for an insertion", replace(6, sha256Hex(base[4]), sha256Hex(base[3])), 6, "line 6 does not fit the chain"},
		{"a prev that is not 64 hex digits is named", replace(6, `"prev":"`, `"prev":"0`), 6, "not 64 hex digits"},
		{"a trailer whose count was edited is named", replace(10, `"count":9`, `"count":8`), 10, "trailer counts 8"},
		{"a trailer whose last was edited is named", replace(10, `"last":"`, `"last":"f`), 10, "last"},
		{"a removed middle record is named by the line now in its place", remove(5), 5, "1 line(s) missing before line 5"},
		{"a removed last record is named by the trailer now in its place", remove(9), 9, "missing before line 9"},
		{"a forged line inserted with a valid prev is named", insert(5, forged), 5, "line 5 was inserted"},
		{"a copied line inserted elsewhere is named", insert(7, base[2]), 7, "line 7"},
		{"two swapped records name the first of them", swap(3), 3, "lines 3 and 4 are swapped"},
		{"a trailer swapped with the last record is named", swap(9), 9, "swapped"},
		{"a cut head is reported on line 1", remove(1), 1, "head of the log was cut"},
		{"a head cut inside a line is reported on line 1", func(l [][]byte) [][]byte { l[0] = l[0][20:]; return l }, 1, "head of the log was cut"},
		{"a cut tail is reported at the last line", remove(10), 9, "run " + testRun + " ended without a trailer at line 9 (tunwall was killed, the run is still going, or the tail was cut); lines 1..9 chain intact"},
		{"a line that is not JSON is named", replace(6, `{`, `{{`), 6, "not a valid JSON record"},
		{"a blank line is named", insert(3, nil), 3, "empty line"},
		{"a record of another run is named", replace(7, testRun, "tw-0000000000000000"), 7, "differs from the header's"},
		{"a second header inside a run is named", insert(4, otherHeader), 4, "the header of run tw-ffffffffffffffff does not chain to line 3"},
		{"a record after the trailer is named", func(l [][]byte) [][]byte { return append(l, l[3]) }, 11, "follows the trailer"},
		{"an unknown kind is named", replace(2, `"kind":"dns"`, `"kind":"ping"`), 2, "unknown kind"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lines := tt.mutate(cloneLines(base))
			_, err := Verify(bytes.NewReader(joinLines(lines)))
			var ve *VerifyError
			if !errors.As(err, &ve) {
				t.Fatalf("Verify error = %v, want a *VerifyError", err)
			}
			if ve.Line != tt.wantLine || !strings.Contains(ve.Msg, tt.wantMsg) {
				t.Fatalf("Verify error = %v, want line %d and %q", err, tt.wantLine, tt.wantMsg)
			}
			t.Log(err)
		})
	}
}

func cloneLines(lines [][]byte) [][]byte {
	out := make([][]byte, len(lines))
	for i, l := range lines {
		out[i] = bytes.Clone(l)
	}
	return out
}

// TestVerifyReportsTheTrailerHash shows that an edit of the trailer's own
// timestamp, which no later line can catch, changes VerifyResult.Last: the
// value to compare with a Summary.Last kept elsewhere.
func TestVerifyReportsTheTrailerHash(t *testing.T) {
	log := buildLog(t, fixedHeader(testRun), fixedRecords(), true)
	good, err := Verify(bytes.NewReader(log))
	if err != nil {
		t.Fatal(err)
	}
	lines := splitLines(log)
	lines[9] = bytes.Replace(lines[9], []byte(`"ts":"2026-03-01T10:00:03`), []byte(`"ts":"2026-03-01T11:00:03`), 1)
	bad, err := Verify(bytes.NewReader(joinLines(lines)))
	if err != nil {
		t.Fatalf("Verify of a log with an edited trailer ts: %v", err)
	}
	if bad.Last == good.Last {
		t.Fatalf("Last %s did not change when the trailer was edited", bad.Last)
	}
}

// TestVerifyResultDescribesTheGoodPrefix checks the partial result of a
// failed Verify.
func TestVerifyResultDescribesTheGoodPrefix(t *testing.T) {
	lines := splitLines(buildLog(t, fixedHeader(testRun), fixedRecords(), true))
	lines[3] = bytes.Replace(lines[3], []byte(`"deny"`), []byte(`"allow"`), 1) // line 4
	res, err := Verify(bytes.NewReader(joinLines(lines)))
	if err == nil {
		t.Fatal("Verify accepted an edited line")
	}
	if res.Records != 2 || res.Last != sha256Hex(lines[2]) || res.Complete {
		t.Fatalf("result = %+v, want 2 records ending at line 3, not complete", res)
	}
}

// TestVerifyEdgeCases covers inputs that are not logs at all.
func TestVerifyEdgeCases(t *testing.T) {
	log := buildLog(t, fixedHeader(testRun), fixedRecords(), true)
	tests := []struct {
		name     string
		in       []byte
		wantLine int
		wantMsg  string
	}{
		{"an empty file has no header", nil, 1, "log is empty"},
		{"a header alone is a run still going", splitLines(log)[0], 1, "without a trailer"},
		{"a torn last line is incomplete, not garbage", log[:len(log)-30], 10, "its last line 10 is incomplete (no newline)"},
		{"a line longer than the limit is named", append(append(bytes.Clone(splitLines(log)[0]), '\n'), bytes.Repeat([]byte("x"), maxLine+10)...), 2, "longer than"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Verify(bytes.NewReader(tt.in))
			var ve *VerifyError
			if !errors.As(err, &ve) || ve.Line != tt.wantLine || !strings.Contains(ve.Msg, tt.wantMsg) {
				t.Fatalf("Verify error = %v, want line %d and %q", err, tt.wantLine, tt.wantMsg)
			}
		})
	}
	t.Run("a trailer without its newline is still complete", func(t *testing.T) {
		res, err := Verify(bytes.NewReader(log[:len(log)-1]))
		if err != nil || !res.Complete {
			t.Fatalf("Verify = %+v, %v; want complete", res, err)
		}
	})
}

// TestVerifyAcceptsRunsOneAfterAnother checks a file holding two complete
// runs, the second chained to the first, and a killed run followed by a
// new one.
func TestVerifyAcceptsRunsOneAfterAnother(t *testing.T) {
	const run2 = "tw-1111111111111111"
	a := buildLog(t, fixedHeader(testRun), fixedRecords()[:3], true)
	b := buildLogAfter(t, a, fixedHeader(run2), fixedRecords()[3:], true)
	res, err := Verify(bytes.NewReader(append(bytes.Clone(a), b...)))
	if err != nil {
		t.Fatal(err)
	}
	if res.Runs != 2 || res.Run != run2 || res.Records != 8 || !res.Complete || len(res.Unfinished) != 0 {
		t.Fatalf("Verify = %+v, want 2 runs, 8 records, complete", res)
	}

	// A run whose header does not chain (written on its own, or with the
	// run before it removed) is named.
	alone := buildLog(t, fixedHeader(run2), fixedRecords()[3:], true)
	_, err = Verify(bytes.NewReader(append(bytes.Clone(a), alone...)))
	var ve *VerifyError
	if !errors.As(err, &ve) || ve.Line != 6 || !strings.Contains(ve.Msg, "does not chain to line 5") {
		t.Fatalf("Verify error = %v, want the unchained header on line 6", err)
	}

	// A killed run (no trailer) followed by a run chained to its last line.
	killed := bytes.TrimSuffix(a, []byte("\n"))
	killed = killed[:bytes.LastIndexByte(killed, '\n')+1] // drop a's trailer
	b = buildLogAfter(t, killed, fixedHeader(run2), fixedRecords()[3:], true)
	res, err = Verify(bytes.NewReader(append(bytes.Clone(killed), b...)))
	if err != nil {
		t.Fatalf("Verify of a killed run and the next: %v", err)
	}
	if want := []UnfinishedRun{{Run: testRun, First: 1, Last: 4}}; !reflect.DeepEqual(res.Unfinished, want) || res.Runs != 2 || !res.Complete {
		t.Fatalf("Verify = %+v, want run %s unfinished at lines 1..4", res, testRun)
	}
	if !strings.Contains(res.Unfinished[0].String(), "ended without a trailer (tunwall was killed?)") {
		t.Errorf("UnfinishedRun.String() = %q", res.Unfinished[0])
	}

	// Killed mid-write: a torn last line, ended by the next run, which
	// chains to it.
	torn := append(bytes.Clone(killed), `{"ts":"2026-03-01T10:00:0`...)
	b = buildLogAfter(t, torn, fixedHeader(run2), fixedRecords()[3:], true)
	res, err = Verify(bytes.NewReader(append(append(torn, '\n'), b...)))
	if err != nil {
		t.Fatalf("Verify of a torn run and the next: %v", err)
	}
	if want := []UnfinishedRun{{Run: testRun, First: 1, Last: 5, Torn: true}}; !reflect.DeepEqual(res.Unfinished, want) {
		t.Fatalf("Unfinished = %+v, want %+v", res.Unfinished, want)
	}
	// The same torn line not followed by a chaining header is garbage.
	_, err = Verify(bytes.NewReader(append(append(torn, '\n'), alone...)))
	if !errors.As(err, &ve) || ve.Line != 5 || !strings.Contains(ve.Msg, "not a valid JSON record") {
		t.Fatalf("Verify error = %v, want the torn line 5 named", err)
	}

}

// TestVerifyCatchesWholeRunsRemovedOrMoved builds three chained runs and
// removes or moves them whole.
func TestVerifyCatchesWholeRunsRemovedOrMoved(t *testing.T) {
	a := buildLog(t, fixedHeader("tw-aaaaaaaaaaaaaaaa"), fixedRecords()[:2], true)
	b := buildLogAfter(t, a, fixedHeader("tw-bbbbbbbbbbbbbbbb"), fixedRecords()[2:5], true)
	ab := append(bytes.Clone(a), b...)
	c := buildLogAfter(t, ab, fixedHeader("tw-cccccccccccccccc"), fixedRecords()[5:], true)
	full := append(bytes.Clone(ab), c...)
	if res, err := Verify(bytes.NewReader(full)); err != nil || res.Runs != 3 {
		t.Fatalf("Verify of 3 chained runs = %+v, %v", res, err)
	}
	na, nb := len(splitLines(a)), len(splitLines(b)) // 4 and 5 lines
	tests := []struct {
		name     string
		in       []byte
		wantLine int
		wantMsg  string
	}{
		{"the middle run removed", append(bytes.Clone(a), c...), na + 1, "does not chain to line 4"},
		{"the first run removed", append(bytes.Clone(b), c...), 1, "head of the log was cut"},
		{"the last two runs swapped", append(append(bytes.Clone(a), c...), b...), na + 1, "does not chain"},
		{"the last run's trailer cut", full[:len(full)-len(splitLines(c)[len(splitLines(c))-1])-1], na + nb + len(splitLines(c)) - 1, "ended without a trailer"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Verify(bytes.NewReader(tt.in))
			var ve *VerifyError
			if !errors.As(err, &ve) || ve.Line != tt.wantLine || !strings.Contains(ve.Msg, tt.wantMsg) {
				t.Fatalf("Verify error = %v, want line %d and %q", err, tt.wantLine, tt.wantMsg)
			}
		})
	}
}

// TestVerifyWithAnchors checks VerifyOptions.Expect against a log and a
// forgery of it rewritten whole.
func TestVerifyWithAnchors(t *testing.T) {
	log := buildLog(t, fixedHeader(testRun), fixedRecords(), true)
	lines := splitLines(log)
	last, mid := sha256Hex(lines[len(lines)-1]), sha256Hex(lines[4])
	res, err := VerifyWith(bytes.NewReader(log), VerifyOptions{Expect: []string{strings.ToUpper(last), mid}})
	if err != nil || !reflect.DeepEqual(res.Anchors, []int{10, 5}) {
		t.Fatalf("VerifyWith = %+v, %v; want anchors on lines 10 and 5", res, err)
	}
	// The forger flips a verdict and re-chains every line after it.
	recs := fixedRecords()
	recs[2].Verdict = VerdictAllow
	forged := buildLog(t, fixedHeader(testRun), recs, true)
	if _, err := Verify(bytes.NewReader(forged)); err != nil {
		t.Fatalf("the forgery is a valid chain: %v", err)
	}
	_, err = VerifyWith(bytes.NewReader(forged), VerifyOptions{Expect: []string{last}})
	var ae *AnchorError
	if !errors.As(err, &ae) || ae.Hash != last || ae.Lines != 10 {
		t.Fatalf("VerifyWith(forgery) error = %v, want an AnchorError for %s", err, last)
	}
	if _, err := VerifyWith(bytes.NewReader(log), VerifyOptions{Expect: []string{"abc"}}); err == nil || !strings.Contains(err.Error(), "64 hex") {
		t.Fatalf("VerifyWith(bad hash) error = %v", err)
	}
}

// FuzzVerify checks that Verify and Summarize never panic, that Verify's
// errors are *VerifyError, and that a log Verify accepts reads back as
// exactly the records it counted.
func FuzzVerify(f *testing.F) {
	log := buildLog(f, fixedHeader(testRun), fixedRecords(), true)
	f.Add(log)
	f.Add(log[:len(log)/2])
	f.Add(buildLog(f, fixedHeader(testRun), fixedRecords()[:2], true))
	f.Add(append(bytes.Clone(log), log...))
	lines := splitLines(log)
	f.Add(joinLines([][]byte{lines[0], lines[2], lines[1], lines[3]}))
	f.Add([]byte("{}\n"))
	f.Add([]byte(`{"kind":"trailer","count":-1}` + "\n"))
	// A run killed mid-write, a run chained to it, starts and a folded record.
	recs := fixedRecords()
	recs[1].Kind = KindStart
	recs[2].Count, recs[2].Until = 3, recs[2].TS.Add(time.Second)
	killed := buildLog(f, fixedHeader(testRun), recs[:4], false)
	killed = append(killed[:len(killed)-20], '\n')
	f.Add(append(bytes.Clone(killed), buildLogAfter(f, killed, fixedHeader("tw-1111111111111111"), recs[4:], true)...))
	f.Fuzz(func(t *testing.T, in []byte) {
		res, verr := Verify(bytes.NewReader(in))
		var ve *VerifyError
		if verr != nil && (!errors.As(verr, &ve) || ve.Line < 1) {
			t.Fatalf("Verify error %v is not a *VerifyError naming a line", verr)
		}
		var each []Record
		eachRes, eachErr := VerifyEach(bytes.NewReader(in), VerifyOptions{}, nil, func(_ int, r Record) { each = append(each, r) })
		if !reflect.DeepEqual(eachRes, res) || fmt.Sprint(eachErr) != fmt.Sprint(verr) {
			t.Fatalf("VerifyEach = %+v, %v; Verify = %+v, %v", eachRes, eachErr, res, verr)
		}
		n, bad := 0, 0
		for r, err := range Records(bytes.NewReader(in)) {
			if err != nil {
				if !errors.As(err, &ve) {
					t.Fatalf("Records error %v is not a *VerifyError", err)
				}
				bad++
				continue
			}
			if n >= len(each) || !reflect.DeepEqual(each[n], r) {
				t.Fatalf("VerifyEach's record %d differs from Records'", n)
			}
			n++
		}
		if n != len(each) {
			t.Fatalf("VerifyEach passed %d records, Records read %d", len(each), n)
		}
		torn := 0 // lines Verify excused: cut short by a kill, ended by the next run
		for _, u := range res.Unfinished {
			if u.Torn {
				torn++
			}
		}
		if verr == nil && (bad != torn || n != res.Records || !res.Complete) {
			t.Fatalf("Records read %d records and %d bad lines, Verify counted %+v", n, bad, res)
		}
		var out bytes.Buffer
		if err := Summarize(bytes.NewReader(in), &out); err != nil {
			t.Fatalf("Summarize: %v", err)
		}
	})
}

// benchLog is a complete log of n copies of the fixed records.
func benchLog(b *testing.B, n int) []byte {
	var recs []Record
	for range n {
		recs = append(recs, fixedRecords()...)
	}
	return buildLog(b, fixedHeader(testRun), recs, true)
}

// BenchmarkVerifyEach reads the records of a log that verifies in one
// pass; BenchmarkVerifyThenRecords is the two passes it replaces.
func BenchmarkVerifyEach(b *testing.B) {
	log := benchLog(b, 2000)
	b.SetBytes(int64(len(log)))
	for b.Loop() {
		n := 0
		if _, err := VerifyEach(bytes.NewReader(log), VerifyOptions{}, nil, func(int, Record) { n++ }); err != nil || n != 2000*len(fixedRecords()) {
			b.Fatalf("VerifyEach: %v, %d records", err, n)
		}
	}
}

func BenchmarkVerifyThenRecords(b *testing.B) {
	log := benchLog(b, 2000)
	b.SetBytes(int64(len(log)))
	for b.Loop() {
		if _, err := Verify(bytes.NewReader(log)); err != nil {
			b.Fatal(err)
		}
		n := 0
		for _, err := range Records(bytes.NewReader(log)) {
			if err != nil {
				b.Fatal(err)
			}
			n++
		}
		if n != 2000*len(fixedRecords()) {
			b.Fatalf("%d records", n)
		}
	}
}
