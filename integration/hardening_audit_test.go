package integration

// Attacks on the audit log (red-team issue "Close the ways out", items 9
// and the audit part of 7): a whole run deleted from a multi-run file, a
// run rewritten whole, tunwall killed with a flow open, a sandbox flooding
// the log with DNS queries, and the size cap and rate bound reached. Every
// log comes from a real `tunwall run` in the test world; tampering is done
// in Go on copies.

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The rate bound the flood tests set (`--audit-max-rate auditDefaultRate`,
// README, "Audit log"): a line budget of auditDefaultRate lines/s with a
// burst of auditDefaultBurst lines (10 s of them), of which repeatable
// records (DNS answers, denials) may use the upper half, and a fold window
// of one second. (The default rate is higher, 10000 lines/s, more than a
// few seconds of this machine's flood could reach.)
const (
	auditDefaultRate  = 1000
	auditDefaultBurst = 10 * auditDefaultRate
)

// auditEndHash is the full last hash the end-of-run line prints.
var auditEndHash = regexp.MustCompile(`last sha256 ([0-9a-f]+)\)`)

// auditLinesOf returns the raw lines of a log file.
func auditLinesOf(t *testing.T, path string) [][]byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return auditSplit(b)
}

func auditWrite(t *testing.T, path string, ls [][]byte) {
	t.Helper()
	var b []byte
	for _, l := range ls {
		b = append(b, l...)
		b = append(b, '\n')
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

func auditKind(l []byte) string {
	var m struct {
		Kind string `json:"kind"`
	}
	json.Unmarshal(l, &m)
	return m.Kind
}

func hexSHA(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

// auditCount is what a record stands for: its count, or 1 without one.
func auditCount(m map[string]any) int {
	if n := auditNum(m, "count"); n > 0 {
		return int(n)
	}
	return 1
}

// verifyFails runs `tunwall audit verify` on path and wants a failure
// naming line with a message containing msg.
func verifyFails(t *testing.T, path string, line int, msg string, extra ...string) {
	t.Helper()
	out, errOut, code := auditCLI(t, nil, append([]string{"audit", "verify", path}, extra...)...)
	prefix := fmt.Sprintf("%s:%d: ", path, line)
	if code != 1 || !strings.HasPrefix(errOut, prefix) || !strings.Contains(errOut, msg) {
		t.Errorf("audit verify %s: want exit 1 and %q...%q on stderr, got exit %d\nstdout: %sstderr: %s",
			strings.Join(append([]string{path}, extra...), " "), prefix, msg, code, out, errOut)
	}
}

// auditSaid counts tunwall's own lines about its audit log (not denial
// lines, whose reasons may repeat the words) that contain what.
func auditSaid(stderr, what string) int {
	n := 0
	for _, l := range lines(stderr) {
		if strings.HasPrefix(l, "tunwall: audit log ") && strings.Contains(l, what) && strings.Contains(l, "denied") {
			n++
		}
	}
	return n
}

func TestAuditChainCatchesAWholeRunDeletedFromAMultiRunFile(t *testing.T) {
	requireTools(t, "curl")
	w := newWorld(t)
	path := filepath.Join(w.dir, "multi.jsonl")
	var runs []string
	for i := range 3 {
		r := w.mustRun(0, runOpts{
			flags:  []string{"--audit", path, "--allow", "allowed.test:80"},
			script: fmt.Sprintf(`curl -4 -sS --max-time 10 http://allowed.test/run%d`, i),
		})
		wantLines(t, r, fmt.Sprintf("web allowed.test /run%d", i))
		all := auditRaw(t, path)
		runs = append(runs, auditStr(all[len(all)-1], "run"))
	}
	out, errOut, code := auditCLI(t, nil, "audit", "verify", path)
	if code != 0 || !strings.Contains(out, runs[2]) {
		t.Fatalf("the intact 3-run file does not verify: exit %d\n%s%s", code, out, errOut)
	}
	ls := auditLinesOf(t, path)
	var heads []int // 0-based line index of each run's header
	for i, l := range ls {
		if auditKind(l) == "header" {
			heads = append(heads, i)
		}
	}
	if len(heads) != 3 || auditKind(ls[heads[1]-1]) != "trailer" || auditKind(ls[len(ls)-1]) != "trailer" {
		t.Fatalf("want 3 runs, each header..trailer, got headers at %v\n%s", heads, auditDump(auditRaw(t, path)))
	}
	// The header of a run appended to a file chains to the line before it.
	for _, h := range heads[1:] {
		var m map[string]any
		json.Unmarshal(ls[h], &m)
		if got, want := auditStr(m, "prev"), hexSHA(ls[h-1]); got != want {
			t.Errorf("header on line %d has prev %s, want the hash of line %d (%s)", h+1, got, h, want)
		}
	}

	t.Run("the middle run deleted whole is named at the header that follows it", func(t *testing.T) {
		p := filepath.Join(w.dir, "no-middle.jsonl")
		auditWrite(t, p, append(cloneAll(ls[:heads[1]]), cloneAll(ls[heads[2]:])...))
		verifyFails(t, p, heads[1]+1, "removed")
	})
	t.Run("the first run deleted whole is found at line 1", func(t *testing.T) {
		p := filepath.Join(w.dir, "no-first.jsonl")
		auditWrite(t, p, cloneAll(ls[heads[1]:]))
		verifyFails(t, p, 1, "head of the log was cut")
	})
	t.Run("two runs swapped are found", func(t *testing.T) {
		p := filepath.Join(w.dir, "swapped.jsonl")
		swapped := append(cloneAll(ls[:heads[1]]), cloneAll(ls[heads[2]:])...)
		swapped = append(swapped, cloneAll(ls[heads[1]:heads[2]])...)
		auditWrite(t, p, swapped)
		verifyFails(t, p, heads[1]+1, "does not chain")
	})
	t.Run("the last run's trailer cut is found at the new last line", func(t *testing.T) {
		p := filepath.Join(w.dir, "no-trailer.jsonl")
		auditWrite(t, p, cloneAll(ls[:len(ls)-1]))
		verifyFails(t, p, len(ls)-1, "without a trailer")
	})
}

func cloneAll(ls [][]byte) [][]byte {
	out := make([][]byte, len(ls))
	for i, l := range ls {
		out[i] = append([]byte(nil), l...)
	}
	return out
}

// rechain rewrites every prev (and the trailers' last) so that the lines
// form a valid chain again: what a forger with write access to the file
// does after editing it.
func rechain(t *testing.T, ls [][]byte) [][]byte {
	t.Helper()
	prevRe := regexp.MustCompile(`"prev":"[0-9a-f]{64}"`)
	lastRe := regexp.MustCompile(`"last":"[0-9a-f]{64}"`)
	out := cloneAll(ls)
	for i := range out {
		if i == 0 {
			continue
		}
		want := hexSHA(out[i-1])
		out[i] = prevRe.ReplaceAll(out[i], []byte(`"prev":"`+want+`"`))
		if auditKind(out[i]) == "trailer" {
			out[i] = lastRe.ReplaceAll(out[i], []byte(`"last":"`+want+`"`))
		}
	}
	return out
}

func TestAuditVerifyExpectPinsTheRunTheEndOfRunLinePrinted(t *testing.T) {
	requireTools(t, "curl")
	w := newWorld(t)
	path := filepath.Join(w.dir, "pinned.jsonl")
	r := w.mustRun(0, runOpts{
		flags: []string{"--audit", path, "--allow", "allowed.test:80"},
		script: `curl -4 -sS --max-time 10 http://allowed.test/pin
curl -4 -sS --max-time 10 http://evil.test/ 2>/dev/null; echo "evil: $?"`,
	})
	wantLines(t, r, "web allowed.test /pin", "evil: 6")
	m := auditEndHash.FindStringSubmatch(r.stderr)
	if m == nil || len(m[1]) != 64 {
		t.Fatalf("the end-of-run line does not print the full SHA-256 of the last line (got %q)\n%s", m, r.stderr)
	}
	anchor := m[1]
	ls := auditLinesOf(t, path)
	if got := hexSHA(ls[len(ls)-1]); got != anchor {
		t.Fatalf("printed hash %s is not the hash of the log's last line %s", anchor, got)
	}
	if !strings.Contains(r.stderr, "--expect "+anchor) {
		t.Errorf("the end-of-run line does not say how to check the log against the hash:\n%s", r.stderr)
	}
	if out, errOut, code := auditCLI(t, nil, "audit", "verify", path, "--expect", anchor); code != 0 || !strings.Contains(out, "anchor") {
		t.Fatalf("verify --expect with the printed hash: exit %d\n%s%s", code, out, errOut)
	}

	// The forger turns the denied evil.test query into an allowed one and
	// rewrites the whole run so the chain is intact again.
	forged := cloneAll(ls)
	edited := false
	for i, l := range forged {
		if strings.Contains(string(l), `"qname":"evil.test"`) {
			forged[i] = []byte(strings.Replace(string(l), `"verdict":"deny"`, `"verdict":"allow"`, 1))
			edited = edited || string(forged[i]) != string(l)
		}
	}
	if !edited {
		t.Fatalf("no denied evil.test query to forge\n%s", auditDump(auditRaw(t, path)))
	}
	forged = rechain(t, forged)
	p := filepath.Join(w.dir, "forged.jsonl")
	auditWrite(t, p, forged)
	if out, errOut, code := auditCLI(t, nil, "audit", "verify", p); code != 0 {
		t.Fatalf("the re-chained forgery should pass a plain verify (that is what the anchor is for): exit %d\n%s%s", code, out, errOut)
	}
	out, errOut, code := auditCLI(t, nil, "audit", "verify", p, "--expect", anchor)
	if code != 1 || !strings.Contains(errOut, anchor) || !strings.Contains(out, "FAILED") {
		t.Errorf("verify --expect with the real hash must reject the re-chained forgery: exit %d\n%s%s", code, out, errOut)
	}

	// A later run appended to the file keeps the anchor valid: it pins
	// everything up to the line it names.
	r2 := w.mustRun(0, runOpts{
		flags:  []string{"--audit", path, "--allow", "allowed.test:80"},
		script: `curl -4 -sS --max-time 10 http://allowed.test/later`,
	})
	wantLines(t, r2, "web allowed.test /later")
	anchor2 := auditEndHash.FindStringSubmatch(r2.stderr)
	if anchor2 == nil {
		t.Fatalf("no hash printed by the second run\n%s", r2.stderr)
	}
	if out, errOut, code := auditCLI(t, nil, "audit", "verify", path, "--expect", anchor, "--expect", anchor2[1]); code != 0 {
		t.Errorf("verify --expect of both runs' hashes on the 2-run file: exit %d\n%s%s", code, out, errOut)
	}
	if _, errOut, code := auditCLI(t, nil, "audit", "verify", path, "--expect", "abc"); code != 2 || !strings.Contains(errOut, "64") {
		t.Errorf("verify --expect abc: want a usage error (exit 2) saying a hash is 64 hex digits, got %d\n%s", code, errOut)
	}
}

func TestAFlowOpenWhenTunwallIsKilledLeavesItsStartRecord(t *testing.T) {
	requireTools(t, "python3", "curl")
	w := newWorld(t)
	path := filepath.Join(w.dir, "killed.jsonl")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// The sandbox opens a connection to the echo server, proves it works,
	// says "open" and keeps it open (bounded: 60s).
	cmd, _ := w.tunwallCmd(ctx, runOpts{
		flags: []string{"--audit", path, "--allow", "echo.test:7"},
		script: `python3 - <<'PY'
import socket, sys, time
s = socket.create_connection(("echo.test", 7), timeout=10)
s.sendall(b"hello\n")
assert s.recv(100) == b"hello\n"
print("open", flush=True)
s.settimeout(60)
try:
    s.recv(100)
except Exception:
    pass
PY`,
	}, "run")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	killed := false
	defer func() {
		if !killed {
			cmd.Process.Kill()
			cmd.Wait()
		}
	}()
	sc := bufio.NewScanner(stdout)
	if !sc.Scan() || sc.Text() != "open" {
		t.Fatalf("the sandbox did not open its connection: %q %v\n%s", sc.Text(), sc.Err(), stderr.String())
	}
	// ip netns exec execs tunwall in place: the child is tunwall itself.
	comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", cmd.Process.Pid))
	if strings.TrimSpace(string(comm)) != "tunwall" {
		t.Fatalf("pid %d is %q, not tunwall", cmd.Process.Pid, comm)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	killed = true
	t.Logf("tunwall killed; its stderr:\n%s", stderr.String())

	all := auditRaw(t, path)
	run := auditStr(all[0], "run")
	var starts, ends []map[string]any
	for _, m := range all {
		if auditNum(m, "port") != 7 {
			continue
		}
		switch auditStr(m, "kind") {
		case "start":
			starts = append(starts, m)
		case "flow":
			ends = append(ends, m)
		}
	}
	if len(starts) != 1 || len(ends) != 0 {
		t.Fatalf("want exactly one start record and no flow record for the open echo.test:7 flow, got %d and %d\n%s",
			len(starts), len(ends), auditDump(all))
	}
	s := starts[0]
	if auditStr(s, "host") != "echo.test" || auditStr(s, "verdict") != "allow" || auditStr(s, "proto") != "tcp" ||
		auditStr(s, "host_from") != "dns" || auditStr(s, "src") == "" || auditStr(s, "dst") == "" || auditStr(s, "rule") == "" {
		t.Errorf("start record does not say what opened: %v", s)
	}
	if k := auditStr(all[len(all)-1], "kind"); k == "trailer" {
		t.Fatalf("a killed run has a trailer?\n%s", auditDump(all))
	}

	// verify says the run ended without a trailer, and that the lines up to
	// there chain: not "corrupt".
	out, errOut, code := auditCLI(t, nil, "audit", "verify", path)
	if code != 1 || !strings.Contains(errOut, "run "+run+" ended without a trailer") || !strings.Contains(errOut, "killed") ||
		!strings.Contains(out, fmt.Sprintf("lines 1..%d chain", len(all))) {
		t.Errorf("verify of the killed run: want exit 1 naming run %s as ended without a trailer (killed?) and its %d lines intact, got exit %d\n%s%s",
			run, len(all), code, out, errOut)
	}
	sum, errOut, code := auditCLI(t, nil, "audit", "summary", path)
	// Exit 1, as verify: the run has no trailer (README, Exit status).
	if code != 1 || !strings.Contains(sum, "1 flow started and never ended") || !strings.Contains(sum, "echo.test") {
		t.Errorf("summary of the killed run does not report the open flow: exit %d\n%s%s", code, sum, errOut)
	}

	// A later run appended to the same file chains to the killed run's last
	// line; verify then accepts the file and still names the killed run.
	r := w.mustRun(0, runOpts{
		flags:  []string{"--audit", path, "--allow", "allowed.test:80"},
		script: `curl -4 -sS --max-time 10 http://allowed.test/after-kill`,
	})
	wantLines(t, r, "web allowed.test /after-kill")
	out, errOut, code = auditCLI(t, nil, "audit", "verify", path)
	if code != 0 || !strings.Contains(out, "run "+run+" (lines 1..") || !strings.Contains(out, "ended without a trailer (tunwall was killed?)") {
		t.Errorf("verify after a new run: want exit 0 with a note that run %s ended without a trailer, got exit %d\n%s%s", run, code, out, errOut)
	}
}

// dnsFlood is a python3 script that sends DNS queries to the sandbox's
// resolver as fast as tunwall answers them, 64 in flight: first the same
// denied name for SAME seconds, then random denied names for RAND seconds
// (each phase also stops at 60000 queries). It prints what it sent and
// how many answers came back.
func dnsFlood(sameSecs, randSecs int) string {
	return fmt.Sprintf(`python3 - %d %d <<'PY'
import os, random, socket, struct, sys, time
same_s, rand_s = float(sys.argv[1]), float(sys.argv[2])
def query(name, qid):
    b = struct.pack(">HHHHHH", qid, 0x0100, 1, 0, 0, 0)
    for part in name.split("."):
        b += bytes([len(part)]) + part.encode()
    return b + b"\x00" + struct.pack(">HH", 1, 1)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.connect(("198.18.0.1", 53))
s.settimeout(0.5)
def flood(label, secs, name):
    sent = answered = 0
    end = time.time() + secs
    while time.time() < end and sent < 60000:
        for _ in range(64):
            s.send(query(name(), sent & 0xffff))
            sent += 1
        for _ in range(64):
            try:
                s.recv(512)
                answered += 1
            except socket.timeout:
                break
    print(label, sent, answered, flush=True)
flood("same", same_s, lambda: "flood-same.evil.test")
flood("random", rand_s, lambda: "r%%016x.evil.test" %% random.getrandbits(64))
PY`, sameSecs, randSecs)
}

// floodCounts parses dnsFlood's output: label -> [sent, answered].
func floodCounts(t *testing.T, stdout string) map[string][2]int {
	t.Helper()
	out := map[string][2]int{}
	for _, l := range lines(stdout) {
		f := strings.Fields(l)
		if len(f) == 3 && (f[0] == "same" || f[0] == "random") {
			a, _ := strconv.Atoi(f[1])
			b, _ := strconv.Atoi(f[2])
			out[f[0]] = [2]int{a, b}
		}
	}
	return out
}

func TestADNSFloodIsFoldedAndTheAuditLogStaysBounded(t *testing.T) {
	requireTools(t, "python3")
	w := newWorld(t)
	const sameSecs, randSecs = 4, 4
	r := w.mustRun(0, runOpts{
		flags:  []string{"--allow", "allowed.test:80", "--audit-max-rate", strconv.Itoa(auditDefaultRate)},
		script: dnsFlood(sameSecs, randSecs),
	})
	c := floodCounts(t, r.stdout)
	same, random := c["same"], c["random"]
	t.Logf("flood: same name %d sent, %d answered; random names %d sent, %d answered; tunwall ran %v",
		same[0], same[1], random[0], random[1], r.elapsed)
	// The flood must be a flood: more queries than the bound allows lines.
	bound := auditDefaultBurst/2 + auditDefaultRate*int(r.elapsed/time.Second+1) + 200
	if random[1] < bound || same[1] < bound {
		t.Fatalf("the flood was too slow to test the bound (%d and %d answers, bound %d lines)", same[1], random[1], bound)
	}
	st, err := os.Stat(r.audit)
	if err != nil {
		t.Fatal(err)
	}
	all := auditRaw(t, r.audit)
	t.Logf("audit log: %d lines, %d bytes", len(all), st.Size())
	if len(all) > bound {
		t.Errorf("the flood of %d queries made %d audit lines (%d bytes); the documented bound for %v is %d lines",
			same[0]+random[0], len(all), st.Size(), r.elapsed, bound)
	}

	// The repeated name is folded: a few records whose counts add up to
	// every query tunwall answered.
	var sameLines, sameCount, dnsDenied int
	for _, m := range auditRecordsOnly(all) {
		if auditStr(m, "kind") != "dns" {
			continue
		}
		if auditStr(m, "verdict") == "deny" {
			dnsDenied += auditCount(m)
		}
		if auditStr(m, "qname") == "flood-same.evil.test" {
			sameLines++
			sameCount += auditCount(m)
			if auditNum(m, "count") > 0 && auditStr(m, "until") == "" {
				t.Errorf("a folded record without the end of its window: %v", m)
			}
		}
	}
	if sameLines == 0 || sameLines > sameSecs+int(r.elapsed/time.Second)+3 {
		t.Errorf("the repeated name has %d records; want it folded into one per second", sameLines)
	}
	if sameCount < same[1] || sameCount > same[0] {
		t.Errorf("the repeated name's records count %d queries; the sandbox sent %d and got %d answers", sameCount, same[0], same[1])
	}
	if dnsDenied < same[1]+random[1] || dnsDenied > same[0]+random[0] {
		t.Errorf("the log counts %d denied queries; the sandbox sent %d and got %d answers", dnsDenied, same[0]+random[0], same[1]+random[1])
	}
	if out, errOut, code := auditCLI(t, nil, "audit", "verify", r.audit); code != 0 {
		t.Errorf("verify of the flooded log: exit %d\n%s%s", code, out, errOut)
	}
	sum, errOut, code := auditCLI(t, nil, "audit", "summary", r.audit)
	if code != 0 || !strings.Contains(sum, fmt.Sprintf("dns        0 allowed, %d denied", dnsDenied)) {
		t.Errorf("summary does not count the folded queries (want %d denied): exit %d\n%s%s", dnsDenied, code, sum, errOut)
	}
	// Nor is the terminal flooded: denial lines on stderr are bounded too.
	n := strings.Count(r.stderr, "tunwall: denied")
	t.Logf("%d denial lines on stderr", n)
	if n > 200 || !strings.Contains(r.stderr, "more denials not shown") {
		t.Errorf("%d denial lines on stderr for one flood, and no count of those not shown", n)
	}
}

func TestATinyAuditCapIsHitNewFlowsAreDeniedAndItIsSaid(t *testing.T) {
	requireTools(t, "python3", "curl", "getent")
	w := newWorld(t)
	const capBytes = 64 << 10
	r := w.mustRun(0, runOpts{
		flags: []string{"--audit-max-size", "64KiB", "--allow", "allowed.test:80"},
		script: `curl -4 -sS --max-time 10 http://allowed.test/before
ip=$(getent ahostsv4 allowed.test | awk 'NR==1 {print $1}')
(
` + dnsFlood(1, 3) + `
) >/dev/null
curl -4 -sS --max-time 10 http://allowed.test/after 2>/dev/null; echo "after: $?"
curl -4 -sS --max-time 10 --resolve "allowed.test:80:$ip" http://allowed.test/by-address 2>/dev/null; echo "by address: $?"`,
	})
	wantLines(t, r, "web allowed.test /before", "after: 6", "by address: 7")
	if n := auditSaid(r.stderr, "size cap"); n != 1 {
		t.Errorf("want stderr to say once that the audit size cap was reached, said %d times:\n%s", n, r.stderr)
	}
	st, err := os.Stat(r.audit)
	if err != nil {
		t.Fatal(err)
	}
	if st.Size() > capBytes+16<<10 {
		t.Errorf("the log is %d bytes, over the %d byte cap (plus 16 KiB for what closes the run)", st.Size(), capBytes)
	}
	all := auditRaw(t, r.audit)
	var limit map[string]any
	after := 0
	for _, m := range all {
		if auditStr(m, "kind") == "limit" && limit == nil {
			limit = m
		}
		if limit != nil && auditStr(m, "kind") != "limit" && auditStr(m, "kind") != "trailer" {
			after += auditCount(m)
		}
	}
	if limit == nil || !strings.Contains(auditStr(limit, "reason"), "denied") {
		t.Fatalf("no limit record saying the cap was reached and new flows are denied\n%s", auditDump(all[len(all)-5:]))
	}
	if auditStr(all[len(all)-1], "kind") != "trailer" {
		t.Errorf("the capped run does not end with its trailer")
	}
	if after == 0 {
		t.Errorf("nothing after the cap is counted, though the flood went on")
	}
	if out, errOut, code := auditCLI(t, nil, "audit", "verify", r.audit); code != 0 {
		t.Errorf("verify of the capped log: exit %d\n%s%s", code, out, errOut)
	}
	t.Logf("capped log: %d lines, %d bytes; %d queries and flows counted after the cap", len(all), st.Size(), after)
}

func TestAuditRateBoundDeniesNewFlowsAndSaysSo(t *testing.T) {
	requireTools(t, "python3")
	w := newWorld(t)
	// 20 lines/s: a burst of 200 lines, 2 per allowed flow (start, end).
	r := w.mustRun(0, runOpts{
		flags: []string{"--audit-max-rate", "20", "--allow", "echo.test:80"},
		script: `python3 - <<'PY'
import socket, time
# Resolve once: every failure below is then a refused connection.
addr = socket.getaddrinfo("echo.test", 80, socket.AF_INET, socket.SOCK_STREAM)[0][4]
ok = failed = 0
end = time.time() + 20
for i in range(400):
    if time.time() > end:
        break
    try:
        s = socket.create_connection(addr, timeout=5)
        s.sendall(b"x")
        if s.recv(10) == b"ok\n":
            ok += 1
        else:
            failed += 1
        s.close()
    except OSError:
        failed += 1
print("ok", ok, "failed", failed)
PY`,
	})
	var ok, failed int
	if _, err := fmt.Sscanf(strings.TrimSpace(r.stdout), "ok %d failed %d", &ok, &failed); err != nil {
		t.Fatalf("bad output: %v\n%s", err, r)
	}
	t.Logf("%d connections worked, %d were refused", ok, failed)
	if ok == 0 || failed == 0 {
		t.Fatalf("want some connections to work and the rest refused by the rate bound, got ok %d failed %d\n%s", ok, failed, r)
	}
	if n := auditSaid(r.stderr, "rate bound"); n != 1 {
		t.Errorf("want stderr to say once that the audit rate bound denies new flows, said %d times:\n%s", n, r.stderr)
	}
	all := auditRaw(t, r.audit)
	var starts, allowed, denied int
	var limit bool
	for _, m := range all {
		switch {
		case auditStr(m, "kind") == "limit":
			limit = true
		case auditStr(m, "kind") == "start":
			starts++
		case auditStr(m, "kind") == "flow" && auditStr(m, "verdict") == "allow":
			allowed++
			if auditStr(m, "outcome") != "ok" {
				t.Errorf("allowed flow with outcome %q: %v", auditStr(m, "outcome"), m)
			}
		case auditStr(m, "kind") == "flow":
			denied += auditCount(m)
		}
	}
	if !limit {
		t.Error("no limit record in the log")
	}
	if starts != ok || allowed != ok || denied != failed {
		t.Errorf("the log has %d starts, %d allowed and %d denied flows; the sandbox saw %d work and %d refused",
			starts, allowed, denied, ok, failed)
	}
	if out, errOut, code := auditCLI(t, nil, "audit", "verify", r.audit); code != 0 {
		t.Errorf("verify: exit %d\n%s%s", code, out, errOut)
	}
}
