package audit

import (
	"bytes"
	"errors"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/tunwall/tunwall/internal/testenv"
)

var update = flag.Bool("update", false, "rewrite testdata/fixed.jsonl and testdata/summary.golden")

// checkGolden compares got with testdata/name, or rewrites it with -update.
func checkGolden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs (run go test -update if the change is intended)\n got:\n%s\nwant:\n%s", path, got, want)
	}
}

// TestFixedLogFormatIsStable pins the bytes of the log format: a change to
// the encoder that would break verifying old logs shows up here.
func TestFixedLogFormatIsStable(t *testing.T) {
	checkGolden(t, "fixed.jsonl", buildLog(t, fixedHeader(testRun), fixedRecords(), true))
}

// TestSummarizeGolden summarises the committed fixed log.
func TestSummarizeGolden(t *testing.T) {
	log, err := os.ReadFile(filepath.Join("testdata", "fixed.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := Summarize(bytes.NewReader(log), &out); err != nil {
		t.Fatal(err)
	}
	checkGolden(t, "summary.golden", out.Bytes())
}

// TestSummarizeReportsDamage checks that a summary of a damaged or running
// log says so instead of looking clean.
func TestSummarizeReportsDamage(t *testing.T) {
	lines := splitLines(buildLog(t, fixedHeader(testRun), fixedRecords(), true))
	tests := []struct {
		name string
		in   [][]byte
		want []string
	}{
		{"a running log has no trailer", lines[:5], []string{"trailer    missing", "integrity  INCOMPLETE: line 5: run " + testRun + " ended without a trailer at line 5"}},
		{"a log without its head has no header", lines[1:], []string{"header     missing", "integrity  FAILED: line 1"}},
		{"an edited line is named", append(slices.Clone(lines[:3]), append([][]byte{bytes.Replace(lines[3], []byte("deny"), []byte("allow"), 1)}, lines[4:]...)...),
			[]string{"integrity  FAILED: line 4: line 4 was changed"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			if err := Summarize(bytes.NewReader(joinLines(tt.in)), &out); err != nil {
				t.Fatal(err)
			}
			for _, w := range tt.want {
				if !strings.Contains(out.String(), w) {
					t.Errorf("summary lacks %q:\n%s", w, out.String())
				}
			}
		})
	}
}

// TestSummarizeNeutralisesControlCharacters checks that a process name
// with an escape sequence cannot reach the terminal.
func TestSummarizeNeutralisesControlCharacters(t *testing.T) {
	r := fixedRecords()[3]
	r.Comm = "evil\x1b]0;pwned\x07\tname\n"
	var out bytes.Buffer
	if err := Summarize(bytes.NewReader(buildLog(t, fixedHeader(testRun), []Record{r}, true)), &out); err != nil {
		t.Fatal(err)
	}
	if strings.ContainsAny(out.String(), "\x1b\x07") || !strings.Contains(out.String(), "evil?]0;pwned??name?") {
		t.Fatalf("control characters reached the summary:\n%q", out.String())
	}
}

// TestSummarizeReturnsWriteErrors checks that a failing output is reported.
func TestSummarizeReturnsWriteErrors(t *testing.T) {
	err := Summarize(bytes.NewReader(buildLog(t, fixedHeader(testRun), fixedRecords(), true)), failWriter{})
	if !errors.Is(err, errFail) {
		t.Fatalf("Summarize error = %v, want errFail", err)
	}
}

var errFail = errors.New("output gone")

type failWriter struct{}

func (failWriter) Write([]byte) (int, error) { return 0, errFail }

// TestTallySortsDenialsFirst checks the host order and counts.
func TestTallySortsDenialsFirst(t *testing.T) {
	tot := Tally(fixedRecords())
	var hosts []string
	for _, h := range tot.Hosts {
		hosts = append(hosts, h.Host+":"+h.Verdicts())
	}
	want := []string{"files.pythonhosted.org:allow+deny", "203.0.113.9:deny", "evil.example:deny", "pypi.org:allow"}
	if !slices.Equal(hosts, want) {
		t.Fatalf("hosts = %v, want %v", hosts, want)
	}
	if tot.FlowsAllowed != 4 || tot.FlowsDenied != 2 || tot.DNSAllowed != 1 || tot.DNSDenied != 1 {
		t.Fatalf("totals = %+v", tot)
	}
	if tot.BytesOut != 812+100+900+700 || tot.BytesIn != 40960+2000+(1<<20)+5000 {
		t.Fatalf("bytes = %d out, %d in", tot.BytesOut, tot.BytesIn)
	}
	f := tot.Hosts[0]
	if f.DenyRule != "default-deny" || f.DenyReason != "port 5353/udp not allowed" || !slices.Equal(f.Comms, []string{"pip", "pip3"}) {
		t.Fatalf("files.pythonhosted.org = %+v", f)
	}
	if p := tot.Hosts[3]; !slices.Equal(p.Comms, []string{"pip", "(gone)"}) || p.DNSAllowed != 1 || p.FlowsAllowed != 2 {
		t.Fatalf("pypi.org = %+v", p)
	}
}

// TestWriterCapsHosts checks that endless distinct names cannot grow a
// Writer's totals without bound.
func TestWriterCapsHosts(t *testing.T) {
	tl := tally{maxHosts: 3}
	for _, h := range []string{"a.example", "b.example", "c.example", "d.example", "a.example", "e.example."} {
		tl.add(&Record{Kind: KindDNS, Verdict: VerdictDeny, Qname: h})
	}
	tot := tl.totals()
	if len(tot.Hosts) != 3 || tot.OtherHosts != 2 || tot.DNSDenied != 6 {
		t.Fatalf("totals = %+v, want 3 hosts, 2 others, 6 denied", tot)
	}
}

// TestRecordsReadsBackAndReportsBadLines checks the reader.
func TestRecordsReadsBackAndReportsBadLines(t *testing.T) {
	lines := splitLines(buildLog(t, fixedHeader(testRun), fixedRecords(), true))
	lines = slices.Insert(lines, 3, []byte("not json"))
	var got []Record
	var errs []error
	for r, err := range Records(bytes.NewReader(joinLines(lines))) {
		if err != nil {
			errs = append(errs, err)
			continue
		}
		got = append(got, r)
	}
	var ve *VerifyError
	if len(errs) != 1 || !errors.As(errs[0], &ve) || ve.Line != 4 {
		t.Fatalf("errors = %v, want one *VerifyError on line 4", errs)
	}
	want := fixedRecords()
	if len(got) != len(want) {
		t.Fatalf("read %d records, want %d", len(got), len(want))
	}
	for i := range want {
		w, g := want[i], got[i]
		w.Run, w.Phase, g.Prev = testRun, "setup", ""
		if !g.TS.Equal(w.TS) {
			t.Fatalf("record %d ts %v, want %v", i, g.TS, w.TS)
		}
		g.TS = w.TS
		if g != w {
			t.Fatalf("record %d:\n got %+v\nwant %+v", i, g, w)
		}
	}
	// Breaking out early stops the iteration.
	n := 0
	for range Records(bytes.NewReader(joinLines(lines))) {
		n++
		break
	}
	if n != 1 {
		t.Fatalf("loop ran %d times after break", n)
	}
}

// TestPackageUsesOnlyTheStandardLibrary keeps the package a leaf.
func TestPackageUsesOnlyTheStandardLibrary(t *testing.T) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		testenv.Skip(t, "no go tool: %v", err)
	}
	out, err := exec.Command(gobin, "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, p := range strings.Fields(string(out)) {
		if p != "github.com/tunwall/tunwall/internal/audit" {
			t.Errorf("audit depends on %s; it must use the standard library only", p)
		}
	}
}
