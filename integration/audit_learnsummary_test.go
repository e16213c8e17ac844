package integration

import (
	"os/exec"
	"regexp"
	"strings"
	"testing"
)

// Learn mode allows what enforce would deny, and says so: the end-of-run
// summary and `audit summary` mark those hosts "would-deny" with the
// reason enforce would give, so a user sees what the policy lacks before
// enforcing it. The end-of-run record count is the one `audit verify`
// gives, and the summary fits 100 columns.
func TestLearnModeSaysWhatEnforceWouldDenyAndCountsAsVerifyDoes(t *testing.T) {
	requireTools(t, "dig")
	w := newWorld(t)
	r := w.mustRun(0, runOpts{
		flags: []string{"--learn", "--allow", "allowed.test"},
		script: `dig +tries=1 +time=5 +short allowed.test >/dev/null
dig +tries=1 +time=5 +short evil.test >/dev/null
dig +tries=1 +time=5 +short a-very-long-name-that-makes-the-summary-table-wide.with-many-labels.evil.test >/dev/null`,
	})
	line := regexp.MustCompile(`(?m)^tunwall:\s+evil\.test\s+(\S+)`).FindStringSubmatch(r.stderr)
	if line == nil || line[1] != "would-deny" {
		t.Errorf("the end-of-run summary does not mark evil.test would-deny: %q\n%s", line, r.stderr)
	}
	if !strings.Contains(r.stderr, "enforcing would deny") {
		t.Errorf("the end-of-run summary of a learn run does not say what enforcing would deny:\n%s", r.stderr)
	}

	out, err := exec.Command(tunwallBin, "audit", "summary", r.audit).CombinedOutput()
	if err != nil {
		t.Fatalf("audit summary: %v\n%s", err, out)
	}
	row := regexp.MustCompile(`(?m)^evil\.test\s+(\S+).*$`).FindStringSubmatch(string(out))
	if row == nil || row[1] != "would-deny" || !strings.Contains(string(out), "would deny evil.test: no rule allows it") {
		t.Errorf("audit summary does not mark evil.test would-deny with enforce's reason: %q\n%s", row, out)
	}
	if row := regexp.MustCompile(`(?m)^allowed\.test\s+(\S+)`).FindStringSubmatch(string(out)); row == nil || row[1] != "allow" {
		t.Errorf("audit summary: allowed.test is %q, want allow\n%s", row, out)
	}
	for l := range strings.SplitSeq(string(out), "\n") {
		if len([]rune(l)) > 100 {
			t.Errorf("audit summary line of %d columns, want at most 100: %q", len([]rune(l)), l)
		}
	}

	// The end-of-run count is verify's.
	end := regexp.MustCompile(`audit log \S+ \((\d+) records`).FindStringSubmatch(r.stderr)
	v, _ := exec.Command(tunwallBin, "audit", "verify", r.audit).CombinedOutput()
	ver := regexp.MustCompile(`(\d+) records`).FindStringSubmatch(string(v))
	if end == nil || ver == nil || end[1] != ver[1] {
		t.Errorf("the end of the run counts %q records, audit verify %q:\n%s\n%s", end, ver, r.stderr, v)
	}
}
