package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// waitFileSh is a shell function that waits (at most 30 s) for a file.
const waitFileSh = `waitfile() { n=0; while [ ! -e "$1" ] && [ $n -lt 600 ]; do sleep 0.05; n=$((n+1)); done; }
`

// TestAPhaseSwitchCutsADownloadFromASetupOnlyHost is the two-phase agent
// of the seed article in one sandbox: a download from a host only the
// setup phase allows is running when the user switches to exec. The
// download must be cut within a second (reset, not ended as if complete),
// a new connection to that host refused, the exec host still reachable,
// and the chain must show the phase record (who asked) and the flow
// revoked.
func TestAPhaseSwitchCutsADownloadFromASetupOnlyHost(t *testing.T) {
	w := newWorld(t)
	requireTools(t, "python3", "curl")
	xdg := filepath.Join(w.dir, "xdg-phase")
	if err := os.Mkdir(xdg, 0o700); err != nil {
		t.Fatal(err)
	}
	pol := filepath.Join(w.dir, "phase-policy.yaml")
	if err := os.WriteFile(pol, []byte(`version: 1
phases:
  setup:
    allow:
      - host: allowed.test
        ports: [80]
      - host: other.test
        ports: [80]
      - host: echo.test
        ports: [7]
        proto: udp
  exec:
    allow:
      - host: other.test
        ports: [80]
`), 0o644); err != nil {
		t.Fatal(err)
	}
	auditPath := filepath.Join(w.dir, "phase-audit.jsonl")
	release := filepath.Join(w.dir, "release-phase")
	// The download reads slowly (bounded: 20 s at most), so that it is
	// surely running when the switch comes, and says when and how it ended.
	dl := `import socket, time
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.connect(("echo.test", 7))
u.settimeout(5)
u.send(b"one")
print("UDP1", u.recv(10).decode(), flush=True)
s = socket.create_connection(("allowed.test", 80))
fake = s.getpeername()[0]
s.sendall(b"GET /bytes/1000000000 HTTP/1.1\r\nHost: allowed.test\r\n\r\n")
got = 0
while got < 1000000:
    b = s.recv(65536)
    if not b: break
    got += len(b)
print("DOWNLOADING", flush=True)
end, how = time.time() + 20, "not cut"
while time.time() < end:
    try:
        b = s.recv(65536)
    except OSError as e:
        how = "error " + type(e).__name__
        break
    if not b:
        how = "eof"
        break
    time.sleep(0.01)
print("ENDED %.3f %s" % (time.time(), how), flush=True)
u.settimeout(2)
u.send(b"two")
try:
    print("UDP2 answered", u.recv(10).decode(), flush=True)
except OSError as e:
    print("UDP2 none", type(e).__name__, flush=True)
try:
    socket.getaddrinfo("allowed.test", 80)
    print("NAME resolves", flush=True)
except OSError as e:
    print("NAME refused", type(e).__name__, flush=True)
try:
    c = socket.create_connection((fake, 80), timeout=5)
    c.sendall(b"GET / HTTP/1.0\r\nHost: allowed.test\r\n\r\n")
    print("NEW", c.recv(100)[:12], flush=True)
except OSError as e:
    print("NEW refused", type(e).__name__, flush=True)
`
	script := waitFileSh + fmt.Sprintf(`python3 -c '%s'
curl -sS --max-time 5 http://other.test/ >/dev/null && echo EXEC ok
echo DONE; waitfile %s`, dl, release)
	o := runOpts{flags: []string{"--policy", pol, "--phase", "setup", "--audit", auditPath}, script: script,
		env: []string{"XDG_RUNTIME_DIR=" + xdg}}
	var switched time.Time
	var phaseOut string
	out, _ := w.runWithCtlMarks(t, o, map[string]func(ctx context.Context){
		"DOWNLOADING": func(ctx context.Context) {
			// ctl flows --watch --json: a listing a second, each with the
			// download and what it moved so far.
			wctx, cancel := context.WithTimeout(ctx, 2500*time.Millisecond)
			watched, _ := w.ctl(wctx, o, "flows", "--watch", "--json")
			cancel()
			var listings int
			for _, l := range strings.Split(strings.TrimSpace(watched), "\n") {
				var fl []struct {
					Host    string `json:"host"`
					BytesIn int64  `json:"bytes_in"`
				}
				if json.Unmarshal([]byte(l), &fl) == nil {
					listings++
					found := false
					for _, f := range fl {
						found = found || f.Host == "allowed.test" && f.BytesIn >= 1000000
					}
					if !found {
						t.Errorf("ctl flows --watch listed %s, want the download with at least 1 MB in", l)
					}
				}
			}
			if listings < 2 {
				t.Errorf("ctl flows --watch --json printed %d listings in 2.5 s, want 2 or more:\n%s", listings, watched)
			}
			var err error
			phaseOut, err = w.ctl(ctx, o, "phase", "exec")
			switched = time.Now()
			if err != nil {
				t.Errorf("ctl phase exec: %v\n%s", err, phaseOut)
			}
		},
		"DONE": func(ctx context.Context) {
			if st := w.ctlStatus(t, ctx, o); st.Phase != "exec" {
				t.Errorf("ctl status after the switch: phase %q, want exec", st.Phase)
			}
			os.WriteFile(release, nil, 0o644)
		},
	}, release)
	if !strings.Contains(phaseOut, "phase setup -> exec") || !strings.Contains(phaseOut, "2 open flows revoked") || !strings.Contains(phaseOut, "allowed.test") ||
		!strings.Contains(phaseOut, "- allow allowed.test:80/tcp") || !strings.Contains(phaseOut, "- allow echo.test:7/udp") {
		t.Errorf("ctl phase exec said:\n%s", phaseOut)
	}
	var endedAt float64
	var how string
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) >= 3 && f[0] == "ENDED" {
			endedAt, _ = strconv.ParseFloat(f[1], 64)
			how = strings.Join(f[2:], " ")
		}
	}
	if how != "error ConnectionResetError" {
		t.Errorf("the download ended %q, want reset (ConnectionResetError)\n%s", how, out)
	}
	if lag := endedAt - float64(switched.UnixNano())/1e9; endedAt == 0 || lag > 1 {
		t.Errorf("the download ended %.3f s after the switch returned, want within 1 s\n%s", lag, out)
	}
	if !strings.Contains(out, "NAME refused") {
		t.Errorf("the setup-only host's name still resolved after the switch:\n%s", out)
	}
	if !strings.Contains(out, "NEW refused ConnectionRefusedError") {
		t.Errorf("a new connection to the fake address tunwall gave the setup-only host was not refused after the switch:\n%s", out)
	}
	if !strings.Contains(out, "UDP1 one") || !strings.Contains(out, "UDP2 none") {
		t.Errorf("want the UDP session answered before the switch and cut after it:\n%s", out)
	}
	if !strings.Contains(out, "EXEC ok") {
		t.Errorf("the exec host was not reachable after the switch:\n%s", out)
	}

	lines := auditRaw(t, auditPath)
	phases := auditOfKind(lines, "phase")
	if len(phases) != 1 {
		t.Fatalf("%d phase records, want 1:\n%s", len(phases), auditDump(lines))
	}
	ph := phases[0]
	if ph["phase"] != "exec" || ph["rule"] != "ctl phase" || !strings.Contains(fmt.Sprint(ph["reason"]), "setup -> exec") ||
		ph["pid"] == float64(0) || !strings.Contains(fmt.Sprint(ph["exe"]), "tunwall") {
		t.Errorf("the phase record does not say what changed and who asked: %v", ph)
	}
	revoked := auditFind(lines, func(m map[string]any) bool {
		return m["kind"] == "flow" && m["host"] == "allowed.test" && m["outcome"] == "revoked"
	})
	if len(revoked) != 1 || revoked[0]["phase"] != "setup" {
		t.Errorf("want one flow to allowed.test revoked, decided in setup: %v\n%s", revoked, auditDump(lines))
	}
	udp := auditFind(lines, func(m map[string]any) bool {
		return m["kind"] == "flow" && m["host"] == "echo.test" && m["proto"] == "udp"
	})
	if len(udp) != 2 || udp[0]["outcome"] != "revoked" || udp[1]["verdict"] != "deny" || udp[1]["phase"] != "exec" {
		t.Errorf("want the UDP session to echo.test revoked, then its next datagram denied in exec: %v", udp)
	}
	denied := auditFind(lines, func(m map[string]any) bool {
		return m["kind"] == "flow" && m["host"] == "allowed.test" && m["verdict"] == "deny"
	})
	if len(denied) != 1 || denied[0]["phase"] != "exec" {
		t.Errorf("want the new connection to allowed.test denied in phase exec: %v", denied)
	}
	if out, err := exec.Command(tunwallBin, "audit", "verify", auditPath).CombinedOutput(); err != nil {
		t.Errorf("audit verify: %v\n%s", err, out)
	}
}

