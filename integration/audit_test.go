package integration

// Tests of the audit log (ARCHITECTURE.md, "Audit record"), process
// attribution, `tunwall audit verify|summary`, the end-of-run summary, and
// learn mode with `tunwall policy suggest`. Every log here comes from a real
// `tunwall run` in the test world; tampering is done in Go on copies.

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// auditRequiredKeys are the keys every flow and DNS line must carry.
var auditRequiredKeys = []string{
	"ts", "run", "phase", "kind", "proto", "src", "dst", "host", "host_from", "port",
	"verdict", "rule", "reason", "pid", "comm", "bytes_out", "bytes_in", "duration_ms", "prev",
}

// auditDNSKeys are the keys DNS lines add.
var auditDNSKeys = []string{"qname", "qtype", "rcode"}

// auditRaw reads an audit log's lines as raw JSON objects, so that tests see
// the keys actually written, not what a Go struct fills in.
func auditRaw(t *testing.T, path string) []map[string]any {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []map[string]any
	for i, l := range auditSplit(b) {
		var m map[string]any
		if err := json.Unmarshal(l, &m); err != nil {
			t.Fatalf("%s:%d: not a JSON object: %v\n%s", path, i+1, err, l)
		}
		out = append(out, m)
	}
	if len(out) == 0 {
		t.Fatalf("%s is empty", path)
	}
	return out
}

// auditSplit splits a log into its lines, without newlines.
func auditSplit(b []byte) [][]byte {
	var out [][]byte
	for _, l := range bytes.SplitAfter(b, []byte("\n")) {
		if len(l) > 0 {
			out = append(out, bytes.TrimSuffix(l, []byte("\n")))
		}
	}
	return out
}

// auditStr returns m[k] as a string ("" if missing or not a string).
func auditStr(m map[string]any, k string) string {
	s, _ := m[k].(string)
	return s
}

// auditNum returns m[k] as a number (-1 if missing or not a number).
func auditNum(m map[string]any, k string) float64 {
	f, ok := m[k].(float64)
	if !ok {
		return -1
	}
	return f
}

// auditCLI runs a tunwall subcommand that needs no namespace (policy,
// audit) and returns its output and exit status.
func auditCLI(t *testing.T, stdin []byte, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, tunwallBin, args...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee) && ctx.Err() == nil:
		code = ee.ExitCode()
	default:
		t.Fatalf("tunwall %s: %v\n%s%s", strings.Join(args, " "), err, o.String(), e.String())
	}
	t.Logf("tunwall %s: exit %d", strings.Join(args, " "), code)
	return o.String(), e.String(), code
}

// auditRecordsOnly returns the flow and dns lines of a raw log.
func auditRecordsOnly(lines []map[string]any) []map[string]any {
	var out []map[string]any
	for _, m := range lines {
		if k := auditStr(m, "kind"); k == "flow" || k == "dns" {
			out = append(out, m)
		}
	}
	return out
}

// auditFind returns the records for which match is true.
func auditFind(lines []map[string]any, match func(map[string]any) bool) []map[string]any {
	var out []map[string]any
	for _, m := range auditRecordsOnly(lines) {
		if match(m) {
			out = append(out, m)
		}
	}
	return out
}

func auditDump(lines []map[string]any) string {
	var b strings.Builder
	for _, m := range lines {
		j, _ := json.Marshal(m)
		b.Write(j)
		b.WriteByte('\n')
	}
	return b.String()
}

// auditWorkload is a short mixed run: allowed HTTP by curl over IPv4, a
// port the rule does not cover, a denied name, and python3 fetching a second
// allowed name. Its lines are fixed, so a test can wantLines it.
const auditWorkload = `curl -4 -sS --max-time 10 http://allowed.test/curl
curl -4 -sS --max-time 10 -o /dev/null https://allowed.test/ 2>/dev/null; echo "port 443: $?"
curl -4 -sS --max-time 10 http://evil.test/ 2>/dev/null; echo "evil: $?"
python3 - <<'PY'
import urllib.request
print(urllib.request.urlopen("http://www.allowed.test/py", timeout=10).read().decode().strip())
PY`

var auditWorkloadFlags = []string{"--allow", "allowed.test:80", "--allow", "www.allowed.test:80"}

var auditWorkloadOut = []string{"web allowed.test /curl", "port 443: 7", "evil: 6", "web www.allowed.test /py"}

