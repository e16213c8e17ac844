package integration

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Credentials that fit the set-ups people already have (issue 21, item 4):
// a corporate CA in the user's own CA variables keeps working, Java trusts
// the run's CA with no flags, placeholders can stay the same across runs
// of one project, and --inject covers runs without a policy file.

// writeSetupPolicy writes a policy file into the world's directory.
func writeSetupPolicy(t *testing.T, w *world, name, text string) string {
	t.Helper()
	p := filepath.Join(w.dir, name)
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestCredsACorporateCAInTheUsersVariablesKeepsWorking: a user behind a
// corporate TLS proxy names its CA in NODE_EXTRA_CA_CERTS and
// CURL_CA_BUNDLE (here: the world's CA, which the host's bundle does not
// hold). With a terminating rule in the policy, node and curl in the
// sandbox must still reach a host tunwall passes through untouched
// (served by the corporate CA) and the terminated host (served by the
// run's CA): the sandbox's file is the user's plus the run's CA, not a
// replacement of it.
func TestCredsACorporateCAInTheUsersVariablesKeepsWorking(t *testing.T) {
	requireTools(t, "curl", "node")
	for _, c := range []struct {
		name   string
		asUser int
		bwrap  bool
	}{
		{"run as root", 0, false},
		{"run rootless", 65534, false},
		{"bwrap, tunwall's files hidden", 0, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			cw := newCredsWorld(t, c.asUser)
			bw := hiddenTmpBwrap(t, cw.world, c.bwrap)
			pol := writeSetupPolicy(t, cw.world, "corp.yaml", fmt.Sprintf(`version: 1
secrets:
  GITHUB_TOKEN: {env: TW_TEST_GITHUB_TOKEN}
phases:
  exec:
    allow:
      - host: api.creds.test
        inject: [GITHUB_TOKEN]
        ca: %s
      - host: plain.creds.test
`, cw.caPEM))
			script := `
echo "NODE_EXTRA_CA_CERTS=$NODE_EXTRA_CA_CERTS"
node -e 'Promise.all(["https://plain.creds.test/node","https://api.creds.test/node"].map(u=>fetch(u,{headers:{authorization:"token "+process.env.GITHUB_TOKEN}}).then(r=>r.text()).catch(e=>"node failed on "+u+": "+(e.cause||e)+"\n"))).then(a=>process.stdout.write(a.join("")))'
curl -sS https://plain.creds.test/curl 2>&1 || echo "curl failed on plain.creds.test"
curl -sS https://api.creds.test/curl -H "Authorization: token $GITHUB_TOKEN" 2>&1 || echo "curl failed on api.creds.test"
`
			r := cw.world.run(runOpts{script: script, flags: []string{"--policy", pol}, bwrap: bw, asUser: c.asUser, env: []string{
				"TW_TEST_GITHUB_TOKEN=" + credsToken,
				// The host's own bundle: it does not hold the "corporate" CA.
				"SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt",
				"NODE_EXTRA_CA_CERTS=" + cw.caPEM,
				"CURL_CA_BUNDLE=" + cw.caPEM,
			}})
			if r.code != 0 {
				t.Fatalf("the sandbox failed\n%s", r)
			}
			noValueAnywhere(t, r)
			if strings.Count(r.stdout, "paste: stored") != 2 {
				t.Errorf("a client lost the corporate CA: the passed-through host was not reached twice\n%s", r)
			}
			if strings.Count(r.stdout, "api: hello") != 2 {
				t.Errorf("a client does not trust the run's CA on the terminated host\n%s", r)
			}
			if c.bwrap && !strings.Contains(r.stdout, "NODE_EXTRA_CA_CERTS="+cw.caPEM+"\n") {
				t.Errorf("bwrap: the merged file is not shown at the user's own path\n%s", r)
			}
		})
	}
}

// hiddenTmpBwrap returns bwrap options (when bwrap is set) for a
// sandbox that sees the host, but only the world's directory of /tmp:
// not tunwall's run directory, so that the run's files must be bound
// where the sandbox looks.
func hiddenTmpBwrap(t *testing.T, w *world, bwrap bool) []string {
	t.Helper()
	if !bwrap {
		return nil
	}
	requireTools(t, "bwrap")
	return []string{"--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp", "--bind", w.dir, w.dir}
}

// javaClient is a Java program that GETs its argument with the
// placeholder as a token and prints the status and body.
const javaClient = `import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;

public class Main {
    public static void main(String[] args) throws Exception {
        HttpClient c = HttpClient.newHttpClient();
        HttpRequest req = HttpRequest.newBuilder(URI.create(args[0]))
            .header("Authorization", "token " + System.getenv("GITHUB_TOKEN")).build();
        try {
            HttpResponse<String> resp = c.send(req, HttpResponse.BodyHandlers.ofString());
            System.out.print("java got " + resp.statusCode() + ": " + resp.body());
        } catch (Exception e) {
            System.out.println("java failed: " + e);
        }
    }
}
`

