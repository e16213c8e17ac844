package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// ctlAttacker tries every route to tunwall's control socket from inside the
// sandbox, as an attacker would, and prints one line per attempt: by path
// (listing the socket directory tunwall uses), through /proc/*/fd and
// /proc/*/root of every process it can see, by every abstract name the
// sandbox's /proc/net/unix shows and by guessed abstract names, and
// through every descriptor it inherited. A line with ANSWERED, CONNECTED
// or LEAK is a way in.
const ctlAttacker = `
import errno, glob, os, socket, sys
d = sys.argv[1]
def en(e): return errno.errorcode.get(e.errno, str(e.errno))
def probe(route, target):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(3)
    try:
        s.connect(target)
    except OSError as e:
        print(f"{route} {target!r}: connect: {en(e)}"); return
    try:
        s.sendall(b'{"cmd":"status"}\n')
        data = s.recv(65536)
    except OSError as e:
        print(f"{route} {target!r}: CONNECTED, then {e}"); return
    finally:
        s.close()
    if b'"status"' in data:
        print(f"{route} {target!r}: ANSWERED {data[:100]!r}")
    elif b'refused' in data:
        print(f"{route} {target!r}: refused by tunwall: {data[:160]!r}")
    else:
        print(f"{route} {target!r}: CONNECTED, answer {data[:100]!r}")

try:
    names = os.listdir(d)
    print(f"path: listdir {d}: {names}")
except OSError as e:
    names = []
    print(f"path: listdir {d}: {en(e)}")
for n in names: probe("path", os.path.join(d, n))

n = 0
for link in glob.glob("/proc/[0-9]*/fd/*"):
    try: t = os.readlink(link)
    except OSError: continue
    if t.startswith("socket:"):
        n += 1; probe("proc-fd", link)
print(f"proc-fd: {n} sockets seen in /proc/*/fd")

for root in glob.glob("/proc/[0-9]*/root"):
    p = root + d
    try: names = os.listdir(p)
    except OSError as e:
        print(f"proc-root {p}: {en(e)}"); continue
    print(f"proc-root {p}: {names}")
    for n in names: probe("proc-root", os.path.join(p, n))

abstract = []
with open("/proc/net/unix") as f:
    for line in f.readlines()[1:]:
        parts = line.split()
        if len(parts) >= 8 and parts[7].startswith("@"): abstract.append(parts[7][1:])
print(f"abstract: {len(abstract)} abstract names in the sandbox's /proc/net/unix: {abstract[:8]}")
for a in abstract[:64]: probe("abstract", "\0" + a)
for g in ["tunwall", "tunwall-control", d, d + "/control.sock"]: probe("abstract-guess", "\0" + g)

n = 0
for fd in sorted(os.listdir("/proc/self/fd"), key=int):
    fd = int(fd)
    try: t = os.readlink(f"/proc/self/fd/{fd}")
    except OSError: continue
    n += 1
    if not t.startswith("socket:"):
        print(f"inherited fd {fd}: {t}"); continue
    try:
        s = socket.socket(fileno=os.dup(fd))
        name = s.getsockname()
        listening = s.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
        s.close()
    except OSError as e:
        print(f"inherited fd {fd}: {t}: {en(e)}"); continue
    leak = "LEAK " if (isinstance(name, str) and name.startswith(d)) or listening else ""
    print(f"inherited fd {fd}: {leak}socket {name!r} listening={listening}")
print(f"inherited: {n} descriptors checked")
`

// ctlAttackRoutes are the routes the attacker must have tried (a line
// starting so each).
var ctlAttackRoutes = []string{"path: listdir", "proc-fd: ", "proc-root ", "abstract: ", "abstract-guess ", "inherited: "}

