package audit

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/tunwall/tunwall/internal/testenv"
)

func openTest(t *testing.T, o Options) *Writer {
	t.Helper()
	w, err := Open(o)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { w.Close() })
	return w
}

func readVerify(t *testing.T, path string) ([]byte, VerifyResult) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	res, err := Verify(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("Verify: %v", err)
	}
	return b, res
}

// TestRoundTrip writes from several goroutines through a tiny queue (so
// that Write blocks), then verifies and reads back every record.
func TestRoundTrip(t *testing.T) {
	const goroutines, perG = 8, 500
	path := filepath.Join(t.TempDir(), "a", "b", "audit.jsonl")
	// A denial budget for all of them: none is folded by domain either.
	w := openTest(t, Options{Path: path, Queue: 3, Header: fixedHeader(""), SyncEvery: 20 * time.Millisecond, DenyRate: goroutines * perG})
	if !strings.HasPrefix(w.Run(), "tw-") || len(w.Run()) != 19 {
		t.Fatalf("Run() = %q, want a NewRunID", w.Run())
	}
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for i := range perG {
				kind, verdict := KindFlow, VerdictAllow
				if i%5 == 0 {
					kind = KindDNS
				}
				if i%3 == 0 {
					verdict = VerdictDeny
				}
				// Each record differs (Reason), so that none is folded.
				w.Write(Record{
					Kind: kind, Proto: ProtoTCP, Verdict: verdict, PID: 1000 + g, Comm: fmt.Sprintf("worker%d", g),
					Reason: fmt.Sprintf("record %d of %d", i, g),
					Host:   fmt.Sprintf("h%d.example", i%7), Port: 443, BytesOut: int64(i), BytesIn: 1,
					Dst: netip.MustParseAddrPort("192.0.2.1:443"),
				})
			}
		})
	}
	wg.Wait()
	sum, err := w.Close()
	if err != nil {
		t.Fatalf("Close: %v", err)
	}
	if sum.Count != goroutines*perG+1 || sum.Lost != 0 {
		t.Fatalf("Summary = %+v, want Count %d, Lost 0", sum, goroutines*perG+1)
	}
	_, res := readVerify(t, path)
	if res.Records != goroutines*perG || !res.Complete || res.Last != sum.Last || res.Run != w.Run() {
		t.Fatalf("Verify = %+v, Summary = %+v", res, sum)
	}

	// Each goroutine's records appear in the order it wrote them.
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	next := map[int]int64{}
	var flows, dns int
	for r, err := range Records(f) {
		if err != nil {
			t.Fatal(err)
		}
		if r.BytesOut != next[r.PID] {
			t.Fatalf("pid %d: record with bytes_out %d, want %d", r.PID, r.BytesOut, next[r.PID])
		}
		next[r.PID]++
		if r.Run != w.Run() || r.Phase != "setup" || r.TS.IsZero() {
			t.Fatalf("record not stamped: %+v", r)
		}
		if r.Kind == KindFlow {
			flows++
		} else {
			dns++
		}
	}
	if flows+dns != goroutines*perG || dns != goroutines*perG/5 {
		t.Fatalf("read %d flows and %d dns records", flows, dns)
	}

	tot := w.Totals()
	if tot.FlowsAllowed+tot.FlowsDenied != flows || tot.DNSAllowed+tot.DNSDenied != dns || len(tot.Hosts) != 7 {
		t.Fatalf("Totals = %+v, want %d flows, %d dns, 7 hosts", tot, flows, dns)
	}
	for _, h := range tot.Hosts {
		if len(h.Comms) != goroutines {
			t.Fatalf("host %s has comms %v, want %d workers", h.Host, h.Comms, goroutines)
		}
	}

	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("log mode %v, want 0600", st.Mode().Perm())
	}
	st, err = os.Stat(filepath.Dir(path))
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o700 {
		t.Errorf("created directory mode %v, want 0700", st.Mode().Perm())
	}
}