func TestEveryAuditRecordHasEveryRequiredKeyBetweenAHeaderAndATrailer(t *testing.T) {
	requireTools(t, "curl", "python3")
	w := newWorld(t)
	r := w.mustRun(0, runOpts{flags: auditWorkloadFlags, script: auditWorkload})
	wantLines(t, r, auditWorkloadOut...)
	all := auditRaw(t, r.audit)

	head, tail := all[0], all[len(all)-1]
	if auditStr(head, "kind") != "header" {
		t.Fatalf("first line is not the header: %v", head)
	}
	if auditStr(tail, "kind") != "trailer" {
		t.Fatalf("last line is not the trailer: %v", tail)
	}
	run := auditStr(head, "run")
	if !regexp.MustCompile(`^tw-[0-9a-f]{16}$`).MatchString(run) {
		t.Errorf("header run id %q is not tw- and 16 hex digits", run)
	}
	if !strings.Contains(r.stderr, "tunwall: run "+run) {
		t.Errorf("stderr does not name run %s at start:\n%s", run, r.stderr)
	}
	// Run as root, the line saying who the command runs as comes first.
	first := lines(r.stderr)
	if len(first) > 0 && strings.HasPrefix(first[0], "tunwall: running ") {
		first = first[1:]
	}
	if len(first) == 0 || !strings.HasPrefix(first[0], "tunwall: run "+run) {
		t.Errorf("the first stderr line (after the one saying who runs the command) is not the run id line:\n%s", r.stderr)
	}
	if n := auditNum(tail, "count"); int(n) != len(all)-1 {
		t.Errorf("trailer count %v, want %d (lines before it)", tail["count"], len(all)-1)
	}

	var flows, queries int
	for i, m := range all {
		if got := auditStr(m, "run"); got != run {
			t.Errorf("line %d: run %q, header says %q", i+1, got, run)
		}
		if k := auditStr(m, "kind"); i > 0 && i < len(all)-1 && k != "flow" && k != "dns" && k != "start" {
			t.Errorf("line %d: kind %q in the middle of the run", i+1, k)
		}
		if _, err := time.Parse(time.RFC3339Nano, auditStr(m, "ts")); err != nil {
			t.Errorf("line %d: ts %q is not RFC 3339: %v", i+1, auditStr(m, "ts"), err)
		}
		if p := auditStr(m, "prev"); len(p) != 64 {
			t.Errorf("line %d: prev %q is not a SHA-256 in hex", i+1, p)
		}
	}
	for _, m := range auditRecordsOnly(all) {
		want := auditRequiredKeys
		if auditStr(m, "kind") == "dns" {
			queries++
			want = append(slices.Clone(want), auditDNSKeys...)
		} else {
			flows++
		}
		var missing []string
		for _, k := range want {
			if _, ok := m[k]; !ok {
				missing = append(missing, k)
			}
		}
		if len(missing) > 0 {
			j, _ := json.Marshal(m)
			t.Errorf("%s record lacks %v: %s", auditStr(m, "kind"), missing, j)
		}
		switch hf := auditStr(m, "host_from"); hf {
		case "dns", "sni", "http", "none":
		default:
			t.Errorf("host_from %q is not dns, sni, http or none", hf)
		}
		switch v := auditStr(m, "verdict"); v {
		case "allow", "deny":
		default:
			t.Errorf("verdict %q is not allow or deny", v)
		}
		if auditStr(m, "rule") == "" || auditStr(m, "reason") == "" {
			t.Errorf("record without rule or reason: %v", m)
		}
	}
	// curl and python each make an allowed flow; curl makes a denied one.
	if flows < 3 || queries < 4 {
		t.Errorf("want at least 3 flow and 4 dns records, got %d and %d\n%s", flows, queries, auditDump(all))
	}
}