// TestAReloadKeepsThePolicyWhenTheFileIsBrokenAndNarrowsOnSIGHUP edits the
// policy of a running sandbox twice: first into a file that does not parse
// (ctl reload must refuse it, name the file and line, and keep the policy
// in effect), then into one that allows another host only, applied by
// SIGHUP (the first host is denied from then on, the other allowed).
func TestAReloadKeepsThePolicyWhenTheFileIsBrokenAndNarrowsOnSIGHUP(t *testing.T) {
	w := newWorld(t)
	requireTools(t, "curl")
	xdg := filepath.Join(w.dir, "xdg-reload")
	if err := os.Mkdir(xdg, 0o700); err != nil {
		t.Fatal(err)
	}
	pol := filepath.Join(w.dir, "reload-policy.yaml")
	write := func(s string) {
		// Replaced whole, as an editor saves it.
		tmp := pol + ".tmp"
		if err := os.WriteFile(tmp, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, pol); err != nil {
			t.Fatal(err)
		}
	}
	write("version: 1\nphases:\n  work:\n    allow:\n      - host: allowed.test\n        ports: [80]\n")
	auditPath := filepath.Join(w.dir, "reload-audit.jsonl")
	r1, r2, release := filepath.Join(w.dir, "reload-1"), filepath.Join(w.dir, "reload-2"), filepath.Join(w.dir, "reload-end")
	get := func(host, tag string) string {
		return fmt.Sprintf("if curl -sS --max-time 5 -o /dev/null http://%s/ 2>/dev/null; then echo %s ok; else echo %s denied; fi\n", host, tag, tag)
	}
	script := waitFileSh + "echo STEP1; waitfile " + r1 + "\n" + get("allowed.test", "A1") +
		"echo STEP2; waitfile " + r2 + "\n" + get("allowed.test", "A2") + get("other.test", "O2") +
		"waitfile " + release
	o := runOpts{flags: []string{"--policy", pol, "--audit", auditPath}, script: script, env: []string{"XDG_RUNTIME_DIR=" + xdg}}
	var broken string
	out, _ := w.runWithCtlMarks(t, o, map[string]func(ctx context.Context){
		"STEP1": func(ctx context.Context) {
			write("version: 1\nphases:\n  work:\n    allow:\n      - hots: other.test\n        ports: [80]\n")
			var err error
			if broken, err = w.ctl(ctx, o, "reload"); err == nil {
				t.Errorf("ctl reload of a broken file succeeded:\n%s", broken)
			}
			os.WriteFile(r1, nil, 0o644)
		},
		"STEP2": func(ctx context.Context) {
			write("version: 1\nphases:\n  work:\n    allow:\n      - host: other.test\n        ports: [80]\n")
			if err := syscall.Kill(w.lastPid, syscall.SIGHUP); err != nil {
				t.Error(err)
			}
			// The reload is done once its record is in the log.
			for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
				if b, _ := os.ReadFile(auditPath); strings.Contains(string(b), `"kind":"phase"`) {
					break
				}
			}
			os.WriteFile(r2, nil, 0o644)
			os.WriteFile(release, nil, 0o644)
		},
	}, release)
	if !strings.Contains(broken, "reload-policy.yaml:5") {
		t.Errorf("ctl reload of a broken file did not name its file and line:\n%s", broken)
	}
	for _, want := range []string{"A1 ok", "A2 denied", "O2 ok"} {
		if !strings.Contains(out, want) {
			t.Errorf("want %q:\n%s", want, out)
		}
	}
	lines := auditRaw(t, auditPath)
	phases := auditOfKind(lines, "phase")
	if len(phases) != 1 || phases[0]["rule"] != "SIGHUP" {
		t.Errorf("want one phase record, by SIGHUP (the broken reload changes nothing): %v", phases)
	}
}

