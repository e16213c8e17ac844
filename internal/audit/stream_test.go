package audit

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// exclusiveWriter is an output that is not safe for concurrent use: it
// records an overlap of two Write calls (and the race detector sees the
// unguarded buffer), and yields inside each Write to widen the window.
type exclusiveWriter struct {
	in       atomic.Int32
	overlaps atomic.Int32
	writes   atomic.Int32
	tooLarge atomic.Int32 // writes over streamChunk bytes of more than one line
	buf      bytes.Buffer
}

func (e *exclusiveWriter) Write(b []byte) (int, error) {
	if e.in.Add(1) > 1 {
		e.overlaps.Add(1)
	}
	defer e.in.Add(-1)
	e.writes.Add(1)
	if len(b) > streamChunk && bytes.Count(b, []byte{'\n'}) > 1 {
		e.tooLarge.Add(1)
	}
	half := len(b) / 2
	e.buf.Write(b[:half])
	time.Sleep(10 * time.Microsecond)
	e.buf.Write(b[half:])
	return len(b), nil
}

// podLabels returns the labels a node agent gives a pod's records.
func podLabels(t testing.TB, ns, pod string) Labels {
	t.Helper()
	l, err := NewLabels(map[string]string{"k8s_namespace": ns, "k8s_pod": pod, "container_id": "c-" + pod, "policy": ns})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// streamRecord is the i-th record a test run on a stream writes.
func streamRecord(pod string, i int) Record {
	return Record{Kind: KindFlow, Proto: ProtoTCP, Src: netip.MustParseAddrPort("198.51.100.2:40000"),
		Dst: netip.MustParseAddrPort("198.51.100.5:443"), Host: fmt.Sprintf("%s-%d.example", pod, i), HostFrom: HostFromDNS, Port: 443,
		Verdict: VerdictAllow, Rule: "exec: host x", Reason: "allowed name", BytesOut: int64(i), Dial: netip.MustParseAddrPort("192.0.2.10:443")}
}

func TestRunsSharingAStreamWriteWholeLinesThatNeverMixAndEachChainVerifies(t *testing.T) {
	out := &exclusiveWriter{}
	s := NewStream(out)
	const runs, records = 8, 300
	var wg sync.WaitGroup
	ids := make([]string, runs)
	sums := make([]Summary, runs)
	for i := range runs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pod := fmt.Sprintf("pod%d", i)
			w, err := Open(Options{Stream: s, Header: Header{Phase: "exec", Labels: podLabels(t, "team-a", pod)}, Queue: 16})
			if err != nil {
				t.Error(err)
				return
			}
			ids[i] = w.Run()
			for j := range records {
				if j%50 == 0 {
					// Some lines wait for their write, as start records do.
					if err := <-w.Commit(streamRecord(pod, j)); err != nil {
						t.Error(err)
					}
					continue
				}
				w.Write(streamRecord(pod, j))
			}
			sum, err := w.Close()
			if err != nil {
				t.Error(err)
			}
			sums[i] = sum
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	if n := out.overlaps.Load(); n != 0 {
		t.Fatalf("%d writes to the shared output overlapped", n)
	}
	if n := out.tooLarge.Load(); n != 0 {
		t.Errorf("%d writes held the shared output for more than %d bytes", n, streamChunk)
	}
	if s.Open() != 0 {
		t.Errorf("stream counts %d runs open after every Close", s.Open())
	}
	// Demultiplex by run: each run's lines, in order, are a log of their own.
	perRun := map[string]*bytes.Buffer{}
	seqs := map[int]bool{}
	for _, line := range splitLines(out.buf.Bytes()) {
		var l anyLine
		if err := decodeLine(line, &l); err != nil {
			t.Fatalf("a line of the shared output does not parse (%v): %.200s", err, line)
		}
		if l.Kind == KindHeader {
			if l.Stream != s.ID() || l.Seq < 1 || l.Seq > runs || seqs[l.Seq] {
				t.Errorf("header of run %s has stream %q seq %d; want stream %s and a seq in 1..%d once", l.Run, l.Stream, l.Seq, s.ID(), runs)
			}
			seqs[l.Seq] = true
		}
		b := perRun[l.Run]
		if b == nil {
			b = &bytes.Buffer{}
			perRun[l.Run] = b
		}
		b.Write(line)
		b.WriteByte('\n')
	}
	if len(perRun) != runs {
		t.Fatalf("the output holds %d runs, want %d", len(perRun), runs)
	}
	for i, id := range ids {
		res, err := Verify(bytes.NewReader(perRun[id].Bytes()))
		if err != nil {
			t.Errorf("run %s's lines do not verify on their own: %v", id, err)
			continue
		}
		if res.Records != records || !res.Complete || res.Last != sums[i].Last {
			t.Errorf("run %s: %d records, complete %v, last %s; want %d, true, %s", id, res.Records, res.Complete, res.Last, records, sums[i].Last)
		}
	}
	// And the whole capture, as VerifyStream reads it.
	res, err := VerifyStream(bytes.NewReader(out.buf.Bytes()))
	if err != nil || len(res.Runs) != runs || len(res.Streams) != 1 {
		t.Errorf("VerifyStream of the shared output: %d runs, %d streams, %v; want %d runs of one stream, no error", len(res.Runs), len(res.Streams), err, runs)
	}
	if w := out.writes.Load(); w >= runs*(records+2) {
		t.Logf("note: %d writes for %d lines: no batching happened", w, runs*(records+2))
	}
}

// failingWriter accepts limit bytes, then writes part of a call and fails.
type failingWriter struct {
	mu    sync.Mutex
	limit int
	buf   bytes.Buffer
}

func (f *failingWriter) Write(b []byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.buf.Len()+len(b) <= f.limit {
		return f.buf.Write(b)
	}
	n := max(f.limit-f.buf.Len(), 0)
	f.buf.Write(b[:n])
	f.limit = 0
	return n, errors.New("pipe reader went away")
}

func TestATornStreamFailsEveryRunOnItAndNothingMoreIsWritten(t *testing.T) {
	out := &failingWriter{limit: 1 << 30}
	s := NewStream(out)
	a, err := Open(Options{Stream: s, Header: Header{Phase: "exec", Labels: podLabels(t, "ns", "a")}})
	if err != nil {
		t.Fatal(err)
	}
	b, err := Open(Options{Stream: s, Header: Header{Phase: "exec", Labels: podLabels(t, "ns", "b")}})
	if err != nil {
		t.Fatal(err)
	}
	out.mu.Lock()
	out.limit = out.buf.Len() + 30 // the next write is cut inside its line
	out.mu.Unlock()
	if err := <-a.Commit(streamRecord("a", 1)); err == nil {
		t.Fatal("a record whose write was cut short was reported written")
	}
	// b wrote nothing since, yet must deny new work at once.
	if err := b.Admit(); !errors.Is(err, ErrStreamFailed) {
		t.Errorf("run b's Admit = %v after the shared output tore; want ErrStreamFailed", err)
	}
	if err := <-b.Commit(streamRecord("b", 1)); err == nil {
		t.Error("run b's record was reported written to a failed stream")
	}
	out.mu.Lock()
	size := out.buf.Len()
	out.mu.Unlock()
	a.Close()
	b.Close()
	if _, err := Open(Options{Stream: s, Header: Header{Phase: "exec"}}); err == nil {
		t.Error("a new run opened on a failed stream")
	}
	out.mu.Lock()
	defer out.mu.Unlock()
	if out.buf.Len() != size {
		t.Errorf("%d bytes were written to the stream after it tore", out.buf.Len()-size)
	}
}

func TestOpenRefusesAPathAndAStreamTogether(t *testing.T) {
	_, err := Open(Options{Path: t.TempDir() + "/x.jsonl", Stream: NewStream(io.Discard)})
	if err == nil || !strings.Contains(err.Error(), "not both") {
		t.Fatalf("Open with a path and a stream: %v", err)
	}
}

// twoStreams returns a capture of two node agent starts on the same output:
// the first killed with its run open, the second closing its runs.
func twoStreams(t *testing.T) []byte {
	t.Helper()
	var out bytes.Buffer
	s1 := NewStream(&out)
	killed, err := Open(Options{Stream: s1, Header: Header{Phase: "exec", Labels: podLabels(t, "ns", "old")}})
	if err != nil {
		t.Fatal(err)
	}
	if err := <-killed.Commit(streamRecord("old", 1)); err != nil {
		t.Fatal(err)
	}
	// The agent is killed: no trailer ever comes. (Close would write one:
	// take the lines as they are now.)
	capture := bytes.Clone(out.Bytes())
	killed.Close()
	out.Reset()
	out.Write(capture)
	s2 := NewStream(&out)
	for _, pod := range []string{"a", "b"} {
		w, err := Open(Options{Stream: s2, Header: Header{Phase: "exec", Labels: podLabels(t, "ns", pod)}})
		if err != nil {
			t.Fatal(err)
		}
		w.Write(streamRecord(pod, 1))
		if _, err := w.Close(); err != nil {
			t.Fatal(err)
		}
	}
	return out.Bytes()
}

func TestARunLeftOpenByAKilledAgentIsReportedIncompleteAndTheOthersOk(t *testing.T) {
	res, err := VerifyStream(bytes.NewReader(twoStreams(t)))
	var ve *VerifyError
	if !errors.As(err, &ve) || !ve.Incomplete {
		t.Fatalf("VerifyStream = %v; want an incomplete *VerifyError", err)
	}
	if len(res.Streams) != 2 || len(res.Runs) != 3 {
		t.Fatalf("%d streams, %d runs; want 2 and 3", len(res.Streams), len(res.Runs))
	}
	if r := res.Runs[0]; r.Err == nil || !r.Err.Incomplete || r.Records != 1 {
		t.Errorf("the killed agent's run: %+v; want incomplete with 1 record", r)
	}
	for _, r := range res.Runs[1:] {
		if r.Err != nil || !r.Complete || r.Records != 1 {
			t.Errorf("run %s: %+v; want intact and complete", r.Run, r)
		}
	}
}

func TestACaptureAndAFileAreEachRefusedWhenCheckedAsTheOther(t *testing.T) {
	capture := twoStreams(t)
	if ok, err := IsStream(bytes.NewReader(capture)); !ok || err != nil {
		t.Errorf("IsStream(capture) = %v, %v", ok, err)
	}
	if _, err := Verify(bytes.NewReader(capture)); err == nil {
		t.Error("a capture of interleaved runs passed Verify as one file's chain")
	}
	file := buildLog(t, fixedHeader(testRun), fixedRecords(), true)
	if ok, err := IsStream(bytes.NewReader(file)); ok || err != nil {
		t.Errorf("IsStream(file) = %v, %v", ok, err)
	}
	if _, err := Verify(bytes.NewReader(file)); err != nil {
		t.Fatal(err)
	}
	res, err := VerifyStream(bytes.NewReader(file))
	if err == nil || len(res.Problems) == 0 || !strings.Contains(res.Problems[0].Msg, "no stream id") {
		t.Errorf("a file's run checked as a capture: %v, problems %v", err, res.Problems)
	}
}

func TestHeadersOfAStreamOutOfOrderFail(t *testing.T) {
	var out bytes.Buffer
	s := NewStream(&out)
	for _, pod := range []string{"a", "b"} {
		w, err := Open(Options{Stream: s, Header: Header{Phase: "exec", Labels: podLabels(t, "ns", pod)}})
		if err != nil {
			t.Fatal(err)
		}
		w.Close()
	}
	lines := splitLines(out.Bytes())
	if len(lines) != 4 {
		t.Fatalf("%d lines", len(lines))
	}
	// b's header and trailer before a's: each chain intact, the order not.
	swapped := bytes.Join([][]byte{lines[2], lines[3], lines[0], lines[1], nil}, []byte("\n"))
	res, err := VerifyStream(bytes.NewReader(swapped))
	if err == nil || len(res.Problems) != 2 {
		t.Fatalf("headers out of seq order: %v, problems %v", err, res.Problems)
	}
	if !strings.Contains(res.Problems[1].Msg, "reordered") {
		t.Errorf("problem %q does not say reordered", res.Problems[1].Msg)
	}
}

// oneRunCapture is a capture of two runs on one stream, a's lines then b's.
func oneRunCapture(t *testing.T) (lines [][]byte, a, b string) {
	t.Helper()
	var out bytes.Buffer
	s := NewStream(&out)
	var ids []string
	for _, pod := range []string{"a", "b"} {
		w, err := Open(Options{Stream: s, Header: Header{Phase: "exec", Labels: podLabels(t, "ns", pod)}})
		if err != nil {
			t.Fatal(err)
		}
		w.Write(streamRecord(pod, 1))
		w.Write(streamRecord(pod, 2))
		if _, err := w.Close(); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, w.Run())
	}
	return splitLines(out.Bytes()), ids[0], ids[1]
}