func TestAllowedAndDeniedFlowsAndQueriesAreRecordedWithTheirVerdicts(t *testing.T) {
	requireTools(t, "curl", "python3")
	w := newWorld(t)
	auditPath := filepath.Join(w.dir, "verdicts.jsonl")
	// The sandbox of a root tunwall is not root: let it read the log.
	if err := os.WriteFile(auditPath, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	// After the denied connection, the script waits (bounded) for its record
	// to reach the file while tunwall is still running: denials are recorded
	// when they happen, not when the run ends.
	r := w.mustRun(0, runOpts{
		flags: []string{"--audit", auditPath, "--allow", "allowed.test:80"},
		script: fmt.Sprintf(`curl -4 -sS --max-time 10 http://allowed.test/get
curl -4 -sS --max-time 10 -o /dev/null https://allowed.test/ 2>/dev/null; echo "port 443: $?"
python3 - <<'PY'
import json, time
deadline = time.time() + 5
seen = "deny not recorded while running"
while time.time() < deadline and seen.startswith("deny not"):
    with open(%q) as f:
        for line in f:
            m = json.loads(line)
            if m.get("kind") == "flow" and m.get("port") == 443 and m.get("verdict") == "deny":
                seen = "deny recorded while running"
    time.sleep(0.05)
print(seen)
PY
curl -4 -sS --max-time 10 http://evil.test/ 2>/dev/null; echo "evil: $?"`, auditPath),
	})
	wantLines(t, r, "web allowed.test /get", "port 443: 7", "deny recorded while running", "evil: 6")
	all := auditRaw(t, auditPath)
	dump := auditDump(all)
	const rule = "--allow allowed.test:80"
	fake4 := netip.MustParsePrefix("198.18.0.0/15")

	// DNS: allowed.test answered (curl -4 asks for A only), evil.test
	// refused and never sent upstream.
	for _, qt := range []string{"A"} {
		q := auditFind(all, func(m map[string]any) bool {
			return auditStr(m, "kind") == "dns" && auditStr(m, "qname") == "allowed.test" && auditStr(m, "qtype") == qt
		})
		if len(q) == 0 {
			t.Errorf("no dns record for allowed.test %s\n%s", qt, dump)
		}
		for _, m := range q {
			if auditStr(m, "verdict") != "allow" || auditStr(m, "rcode") != "NOERROR" || auditStr(m, "host") != "allowed.test" ||
				!strings.Contains(auditStr(m, "rule"), rule) || auditNum(m, "port") != 53 {
				t.Errorf("allowed query recorded wrongly: %v", m)
			}
		}
	}
	evilQ := auditFind(all, func(m map[string]any) bool {
		return auditStr(m, "kind") == "dns" && auditStr(m, "qname") == "evil.test"
	})
	if len(evilQ) == 0 {
		t.Errorf("no dns record for the denied name evil.test\n%s", dump)
	}
	for _, m := range evilQ {
		if auditStr(m, "verdict") != "deny" || auditStr(m, "rule") != "default-deny" || auditStr(m, "host") != "evil.test" ||
			(auditStr(m, "rcode") != "NXDOMAIN" && auditStr(m, "rcode") != "REFUSED") || auditStr(m, "reason") == "" {
			t.Errorf("denied query recorded wrongly: %v", m)
		}
	}
	if w.DNS.Asked("evil.test") {
		t.Error("the denied name evil.test reached the world's resolver")
	}
	w.noArrivals("evil")

	// The allowed GET: the name, the rule, the real address dialled, bytes.
	get := auditFind(all, func(m map[string]any) bool {
		return auditStr(m, "kind") == "flow" && auditNum(m, "port") == 80 && auditStr(m, "verdict") == "allow"
	})
	if len(get) != 1 {
		t.Fatalf("want exactly 1 allowed flow to port 80 (curl -4), got %d\n%s", len(get), dump)
	}
	m := get[0]
	if auditStr(m, "host") != "allowed.test" || auditStr(m, "host_from") != "dns" || auditStr(m, "proto") != "tcp" ||
		!strings.Contains(auditStr(m, "rule"), rule) || auditStr(m, "dial") != "192.0.2.10:80" {
		t.Errorf("allowed flow recorded wrongly (want host allowed.test from dns, rule %q, dial 192.0.2.10:80): %v", rule, m)
	}
	if dst, err := netip.ParseAddrPort(auditStr(m, "dst")); err != nil || !fake4.Contains(dst.Addr()) || dst.Port() != 80 {
		t.Errorf("allowed flow dst %q is not the fake IP the sandbox dialled, port 80", auditStr(m, "dst"))
	}
	if auditNum(m, "bytes_out") <= 0 || auditNum(m, "bytes_in") <= 0 || auditNum(m, "duration_ms") < 0 {
		t.Errorf("allowed GET: bytes_out %v, bytes_in %v, duration_ms %v; want bytes both ways and a duration",
			m["bytes_out"], m["bytes_in"], m["duration_ms"])
	}

	// The denied port: no dial, no bytes, a reason naming the port.
	deny := auditFind(all, func(m map[string]any) bool { return auditStr(m, "kind") == "flow" && auditNum(m, "port") == 443 })
	if len(deny) == 0 {
		t.Fatalf("no flow record for the denied allowed.test:443\n%s", dump)
	}
	for _, m := range deny {
		if auditStr(m, "verdict") != "deny" || auditStr(m, "host") != "allowed.test" || auditStr(m, "rule") != "default-deny" ||
			!strings.Contains(auditStr(m, "reason"), "443") || auditStr(m, "dial") != "" ||
			auditNum(m, "bytes_out") != 0 || auditNum(m, "bytes_in") != 0 {
			t.Errorf("denied flow recorded wrongly: %v", m)
		}
		if d := auditNum(m, "duration_ms"); d < 0 || d > 1000 {
			t.Errorf("denied flow took %vms to decide; a denial is immediate", d)
		}
	}
	for _, m := range auditRecordsOnly(all) {
		if auditNum(m, "duration_ms") < 0 {
			t.Errorf("negative or missing duration_ms: %v", m)
		}
	}
	if !strings.Contains(r.stderr, "tunwall: denied allowed.test:443") || !strings.Contains(r.stderr, "evil.test") {
		t.Errorf("stderr lacks the denial lines:\n%s", r.stderr)
	}
}

func TestFlowsAndQueriesAreAttributedToTheProcessThatMadeThem(t *testing.T) {
	requireTools(t, "curl", "python3")
	w := newWorld(t)
	// curl uses allowed.test and python3 www.allowed.test, so every record
	// says by its host which program must own it.
	r := w.mustRun(0, runOpts{flags: auditWorkloadFlags, script: auditWorkload})
	wantLines(t, r, auditWorkloadOut...)
	all := auditRaw(t, r.audit)
	want := map[string]string{"allowed.test": "curl", "evil.test": "curl", "www.allowed.test": "python3"}
	seen := map[string]map[string]int{} // comm -> kind -> count
	pids := map[string]map[float64]bool{}
	for _, m := range auditRecordsOnly(all) {
		comm, ok := want[auditStr(m, "host")]
		if !ok {
			t.Errorf("record about an unexpected host: %v", m)
			continue
		}
		if auditStr(m, "comm") != comm || auditNum(m, "pid") <= 0 || m["owner"] != "" {
			t.Errorf("%s record about %s: comm %q pid %v owner %q; want comm %q, a pid and owner \"\"",
				auditStr(m, "kind"), auditStr(m, "host"), auditStr(m, "comm"), m["pid"], m["owner"], comm)
			continue
		}
		if seen[comm] == nil {
			seen[comm], pids[comm] = map[string]int{}, map[float64]bool{}
		}
		seen[comm][auditStr(m, "kind")]++
		pids[comm][auditNum(m, "pid")] = true
	}
	for _, comm := range []string{"curl", "python3"} {
		if seen[comm]["flow"] == 0 || seen[comm]["dns"] == 0 {
			t.Errorf("want flow and dns records attributed to %s, got %v\n%s", comm, seen[comm], auditDump(all))
		}
	}
	for p := range pids["python3"] {
		if pids["curl"][p] {
			t.Errorf("pid %v is given to both curl and python3", p)
		}
	}
}

// Each of 20 processes started one after another in the sandbox names
// itself (its comm) and sends one DNS query of a name of its own: every
// query has one record, naming the process that asked (its own comm, a pid
// no other has), though the process was not there a moment before and is
// gone a moment after.
func TestAQueryFromAProcessStartedJustNowIsAttributedToIt(t *testing.T) {
	requireTools(t, "python3")
	w := newWorld(t)
	const n = 20
	script := fmt.Sprintf(`for i in $(seq 1 %d); do python3 -c '
import socket, struct, sys
me = sys.argv[1]
open("/proc/self/comm", "w").write(me)
q = struct.pack(">HHHHHH", 0x1234, 0x0100, 1, 0, 0, 0)
q += b"".join(bytes([len(l)]) + l.encode() for l in (me + ".allowed.test").split(".")) + b"\0" + struct.pack(">HH", 1, 1)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(5)
s.sendto(q, ("192.0.2.53", 53))
s.recv(512)
' q$i || echo "q$i failed"; done; echo done`, n)
	r := w.mustRun(0, runOpts{flags: auditWorkloadFlags, script: script})
	wantLines(t, r, "done")
	if strings.Contains(r.stdout, "failed") {
		t.Fatalf("queries failed:\n%s", r)
	}
	all := auditRaw(t, r.audit)
	count := map[string]int{}
	pids := map[float64]string{}
	for _, m := range auditRecordsOnly(all) {
		if auditStr(m, "kind") != "dns" {
			continue
		}
		name := auditStr(m, "qname")
		me, ok := strings.CutSuffix(name, ".allowed.test")
		if !ok {
			t.Errorf("a query of an unexpected name: %v", m)
			continue
		}
		count[me]++
		pid := auditNum(m, "pid")
		if auditStr(m, "comm") != me || pid <= 0 || m["owner"] != "" {
			t.Errorf("record of %s: comm %q pid %v owner %q; want comm %q, a pid and owner \"\"", name, auditStr(m, "comm"), m["pid"], m["owner"], me)
			continue
		}
		if other, ok := pids[pid]; ok && other != me {
			t.Errorf("pid %v is given to both %s and %s", pid, other, me)
		}
		pids[pid] = me
	}
	for i := 1; i <= n; i++ {
		if me := fmt.Sprintf("q%d", i); count[me] != 1 {
			t.Errorf("%d records of %s's query, want 1\n%s", count[me], me, auditDump(all))
		}
	}
}

// auditTamperCase is one way to damage a log: edit returns the damaged
// lines, and the verifier must name line wantLine with a message containing
// wantMsg.
type auditTamperCase struct {
	name     string
	edit     func(ls [][]byte) [][]byte
	wantLine func(n int) int // n is the number of lines of the intact log
	wantMsg  string
}

func TestAuditVerifyAcceptsAnIntactLogAndNamesTheTamperedLine(t *testing.T) {
	requireTools(t, "curl", "python3")
	w := newWorld(t)
	r := w.mustRun(0, runOpts{flags: auditWorkloadFlags, script: auditWorkload})
	wantLines(t, r, auditWorkloadOut...)
	orig, err := os.ReadFile(r.audit)
	if err != nil {
		t.Fatal(err)
	}
	ls := auditSplit(orig)
	n := len(ls)
	if n < 8 {
		t.Fatalf("want a log of at least 8 lines to tamper with, got %d", n)
	}
	run := auditStr(auditRaw(t, r.audit)[0], "run")

	out, errOut, code := auditCLI(t, nil, "audit", "verify", r.audit)
	if code != 0 || !strings.Contains(out, "ok") || !strings.Contains(out, run) ||
		!strings.Contains(out, fmt.Sprintf("%d records", n-2)) {
		t.Fatalf("intact log: want exit 0 naming run %s and %d records, got exit %d\n%s%s", run, n-2, code, out, errOut)
	}

	// mid is a record line in the middle of the log whose host is set.
	mid := -1
	for i := n / 2; i < n-1 && mid < 0; i++ {
		if bytes.Contains(ls[i], []byte(`"host":"allowed.test"`)) || bytes.Contains(ls[i], []byte(`"host":"www.allowed.test"`)) ||
			bytes.Contains(ls[i], []byte(`"host":"evil.test"`)) {
			mid = i
		}
	}
	if mid < 2 || mid > n-3 {
		t.Fatalf("no record with a host in the middle of the log (index %d of %d)", mid, n)
	}
	k := mid + 1 // 1-based line number of mid
	cases := []auditTamperCase{
		{
			name: "a host edited in the middle is named",
			edit: func(ls [][]byte) [][]byte {
				re := regexp.MustCompile(`"host":"[^"]*"`)
				ls[mid] = re.ReplaceAll(ls[mid], []byte(`"host":"harmless.test"`))
				return ls
			},
			wantLine: func(int) int { return k },
			wantMsg:  "changed",
		},
		{
			name:     "a removed line is named",
			edit:     func(ls [][]byte) [][]byte { return slices.Delete(ls, mid, mid+1) },
			wantLine: func(int) int { return k },
			wantMsg:  "missing",
		},
		{
			name: "an inserted copy of another line is named",
			edit: func(ls [][]byte) [][]byte {
				return slices.Insert(ls, mid, slices.Clone(ls[1])) // a copy of the first record
			},
			wantLine: func(int) int { return k },
			wantMsg:  "inserted",
		},
		{
			name:     "a cut head is found at line 1",
			edit:     func(ls [][]byte) [][]byte { return ls[1:] },
			wantLine: func(int) int { return 1 },
			wantMsg:  "head",
		},
		{
			name:     "a cut trailer is found at the new last line",
			edit:     func(ls [][]byte) [][]byte { return ls[:len(ls)-1] },
			wantLine: func(n int) int { return n - 1 },
			wantMsg:  "without a trailer",
		},
		{
			name:     "a tail cut by two lines is found at the new last line",
			edit:     func(ls [][]byte) [][]byte { return ls[:len(ls)-2] },
			wantLine: func(n int) int { return n - 2 },
			wantMsg:  "without a trailer",
		},
		{
			name: "two swapped lines are named",
			edit: func(ls [][]byte) [][]byte {
				ls[mid], ls[mid+1] = ls[mid+1], ls[mid]
				return ls
			},
			wantLine: func(int) int { return k },
			wantMsg:  "swapped",
		},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			copyLines := make([][]byte, n)
			for j := range ls {
				copyLines[j] = slices.Clone(ls[j])
			}
			damaged := c.edit(copyLines)
			var buf bytes.Buffer
			for _, l := range damaged {
				buf.Write(l)
				buf.WriteByte('\n')
			}
			if bytes.Equal(buf.Bytes(), orig) {
				t.Fatal("the edit changed nothing")
			}
			path := filepath.Join(w.dir, fmt.Sprintf("tampered-%d.jsonl", i))
			if err := os.WriteFile(path, buf.Bytes(), 0o600); err != nil {
				t.Fatal(err)
			}
			out, errOut, code := auditCLI(t, nil, "audit", "verify", path)
			t.Logf("%s", errOut)
			line := c.wantLine(n)
			prefix := fmt.Sprintf("%s:%d: ", path, line)
			if code == 0 || !strings.HasPrefix(errOut, prefix) || !strings.Contains(errOut, c.wantMsg) ||
				!strings.Contains(out, "FAILED") {
				t.Errorf("want a non-zero exit and %q ... %q on stderr, got exit %d\nstdout: %sstderr: %s",
					prefix, c.wantMsg, code, out, errOut)
			}
		})
	}
}

