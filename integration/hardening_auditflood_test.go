package integration

// Attack on the audit log's volume (third review, item 6, first bullet): a
// sandbox that can do nothing but send DNS queries floods tunwall with
// denied queries for distinct long names under many domains, so that no two
// records fold as repeats. Every denied line costs disk; the log must stay
// at a few MiB a minute, while an allowed flow made during the flood keeps
// its own records and the counts still add up.

import (
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The denial budget the README states (Audit log, "Volume bounds"): at
// most floodDenyRate denial lines a second after a burst of floodDenyBurst,
// plus at most one count line a second per kind and verdict; a sample
// name is cut to floodSampleMax bytes, at most floodSamples of them.
const (
	floodDenyRate  = 20
	floodDenyBurst = 10 * floodDenyRate
	floodSamples   = 3
	floodSampleMax = 64
)

// denialFloodPy sends DNS queries for distinct names of three random
// 60-character labels under 61 fixed domains (dNN-flood.test) and, one query
// in four, under a new random domain, 64 in flight, for SECS seconds or CAP
// queries. Half-way it makes one HTTP request to allowed.test (from a
// thread, while the flood goes on). It prints "flood SENT ANSWERED SECONDS"
// and "during BODY".
const denialFloodPy = `python3 - "$@" <<'PY'
import random, socket, struct, sys, threading, time
secs, cap = float(sys.argv[1]), int(sys.argv[2])
def query(name, qid):
    b = struct.pack(">HHHHHH", qid, 0x0100, 1, 0, 0, 0)
    for part in name.split("."):
        b += bytes([len(part)]) + part.encode()
    return b + b"\x00" + struct.pack(">HH", 1, 1)
def label():
    return "%060x" % random.getrandbits(240)
def name(i):
    if i % 4 == 3:
        dom = "z%016x.test" % random.getrandbits(64)
    else:
        dom = "d%02d-flood.test" % (i % 61)
    return "%s.%s.%s.%s" % (label(), label(), label(), dom)
during = {}
def fetch():
    try:
        c = socket.create_connection(("allowed.test", 80), timeout=10)
        c.sendall(b"GET /during-flood HTTP/1.0\r\nHost: allowed.test\r\n\r\n")
        body = b""
        while True:
            d = c.recv(4096)
            if not d:
                break
            body += d
        during["body"] = body.split(b"\r\n\r\n", 1)[-1].decode().strip()
    except Exception as e:
        during["body"] = "error: %r" % (e,)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.connect(("198.18.0.1", 53))
s.settimeout(0.5)
sent = answered = 0
start = time.time()
end = start + secs
t = None
while time.time() < end and sent < cap:
    if t is None and time.time() > start + secs / 2:
        t = threading.Thread(target=fetch)
        t.start()
    for _ in range(64):
        s.send(query(name(sent), sent & 0xffff))
        sent += 1
    for _ in range(64):
        try:
            s.recv(512)
            answered += 1
        except socket.timeout:
            break
if t is not None:
    t.join()
print("flood", sent, answered, round(time.time() - start, 2), flush=True)
print("during", during.get("body"), flush=True)
PY`

// endCounts is the end-of-run line's DNS counts.
var endCounts = regexp.MustCompile(`tunwall: \d+ flows allowed, \d+ denied; (\d+) DNS queries answered, (\d+) denied`)

func TestADenialFloodOfDistinctNamesIsFoldedByDomainAndCostsLittleLog(t *testing.T) {
	requireTools(t, "python3")
	w := newWorld(t)
	// TUNWALL_FLOOD_SECS=60 measures a minute of it (the README's figure).
	secs := 10
	if n, err := strconv.Atoi(os.Getenv("TUNWALL_FLOOD_SECS")); err == nil && n > 0 {
		secs = n
	}
	maxQueries := 40000 * secs
	r := w.mustRun(0, runOpts{
		flags: []string{"--allow", "allowed.test:80"},
		argv:  []string{"sh", "-c", denialFloodPy, "flood", strconv.Itoa(secs), strconv.Itoa(maxQueries)},
	})
	var sent, answered int
	var took float64
	var during string
	for _, l := range lines(r.stdout) {
		if f := strings.Fields(l); len(f) == 4 && f[0] == "flood" {
			sent, _ = strconv.Atoi(f[1])
			answered, _ = strconv.Atoi(f[2])
			took, _ = strconv.ParseFloat(f[3], 64)
		}
		if rest, ok := strings.CutPrefix(l, "during "); ok {
			during = rest
		}
	}
	st, err := os.Stat(r.audit)
	if err != nil {
		t.Fatal(err)
	}
	all := auditRaw(t, r.audit)
	perMin := float64(st.Size()) / max(r.elapsed.Seconds(), 1) * 60 / (1 << 20)
	t.Logf("flood: %d queries sent, %d answered in %.1fs; tunwall ran %v; audit log %d lines, %d bytes (%.2f MiB, %.2f MiB a minute)",
		sent, answered, took, r.elapsed.Round(time.Millisecond), len(all), st.Size(), float64(st.Size())/(1<<20), perMin)
	if answered < 20000 {
		t.Fatalf("the flood was too slow to test the bound: %d answers\n%s", answered, r)
	}

	// The bound: the denial budget, one count line a second per kind
	// and verdict (flow, dns, http; both verdicts), the allowed flow's
	// records, header and trailer. A line of this flood is under 1 KiB.
	secsRun := int(r.elapsed/time.Second) + 2
	maxLines := floodDenyBurst + floodDenyRate*secsRun + 6*secsRun + 20
	maxBytes := int64(maxLines) << 10
	if len(all) > maxLines || st.Size() > maxBytes {
		t.Errorf("a %v flood of %d distinct denied names wrote %d lines, %d bytes (%.1f MiB a minute); the bound is %d lines, %d bytes",
			r.elapsed.Round(time.Millisecond), answered, len(all), st.Size(), perMin, maxLines, maxBytes)
	}

	// The allowed flow made during the flood: answered, and recorded one
	// by one (its start and its flow, with no count).
	if during != "web allowed.test /during-flood" {
		t.Errorf("the request to allowed.test during the flood got %q", during)
	}
	var starts, flows int
	var deniedDNS, folded, withSamples int
	for _, m := range all {
		host := auditStr(m, "host")
		switch {
		case auditStr(m, "kind") == "start" && host == "allowed.test":
			starts++
		case auditStr(m, "kind") == "flow" && host == "allowed.test" && auditStr(m, "verdict") == "allow":
			flows++
			if auditNum(m, "count") > 0 {
				t.Errorf("an allowed flow was folded: %v", m)
			}
		case auditStr(m, "kind") == "dns" && auditStr(m, "verdict") == "deny":
			deniedDNS += auditCount(m)
			if auditNum(m, "count") > 0 {
				folded++
			}
			samples, _ := m["samples"].([]any)
			if len(samples) == 0 {
				continue
			}
			withSamples++
			if len(samples) > floodSamples {
				t.Errorf("a folded record with %d samples, want at most %d: %v", len(samples), floodSamples, m)
			}
			for _, s := range samples {
				if str, _ := s.(string); len(str) > floodSampleMax || !strings.HasSuffix(host, ".test") {
					t.Errorf("sample %q (%d bytes) of a record folded under %q: want at most %d bytes, under a .test domain", str, len(str), host, floodSampleMax)
				}
			}
		}
	}
	if starts != 1 || flows != 1 {
		t.Errorf("the flow to allowed.test during the flood has %d start and %d flow records, want 1 and 1", starts, flows)
	}
	if withSamples == 0 {
		t.Errorf("no denial was folded by domain (no record with samples); %d folded records", folded)
	}

	// The counts add up: in the log, in `audit summary` and in the
	// end-of-run line, every answered query is counted once.
	if deniedDNS < answered || deniedDNS > sent {
		t.Errorf("the log counts %d denied queries; the sandbox sent %d and got %d answers", deniedDNS, sent, answered)
	}
	if m := endCounts.FindStringSubmatch(r.stderr); m == nil || m[2] != strconv.Itoa(deniedDNS) {
		t.Errorf("the end-of-run line does not count the %d denied queries the log holds: %q", deniedDNS, m)
	}
	if out, errOut, code := auditCLI(t, nil, "audit", "verify", r.audit); code != 0 {
		t.Errorf("verify of the flooded log: exit %d\n%s%s", code, out, errOut)
	}
	sum, errOut, code := auditCLI(t, nil, "audit", "summary", r.audit)
	if code != 0 || !regexp.MustCompile(fmt.Sprintf(`(?m)^dns +\d+ allowed, %d denied$`, deniedDNS)).MatchString(sum) || !strings.Contains(sum, "integrity  ok") {
		t.Errorf("summary does not count the %d denied queries, or the chain: exit %d\n%s%s", deniedDNS, code, sum, errOut)
	}
}