// auditOfKind returns the lines of kind.
func auditOfKind(lines []map[string]any, kind string) []map[string]any {
	var out []map[string]any
	for _, m := range lines {
		if m["kind"] == kind {
			out = append(out, m)
		}
	}
	return out
}

// TestTheSandboxCannotMakeTunwallReloadAPolicyItEdited is the sandbox
// widening its own fence: under a rootless run it is the user's uid, so
// it can edit a policy file the user can write, and SIGHUP reloads the
// policy. It appends an allow rule for evil.test, then sends SIGHUP to
// every process it can name and to every process it may signal (kill -1):
// tunwall, in the pid namespace above, must be out of reach, and
// evil.test still denied. (The control socket's routes are
// TestTheSandboxCannotReachTheControlSocket's.)
func TestTheSandboxCannotMakeTunwallReloadAPolicyItEdited(t *testing.T) {
	w := newWorld(t)
	requireTools(t, "curl", "bwrap")
	for i, c := range []struct {
		name  string
		bwrap bool
	}{{"run rootless", false}, {"bwrap rootless", true}} {
		t.Run(c.name, func(t *testing.T) {
			dir := filepath.Join(w.dir, fmt.Sprintf("hup-%d", i))
			if err := os.Mkdir(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			pol := filepath.Join(dir, "policy.yaml")
			if err := os.WriteFile(pol, []byte("version: 1\nphases:\n  work:\n    allow:\n      - host: allowed.test\n        ports: [80]\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			for _, p := range []string{dir, pol} {
				if err := os.Chown(p, 65534, 65534); err != nil {
					t.Fatal(err)
				}
			}
			auditPath := filepath.Join(dir, "audit.jsonl")
			script := fmt.Sprintf(`trap '' HUP
printf '      - host: evil.test\n        ports: [80]\n' >> %s && echo EDITED
n=0; for p in /proc/[0-9]*; do kill -HUP "${p#/proc/}" 2>/dev/null && n=$((n+1)); done; echo "signalled $n"
kill -HUP -1 2>/dev/null
sleep 1
if curl -sS --max-time 5 -o /dev/null http://evil.test/ 2>/dev/null; then echo EVIL reached; else echo EVIL denied; fi`, pol)
			o := runOpts{asUser: 65534, flags: []string{"--policy", pol, "--audit", auditPath}, script: script}
			if c.bwrap {
				o.bwrap = []string{"--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--bind", dir, dir}
			}
			r := w.run(o)
			if r.code != 0 || !strings.Contains(r.stdout, "EDITED") {
				t.Fatalf("the sandbox did not edit the policy file (the test would prove nothing): %s", r)
			}
			if !strings.Contains(r.stdout, "EVIL denied") {
				t.Errorf("the sandbox widened its own policy: %s", r)
			}
			if b, _ := os.ReadFile(auditPath); strings.Contains(string(b), `"kind":"phase"`) {
				t.Errorf("tunwall reloaded the policy at the sandbox's signal")
			}
		})
	}
}