func TestAuditSummaryListsHostsWithDenialsFirst(t *testing.T) {
	requireTools(t, "curl")
	w := newWorld(t)
	// allowed.test has the most flows, so only "denials first" puts the
	// denied names above it.
	r := w.mustRun(0, runOpts{
		flags: []string{"--allow", "allowed.test:80"},
		script: `for i in 1 2 3; do curl -4 -sS --max-time 10 http://allowed.test/$i; done
curl -sS --max-time 10 http://evil.test/ 2>/dev/null; echo "evil: $?"
curl -sS --max-time 10 http://denied.test/ 2>/dev/null; echo "denied: $?"`,
	})
	wantLines(t, r, "web allowed.test /1", "web allowed.test /2", "web allowed.test /3", "evil: 6", "denied: 6")
	run := auditStr(auditRaw(t, r.audit)[0], "run")
	out, errOut, code := auditCLI(t, nil, "audit", "summary", r.audit)
	if code != 0 {
		t.Fatalf("audit summary: exit %d\n%s%s", code, out, errOut)
	}
	if !strings.Contains(out, run) || !strings.Contains(out, "integrity  ok") {
		t.Errorf("summary does not name run %s or does not report the chain intact:\n%s", run, out)
	}
	var rows [][]string
	in := false
	for _, l := range strings.Split(out, "\n") {
		switch {
		case strings.HasPrefix(l, "HOST"):
			in = true
		case in && strings.TrimSpace(l) == "":
			in = false
		case in:
			rows = append(rows, strings.Fields(l))
		}
	}
	byHost := map[string]int{}
	for i, f := range rows {
		if len(f) < 3 {
			t.Fatalf("short table row %q\n%s", f, out)
		}
		byHost[f[0]] = i
	}
	for _, h := range []string{"allowed.test", "evil.test", "denied.test"} {
		if _, ok := byHost[h]; !ok {
			t.Fatalf("summary table has no row for %s:\n%s", h, out)
		}
	}
	if rows[byHost["allowed.test"]][1] != "allow" || rows[byHost["evil.test"]][1] != "deny" || rows[byHost["denied.test"]][1] != "deny" {
		t.Errorf("wrong verdicts in the table:\n%s", out)
	}
	lastDenied, firstAllowed := -1, len(rows)
	for i, f := range rows {
		if strings.Contains(f[1], "deny") {
			lastDenied = i
		} else if i < firstAllowed {
			firstAllowed = i
		}
	}
	if lastDenied > firstAllowed {
		t.Errorf("a denied host is listed after an allowed one:\n%s", out)
	}
	if row := strings.Join(rows[byHost["evil.test"]], " "); !strings.Contains(row, "default-deny") || !strings.Contains(row, "curl") {
		t.Errorf("evil.test row does not name its first denial's rule and the process: %q", row)
	}
}