// TestCredsJavaTrustsTheRunsCAWithNoFlags: a real Java HttpClient, given
// no trust store flag, reaches a terminated host (the run's CA) with the
// token injected, and still reaches a host tunwall passes through (the
// host's roots, here the world's CA in tunwall's SSL_CERT_FILE).
func TestCredsJavaTrustsTheRunsCAWithNoFlags(t *testing.T) {
	requireTools(t, "java")
	for _, c := range []struct {
		name  string
		bwrap bool
	}{
		{"run as root", false},
		{"bwrap, tunwall's files hidden", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			cw := newCredsWorld(t, 0)
			bw := hiddenTmpBwrap(t, cw.world, c.bwrap)
			src := filepath.Join(cw.dir, "Main.java")
			if err := os.WriteFile(src, []byte(javaClient), 0o644); err != nil {
				t.Fatal(err)
			}
			script := `
echo "JAVA_TOOL_OPTIONS=$JAVA_TOOL_OPTIONS"
java ` + src + ` https://api.creds.test/java 2>&1
java ` + src + ` https://plain.creds.test/java 2>&1
`
			r := cw.run(runOpts{script: script, bwrap: bw, timeout: 240 * time.Second, env: []string{"JAVA_TOOL_OPTIONS=-Xss2m"}})
			if r.code != 0 {
				t.Fatalf("the sandbox failed\n%s", r)
			}
			noValueAnywhere(t, r)
			if !strings.Contains(r.stdout, "java got 200: api: hello HTTP/2.0 GET /java") {
				t.Errorf("Java did not reach the terminated host with the token\n%s", r)
			}
			if !strings.Contains(r.stdout, "java got 200: paste: stored") {
				t.Errorf("Java did not reach the passed-through host\n%s", r)
			}
			if !strings.Contains(r.stdout, "JAVA_TOOL_OPTIONS=-Xss2m ") {
				t.Errorf("the user's JAVA_TOOL_OPTIONS was not kept\n%s", r)
			}
			if c.bwrap && !strings.Contains(r.stdout, "-Djavax.net.ssl.trustStore=/etc/") {
				t.Errorf("bwrap: the trust store is not bound over the distribution's\n%s", r)
			}
			auths := cw.creds.Auths("api")
			if len(auths) != 1 || auths[0] != "token "+credsToken {
				t.Errorf("the API got %d requests, want 1 with the real token", len(auths))
			}
		})
	}
}

// TestCredsStablePlaceholdersKeepASavedRemoteURLWorking: with
// --stable-placeholders, a git clone whose remote URL holds the
// placeholder (as `git clone https://x-access-token:$GITHUB_TOKEN@...`
// saves it) fetches again in the next run of the same project; without
// the flag each run has a placeholder of its own.
func TestCredsStablePlaceholdersKeepASavedRemoteURLWorking(t *testing.T) {
	requireTools(t, "git")
	cw := newCredsWorld(t, 0)
	state := filepath.Join(cw.dir, "state")
	env := []string{"XDG_STATE_HOME=" + state}
	clone := filepath.Join(cw.dir, "clone")
	gitEnv := `export GIT_CONFIG_NOSYSTEM=1 GIT_TERMINAL_PROMPT=0 HOME=$(mktemp -d)
echo "PLACEHOLDER=$GITHUB_TOKEN"
`
	first := cw.run(runOpts{flags: []string{"--stable-placeholders"}, env: env, script: gitEnv +
		`git clone -q "https://x-access-token:$GITHUB_TOKEN@git.creds.test/repo.git" ` + clone + ` && echo cloned`})
	if first.code != 0 || !strings.Contains(first.stdout, "cloned") {
		t.Fatalf("the first run did not clone\n%s", first)
	}
	second := cw.run(runOpts{flags: []string{"--stable-placeholders"}, env: env, script: gitEnv +
		`cd ` + clone + ` && git fetch -q origin 2>&1 && echo fetched`})
	if second.code != 0 || !strings.Contains(second.stdout, "fetched") {
		t.Errorf("the second run could not fetch with the saved remote URL\n%s", second)
	}
	p1, p2 := placeholderRE.FindString(first.stdout), placeholderRE.FindString(second.stdout)
	if p1 == "" || p1 != p2 {
		t.Errorf("placeholders %q and %q, want one stable placeholder", p1, p2)
	}
	third := cw.run(runOpts{env: env, script: `echo "PLACEHOLDER=$GITHUB_TOKEN"`})
	if p3 := placeholderRE.FindString(third.stdout); p3 == "" || p3 == p1 {
		t.Errorf("without --stable-placeholders the placeholder is %q, want a new one (stable: %q)", p3, p1)
	}
	keys, _ := filepath.Glob(filepath.Join(state, "tunwall", "placeholder-keys", "*"))
	if len(keys) != 1 {
		t.Fatalf("%d placeholder keys in the state directory, want 1", len(keys))
	}
	if fi, err := os.Stat(keys[0]); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("the placeholder key %s: %v, mode %v, want 0600", keys[0], err, fi.Mode())
	}
	for _, r := range []result{first, second, third} {
		noValueAnywhere(t, r)
	}
	for _, a := range cw.creds.Auths("git") {
		if strings.Contains(a, "twp_") {
			t.Errorf("the git server got a placeholder: %q", a)
		}
	}
}

