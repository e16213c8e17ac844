package audit

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestAPhaseRecordChangesThePhaseOfTheRecordsAfterIt writes records around
// a change of the policy: those written after the phase record without a
// phase of their own are of the new phase, those before of the header's,
// one that names its phase keeps it; the log verifies, and the trailer is
// of the phase in effect at the end.
func TestAPhaseRecordChangesThePhaseOfTheRecordsAfterIt(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	w := openTest(t, Options{Path: path, Header: fixedHeader("")})
	w.Write(Record{Kind: KindFlow, Verdict: VerdictAllow, Reason: "before"})
	if err := <-w.Commit(Record{TS: time.Now(), Kind: KindPhase, Phase: "exec", Rule: "ctl phase", Reason: "phase setup -> exec", PID: 7}); err != nil {
		t.Fatalf("the phase record: %v", err)
	}
	w.Write(Record{Kind: KindFlow, Verdict: VerdictAllow, Reason: "after"})
	w.Write(Record{Kind: KindFlow, Verdict: VerdictAllow, Reason: "decided before", Phase: "setup"})
	if _, err := w.Close(); err != nil {
		t.Fatal(err)
	}
	_, res := readVerify(t, path)
	if res.Records != 4 || !res.Complete {
		t.Fatalf("Verify = %+v", res)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	want := map[string]string{"before": "setup", "phase setup -> exec": "exec", "after": "exec", "decided before": "setup"}
	for r, err := range Records(f) {
		if err != nil {
			t.Fatal(err)
		}
		if want[r.Reason] != r.Phase {
			t.Errorf("record %q of kind %s: phase %q, want %q", r.Reason, r.Kind, r.Phase, want[r.Reason])
		}
	}
	b, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if tr := lines[len(lines)-1]; !strings.Contains(tr, `"kind":"trailer"`) || !strings.Contains(tr, `"phase":"exec"`) {
		t.Errorf("trailer %s, want of phase exec", tr)
	}
}