// auditSummaryLine matches the first end-of-run summary line.
var auditSummaryLine = regexp.MustCompile(`^tunwall: (\d+) flows allowed, (\d+) denied; (\d+) DNS queries answered, (\d+) denied;`)

func TestEndOfRunSummaryIsPrintedOnStderrAndQuietSilencesIt(t *testing.T) {
	requireTools(t, "curl")
	w := newWorld(t)
	script := `curl -4 -sS --max-time 10 http://allowed.test/a
curl -4 -sS --max-time 10 http://allowed.test/b
curl -4 -sS --max-time 10 -o /dev/null https://allowed.test/ 2>/dev/null; echo "port 443: $?"
curl -sS --max-time 10 http://evil.test/ 2>/dev/null; echo "evil: $?"`
	want := []string{"web allowed.test /a", "web allowed.test /b", "port 443: 7", "evil: 6"}

	r := w.mustRun(0, runOpts{flags: []string{"--allow", "allowed.test:80"}, script: script})
	wantLines(t, r, want...)
	// Start records are not flows of their own; a folded record (count)
	// stands for several.
	var fa, fd, da, dd int
	for _, rec := range records(t, r.audit) {
		n := max(rec.Count, 1)
		switch {
		case rec.Kind == "flow" && rec.Verdict == "allow":
			fa += n
		case rec.Kind == "flow":
			fd += n
		case rec.Kind == "dns" && rec.Verdict == "allow":
			da += n
		case rec.Kind == "dns":
			dd += n
		}
	}
	var got []string
	stderr := lines(r.stderr)
	sumAt := -1
	for i, l := range stderr {
		if m := auditSummaryLine.FindStringSubmatch(l); m != nil {
			got, sumAt = m[1:], i
		}
	}
	if wantCounts := []string{fmt.Sprint(fa), fmt.Sprint(fd), fmt.Sprint(da), fmt.Sprint(dd)}; !slices.Equal(got, wantCounts) {
		t.Errorf("summary counts (flows allowed, denied, DNS answered, denied) = %v, the audit log says %v\n%s", got, wantCounts, r.stderr)
	}
	if sumAt < 0 || fd == 0 || dd == 0 {
		t.Fatalf("no summary line, or the run denied nothing:\n%s", r.stderr)
	}
	// Top hosts follow, denied hosts first; allowed.test saw a denial (443)
	// too, so both are marked.
	var hostLines []string
	for _, l := range stderr[sumAt+1:] {
		if strings.HasPrefix(l, "tunwall:   ") {
			if f := strings.Fields(strings.TrimPrefix(l, "tunwall:")); len(f) >= 2 {
				hostLines = append(hostLines, f[0]+" "+f[1])
			}
		}
	}
	if !slices.Contains(hostLines, "evil.test deny") || !slices.Contains(hostLines, "allowed.test allow+deny") {
		t.Errorf("top hosts are %q, want evil.test deny and allowed.test allow+deny\n%s", hostLines, r.stderr)
	}
	if last := stderr[len(stderr)-1]; !strings.HasPrefix(last, "tunwall: audit log "+r.audit+" (") || !strings.Contains(last, "tunwall audit verify "+r.audit) {
		t.Errorf("the last stderr line does not name the audit log %s: %q", r.audit, last)
	}
	for _, d := range []string{"tunwall: denied allowed.test:443 tcp", "tunwall: denied DNS A evil.test"} {
		if !strings.Contains(r.stderr, d) {
			t.Errorf("stderr lacks the denial line %q:\n%s", d, r.stderr)
		}
	}

	q := w.mustRun(0, runOpts{flags: []string{"--quiet", "--allow", "allowed.test:80"}, script: script})
	wantLines(t, q, want...)
	if q.stderr != "" {
		t.Errorf("--quiet: want nothing on stderr (the commands' own stderr is discarded), got:\n%s", q.stderr)
	}
	denied := 0
	for _, rec := range records(t, q.audit) {
		if rec.Verdict == "deny" {
			denied++
		}
	}
	if denied == 0 {
		t.Error("--quiet must not silence the audit log, but it records no denial")
	}
}