// TestHeaderLineHoldsExactlyTheSpecKeys pins the key order of each kind.
func TestHeaderLineHoldsExactlyTheSpecKeys(t *testing.T) {
	log := buildLog(t, fixedHeader(testRun), fixedRecords()[:3], true)
	lines := splitLines(log)
	want := []string{
		`ts run phase kind version policy policy_sha256 argv config prev`,
		`ts run phase kind proto src dst host host_from port verdict rule reason pid comm exe owner bytes_out bytes_in duration_ms dial qname qtype rcode prev`,
		`ts run phase kind proto src dst host host_from port verdict rule reason pid comm exe owner bytes_out bytes_in duration_ms dial prev`,
		`ts run phase kind proto src dst host host_from port verdict rule reason pid comm exe owner bytes_out bytes_in duration_ms dial qname qtype rcode prev`,
		`ts run phase kind count last lost prev`,
	}
	for i, l := range lines {
		dec := json.NewDecoder(bytes.NewReader(l))
		var keys []string
		if _, err := dec.Token(); err != nil {
			t.Fatal(err)
		}
		for dec.More() {
			tok, err := dec.Token()
			if err != nil {
				t.Fatal(err)
			}
			keys = append(keys, tok.(string))
			var skip json.RawMessage
			if err := dec.Decode(&skip); err != nil {
				t.Fatal(err)
			}
		}
		if got := strings.Join(keys, " "); got != want[i] {
			t.Errorf("line %d keys:\n got %s\nwant %s", i+1, got, want[i])
		}
	}
	if !bytes.Contains(lines[0], []byte(`"prev":"`+strings.Repeat("0", 64)+`"`)) {
		t.Errorf("header prev is not 64 zeros: %s", lines[0])
	}
	if !bytes.Contains(lines[0], []byte(`"ts":"2026-03-01T10:00:00.000000000Z"`)) {
		t.Errorf("header ts is not RFC 3339 with nanoseconds in UTC: %s", lines[0])
	}
}

// TestCloseIsIdempotentAndLateWritesAreLost covers the end of a Writer.
func TestCloseIsIdempotentAndLateWritesAreLost(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	w := openTest(t, Options{Path: path, Header: fixedHeader(testRun)})
	w.Write(fixedRecords()[0])
	w.Write(Record{Kind: "bogus"}) // not flow or dns: lost, and said so in the trailer
	if err := w.Err(); err != nil {
		t.Fatalf("Err while healthy = %v", err)
	}
	s1, err := w.Close()
	if err != nil {
		t.Fatal(err)
	}
	if s1.Count != 2 || s1.Lost != 1 {
		t.Fatalf("first Close = %+v, want Count 2, Lost 1", s1)
	}
	w.Write(fixedRecords()[1])
	w.Write(fixedRecords()[2])
	s2, err := w.Close()
	if err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if s2.Count != s1.Count || s2.Last != s1.Last || s2.Lost != 3 {
		t.Fatalf("second Close = %+v, want %+v with Lost 3", s2, s1)
	}
	if !errors.Is(w.Err(), ErrClosed) {
		t.Fatalf("Err after Close = %v, want ErrClosed", w.Err())
	}
	if got := w.Totals().Lost; got != 3 {
		t.Fatalf("Totals().Lost = %d, want 3", got)
	}
	_, res := readVerify(t, path)
	if res.Records != 1 || res.Lost != 1 || res.Last != s1.Last {
		t.Fatalf("Verify = %+v, want 1 record and lost 1 ending at %s", res, s1.Last)
	}
}

