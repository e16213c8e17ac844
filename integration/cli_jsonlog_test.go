package integration

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCLIJSONLogIsJSON: with --json-log every line tunwall writes to stderr
// parses as a JSON object — the banner, a denial, the summary, and a
// start-up error.
func TestCLIJSONLogIsJSON(t *testing.T) {
	requireTools(t, "curl")
	w := newWorld(t)
	check := func(what, stderr string, want ...string) {
		t.Helper()
		events := map[string]bool{}
		n := 0
		for _, l := range strings.Split(strings.TrimRight(stderr, "\n"), "\n") {
			var obj map[string]any
			if err := json.Unmarshal([]byte(l), &obj); err != nil {
				t.Errorf("%s: a stderr line is not JSON (%v): %q", what, err, l)
				continue
			}
			n++
			if e, ok := obj["event"].(string); ok {
				events[e] = true
			}
			if _, ok := obj["msg"].(string); !ok {
				t.Errorf("%s: no msg: %q", what, l)
			}
		}
		for _, e := range want {
			if !events[e] {
				t.Errorf("%s: no %q event in stderr:\n%s", what, e, stderr)
			}
		}
		t.Logf("%s: %d JSON lines", what, n)
	}
	// A run with an allowed flow and a denied one; the command writes
	// nothing to stderr itself.
	r := w.mustRun(0, runOpts{
		flags:  []string{"--json-log", "--allow", "allowed.test:80"},
		script: `curl -sS http://allowed.test/ok >/dev/null; curl -s --max-time 5 http://evil.test/ >/dev/null 2>&1; exit 0`,
	})
	check("run", r.stderr, "start", "denied", "summary", "audit_closed")

	// Start-up errors: a policy that does not load, a bad flag.
	bad := filepath.Join(w.dir, "bad.yaml")
	os.WriteFile(bad, []byte("version: 1\nphases:\n  exec:\n    allow:\n      - cidr: 10.0.0.0/33\n      - host: .x.test\n"), 0o644)
	r = w.mustRun(2, runOpts{flags: []string{"--json-log", "--policy", bad}, script: "true"})
	check("a policy that does not load", r.stderr)
	if !strings.Contains(r.stderr, "bad.yaml:5") || !strings.Contains(r.stderr, "bad.yaml:6") {
		t.Errorf("the errors are not in the JSON:\n%s", r.stderr)
	}
	r = w.mustRun(2, runOpts{flags: []string{"--json-log", "--polcy", bad}, script: "true"})
	check("a bad flag", r.stderr)
	// A setup failure after the sandbox exists (the audit log cannot be opened).
	r = w.mustRun(125, runOpts{flags: []string{"--json-log", "--allow", "allowed.test", "--audit", "/proc/tunwall-none/a.jsonl"}, script: "true"})
	check("a setup failure", r.stderr)
}
