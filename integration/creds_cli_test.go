package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tunwall/tunwall/policy"
)

// TestCredsAuditSummaryExplainAndSuggest: the audit summary groups the
// requests of terminated flows by host and method; policy explain takes a
// URL and a method; and policy suggest turns a learn-mode run's requests
// into http lists that allow exactly what was done.
func TestCredsAuditSummaryExplainAndSuggest(t *testing.T) {
	requireTools(t, "curl")
	cw := newCredsWorld(t, 0)
	// Learn mode: the API's rule has inject but the http list this run
	// learns.
	learnPol := filepath.Join(cw.dir, "learn.yaml")
	os.WriteFile(learnPol, []byte(`version: 1
secrets:
  GITHUB_TOKEN: {env: TW_TEST_GITHUB_TOKEN}
phases:
  exec:
    allow:
      - host: api.creds.test
        inject: [GITHUB_TOKEN]
`), 0o644)
	script := `
for p in /repos/acme/widget /repos/acme/widget/issues; do curl -sS https://api.creds.test$p -H "Authorization: token $GITHUB_TOKEN"; done
curl -sS -X POST https://api.creds.test/repos/acme/widget/pulls -H "Authorization: token $GITHUB_TOKEN" -d '{}'
curl -sS https://plain.creds.test:443/ -o /dev/null -k || true
`
	r := cw.world.run(runOpts{script: script, flags: []string{"--policy", learnPol, "--learn"}, env: []string{"TW_TEST_GITHUB_TOKEN=" + credsToken}})
	if r.code != 0 {
		t.Fatalf("the learn run failed\n%s", r)
	}
	if n := len(cw.creds.Auths("api")); n != 3 {
		t.Fatalf("the API got %d requests in learn mode, want 3\n%s", n, r)
	}
	noValueAnywhere(t, r)

	sum, err := exec.Command(tunwallBin, "audit", "summary", r.audit).CombinedOutput()
	if err != nil {
		t.Fatalf("audit summary: %v\n%s", err, sum)
	}
	t.Logf("summary:\n%s", sum)
	for _, want := range []string{"http       3 requests allowed, 0 denied", "HTTP HOST", "api.creds.test  GET     2", "api.creds.test  POST    1", "GITHUB_TOKEN"} {
		if !strings.Contains(string(sum), want) {
			t.Errorf("the summary has no %q", want)
		}
	}

	sug, err := exec.Command(tunwallBin, "policy", "suggest", r.audit).CombinedOutput()
	if err != nil {
		t.Fatalf("policy suggest: %v\n%s", err, sug)
	}
	t.Logf("suggested:\n%s", sug)
	p, err := policy.Parse("suggested.yaml", sug)
	if err != nil {
		t.Fatalf("the suggestion does not parse: %v\n%s", err, sug)
	}
	rs, err := policy.Select(p, "", nil, policy.Guard{})
	if err != nil {
		t.Fatal(err)
	}
	for _, req := range [][2]string{{"GET", "/repos/acme/widget"}, {"GET", "/repos/acme/widget/issues"}, {"POST", "/repos/acme/widget/pulls"}} {
		if d := rs.DecideRequest("api.creds.test", 443, req[0], req[1]); !d.Allowed() {
			t.Errorf("the suggestion denies %s %s: %+v", req[0], req[1], d)
		}
	}
	if d := rs.DecideRequest("api.creds.test", 443, "DELETE", "/repos/acme/widget"); d.Allowed() {
		t.Errorf("the suggestion allows what was never done")
	}
	if !strings.Contains(string(sug), "inject: [GITHUB_TOKEN]") {
		t.Errorf("the suggestion does not inject the secret")
	}

	out, err := exec.Command(tunwallBin, "policy", "explain", cw.policy, "https://api.creds.test/repos/acme/widget/pulls", "--method", "POST").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "http: POST https://api.creds.test/repos/acme/widget/pulls: allow") || !strings.Contains(string(out), "inject: GITHUB_TOKEN") {
		t.Errorf("explain an allowed request: %v\n%s", err, out)
	}
	out, err = exec.Command(tunwallBin, "policy", "explain", cw.policy, "https://api.creds.test/gists", "--method", "post").CombinedOutput()
	if code := exitCode(err); code != 1 || !strings.Contains(string(out), "no http rule of api.creds.test allows POST /gists") || !strings.Contains(string(out), "to allow it, add") {
		t.Errorf("explain a denied request: exit %d\n%s", code, out)
	}
	out, err = exec.Command(tunwallBin, "policy", "explain", cw.policy, "https://mtls.creds.test/x").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "is not terminated") {
		t.Errorf("explain a host that is not terminated: %v\n%s", err, out)
	}
}

func exitCode(err error) int {
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode()
	}
	if err != nil {
		return -1
	}
	return 0
}