// TestTheSandboxCannotReachTheControlSocket runs the attacker inside run
// and bwrap sandboxes, root and rootless, while tunwall's control socket
// is live (ctl status from the host answers), and requires every route to
// end in absence or refusal.
func TestTheSandboxCannotReachTheControlSocket(t *testing.T) {
	w := newWorld(t)
	requireTools(t, "python3", "bwrap")
	attacker := filepath.Join(w.dir, "ctl-attacker.py")
	if err := os.WriteFile(attacker, []byte(ctlAttacker), 0o644); err != nil {
		t.Fatal(err)
	}
	bw := []string{"--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--bind", w.dir, w.dir}
	for i, c := range []struct {
		name     string
		asUser   int
		bwrap    []string
		explicit bool // --control PATH, in a directory the sandbox sees
	}{
		{"run as root", 0, nil, false},
		{"run rootless", 65534, nil, false},
		{"bwrap as root", 0, bw, false},
		{"bwrap rootless", 65534, bw, false},
		{"run rootless with --control PATH", 65534, nil, true},
		{"bwrap rootless with --control PATH", 65534, bw, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			xdg := filepath.Join(w.dir, fmt.Sprintf("xdg-%d", i))
			if err := os.Mkdir(xdg, 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.Chown(xdg, c.asUser, c.asUser); err != nil {
				t.Fatal(err)
			}
			ctlDir := filepath.Join(xdg, "tunwall")
			flags := []string{"--allow", "allowed.test"}
			var ctlArgs []string
			if c.explicit {
				// The directory stays visible; the socket is covered.
				ctlDir = xdg
				ctlArgs = []string{"--control", filepath.Join(xdg, "explicit.sock")}
				flags = append(flags, ctlArgs...)
			}
			release := filepath.Join(w.dir, fmt.Sprintf("release-%d", i))
			script := fmt.Sprintf(`python3 %s %s; echo ATTACKED; n=0; while [ ! -e %s ] && [ $n -lt 600 ]; do sleep 0.05; n=$((n+1)); done`, attacker, ctlDir, release)
			o := runOpts{asUser: c.asUser, bwrap: c.bwrap, flags: flags, script: script,
				env: []string{"XDG_RUNTIME_DIR=" + xdg}}
			var entered []string
			out, status := w.runWithCtl(t, o, "ATTACKED", release, func(ctx context.Context, tunwallPid int) {
				// A process of the user that joins the sandbox's network
				// (or, under run, pid) namespace, and so sees the socket
				// through the host's file system, as a descriptor passed
				// out of the sandbox would let it: the peer checks refuse.
				sb := sandboxPid(t, tunwallPid)
				socks, _ := filepath.Glob(filepath.Join(ctlDir, "*.sock"))
				if len(socks) != 1 {
					t.Errorf("want one control socket in %s, found %q", ctlDir, socks)
					return
				}
				joins := [][]string{{"-n"}}
				if c.bwrap == nil {
					joins = append(joins, []string{"-p"})
				}
				if c.asUser != 0 {
					// Its user namespace alone (-U is added below): a
					// sandbox process that made a network and pid
					// namespace of its own is still in it.
					joins = append(joins, []string{})
				}
				for _, j := range joins {
					args := append([]string{"-t", fmt.Sprint(sb)}, j...)
					if c.asUser != 0 {
						args = append(args, "-U", "--preserve-credentials")
					}
					args = append(args, "--", tunwallBin, "ctl", "status", "--control", socks[0])

					got, err := w.asUser(ctx, o, "nsenter", args...)
					entered = append(entered, fmt.Sprintf("nsenter %s: %v: %s", strings.Join(j, " "), err, strings.TrimSpace(got)))
					if err == nil || !strings.Contains(got, "refused:") {
						t.Errorf("a process in the sandbox's namespace (nsenter %s) was not refused: %v\n%s", strings.Join(j, " "), err, got)
					}
				}
			}, ctlArgs...)
			t.Logf("joining the sandbox's namespaces:\n%s", strings.Join(entered, "\n"))
			if status.Run == "" {
				t.Fatalf("ctl status from the host did not answer while the attacker ran:\n%s", out)
			}
			for _, route := range ctlAttackRoutes {
				if !strings.Contains(out, "\n"+route) && !strings.HasPrefix(out, route) {
					t.Errorf("the attacker did not try route %q:\n%s", route, out)
				}
			}
			for _, l := range lines(out) {
				if strings.Contains(l, "ANSWERED") || strings.Contains(l, "CONNECTED") || strings.Contains(l, "LEAK") {
					t.Errorf("a way in from the sandbox: %s", l)
				}
			}
			t.Logf("attacker's view:\n%s", out)
		})
	}
}

// runWithCtl starts tunwall with o, reads its output until a line equal to
// mark, asks `tunwall ctl status --json` from the host (as o.asUser, with
// o.env), then creates release and waits for tunwall to exit 0. It returns
// the sandbox's output and the status.
func (w *world) runWithCtl(t *testing.T, o runOpts, mark, release string, more func(ctx context.Context, tunwallPid int), ctlArgs ...string) (string, ctlStatus) {
	t.Helper()
	var st ctlStatus
	out, _ := w.runWithCtlMarks(t, o, map[string]func(ctx context.Context){mark: func(ctx context.Context) {
		st = w.ctlStatus(t, ctx, o, ctlArgs...)
		if more != nil {
			more(ctx, w.lastPid)
		}
		os.WriteFile(release, nil, 0o644)
	}}, release)
	return out, st
}