func TestJSONLogMakesTunwallsOwnDiagnosticsJSON(t *testing.T) {
	requireTools(t, "curl")
	w := newWorld(t)
	// The commands' stderr is discarded, so every stderr line is tunwall's:
	// with --json-log every one is a JSON object, the run line, denial
	// lines and the end-of-run summary too (README, "--json-log"), each
	// with its event.
	r := w.mustRun(0, runOpts{
		flags: []string{"-v", "--json-log", "--allow", "allowed.test:80"},
		script: `curl -4 -sS --max-time 10 http://allowed.test/json 2>/dev/null
curl -sS --max-time 10 http://evil.test/ 2>/dev/null; echo "evil: $?"`,
	})
	wantLines(t, r, "web allowed.test /json", "evil: 6")
	events := map[string]int{}
	for _, l := range lines(r.stderr) {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Errorf("with --json-log, a line tunwall wrote is not JSON: %q", l)
			continue
		}
		if auditStr(m, "level") == "" || auditStr(m, "msg") == "" || auditStr(m, "time") == "" {
			t.Errorf("JSON line without time, level and msg: %q", l)
		}
		events[auditStr(m, "event")]++
	}
	t.Logf("events: %v", events)
	for _, e := range []string{"start", "denied", "summary", "summary_host", "audit_closed"} {
		if events[e] == 0 {
			t.Errorf("with -v --json-log, no %q event among tunwall's lines:\n%s", e, r.stderr)
		}
	}
}

// auditLearnWorkload uses names no rule allows in a learn run: plain HTTP by
// curl, node's fetch over HTTPS, and two HTTPS siblings under one parent.
const auditLearnWorkload = `curl -4 -sS --max-time 10 http://allowed.test/learn
node -e 'fetch("https://api.allowed.test/node").then(r => r.text()).then(t => process.stdout.write(t), e => { console.log("node failed: " + (e.cause || e)); process.exit(1) })'
curl -sS --max-time 10 https://a.cdn.allowed.test/a
curl -sS --max-time 10 https://b.cdn.allowed.test/b`

var auditLearnOut = []string{"web allowed.test /learn", "api api.allowed.test /node", "web a.cdn.allowed.test /a", "web b.cdn.allowed.test /b"}