func TestALineAfterARunsTrailerOrAHeaderChainedToAnotherRunFails(t *testing.T) {
	lines, a, b := oneRunCapture(t) // a: lines 0..3, b: lines 4..7
	join := func(ls ...[]byte) []byte { return append(bytes.Join(ls, []byte("\n")), '\n') }

	// a's record replayed after a's trailer (between b's lines).
	replay := join(lines[0], lines[1], lines[2], lines[3], lines[4], lines[1], lines[5], lines[6], lines[7])
	res, err := VerifyStream(bytes.NewReader(replay))
	if err == nil || res.Runs[0].Run != a || res.Runs[0].Err == nil || !strings.Contains(res.Runs[0].Err.Msg, "after its trailer") {
		t.Errorf("a record of run %s replayed after its trailer: %v, run a: %+v", a, err, res.Runs[0].Err)
	}
	if len(res.Runs) == 2 && res.Runs[1].Err != nil {
		t.Errorf("run %s, untouched, failed: %v", b, res.Runs[1].Err)
	}

	// b's header forged to chain to a's trailer, as a file's would: a
	// stream's header chains to zeros only.
	var h map[string]any
	if err := json.Unmarshal(lines[4], &h); err != nil {
		t.Fatal(err)
	}
	h["prev"] = fmt.Sprintf("%x", sha256.Sum256(lines[3]))
	forged, _ := json.Marshal(h)
	res, err = VerifyStream(bytes.NewReader(join(lines[0], lines[1], lines[2], lines[3], forged, lines[5], lines[6], lines[7])))
	if err == nil || len(res.Runs) != 2 || res.Runs[1].Err == nil {
		t.Errorf("run %s's header chained to another run's line passed: %v", b, err)
	}

	// A line that is no record at all, among intact runs.
	res, err = VerifyStream(bytes.NewReader(join(lines[0], lines[1], []byte(`{"hello":"world"}`), lines[2], lines[3], lines[4], lines[5], lines[6], lines[7])))
	if err == nil || len(res.Problems) != 1 || res.Problems[0].Line != 3 {
		t.Errorf("a line that is no record: %v, problems %v", err, res.Problems)
	}
}

func TestABurstOfOneRunReachesTheStreamInBoundedWrites(t *testing.T) {
	out := &exclusiveWriter{}
	s := NewStream(out)
	w, err := Open(Options{Stream: s, Header: Header{Phase: "exec", Labels: podLabels(t, "ns", "burst")}, Queue: 8192})
	if err != nil {
		t.Fatal(err)
	}
	// 5000 lines of ~700 bytes queued at once: several flushSize buffers.
	for i := range 5000 {
		w.Write(streamRecord(strings.Repeat("p", 300), i))
	}
	if _, err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if n := out.tooLarge.Load(); n != 0 {
		t.Errorf("%d writes of more than %d bytes", n, streamChunk)
	}
	if out.buf.Len() < 2*streamChunk {
		t.Fatalf("only %d bytes written: the test did not burst", out.buf.Len())
	}
	if res, err := VerifyStream(bytes.NewReader(out.buf.Bytes())); err != nil || res.Runs[0].Records != 5000 {
		t.Errorf("VerifyStream: %v, %+v", err, res.Runs)
	}
}
