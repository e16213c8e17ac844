package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tunwall/tunwall/internal/audit"
)

// askDecider is a decider (--decider) in python3: it logs every request
// line to argv[1] and answers from argv[2], a mode: "table" allows
// www.allowed.test for the run and denies anything else, "silent" never
// answers, "die" exits at the first request, "late" allows after 3 s.
const askDecider = `
import json, sys, time
log, mode = sys.argv[1], sys.argv[2]
for line in sys.stdin:
    with open(log, "a") as f: f.write(line)
    if mode == "die": sys.exit(3)
    if mode == "silent": continue
    q = json.loads(line)
    if mode == "late":
        time.sleep(3)
        print(json.dumps({"id": q["id"], "verdict": "allow", "scope": "once"}), flush=True)
        continue
    if q["host"] == "www.allowed.test":
        a = {"id": q["id"], "verdict": "allow", "scope": "run", "reason": "on the table"}
    else:
        a = {"id": q["id"], "verdict": "deny", "reason": "not on the table"}
    print(json.dumps(a), flush=True)
`

// writeDecider writes the decider where tunwall (as any user) can run it.
func writeDecider(t *testing.T, w *world) string {
	t.Helper()
	p := filepath.Join(w.dir, "decider.py")
	if err := os.WriteFile(p, []byte(askDecider), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// kindApproval is the kind of approval records (audit.KindApproval).
const kindApproval = "approval"

// approvals are the approval records of an audit log.
func approvals(t *testing.T, path string) []audit.Record {
	t.Helper()
	var out []audit.Record
	for _, r := range records(t, path) {
		if r.Kind == kindApproval {
			out = append(out, r)
		}
	}
	return out
}

// TestAskADeciderApprovesOneHostAndDeniesAnother runs curl in the sandbox
// against two names no rule allows, under --ask with a decider that
// allows one and denies the other: the approved one is fetched, the
// denied one is not (and never reaches the world), each request and
// answer is an approval record, and the log verifies.
func TestAskADeciderApprovesOneHostAndDeniesAnother(t *testing.T) {
	w := newWorld(t)
	requireTools(t, "curl", "python3")
	log := filepath.Join(w.dir, "decider-table.log")
	dec := writeDecider(t, w)
	// A client that retries a lookup that failed, as an application
	// would: the decider (a python3 just started on a busy machine) may
	// take longer than a lookup is held.
	script := `for i in 1 2 3; do curl -sS --fail -o /dev/null -w 'approved fetch took %{time_total}s (name lookup %{time_namelookup}s)\n' https://www.allowed.test/ && { echo APPROVED-OK; break; }; done
curl -sS --fail -o /dev/null -w 'the same name again took %{time_total}s (name lookup %{time_namelookup}s)\n' https://www.allowed.test/
curl -sS --max-time 10 -o /dev/null https://api.allowed.test/ 2>/dev/null || echo DENIED-FAILED`
	r := w.mustRun(0, runOpts{flags: []string{"--allow", "allowed.test", "--ask", "--decider", fmt.Sprintf("python3 %s %s table", dec, log)}, script: script})
	if !strings.Contains(r.stdout, "\nAPPROVED-OK\n") || !strings.Contains(r.stdout, "\nDENIED-FAILED\n") {
		t.Fatalf("want the approved name fetched and the denied one not\n%s", r)
	}
	t.Logf("sandbox:\n%s", r.stdout)
	b, _ := os.ReadFile(log)
	var reqs []map[string]any
	for _, l := range lines(string(b)) {
		var q map[string]any
		if err := json.Unmarshal([]byte(l), &q); err != nil {
			t.Fatalf("decider got a line that is not JSON: %q", l)
		}
		reqs = append(reqs, q)
	}
	if len(reqs) != 2 || reqs[0]["host"] != "www.allowed.test" || reqs[1]["host"] != "api.allowed.test" {
		t.Fatalf("decider requests %v, want one for www.allowed.test then one for api.allowed.test", reqs)
	}
	for _, k := range []string{"id", "phase", "proto", "host", "port", "pid", "comm", "exe"} {
		if _, ok := reqs[0][k]; !ok {
			t.Errorf("decider request %v has no %q", reqs[0], k)
		}
	}
	var got []string
	for _, a := range approvals(t, r.audit) {
		got = append(got, a.Host+" "+a.Outcome+" "+a.Verdict)
		t.Logf("approval record %s %s %s pid %d comm %q", a.TS.Format("15:04:05.000"), a.Host, a.Outcome, a.PID, a.Comm)
	}
	want := []string{"www.allowed.test pending deny", "www.allowed.test approved allow", "api.allowed.test pending deny", "api.allowed.test denied deny"}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("approval records:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if out, err := w.AgentCommand(context.Background(), tunwallBin, "audit", "verify", r.audit).CombinedOutput(); err != nil {
		t.Errorf("audit verify: %v\n%s", err, out)
	}
	if out, err := w.AgentCommand(context.Background(), tunwallBin, "audit", "summary", r.audit).CombinedOutput(); err != nil || !strings.Contains(string(out), "approvals  4 records") {
		t.Errorf("audit summary does not count the 4 approval records: %v\n%s", err, out)
	}
	f, err := os.Open(r.audit)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var h audit.Header
	for range audit.RecordsWithHeaders(f, func(hh audit.Header) { h = hh }) {
	}
	if h.Config["ask"] != "true" || h.Config["ask_timeout"] != "30s" || h.Config["ask_decider"] != "true" {
		t.Errorf("header config %v does not record --ask", h.Config)
	}
}

// TestAskFailsClosedWhenTheDeciderNeverAnswers: a decider that reads the
// request and says nothing; the name is denied once --ask-timeout passes,
// and the client's lookup fails within a bound.
func TestAskFailsClosedWhenTheDeciderNeverAnswers(t *testing.T) {
	w := newWorld(t)
	requireTools(t, "curl", "python3")
	dec := writeDecider(t, w)
	script := `s=$(date +%s); curl -sS --max-time 30 -o /dev/null https://www.allowed.test/ 2>/dev/null && echo LEAKED; echo TOOK $(( $(date +%s) - s ))`
	r := w.mustRun(0, runOpts{flags: []string{"--allow", "allowed.test", "--ask", "--ask-timeout", "3s", "--decider", fmt.Sprintf("python3 %s %s silent", dec, filepath.Join(w.dir, "silent.log"))}, script: script})
	if strings.Contains(r.stdout, "LEAKED") {
		t.Fatalf("a name nobody approved was fetched\n%s", r)
	}
	var took int
	fmt.Sscanf(r.stdout[strings.Index(r.stdout, "TOOK"):], "TOOK %d", &took)
	if took > 20 {
		t.Errorf("the lookup took %d s to fail, want within the resolver's retries of a 3 s --ask-timeout", took)
	}
	var timedOut bool
	for _, a := range approvals(t, r.audit) {
		if a.Host == "www.allowed.test" && a.Outcome == "timeout" && a.Verdict == audit.VerdictDeny {
			timedOut = true
		}
	}
	if !timedOut {
		t.Errorf("no approval record denies www.allowed.test on timeout:\n%v", approvals(t, r.audit))
	}
}

// TestAskFailsClosedWhenTheDeciderDies: a decider that exits at its first
// request; both names are denied, and tunwall says so once.
func TestAskFailsClosedWhenTheDeciderDies(t *testing.T) {
	w := newWorld(t)
	requireTools(t, "curl", "python3")
	dec := writeDecider(t, w)
	script := `curl -sS --max-time 15 -o /dev/null https://www.allowed.test/ 2>/dev/null && echo LEAKED
curl -sS --max-time 15 -o /dev/null https://api.allowed.test/ 2>/dev/null && echo LEAKED; echo DONE`
	r := w.mustRun(0, runOpts{flags: []string{"--allow", "allowed.test", "--ask", "--ask-timeout", "20s", "--decider", fmt.Sprintf("python3 %s %s die", dec, filepath.Join(w.dir, "die.log"))}, script: script})
	if strings.Contains(r.stdout, "LEAKED") || !strings.Contains(r.stdout, "DONE") {
		t.Fatalf("a name was fetched with a dead decider\n%s", r)
	}
	// Said once: the line about the decider itself (the denial lines
	// that follow give each name's reason).
	if n := strings.Count(r.stderr, "tunwall: --decider "); n != 1 {
		t.Errorf("stderr says %d times that the decider is gone, want once:\n%s", n, r.stderr)
	}
	for _, h := range []string{"www.allowed.test", "api.allowed.test"} {
		found := false
		for _, a := range approvals(t, r.audit) {
			found = found || a.Host == h && a.Outcome == "denied" && strings.Contains(a.Reason, "decider")
		}
		if !found {
			t.Errorf("no approval record denies %s for the dead decider", h)
		}
	}
}

// TestCtlAllowAlwaysWritesTheOverlayAndTheNextRunUsesIt: with --ask and
// no decider, a lookup waits; ctl pending lists it, ctl allow --always
// approves it, the fetch that follows works, the overlay next to the
// policy holds the rule, and a second run without --ask fetches the
// name through the overlay alone.
func TestCtlAllowAlwaysWritesTheOverlayAndTheNextRunUsesIt(t *testing.T) {
	w := newWorld(t)
	requireTools(t, "curl", "python3")
	xdg := filepath.Join(w.dir, "xdg-ask")
	if err := os.Mkdir(xdg, 0o700); err != nil {
		t.Fatal(err)
	}
	pol := filepath.Join(w.dir, "ask-policy.yaml")
	if err := os.WriteFile(pol, []byte("version: 1\nphases:\n  exec:\n    allow:\n      - host: allowed.test\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	overlay := filepath.Join(w.dir, "ask-policy.approved.yaml")
	release := filepath.Join(w.dir, "release-ask")
	// The lookup runs in the background: ASKED is printed while it waits.
	script := fmt.Sprintf(`python3 -c 'import socket
try: socket.getaddrinfo("www.allowed.test", 443)
except OSError: pass' & sleep 0.5; echo ASKED; n=0; while [ ! -e %s ] && [ $n -lt 600 ]; do sleep 0.05; n=$((n+1)); done
curl -sS --fail -o /dev/null https://www.allowed.test/ && echo FETCHED`, release)
	o := runOpts{flags: []string{"--policy", pol, "--ask"}, script: script, env: []string{"XDG_RUNTIME_DIR=" + xdg}}
	var pending string
	out, _ := w.runWithCtlMarks(t, o, map[string]func(ctx context.Context){"ASKED": func(ctx context.Context) {
		defer os.WriteFile(release, nil, 0o644)
		var list []struct {
			ID   string `json:"id"`
			Host string `json:"host"`
		}
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			var err error
			if pending, err = w.ctl(ctx, o, "pending", "--json"); err != nil {
				t.Errorf("ctl pending: %v\n%s", err, pending)
				return
			}
			if json.Unmarshal([]byte(pending), &list) == nil && len(list) > 0 {
				break
			}
		}
		if len(list) != 1 || list[0].Host != "www.allowed.test" {
			t.Errorf("ctl pending --json: %s, want www.allowed.test", pending)
			return
		}
		if got, err := w.ctl(ctx, o, "allow", list[0].ID, "--always"); err != nil {
			t.Errorf("ctl allow --always: %v\n%s", err, got)
		}
	}}, release)
	if !strings.Contains(out, "FETCHED") {
		t.Fatalf("the approved name was not fetched:\n%s", out)
	}
	b, err := os.ReadFile(overlay)
	if err != nil || !strings.Contains(string(b), "www.allowed.test") {
		t.Fatalf("overlay %s: %v\n%s", overlay, err, b)
	}
	if got, err := w.AgentCommand(context.Background(), tunwallBin, "policy", "check", pol).CombinedOutput(); err != nil || !strings.Contains(string(got), "www.allowed.test") {
		t.Errorf("policy check does not show the overlay's rule: %v\n%s", err, got)
	}
	r := w.mustRun(0, runOpts{flags: []string{"--policy", pol}, script: `curl -sS --fail -o /dev/null https://www.allowed.test/ && echo AGAIN`})
	wantLines(t, r, "AGAIN")
}

// askFlooder sends DNS queries for n distinct unknown names to the
// sandbox's resolver as fast as it can, then counts the answers.
const askFlooder = `
import socket, struct, sys, time
n = int(sys.argv[1])
ns = [l.split()[1] for l in open("/etc/resolv.conf") if l.startswith("nameserver")][0]
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
def q(i, name):
    h = struct.pack(">HHHHHH", i & 0xffff, 0x0100, 1, 0, 0, 0)
    b = b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0"
    return h + b + struct.pack(">HH", 1, 1)
for i in range(n):
    # Half under one domain, half spread over 500 (the per-domain and
    # the total bound).
    s.sendto(q(i, f"f{i}.flood.example" if i % 2 else f"f{i}.d{i % 500}.example"), (ns, 53))
s.settimeout(5)
got = 0
try:
    while got < n:
        s.recv(512); got += 1
except OSError: pass
print(f"FLOODED {n} answered {got}", flush=True)
`

// TestAFloodOfUnknownNamesDoesNotGrowThePendingSetPastItsBound: 2000
// distinct unknown names under --ask with a decider that never answers;
// ctl pending lists at most the bound, the decider is asked at most the
// bound, and the names past it are denied at once, recorded.
func TestAFloodOfUnknownNamesDoesNotGrowThePendingSetPastItsBound(t *testing.T) {
	w := newWorld(t)
	requireTools(t, "python3")
	xdg := filepath.Join(w.dir, "xdg-flood")
	if err := os.Mkdir(xdg, 0o700); err != nil {
		t.Fatal(err)
	}
	dec := writeDecider(t, w)
	log := filepath.Join(w.dir, "flood.log")
	flooder := filepath.Join(w.dir, "flooder.py")
	if err := os.WriteFile(flooder, []byte(askFlooder), 0o644); err != nil {
		t.Fatal(err)
	}
	release := filepath.Join(w.dir, "release-flood")
	script := fmt.Sprintf(`python3 %s 2000; echo FLOODED; n=0; while [ ! -e %s ] && [ $n -lt 600 ]; do sleep 0.05; n=$((n+1)); done`, flooder, release)
	o := runOpts{flags: []string{"--allow", "allowed.test", "--ask", "--ask-timeout", "60s", "--decider", fmt.Sprintf("python3 %s %s silent", dec, log)},
		script: script, env: []string{"XDG_RUNTIME_DIR=" + xdg}}
	var n int
	var flood []struct {
		Host string `json:"host"`
	}
	r := result{audit: filepath.Join(w.dir, fmt.Sprintf("audit-%d.jsonl", w.runs.Load()+1))}
	out, _ := w.runWithCtlMarks(t, o, map[string]func(ctx context.Context){"FLOODED": func(ctx context.Context) {
		defer os.WriteFile(release, nil, 0o644)
		got, err := w.ctl(ctx, o, "pending", "--json")
		if err != nil || json.Unmarshal([]byte(got), &flood) != nil {
			t.Errorf("ctl pending --json: %v\n%s", err, got)
		}
		n = len(flood)
		text, err := w.ctl(ctx, o, "metrics")
		if err != nil {
			t.Errorf("ctl metrics: %v\n%s", err, text)
			return
		}
		if v, ok := metricValue(parseMetrics(t, "ctl metrics", text), "tunwall_pending_approvals", nil); !ok || int(v) != n {
			t.Errorf("tunwall_pending_approvals = %v (found %v), want %d as ctl pending lists", v, ok, n)
		}
	}}, release)
	t.Logf("sandbox: %s; pending: %d", strings.TrimSpace(out), n)
	if n <= 8 || n > 64 {
		t.Errorf("%d requests pending after 2000 names, want 9..64 (the total bound, reached)", n)
	}
	perDomain := 0
	for _, p := range flood {
		if strings.HasSuffix(p.Host, ".flood.example") {
			perDomain++
		}
	}
	if perDomain > 8 {
		t.Errorf("%d requests pending under flood.example, want at most 8", perDomain)
	}
	bound := 0
	for _, a := range approvals(t, r.audit) {
		if a.Rule == "approval-bound" && a.Verdict == audit.VerdictDeny {
			bound++
		}
	}
	if bound == 0 {
		t.Errorf("no approval record of a name denied at once past the bound")
	}
	t.Logf("%d names denied at once past the bounds (recorded)", bound)
	b, _ := os.ReadFile(log)
	if asked := len(lines(string(b))); asked > 64 {
		t.Errorf("the decider was asked %d times, want at most 64", asked)
	}
}

// TestTheSandboxCannotAnswerItsOwnApproval: a process in the sandbox
// tries to answer for the decider (writing allow lines, with guessed and
// read ids, into every descriptor of every process it can see, its own
// included) and to read the decider's requests; the name stays unfetched.
func TestTheSandboxCannotAnswerItsOwnApproval(t *testing.T) {
	w := newWorld(t)
	requireTools(t, "curl", "python3", "bwrap")
	dec := writeDecider(t, w)
	forger := filepath.Join(w.dir, "forger.py")
	if err := os.WriteFile(forger, []byte(`
import glob, json, os, re, socket, threading, time
def lookup():
    try: socket.getaddrinfo("www.allowed.test", 443)
    except OSError: pass
threading.Thread(target=lookup, daemon=True).start()
time.sleep(0.5)
ids = ["%08x" % i for i in range(16)]
for link in glob.glob("/proc/[0-9]*/fd/*"):
    try:
        fd = os.open(link, os.O_RDONLY | os.O_NONBLOCK)
        data = os.read(fd, 65536); os.close(fd)
        ids += re.findall(rb'"id":\s*"([^"]+)"', data)
        print(f"READ {link}: {len(data)} bytes")
    except OSError: pass
for link in glob.glob("/proc/[0-9]*/fd/*"):
    for i in ids:
        i = i.decode() if isinstance(i, bytes) else i
        try:
            fd = os.open(link, os.O_WRONLY | os.O_NONBLOCK)
            os.write(fd, (json.dumps({"id": i, "verdict": "allow", "scope": "run"}) + "\n").encode()); os.close(fd)
        except OSError: pass
print("FORGED", flush=True)
`), 0o644); err != nil {
		t.Fatal(err)
	}
	bw := []string{"--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--bind", w.dir, w.dir}
	script := fmt.Sprintf(`python3 %s; curl -sS --max-time 15 -o /dev/null https://www.allowed.test/ 2>/dev/null && echo LEAKED; echo DONE`, forger)
	for i, c := range []struct {
		name   string
		bwrap  []string
		asUser int
	}{{"run", nil, 0}, {"bwrap", bw, 0}, {"run rootless", nil, 65534}, {"bwrap rootless", bw, 65534}} {
		t.Run(c.name, func(t *testing.T) {
			r := w.mustRun(0, runOpts{bwrap: c.bwrap, asUser: c.asUser, flags: []string{"--allow", "allowed.test", "--ask", "--ask-timeout", "10s", "--decider", fmt.Sprintf("python3 %s %s silent", dec, filepath.Join(w.dir, fmt.Sprintf("forged-%d.log", i)))}, script: script})
			if strings.Contains(r.stdout, "LEAKED") || !strings.Contains(r.stdout, "DONE") || !strings.Contains(r.stdout, "FORGED") {
				t.Fatalf("the sandbox approved its own request (or the forger did not run)\n%s", r)
			}
			for _, a := range approvals(t, r.audit) {
				if a.Verdict == audit.VerdictAllow {
					t.Errorf("an approval allowed: %+v", a)
				}
			}
			t.Logf("sandbox's view:\n%s", r.stdout)
		})
	}
}

// TestAskHoldsAConnectionToAPortNoApprovalCovers: the name's lookup is
// approved (for 443), then a connection to its port 80 is held as a
// request of its own (proto tcp, port 80) and approved by the decider
// while the handshake waits; a second name's lookup is denied, so its
// connection never starts.
func TestAskHoldsAConnectionToAPortNoApprovalCovers(t *testing.T) {
	w := newWorld(t)
	requireTools(t, "curl", "python3")
	log := filepath.Join(w.dir, "decider-flow.log")
	dec := writeDecider(t, w)
	script := `for i in 1 2 3; do curl -sS --fail -o /dev/null http://www.allowed.test/ && { echo PORT80-OK; break; }; done`
	r := w.mustRun(0, runOpts{flags: []string{"--allow", "allowed.test", "--ask", "--decider", fmt.Sprintf("python3 %s %s table", dec, log)}, script: script})
	if !strings.Contains(r.stdout, "PORT80-OK") {
		t.Fatalf("port 80 of the approved name was not fetched\n%s", r)
	}
	b, _ := os.ReadFile(log)
	var got []string
	for _, l := range lines(string(b)) {
		var q struct {
			Proto, Host string
			Port        int
		}
		json.Unmarshal([]byte(l), &q)
		got = append(got, fmt.Sprintf("%s %s %d", q.Proto, q.Host, q.Port))
	}
	if strings.Join(got, ",") != "dns www.allowed.test 0,tcp www.allowed.test 80" {
		t.Errorf("decider requests %q, want the name, then its port 80", got)
	}
	var flowOK bool
	for _, rec := range records(t, r.audit) {
		flowOK = flowOK || rec.Kind == audit.KindFlow && rec.Host == "www.allowed.test" && rec.Port == 80 && rec.Verdict == audit.VerdictAllow && strings.HasPrefix(rec.Rule, "approval:")
	}
	if !flowOK {
		t.Errorf("no allowed flow record to www.allowed.test:80 by an approval")
	}
}

// TestAskHoldsASocksRequestForADecision: tunwall socks --ask holds a
// CONNECT to a name no rule allows; the decider allows one name and
// denies another, and the clients see exactly that.
func TestAskHoldsASocksRequestForADecision(t *testing.T) {
	w := newWorld(t)
	requireTools(t, "curl", "python3")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	dec := writeDecider(t, w)
	xdg := filepath.Join(w.dir, "xdg-socks-ask")
	if err := os.Mkdir(xdg, 0o700); err != nil {
		t.Fatal(err)
	}
	o := runOpts{flags: []string{"--listen", "127.0.0.1:1083", "--allow", "allowed.test", "--ask", "--decider", fmt.Sprintf("python3 %s %s table", dec, filepath.Join(w.dir, "socks.log"))},
		env: []string{"XDG_RUNTIME_DIR=" + xdg}}
	proxy, _, _ := w.startBackground(ctx, "socks", o, "SOCKS5 proxy on")
	defer func() {
		proxy.Process.Signal(syscall.SIGTERM)
		proxy.Wait()
	}()
	curl := func(host string) error {
		return w.AgentCommand(ctx, "curl", "-sS", "--fail", "--max-time", "15", "--cacert", w.caPEM, "--socks5-hostname", "127.0.0.1:1083", "-o", "/dev/null", "https://"+host+"/").Run()
	}
	if err := curl("www.allowed.test"); err != nil {
		t.Errorf("the approved name through socks: %v", err)
	}
	if err := curl("api.allowed.test"); err == nil {
		t.Errorf("the denied name was fetched through socks")
	}
}

// TestALookupAnsweredSERVFAILWhileHeldSucceedsOnItsRetry: the decider
// answers after 3 s, longer than a lookup is held (2 s); the lookup is
// answered SERVFAIL, the resolver asks again, and that query gets the
// approval: one curl, no failure.
func TestALookupAnsweredSERVFAILWhileHeldSucceedsOnItsRetry(t *testing.T) {
	w := newWorld(t)
	requireTools(t, "curl", "python3")
	dec := writeDecider(t, w)
	script := `for i in 1 2 3; do curl -sS --fail -o /dev/null -w 'name lookup %{time_namelookup}s\n' https://www.allowed.test/ && { echo FETCHED; break; }; done`
	r := w.mustRun(0, runOpts{flags: []string{"--allow", "allowed.test", "--ask", "--decider", fmt.Sprintf("python3 %s %s late", dec, filepath.Join(w.dir, "late.log"))}, script: script})
	if !strings.Contains(r.stdout, "FETCHED") {
		t.Fatalf("the lookup approved after its first hold did not succeed on its retry\n%s", r)
	}
	var servfail bool
	for _, rec := range records(t, r.audit) {
		servfail = servfail || rec.Kind == audit.KindDNS && rec.Qname == "www.allowed.test" && rec.Rcode == "SERVFAIL"
	}
	if !servfail {
		t.Errorf("no query was answered SERVFAIL while held")
	}
	t.Logf("sandbox: %s", r.stdout)
}