func TestLearnSuggestEnforceRoundTrip(t *testing.T) {
	requireTools(t, "curl", "node")
	w := newWorld(t)

	// 1. Learn: no rule names these hosts, yet everything works, and the
	// log says what enforce mode would have done.
	l := w.mustRun(0, runOpts{flags: []string{"--learn"}, script: auditLearnWorkload})
	wantLines(t, l, auditLearnOut...)
	all := auditRaw(t, l.audit)
	if cfg, _ := all[0]["config"].(map[string]any); cfg == nil || cfg["learn"] != "true" {
		t.Errorf("learn run header config does not say learn=true: %v", all[0]["config"])
	}
	for _, m := range auditRecordsOnly(all) {
		if auditStr(m, "verdict") != "allow" || !strings.Contains(auditStr(m, "reason"), "enforce would deny") {
			t.Errorf("learn mode record does not say it was allowed though enforce would deny: %v", m)
		}
	}
	for _, h := range []string{"allowed.test", "api.allowed.test", "a.cdn.allowed.test", "b.cdn.allowed.test"} {
		if len(auditFind(all, func(m map[string]any) bool { return auditStr(m, "kind") == "flow" && auditStr(m, "host") == h })) == 0 {
			t.Errorf("learn log has no flow to %s\n%s", h, auditDump(all))
		}
	}

	// 2. Suggest a policy from the log.
	yaml, errOut, code := auditCLI(t, nil, "policy", "suggest", l.audit, "--phase", "exec")
	if code != 0 {
		t.Fatalf("policy suggest: exit %d\n%s", code, errOut)
	}
	t.Logf("suggested policy:\n%s", yaml)
	pol := filepath.Join(w.dir, "policy.yaml")
	if err := os.WriteFile(pol, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, errOut, code := auditCLI(t, nil, "policy", "check", pol); code != 0 {
		t.Fatalf("the suggested policy does not pass policy check: exit %d\n%s%s", code, out, errOut)
	}
	ylines := strings.Split(yaml, "\n")
	wild := slices.IndexFunc(ylines, func(s string) bool { return strings.TrimSpace(s) == `- host: "*.cdn.allowed.test"` })
	if wild < 0 {
		t.Fatalf("the suggested policy does not group the cdn siblings into *.cdn.allowed.test:\n%s", yaml)
	}
	if c := strings.TrimSpace(ylines[max(wild-1, 0)]); !strings.HasPrefix(c, "#") || !strings.Contains(c, "a.cdn.allowed.test") ||
		!strings.Contains(c, "b.cdn.allowed.test") {
		t.Errorf("*.cdn.allowed.test is not preceded by a comment naming the names it groups; line before it: %q", c)
	}
	var hosts []string
	for _, s := range ylines {
		s = strings.TrimSpace(s)
		switch {
		case strings.HasPrefix(s, "- host:"):
			hosts = append(hosts, strings.Trim(strings.TrimSpace(strings.TrimPrefix(s, "- host:")), `"`))
		case strings.HasPrefix(s, "- cidr:"), strings.HasPrefix(s, "proto:"):
			t.Errorf("the suggested policy has a rule the run did not need: %q", s)
		}
	}
	slices.Sort(hosts)
	if want := []string{"*.cdn.allowed.test", "allowed.test", "api.allowed.test"}; !slices.Equal(hosts, want) {
		t.Errorf("suggested hosts %q, want exactly %q", hosts, want)
	}
	for _, c := range []struct {
		dest  string
		allow bool
	}{
		{"allowed.test:80", true},
		{"api.allowed.test:443", true},
		{"a.cdn.allowed.test:443", true},
		{"c.cdn.allowed.test:443", true}, // a sibling the wildcard covers
		{"allowed.test:443", false},      // only :80 was used
		{"api.allowed.test:80", false},
		{"a.cdn.allowed.test:80", false},
		{"cdn.allowed.test:443", false}, // never the apex
		{"denied.test:443", false},
		{"other.test:80", false},
		{"evilallowed.test:443", false},
	} {
		out, errOut, code := auditCLI(t, nil, "policy", "explain", pol, c.dest)
		if got := code == 0; got != c.allow {
			t.Errorf("policy explain %s: exit %d, want allowed=%v\n%s%s", c.dest, code, c.allow, out, errOut)
		}
	}

	// 3. Enforce with the suggested policy: the same workload passes, a name
	// outside it does not.
	e := w.mustRun(0, runOpts{
		flags:  []string{"--policy", pol},
		script: auditLearnWorkload + "\ncurl -sS --max-time 10 http://other.test/ 2>/dev/null; echo \"other: $?\"",
	})
	wantLines(t, e, append(slices.Clone(auditLearnOut), "other: 6")...)
	eall := auditRaw(t, e.audit)
	for _, m := range auditRecordsOnly(eall) {
		allowed := auditStr(m, "verdict") == "allow"
		if auditStr(m, "rule") == "learn" || strings.Contains(auditStr(m, "reason"), "learn mode") {
			t.Errorf("enforce run record mentions learn mode: %v", m)
		}
		if other := auditStr(m, "host") == "other.test"; other == allowed {
			t.Errorf("enforce run: verdict %q for %s: %v", auditStr(m, "verdict"), auditStr(m, "host"), m)
		}
	}
	if w.DNS.Asked("other.test") {
		t.Error("other.test, denied by the suggested policy, reached the world's resolver")
	}
}

func TestLearnModeStillNeverDialsWhatTheGuardForbids(t *testing.T) {
	requireTools(t, "curl")
	w := newWorld(t)
	// rebind-lo.test resolves to 127.0.0.1 and ::1, where the agent-lo
	// logging servers listen on :8081 and :443.
	r := w.mustRun(0, runOpts{
		flags: []string{"--learn"},
		script: `curl -sS --max-time 10 http://rebind-lo.test:8081/ >/dev/null 2>&1; echo "http: $?"
curl -sS --max-time 10 https://rebind-lo.test/ >/dev/null 2>&1; echo "https: $?"
curl -4 -sS --max-time 10 http://allowed.test/still`,
	})
	got := lines(r.stdout)
	if len(got) != 3 || got[0] == "http: 0" || got[1] == "https: 0" || got[2] != "web allowed.test /still" {
		t.Fatalf("want both rebind-lo.test requests to fail and allowed.test to work in learn mode\n%s", r)
	}
	w.noArrivals("agent-lo", "agent-veth")
	all := auditRaw(t, r.audit)
	flows := auditFind(all, func(m map[string]any) bool {
		return auditStr(m, "kind") == "flow" && auditStr(m, "host") == "rebind-lo.test"
	})
	if len(flows) == 0 {
		t.Fatalf("no flow record for rebind-lo.test\n%s", auditDump(all))
	}
	for _, m := range flows {
		if auditStr(m, "verdict") != "deny" || auditStr(m, "dial") != "" || auditStr(m, "reason") == "" {
			t.Errorf("learn mode flow to rebind-lo.test is not a denial with a reason and no dial: %v", m)
		}
	}
	// What learn mode refused is not suggested either.
	yaml, errOut, code := auditCLI(t, nil, "policy", "suggest", r.audit)
	if code != 0 || strings.Contains(yaml, "rebind-lo") || !strings.Contains(yaml, `"allowed.test"`) {
		t.Errorf("policy suggest: exit %d; want allowed.test and no rebind-lo.test\n%s%s", code, yaml, errOut)
	}
}

func TestAnUnwritableAuditLogDeniesNewFlows(t *testing.T) {
	requireTools(t, "curl", "python3", "getent", "unshare", "mount")
	w := newWorld(t)
	// The audit log lives on a 256 KiB tmpfs mounted in a private mount
	// namespace (unshare -m) that tunwall then runs in, so the host never
	// sees the mount and it disappears with the last process. The sandbox's
	// own mount namespace is a copy of tunwall's, so the same tmpfs is
	// visible inside it: the script fills it with dd, then asks for an
	// allowed name until tunwall's next audit write fails (the log's last
	// page may still take a few lines) and tunwall starts denying. A bounded
	// loop, not a sleep, waits for that. The fake address of allowed.test,
	// learnt while the log was healthy, then proves that a new connection is
	// refused too, not only the name's resolution.
	fs := filepath.Join(w.dir, "tmpfs")
	if err := os.Mkdir(fs, 0o755); err != nil {
		t.Fatal(err)
	}
	auditPath := filepath.Join(fs, "audit.jsonl")
	script := fmt.Sprintf(`curl -4 -sS --max-time 10 http://allowed.test/before
ip=$(getent ahostsv4 allowed.test | awk 'NR==1 {print $1}')
dd if=/dev/zero of=%s/fill bs=4k 2>/dev/null; echo "filled"
python3 - <<'PY'
import socket, time
deadline = time.time() + 20
for i in range(2000):
    if time.time() > deadline:
        print("still resolving after", i)
        break
    try:
        socket.getaddrinfo("allowed.test", 80, socket.AF_INET, socket.SOCK_STREAM)
    except socket.gaierror:
        print("resolution denied")
        break
    time.sleep(0.01)
else:
    print("still resolving after 2000")
PY
curl -4 -sS --max-time 10 http://allowed.test/after 2>/dev/null; echo "after: $?"
curl -4 -sS --max-time 10 --resolve "allowed.test:80:$ip" http://allowed.test/after-by-address 2>/dev/null; echo "after by address: $?"
exit 3`, fs)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "unshare", "-m", "--propagation", "private", "sh", "-c",
		`mount -t tmpfs -o size=256k,mode=0777 tunwall-audit-test "$1" && shift && exec "$@"`, "sh", fs,
		"ip", "netns", "exec", w.AgentNS, tunwallBin, "run", "--dns-upstream", "192.0.2.53:53",
		"--audit", auditPath, "--allow", "allowed.test:80", "--", "sh", "-c", script)
	cmd.Env = append(os.Environ(), "HOME="+w.dir)
	cmd.WaitDelay = 5 * time.Second
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	r := result{stdout: stdout.String(), stderr: stderr.String()}
	var ee *exec.ExitError
	switch {
	case ctx.Err() != nil:
		t.Fatalf("timed out\n%s", r)
	case errors.As(err, &ee):
		r.code = ee.ExitCode()
	case err != nil:
		t.Fatalf("%v\n%s", err, r)
	}
	t.Logf("%s", r)
	if _, err := os.Stat(filepath.Join(fs, "fill")); err == nil {
		t.Error("the tmpfs leaked out of its private mount namespace")
	}
	// Records were lost (the denials): exitAuditLost, and the command's
	// own status on stderr.
	if r.code != exitAuditLost || !strings.Contains(r.stderr, "the command exited 3; exiting 122") {
		t.Errorf("tunwall exited %d, want %d saying the command's status 3\n%s", r.code, exitAuditLost, r)
	}
	wantLines(t, r, "web allowed.test /before", "filled", "resolution denied", "after: 6", "after by address: 7")
	re := regexp.MustCompile(`tunwall: audit log ` + regexp.QuoteMeta(auditPath) + ` cannot be written: .*; denying new flows`)
	if !re.MatchString(r.stderr) {
		t.Errorf("stderr does not say the audit log cannot be written and new flows are denied:\n%s", r.stderr)
	}
}