// TestOpenAppendsARunAfterAnother checks that a second Open of the same
// path adds a run, even after a torn last line, and that a second Writer
// on a file in use is refused.
func TestOpenAppendsARunAfterAnother(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	w := openTest(t, Options{Path: path, Header: fixedHeader("")})
	if _, err := Open(Options{Path: path}); err == nil || !strings.Contains(err.Error(), "in use") {
		t.Fatalf("second Open of a file in use: err = %v, want in use", err)
	}
	w.Write(fixedRecords()[0])
	if _, err := w.Close(); err != nil {
		t.Fatal(err)
	}
	w2 := openTest(t, Options{Path: path, Header: fixedHeader("")})
	w2.Write(fixedRecords()[1])
	if _, err := w2.Close(); err != nil {
		t.Fatal(err)
	}
	_, res := readVerify(t, path)
	if res.Runs != 2 || res.Run != w2.Run() || res.Records != 2 || !res.Complete {
		t.Fatalf("Verify = %+v, want two complete runs", res)
	}

	// A torn line, as a crash mid-write leaves it, is ended before the header.
	torn := filepath.Join(t.TempDir(), "torn.jsonl")
	if err := os.WriteFile(torn, []byte(`{"ts":"2026`), 0o600); err != nil {
		t.Fatal(err)
	}
	w3 := openTest(t, Options{Path: torn, Header: fixedHeader("")})
	if _, err := w3.Close(); err != nil {
		t.Fatal(err)
	}
	b, res := readVerify(t, torn)
	lines := splitLines(b)
	if len(lines) != 3 || string(lines[0]) != `{"ts":"2026` {
		t.Fatalf("torn file holds %q", b)
	}
	if want := []UnfinishedRun{{First: 1, Last: 1, Torn: true}}; res.Runs != 1 || !res.Complete || !reflect.DeepEqual(res.Unfinished, want) {
		t.Fatalf("Verify = %+v, want one run after the torn line 1", res)
	}

	// Each header chains to the line before it: the previous run's trailer,
	// or the torn line.
	for _, p := range []string{path, torn} {
		ls := splitLines(mustRead(t, p))
		for i, l := range ls {
			if i > 0 && bytes.Contains(l, []byte(`"kind":"header"`)) && !bytes.Contains(l, []byte(`"prev":"`+sha256Hex(ls[i-1])+`"`)) {
				t.Errorf("%s: header on line %d does not chain to line %d", p, i+1, i)
			}
		}
	}
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestOpenRejectsBadOptions checks validation.
func TestOpenRejectsBadOptions(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name string
		o    Options
	}{
		{"an empty path is refused", Options{}},
		{"a negative queue is refused", Options{Path: filepath.Join(dir, "q"), Queue: -1}},
		{"a negative sync period is refused", Options{Path: filepath.Join(dir, "s"), SyncEvery: -time.Second}},
		{"a path under a regular file is refused", Options{Path: filepath.Join(dir, "q2", "x")}},
	}
	if err := os.WriteFile(filepath.Join(dir, "q2"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if w, err := Open(tt.o); err == nil {
				w.Close()
				t.Fatal("Open succeeded")
			}
		})
	}
}

// TestOpenFailsWhenTheHeaderCannotBeWritten uses /dev/full, where every
// write fails with ENOSPC.
func TestOpenFailsWhenTheHeaderCannotBeWritten(t *testing.T) {
	if _, err := os.Stat("/dev/full"); err != nil {
		testenv.Skip(t, "no /dev/full: %v", err)
	}
	w, err := Open(Options{Path: "/dev/full", Header: fixedHeader("")})
	if err == nil {
		w.Close()
		t.Fatal("Open on /dev/full succeeded")
	}
	if !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("Open error = %v, want ENOSPC", err)
	}
}

// fsizeChildEnv makes the test binary run failingChild instead of tests.
const fsizeChildEnv = "AUDIT_TEST_FSIZE_CHILD"

type childReport struct {
	OnErrorCalls int
	ErrIsEFBIG   bool
	CloseErr     string
	Summary      Summary
	Written      int
}

