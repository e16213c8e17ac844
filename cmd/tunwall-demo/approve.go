package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// deciderJS is the demo's decider: the hosts a team lets an agent reach
// beyond its policy, answered for the rest of the run; anything else is
// denied. tunwall starts it outside the sandbox and speaks to it one JSON
// object a line (docs/cli.md, --decider).
const deciderJS = `// decider.js: tunwall run --ask --decider 'node decider.js'
const ok = new Set(["api.other.test"]);  // think: the team's approved list
require("readline").createInterface({input: process.stdin}).on("line", line => {
  const r = JSON.parse(line);
  const yes = ok.has(r.host);
  console.error("decider: " + r.comm + " (pid " + r.pid + ") asks for " + r.host + ": " + (yes ? "allow" : "deny"));
  process.stdout.write(JSON.stringify({id: r.id, verdict: yes ? "allow" : "deny", scope: "run",
    reason: yes ? "on the team's list" : "not on the team's list"}) + "\n");
});
`

var approveWorkload = []step{
	{title: "curl https://api.other.test/   (no rule: held, and the decider allows it)",
		script: `for i in 1 2 3; do curl -sS --max-time 20 https://api.other.test/ && exit 0; sleep 1; done; exit 1`, allowed: true, want: "api.other.test /"},
	{title: "curl https://other.test/       (no rule: held, and the decider denies it)",
		script: `curl -sS --max-time 20 https://other.test/`},
}

// approvals runs a sandbox with --ask and a decider: a name no rule
// allows is held until the decider answers, and the client's retry gets
// the answer.
func (d *demo) approvals(ctx context.Context, dir, policy string, env []string) {
	heading("Approving unknown hosts: tunwall run --ask --decider 'node decider.js'")
	js := filepath.Join(dir, "decider.js")
	if err := os.WriteFile(js, []byte(deciderJS), 0o644); err != nil {
		d.check(false, "write %s: %v", js, err)
		return
	}
	fmt.Print(deciderJS)
	audit := filepath.Join(dir, "ask.jsonl")
	code, results := d.runSteps(ctx, env, "", approveWorkload, "run", "--policy", policy, "--phase", "exec",
		"--ask", "--decider", "node "+js, "--audit", audit)
	d.check(code == 0 || code == 1, "tunwall run --ask exited %d, want the workload's status", code)
	for _, bad := range checkSteps(approveWorkload, results) {
		d.check(false, "%s", bad)
	}
	b, err := os.ReadFile(audit)
	d.check(err == nil, "read the audit log: %v", err)
	n := strings.Count(string(b), `"kind":"approval"`)
	fmt.Printf("approval records in the audit log: %d\n", n)
	d.check(n >= 2, "the audit log has %d approval records, want the requests and their decisions", n)
	d.cmd(0, "audit", "verify", audit)
}