func TestHeaderRecordsThePolicyHashAndTheConfigKnobs(t *testing.T) {
	requireTools(t, "curl")
	w := newWorld(t)
	src := []byte(`version: 1
phases:
  exec:
    allow:
      - host: allowed.test
        ports: [80]
`)
	pol := filepath.Join(w.dir, "header-policy.yaml")
	if err := os.WriteFile(pol, src, 0o644); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(src)
	r := w.mustRun(0, runOpts{
		flags:  []string{"--policy", pol, "--sniff-timeout", "250ms"},
		script: `curl -4 -sS --max-time 10 http://allowed.test/h`,
	})
	wantLines(t, r, "web allowed.test /h")
	h := auditRaw(t, r.audit)[0]
	if auditStr(h, "kind") != "header" {
		t.Fatalf("first line is not the header: %v", h)
	}
	if got := auditStr(h, "policy_sha256"); got != hex.EncodeToString(sum[:]) {
		t.Errorf("header policy_sha256 %q, want %x (the policy file's)", got, sum)
	}
	if auditStr(h, "policy") != pol || auditStr(h, "phase") != "exec" {
		t.Errorf("header policy %q phase %q, want %q and exec", auditStr(h, "policy"), auditStr(h, "phase"), pol)
	}
	cfg, _ := h["config"].(map[string]any)
	for k, want := range map[string]string{"learn": "false", "dns_upstream": "192.0.2.53:53", "sniff_timeout": "250ms", "phase": "exec"} {
		if got, _ := cfg[k].(string); !strings.HasPrefix(got, want) {
			t.Errorf("header config[%q] = %q, want %q", k, got, want)
		}
	}
	argv, _ := h["argv"].([]any)
	if !slices.Contains(argv, any("--policy")) || !slices.Contains(argv, any(pol)) {
		t.Errorf("header argv %v does not hold the command line", argv)
	}
	if v := auditStr(h, "version"); v == "" {
		t.Error("header has no tunwall version")
	}
}

// TestEveryLineOfALabelledRunCarriesItsLabels: --label puts the run's
// labels on its header, on every record (allowed and denied flows, DNS,
// http) and on its trailer, and audit summary --by groups by one.
func TestEveryLineOfALabelledRunCarriesItsLabels(t *testing.T) {
	requireTools(t, "curl")
	w := newWorld(t)
	pol := writeSetupPolicy(t, w, "labels.yaml", publicOnlyPolicy)
	script := `curl -s -o /dev/null http://allowed.test/public/x
curl -s -o /dev/null --max-time 5 http://denied.test/ || true
`
	r := w.mustRun(0, runOpts{flags: []string{"--policy", pol, "--label", "task=T-12", "--label", "model=m <1>"}, script: script})
	b, err := os.ReadFile(r.audit)
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]int{}
	for i, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var l struct {
			Kind   string            `json:"kind"`
			Labels map[string]string `json:"labels"`
		}
		if err := json.Unmarshal([]byte(line), &l); err != nil {
			t.Fatalf("line %d: %v", i+1, err)
		}
		kinds[l.Kind]++
		if l.Labels["task"] != "T-12" || l.Labels["model"] != "m <1>" || len(l.Labels) != 2 {
			t.Errorf("line %d (%s) has labels %v", i+1, l.Kind, l.Labels)
		}
	}
	for _, k := range []string{"header", "start", "flow", "dns", "http", "trailer"} {
		if kinds[k] == 0 {
			t.Errorf("no %s line in the log (kinds: %v)", k, kinds)
		}
	}
	out, err := exec.Command(tunwallBin, "audit", "summary", "--by", "task", r.audit).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "task       T-12\n") {
		t.Errorf("audit summary --by task: %v\n%s", err, out)
	}
}