// TestWriteFailureMidRun runs a child with RLIMIT_FSIZE so small that the
// file fills up: a real write error, either after a few records or exactly
// at the trailer.
func TestWriteFailureMidRun(t *testing.T) {
	if mode := os.Getenv(fsizeChildEnv); mode != "" {
		failingChild(t, mode)
		return
	}
	tests := []struct {
		name        string
		mode        string
		wantLost    bool // some records are lost, not only the trailer
		wantVerifyA string
	}{
		{"a full disk mid-run stops the writer and counts the rest as lost", "mid", true, ""},
		// RLIMIT_FSIZE is no full disk: the room kept for the trailer
		// does not help, but the torn trailer is cut off.
		{"a full disk at the trailer loses no record", "trailer", false, "ended without a trailer"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "audit.jsonl")
			cmd := exec.Command(os.Args[0], "-test.run=^TestWriteFailureMidRun$")
			cmd.Env = append(os.Environ(), fsizeChildEnv+"="+tt.mode, "AUDIT_TEST_PATH="+path)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("child: %v\n%s\n%s", err, out, stderr.Bytes())
			}
			var rep childReport
			i := bytes.IndexByte(out, '{')
			if i < 0 {
				t.Fatalf("child printed no report: %s", out)
			}
			if err := json.NewDecoder(bytes.NewReader(out[i:])).Decode(&rep); err != nil {
				t.Fatalf("child report %q: %v", out, err)
			}
			t.Logf("child: %+v", rep)
			if rep.OnErrorCalls != 1 || !rep.ErrIsEFBIG || !strings.Contains(rep.CloseErr, "file too large") {
				t.Fatalf("child report = %+v, want one OnError call and EFBIG from Err and Close", rep)
			}
			if rep.Summary.Count+rep.Summary.Lost != rep.Written+1 {
				t.Fatalf("Summary %+v does not account for %d records and the header", rep.Summary, rep.Written)
			}
			if (rep.Summary.Lost > 0) != tt.wantLost {
				t.Fatalf("Summary.Lost = %d, want lost records: %v", rep.Summary.Lost, tt.wantLost)
			}
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if len(b) > 0 && b[len(b)-1] != '\n' {
				t.Fatalf("the file ends in a torn line: %q", b[max(0, len(b)-80):])
			}
			if got := bytes.Count(b, []byte("\n")); got != rep.Summary.Count {
				t.Fatalf("file holds %d whole lines, Summary.Count = %d", got, rep.Summary.Count)
			}
			res, err := Verify(bytes.NewReader(b))
			var ve *VerifyError
			if !errors.As(err, &ve) || (ve.Line != rep.Summary.Count && ve.Line != rep.Summary.Count+1) || !strings.Contains(ve.Msg, tt.wantVerifyA) {
				t.Fatalf("Verify of the cut log = %v, want an error at line %d or %d", err, rep.Summary.Count, rep.Summary.Count+1)
			}
			if res.Last != rep.Summary.Last {
				t.Fatalf("Verify's last good line %s, Summary.Last %s", res.Last, rep.Summary.Last)
			}
		})
	}
}

// failingChild is TestWriteFailureMidRun's child process.
func failingChild(t *testing.T, mode string) {
	limit := uint64(4096)
	if mode == "trailer" {
		// Room for the header and every record, not for the trailer.
		limit = uint64(len(buildLog(t, fixedHeader(testRun), fixedRecords(), false)) + 10)
	}
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_FSIZE, &lim); err != nil {
		t.Fatal(err)
	}
	orig := lim
	lim.Cur = limit
	if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &lim); err != nil {
		t.Fatal(err)
	}
	// The test binary writes its coverage profile (go test -cover) after
	// this returns: give it the room back.
	defer syscall.Setrlimit(syscall.RLIMIT_FSIZE, &orig)
	var rep childReport
	var calls atomic.Int32
	w, err := Open(Options{Path: os.Getenv("AUDIT_TEST_PATH"), Header: fixedHeader(testRun), OnError: func(error) { calls.Add(1) }})
	if err != nil {
		t.Fatal(err)
	}
	if mode == "trailer" {
		for _, r := range fixedRecords() {
			w.Write(r)
			rep.Written++
		}
	} else {
		for i := 0; i < 200 && w.Err() == nil; i++ {
			w.Write(fixedRecords()[i%8])
			rep.Written++
		}
		// A few more after the failure: they are lost, and must not block.
		for range 10 {
			w.Write(fixedRecords()[0])
			rep.Written++
		}
	}
	s, err := w.Close()
	rep.Summary = s
	rep.ErrIsEFBIG = errors.Is(w.Err(), syscall.EFBIG)
	if err != nil {
		rep.CloseErr = err.Error()
	}
	rep.OnErrorCalls = int(calls.Load())
	json.NewEncoder(os.Stdout).Encode(rep)
}

