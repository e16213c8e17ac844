package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/tunwall/tunwall/internal/audit"
)

// capturePod is one pod whose run a capture holds.
type capturePod struct {
	ns, pod string
	run     string
	records int
}

// streamCapture writes the runs of pods to one audit.Stream, their lines
// interleaved round-robin (as a node agent serving them at once writes its
// stdout), and returns the capture's lines and the pods with their run ids.
func streamCapture(t *testing.T, records ...int) ([][]byte, []capturePod) {
	t.Helper()
	var out bytes.Buffer
	s := audit.NewStream(&out)
	pods := make([]capturePod, len(records))
	ws := make([]*audit.Writer, len(records))
	for i, n := range records {
		pods[i] = capturePod{ns: fmt.Sprintf("team-%c", 'a'+i), pod: fmt.Sprintf("agent-%d", i), records: n}
		labels, err := audit.NewLabels(map[string]string{
			"k8s_namespace": pods[i].ns, "k8s_pod": pods[i].pod, "container_id": fmt.Sprintf("c0ffee%02d", i), "policy": pods[i].ns,
		})
		if err != nil {
			t.Fatal(err)
		}
		w, err := audit.Open(audit.Options{Stream: s, Header: audit.Header{Phase: "exec", Version: "test", Labels: labels,
			Config: map[string]string{"node": "node-1"}}})
		if err != nil {
			t.Fatal(err)
		}
		ws[i], pods[i].run = w, w.Run()
	}
	for j := 0; ; j++ {
		wrote := false
		for i, w := range ws {
			if j >= records[i] {
				continue
			}
			wrote = true
			verdict := audit.VerdictAllow
			if j%3 == 2 {
				verdict = audit.VerdictDeny
			}
			// Commit: the line is out before the next pod's, so that the
			// capture interleaves line by line.
			if err := <-w.Commit(audit.Record{Kind: audit.KindStart, Proto: audit.ProtoTCP,
				Src: netip.MustParseAddrPort("198.51.100.2:40000"), Dst: netip.MustParseAddrPort("198.51.100.5:443"),
				Host: fmt.Sprintf("h%d.%s.example", j, pods[i].pod), HostFrom: audit.HostFromDNS, Port: 443,
				Verdict: verdict, Rule: "exec: host *.example", Reason: "test"}); err != nil {
				t.Fatal(err)
			}
		}
		if !wrote {
			break
		}
	}
	for _, w := range ws {
		if _, err := w.Close(); err != nil {
			t.Fatal(err)
		}
	}
	return bytes.SplitAfter(bytes.TrimSuffix(out.Bytes(), []byte("\n")), []byte("\n")), pods
}

// lineOf returns the index in lines of the k-th line (0: its header) of run.
func lineOf(t *testing.T, lines [][]byte, run string, k int) int {
	t.Helper()
	for i, l := range lines {
		if bytes.Contains(l, []byte(`"run":"`+run+`"`)) {
			if k == 0 {
				return i
			}
			k--
		}
	}
	t.Fatalf("run %s has no such line", run)
	return -1
}

// auditCLI runs `tunwall audit SUB FILE args...` on lines and returns its
// exit status and output.
func auditCLI(t *testing.T, sub string, lines [][]byte, args ...string) (int, string, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "capture.jsonl")
	var b []byte
	for _, l := range lines {
		b = append(b, l...)
		if len(l) > 0 && l[len(l)-1] != '\n' {
			b = append(b, '\n')
		}
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), append([]string{"audit", sub, path}, args...), &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

// without returns lines less those at the given indices.
func without(lines [][]byte, drop ...int) [][]byte {
	var out [][]byte
	for i, l := range lines {
		skip := false
		for _, d := range drop {
			skip = skip || d == i
		}
		if !skip {
			out = append(out, l)
		}
	}
	return out
}

// setRun returns line with its run id replaced.
func setRun(t *testing.T, line []byte, run string) []byte {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal(line, &m); err != nil {
		t.Fatal(err)
	}
	m["run"], _ = json.Marshal(run)
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return append(b, '\n')
}

// runVerdict returns what verify's output says of run: its line.
func runVerdict(out, run string) string {
	m := regexp.MustCompile(`(?m)^.*run ` + regexp.QuoteMeta(run) + `\b.*$`).FindString(out)
	return m
}

func TestAuditVerifyOfAStdoutCaptureChecksEachPodsChainApart(t *testing.T) {
	lines, pods := streamCapture(t, 5, 7, 4)
	code, out, errOut := auditCLI(t, "verify", lines)
	if code != exitOK {
		t.Fatalf("an intact capture of 3 interleaved runs: exit %d\n%s%s", code, out, errOut)
	}
	for _, p := range pods {
		v := runVerdict(out, p.run)
		if !strings.Contains(v, "ok") || !strings.Contains(v, fmt.Sprintf("%d records", p.records)) || !strings.Contains(v, "k8s_pod="+p.pod) {
			t.Errorf("verify says of run %s (pod %s, %d records): %q\n%s", p.run, p.pod, p.records, v, out)
		}
	}
}