// TestCredsInjectFlagWorksWithoutAPolicyFile: --inject HOST=SECRET allows
// HOST:443 and injects SECRET, read from tunwall's variable of the same
// name unless --secret declares it; a declared secret that no rule
// injects is said at start.
func TestCredsInjectFlagWorksWithoutAPolicyFile(t *testing.T) {
	requireTools(t, "curl")
	cw := newCredsWorld(t, 0)
	script := `
echo "PLACEHOLDER=$GITHUB_TOKEN"
curl -sS https://api.creds.test/inject -H "Authorization: token $GITHUB_TOKEN"
curl -sS https://api.creds.test/declared -H "Authorization: Bearer $GH"
curl -sS https://paste.creds.test/ -o /dev/null 2>/dev/null || echo "paste refused"
`
	r := cw.world.run(runOpts{script: script,
		flags: []string{"--inject", "api.creds.test=GITHUB_TOKEN", "--inject", "api.creds.test=GH", "--secret", "GH=env:TW_TEST_GH", "--secret", "UNUSED=env:TW_TEST_GH"},
		env:   []string{"GITHUB_TOKEN=" + credsToken, "TW_TEST_GH=" + credsToken}})
	if r.code != 0 {
		t.Fatalf("the sandbox failed\n%s", r)
	}
	noValueAnywhere(t, r)
	noValue(t, "the sandbox's output", r.stdout)
	for _, want := range []string{"PLACEHOLDER=twp_GITHUB_TOKEN_", "api: hello HTTP/2.0 GET /inject", "api: hello HTTP/2.0 GET /declared", "paste refused"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("missing %q\n%s", want, r)
		}
	}
	if !strings.Contains(r.stderr, "secret UNUSED is declared but no rule injects it") {
		t.Errorf("no warning for a secret no rule injects\n%s", r)
	}
	if strings.Contains(r.stderr, "secret GH is declared but") || strings.Contains(r.stderr, "secret GITHUB_TOKEN is declared but") {
		t.Errorf("a warning for an injected secret\n%s", r)
	}
	auths := cw.creds.Auths("api")
	if len(auths) != 2 || auths[0] != "token "+credsToken || auths[1] != "Bearer "+credsToken {
		t.Errorf("the API got %d requests, want 2 with the real token", len(auths))
	}
}

// TestCredsSuggestWritesTheSecretsItsRulesInject: policy suggest of a
// learn run writes the secrets section (names and sources from the run's
// header), so the suggestion passes policy check and runs as it is; and
// policy check fails, as run does, on an inject of an undeclared secret.
func TestCredsSuggestWritesTheSecretsItsRulesInject(t *testing.T) {
	requireTools(t, "curl")
	cw := newCredsWorld(t, 0)
	r := cw.run(runOpts{flags: []string{"--learn"}, script: `curl -sS https://api.creds.test/learn -H "Authorization: token $GITHUB_TOKEN"`})
	if r.code != 0 || !strings.Contains(r.stdout, "api: hello") {
		t.Fatalf("the learn run failed\n%s", r)
	}
	sug, err := exec.Command(tunwallBin, "policy", "suggest", r.audit).Output()
	if err != nil {
		t.Fatalf("policy suggest: %v\n%s", err, sug)
	}
	t.Logf("suggested:\n%s", sug)
	if !strings.Contains(string(sug), "GITHUB_TOKEN: {env: TW_TEST_GITHUB_TOKEN}") {
		t.Errorf("the suggestion does not declare GITHUB_TOKEN from its source")
	}
	pol := writeSetupPolicy(t, cw.world, "suggested.yaml", string(sug))
	if out, err := exec.Command(tunwallBin, "policy", "check", pol).CombinedOutput(); err != nil {
		t.Errorf("policy check of the suggestion: %v\n%s", err, out)
	}
	again := cw.world.run(runOpts{flags: []string{"--policy", pol}, env: []string{"TW_TEST_GITHUB_TOKEN=" + credsToken},
		script: `curl -sS https://api.creds.test/learn -H "Authorization: token $GITHUB_TOKEN"`})
	if again.code != 0 || !strings.Contains(again.stdout, "api: hello") {
		t.Errorf("the suggested policy does not run as it is\n%s", again)
	}

	undeclared := writeSetupPolicy(t, cw.world, "undeclared.yaml", `version: 1
phases:
  exec:
    allow:
      - host: api.creds.test
        inject: [GITHUB_TOKEN]
`)
	out, err := exec.Command(tunwallBin, "policy", "check", undeclared).CombinedOutput()
	if exitCode(err) != 1 || !strings.Contains(string(out), "injects secret GITHUB_TOKEN, which is not declared") {
		t.Errorf("policy check of an undeclared secret: exit %d, want 1\n%s", exitCode(err), out)
	}
	out, err = exec.Command(tunwallBin, "policy", "check", undeclared, "--secret", "GITHUB_TOKEN=env:X").CombinedOutput()
	if err != nil {
		t.Errorf("policy check with --secret declaring it: %v\n%s", err, out)
	}
}