// runWithCtlMarks starts tunwall with o and reads its output; at each line
// equal to a key of marks it calls that function (which asks tunwall
// things from the host and lets the sandbox go on). It creates release
// once done (the sandbox's last wait) and requires tunwall to exit 0.
func (w *world) runWithCtlMarks(t *testing.T, o runOpts, marks map[string]func(ctx context.Context), release string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	sub := "run"
	if o.bwrap != nil {
		sub = "bwrap"
	}
	cmd, _ := w.tunwallCmd(ctx, o, sub)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	pipe, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer os.WriteFile(release, nil, 0o644) // never leave the sandbox waiting
	w.lastPid = cmd.Process.Pid
	var out strings.Builder
	br := bufio.NewReader(pipe)
	for {
		line, err := br.ReadString('\n')
		out.WriteString(line)
		if f := marks[strings.TrimSpace(line)]; f != nil {
			f(ctx)
		}
		if err != nil {
			break
		}
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("tunwall %s: %v\n--- stdout\n%s--- stderr\n%s", sub, err, out.String(), stderr.String())
	}
	return out.String(), cmd.Process.Pid
}

// ctlStatus is what `tunwall ctl status --json` prints (the fields the
// tests read).
type ctlStatus struct {
	Run          string   `json:"run"`
	Phase        string   `json:"phase"`
	PolicyFile   string   `json:"policy_file"`
	PolicySHA256 string   `json:"policy_sha256"`
	Argv         []string `json:"argv"`
	Totals       struct {
		FlowsAllowed uint64 `json:"flows_allowed"`
		FlowsDenied  uint64 `json:"flows_denied"`
		DNSAllowed   uint64 `json:"dns_allowed"`
		DNSDenied    uint64 `json:"dns_denied"`
		BytesOut     uint64 `json:"bytes_out"`
		BytesIn      uint64 `json:"bytes_in"`
	} `json:"totals"`
}

// ctl runs `tunwall ctl ARGS...` on the host as o.asUser with o.env.
func (w *world) ctl(ctx context.Context, o runOpts, args ...string) (string, error) {
	return w.asUser(ctx, o, tunwallBin, append([]string{"ctl"}, args...)...)
}

// sandboxPid finds a process below tunwallPid in another network
// namespace than tunwall's (the sandbox's init).
func sandboxPid(t *testing.T, tunwallPid int) int {
	t.Helper()
	own, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", tunwallPid))
	if err != nil {
		t.Fatal(err)
	}
	queue := []int{tunwallPid}
	for i := 0; i < len(queue) && i < 64; i++ {
		tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", queue[i]))
		for _, f := range tasks {
			b, _ := os.ReadFile(f)
			for _, s := range strings.Fields(string(b)) {
				var pid int
				fmt.Sscan(s, &pid)
				if ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", pid)); err == nil && ns != own {
					return pid
				}
				queue = append(queue, pid)
			}
		}
	}
	t.Fatalf("no process below tunwall (%d) in another network namespace", tunwallPid)
	return 0
}

// asUser runs name ARGS... on the host as o.asUser with o.env.
func (w *world) asUser(ctx context.Context, o runOpts, name string, args ...string) (string, error) {
	full := append([]string{name}, args...)
	if o.asUser != 0 {
		full = append([]string{"setpriv", fmt.Sprintf("--reuid=%d", o.asUser), fmt.Sprintf("--regid=%d", o.asUser), "--clear-groups", "--"}, full...)
	}
	cmd := exec.CommandContext(ctx, full[0], full[1:]...)
	cmd.Env = append(os.Environ(), o.env...)
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	w.t.Logf("%s: %v", strings.Join(full, " "), err)
	return string(out), err
}

func (w *world) ctlStatus(t *testing.T, ctx context.Context, o runOpts, args ...string) ctlStatus {
	t.Helper()
	out, err := w.ctl(ctx, o, append([]string{"status", "--json"}, args...)...)
	var st ctlStatus
	if err != nil {
		t.Errorf("tunwall ctl status: %v\n%s", err, out)
		return st
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Errorf("tunwall ctl status --json: %v\n%s", err, out)
	}
	return st
}