// BenchmarkWrite measures Write throughput from parallel goroutines to a
// file in the test's temporary directory.
func BenchmarkWrite(b *testing.B) {
	path := filepath.Join(b.TempDir(), "audit.jsonl")
	w, err := Open(Options{Path: path, Header: fixedHeader("")})
	if err != nil {
		b.Fatal(err)
	}
	rec := fixedRecords()[1]
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			w.Write(rec)
		}
	})
	s, err := w.Close()
	b.StopTimer()
	if err != nil {
		b.Fatal(err)
	}
	if s.Lost != 0 {
		b.Fatalf("lost %d records", s.Lost)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "records/s")
}

// TestAFullDiskKeepsWholeLinesAndTheTrailer fills a real 64 KiB tmpfs (root
// only: it mounts one) with records: the file holds whole lines only, ends
// with a trailer counting what was lost, and verifies; space reserved
// beyond the end is given back.
func TestAFullDiskKeepsWholeLinesAndTheTrailer(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("needs root to mount a tmpfs, and CI=true: refusing to skip")
		}
		testenv.Skip(t, "needs root to mount a tmpfs")
	}
	for _, pad := range []int{0, 1, 200, 3000} { // record sizes, so the disk fills at different places in a line
		t.Run(fmt.Sprintf("pad %d", pad), func(t *testing.T) {
			dir := t.TempDir()
			if err := syscall.Mount("audit-test", dir, "tmpfs", 0, "size=64k"); err != nil {
				t.Fatalf("mount tmpfs: %v", err)
			}
			defer syscall.Unmount(dir, syscall.MNT_DETACH)
			path := filepath.Join(dir, "audit.jsonl")
			var onErr atomic.Int32
			w, err := Open(Options{Path: path, Header: fixedHeader(""), OnError: func(error) { onErr.Add(1) }})
			if err != nil {
				t.Fatal(err)
			}
			sent := 0
			for i := 0; i < 2000; i++ {
				r := fixedRecords()[1]
				r.Reason = strings.Repeat("x", pad+i%97)
				if err := <-w.Commit(r); err != nil {
					if !errors.Is(err, syscall.ENOSPC) {
						t.Fatalf("Commit error %v, want ENOSPC", err)
					}
				}
				sent++
			}
			s, err := w.Close()
			if !errors.Is(err, syscall.ENOSPC) || onErr.Load() != 1 {
				t.Fatalf("Close = %v (OnError %d calls), want ENOSPC once", err, onErr.Load())
			}
			if s.Lost == 0 || s.Count-1+s.Lost != sent {
				t.Fatalf("Summary %+v does not account for %d records", s, sent)
			}
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if len(b) == 0 || b[len(b)-1] != '\n' {
				t.Fatalf("the log ends in a torn line: %q", b[max(0, len(b)-80):])
			}
			res, err := Verify(bytes.NewReader(b))
			if err != nil {
				t.Fatalf("Verify: %v", err)
			}
			if !res.Complete || res.Lost != s.Lost || res.Last != s.Last || res.Records != s.Count-1 {
				t.Fatalf("Verify = %+v, Summary %+v", res, s)
			}
			var st syscall.Stat_t
			if err := syscall.Stat(path, &st); err != nil {
				t.Fatal(err)
			}
			if alloc := st.Blocks * 512; alloc > st.Size+4096 {
				t.Fatalf("%d bytes allocated for a file of %d: the reserve was not given back", alloc, st.Size)
			}
			t.Logf("%d bytes, %d records in, %d lost", len(b), res.Records, s.Lost)
		})
	}
}