// TestForgedOrDroppedLinesOfOnePodAmongOthersAreFound is the attacker who
// edits a capture of many pods' chains: each change must fail verify, name
// the run it broke, and leave the other runs ok.
func TestForgedOrDroppedLinesOfOnePodAmongOthersAreFound(t *testing.T) {
	lines, pods := streamCapture(t, 5, 7, 4)
	a, b, c := pods[0].run, pods[1].run, pods[2].run
	cases := []struct {
		name   string
		lines  func() [][]byte
		broken []string // the runs said to be broken (none when the failure is the capture's)
		gone   string   // a run no longer in the capture
		want   string   // in the output
	}{
		{"one record of pod B removed", func() [][]byte { return without(lines, lineOf(t, lines, b, 3)) }, []string{b}, "", "FAILED"},
		{"two records of pod B swapped", func() [][]byte {
			l := append([][]byte(nil), lines...)
			i, j := lineOf(t, l, b, 2), lineOf(t, l, b, 3)
			l[i], l[j] = l[j], l[i]
			return l
		}, []string{b}, "", "swapped"},
		{"pod B's trailer and last record removed (its tail cut)", func() [][]byte {
			return without(lines, lineOf(t, lines, b, pods[1].records), lineOf(t, lines, b, pods[1].records+1))
		}, []string{b}, "", "incomplete"},
		{"a second header of pod B forged mid-stream", func() [][]byte {
			h := lines[lineOf(t, lines, b, 0)]
			l := append([][]byte(nil), lines[:lineOf(t, lines, b, 4)]...)
			l = append(l, h)
			return append(l, lines[lineOf(t, lines, b, 4):]...)
		}, []string{b}, "", "header"},
		{"a line of pod A moved into run B (its run id rewritten)", func() [][]byte {
			l := append([][]byte(nil), lines...)
			i := lineOf(t, l, a, 2)
			l[i] = setRun(t, l[i], b)
			return l
		}, []string{a, b}, "", "FAILED"},
		{"a record of a run with no header", func() [][]byte {
			l := append([][]byte(nil), lines...)
			i := lineOf(t, l, c, 2)
			l[i] = setRun(t, l[i], "tw-00000000deadbeef")
			return l
		}, []string{"tw-00000000deadbeef", c}, "", "no header"},
		{"pod B's whole chain removed", func() [][]byte {
			var drop []int
			for k := 0; k < pods[1].records+2; k++ {
				drop = append(drop, lineOf(t, lines, b, k))
			}
			return without(lines, drop...)
		}, nil, b, "missing"},
		{"a line of pod A spliced in before pod A's header", func() [][]byte {
			l := append([][]byte(nil), lines...)
			i, j := lineOf(t, l, a, 0), lineOf(t, l, a, 1)
			moved := l[j]
			l = without(l, j)
			return append(l[:i], append([][]byte{moved}, l[i:]...)...)
		}, []string{a}, "", "FAILED"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := auditCLI(t, "verify", tc.lines())
			if code != exitFail {
				t.Fatalf("exit %d, want %d\n%s%s", code, exitFail, out, errOut)
			}
			all := out + errOut
			if !strings.Contains(all, tc.want) {
				t.Errorf("output does not say %q:\n%s", tc.want, all)
			}
			for _, r := range tc.broken {
				if v := runVerdict(out, r); !strings.Contains(v, "FAILED") && !strings.Contains(v, "INCOMPLETE") {
					t.Errorf("verify's line for run %s does not say it failed: %q\n%s", r, v, all)
				}
			}
			for _, p := range pods {
				if slices.Contains(tc.broken, p.run) || p.run == tc.gone {
					continue
				}
				if v := runVerdict(out, p.run); !strings.Contains(v, ": ok") {
					t.Errorf("run %s (untouched) is not said to be ok: %q\n%s", p.run, v, all)
				}
			}
			// summary agrees.
			if code, sout, serr := auditCLI(t, "summary", tc.lines()); code != exitFail {
				t.Errorf("summary of the tampered capture: exit %d\n%s%s", code, sout, serr)
			}
		})
	}
}

func TestAuditSummaryByK8sPodGroupsAStdoutCaptureByPod(t *testing.T) {
	lines, pods := streamCapture(t, 5, 7, 4)
	code, out, errOut := auditCLI(t, "summary", lines, "--by", "k8s_pod")
	if code != exitOK {
		t.Fatalf("summary --by k8s_pod of an intact capture: exit %d\n%s%s", code, out, errOut)
	}
	for _, p := range pods {
		re := regexp.MustCompile(`(?m)^k8s_pod\s+` + regexp.QuoteMeta(p.pod) + `\n(?:.*\n)*?runs\s+` + regexp.QuoteMeta(p.run) + `\n`)
		if !re.MatchString(out) {
			t.Errorf("summary has no group for pod %s of run %s:\n%s", p.pod, p.run, out)
		}
	}
	if !strings.Contains(out, "integrity  ok") {
		t.Errorf("summary does not say the capture is intact:\n%s", out)
	}
}
