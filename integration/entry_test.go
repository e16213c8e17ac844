package integration

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// bwrapBase is a typical agent sandbox: the host's filesystem read-only,
// fresh /dev and /proc, its own pid namespace.
var bwrapBase = []string{"--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--unshare-pid", "--setenv", "HOME", "/tmp"}

func TestBwrapAllowsDeniesAndReturnsTheCommandsStatus(t *testing.T) {
	requireTools(t, "bwrap", "curl", "node")
	w := newWorld(t)
	r := w.mustRun(9, runOpts{
		bwrap: append(append([]string{}, bwrapBase...), "--setenv", "HTTPS_PROXY", "http://192.0.2.66:3128"),
		flags: []string{"--allow", "allowed.test:80", "--allow", "allowed.test:443"},
		script: `ip -o link show | awk -F': ' '{print $2}'
curl -sS http://allowed.test/bwrap
curl -sS --max-time 10 http://evil.test/ 2>/dev/null; echo "curl denied: $?"
node -e 'fetch("https://allowed.test/node").then(r=>r.text()).then(t=>process.stdout.write(t))'
node -e 'fetch("https://evil.test/").then(()=>console.log("reached")).catch(e=>console.log("fetch denied:", e.cause.code))'
exit 9`,
	})
	wantLines(t, r, "lo", "tun0", "web allowed.test /bwrap", "curl denied: 6", "web allowed.test /node", "fetch denied: ENOTFOUND")
	w.noArrivals("evil")
	if w.DNS.Asked("evil.test") {
		t.Error("the denied name reached the world's resolver")
	}
}

func TestBwrapRootlessAsAnUnprivilegedUserKeepsTheUsersID(t *testing.T) {
	requireTools(t, "bwrap", "curl", "setpriv")
	w := newWorld(t)
	if err := os.Chmod("/dev/net/tun", 0o666); err != nil {
		t.Fatal(err)
	}
	r := w.mustRun(0, runOpts{
		asUser: 65534,
		bwrap:  append(append([]string{}, bwrapBase...), "--unshare-all"),
		flags:  []string{"--allow", "allowed.test:80"},
		script: `id -u; ip -o link show | awk -F': ' '{print $2}'; curl -sS http://allowed.test/rootless-bwrap; curl -sS --max-time 10 https://192.0.2.66/ 2>/dev/null; echo "raw ip: $?"`,
	})
	wantLines(t, r, "65534", "lo", "tun0", "web allowed.test /rootless-bwrap", "raw ip: 7")
}

func TestBwrapRefusesArgumentsThatWouldGiveTheSandboxANetwork(t *testing.T) {
	requireTools(t, "bwrap")
	w := newWorld(t)
	for _, c := range []struct {
		args []string
		name string
	}{
		{[]string{"--userns", "7"}, "--userns"},
		{[]string{"--pidns", "7"}, "--pidns"},
		{[]string{"--bogus-option"}, "--bogus-option"},
	} {
		r := w.run(runOpts{bwrap: c.args, argv: []string{"true"}, flags: []string{"--allow", "allowed.test"}})
		if r.code != 2 || !strings.Contains(r.stderr, c.name) {
			t.Errorf("bwrap %v: want usage error (2) naming %s\n%s", c.args, c.name, r)
		}
	}
}

// startBackground starts a long-running tunwall (attach, socks) and waits
// until its stderr contains ready.
func (w *world) startBackground(ctx context.Context, sub string, o runOpts, ready string) (*exec.Cmd, string, *strings.Builder) {
	w.t.Helper()
	cmd, auditPath := w.tunwallCmd(ctx, o, sub)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		w.t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		w.t.Fatal(err)
	}
	var log strings.Builder
	found := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		ok := false
		for sc.Scan() {
			log.WriteString(sc.Text() + "\n")
			if !ok && strings.Contains(sc.Text(), ready) {
				ok = true
				found <- true
			}
		}
		if !ok {
			found <- false
		}
	}()
	select {
	case ok := <-found:
		if !ok {
			cmd.Wait()
			w.t.Fatalf("tunwall %s exited before %q:\n%s", sub, ready, log.String())
		}
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		w.t.Fatalf("tunwall %s never printed %q", sub, ready)
	}
	w.t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	return cmd, auditPath, &log
}

// netns makes a named network namespace for the test and removes it after.
func (w *world) netns(name string) string {
	w.t.Helper()
	name = name + "-" + w.ID
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		w.t.Fatalf("ip netns add: %v: %s", err, out)
	}
	w.t.Cleanup(func() { exec.Command("ip", "netns", "del", name).Run() })
	exec.Command("ip", "-n", name, "link", "set", "lo", "up").Run()
	return name
}

func TestAttachServesAnIPNetnsNamespaceUntilSIGTERM(t *testing.T) {
	requireTools(t, "curl")
	w := newWorld(t)
	ns := w.netns("twjob")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd, auditPath, log := w.startBackground(ctx, "attach", runOpts{
		flags: []string{"--netns", "/run/netns/" + ns, "--allow", "allowed.test:80"},
	}, "serving the namespace")
	in := func(script string) string {
		out, _ := exec.CommandContext(ctx, "ip", "netns", "exec", ns, "sh", "-c", script).CombinedOutput()
		return string(out)
	}
	// Queries to any address on port 53 are answered by tunwall, whatever
	// the namespace's resolv.conf names.
	got := in(`ip -o link show | awk -F': ' '{print $2}'; curl -sS http://allowed.test/attached; dig +short +tries=1 @192.0.2.66 evil.test; curl -sS --max-time 10 http://evil.test/ 2>/dev/null; echo "denied: $?"`)
	want := "lo\ntun0\nweb allowed.test /attached\ndenied: 6\n"
	if got != want {
		t.Fatalf("inside the attached namespace:\n got %q\nwant %q\n%s", got, want, log)
	}
	cmd.Process.Signal(syscall.SIGTERM)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("attach after SIGTERM: %v\n%s", err, log)
	}
	// Detached: the TUN is gone, and with it the namespace's network.
	if got := in(`ip -o link show | awk -F': ' '{print $2}'; curl -sS --max-time 5 http://192.0.2.10/ 2>/dev/null; echo "after detach: $?"`); got != "lo\nafter detach: 7\n" {
		t.Errorf("after SIGTERM the namespace still has a network: %q", got)
	}
	recs := records(t, auditPath)
	var allowed, denied int
	for _, r := range recs {
		if r.Kind == "flow" && r.Host == "allowed.test" && r.Verdict == "allow" {
			allowed++
		}
		if r.Kind == "dns" && r.Host == "evil.test" && r.Verdict == "deny" {
			denied++
		}
	}
	if allowed == 0 || denied == 0 {
		t.Errorf("audit: %d allowed flows to allowed.test, %d denied evil.test queries; want both > 0", allowed, denied)
	}
	w.noArrivals("evil")
}

func TestAttachRefusesANamespaceThatAlreadyHasARouteOut(t *testing.T) {
	w := newWorld(t)
	ns := w.netns("twout")
	for _, c := range [][]string{
		{"ip", "-n", ns, "link", "add", "out0", "type", "veth", "peer", "name", "out1"},
		{"ip", "-n", ns, "link", "set", "out0", "up"},
		{"ip", "-n", ns, "link", "set", "out1", "up"},
		{"ip", "-n", ns, "route", "add", "default", "dev", "out0"},
	} {
		if out, err := exec.Command(c[0], c[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v: %s", c, err, out)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd, _ := w.tunwallCmd(ctx, runOpts{flags: []string{"--netns", "/run/netns/" + ns, "--allow", "allowed.test"}}, "attach")
	out, err := cmd.CombinedOutput()
	if code := cmd.ProcessState.ExitCode(); err == nil || code != 125 || !strings.Contains(string(out), "out0") || !strings.Contains(string(out), "--force") {
		t.Fatalf("want exit 125 naming out0 and --force, got %v (%d):\n%s", err, code, out)
	}
	if got, _ := exec.Command("ip", "-n", ns, "-o", "link", "show", "tun0").CombinedOutput(); !strings.Contains(string(got), "does not exist") {
		t.Errorf("a TUN was left behind: %s", got)
	}
}

func TestAttachByPidEndsWhenTheNamespacesLastProcessExits(t *testing.T) {
	requireTools(t, "curl", "unshare")
	w := newWorld(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	flag := filepath.Join(w.dir, "go")
	ready := filepath.Join(w.dir, "in-its-namespace")
	// A process in a network namespace of its own, waiting to be served;
	// it says when it is there (ip and unshare exec in place: its pid is
	// the shell's).
	job := w.AgentCommand(ctx, "unshare", "--net", "sh", "-c", fmt.Sprintf(`ip link set lo up; : > %s; while [ ! -e %s ]; do sleep 0.05; done; curl -sS --max-time 10 http://allowed.test/by-pid`, ready, flag))
	var jobOut strings.Builder
	job.Stdout, job.Stderr = &jobOut, &jobOut
	if err := job.Start(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, err := os.Stat(ready); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the job did not enter its namespace within 10s: %s", jobOut.String())
		}
	}
	cmd, _, log := w.startBackground(ctx, "attach", runOpts{
		flags: []string{"--pid", fmt.Sprint(job.Process.Pid), "--allow", "allowed.test:80"},
	}, "serving the namespace")
	os.WriteFile(flag, nil, 0o644)
	job.Wait()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("attach: %v\n%s", err, log)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("attach did not end after the namespace emptied\n%s", log)
	}
	if jobOut.String() != "web allowed.test /by-pid\n" {
		t.Errorf("the job saw %q", jobOut.String())
	}
	if !strings.Contains(log.String(), "last process exited") {
		t.Errorf("attach did not say why it ended:\n%s", log)
	}
}

func TestSocksAppliesThePolicyAndAuditsByName(t *testing.T) {
	requireTools(t, "curl")
	w := newWorld(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	proxy, proxyAudit, _ := w.startBackground(ctx, "socks", runOpts{
		flags: []string{"--listen", "127.0.0.1:1080", "--allow", "allowed.test:80"},
	}, "SOCKS5 proxy on")
	script := `curl -sS --socks5-hostname 127.0.0.1:1080 http://allowed.test/socks
curl -sS --max-time 10 --socks5-hostname 127.0.0.1:1080 http://evil.test/ 2>/dev/null; echo "denied name: $?"
curl -sS --max-time 10 --socks5 127.0.0.1:1080 http://192.0.2.66/ 2>/dev/null; echo "raw ip: $?"
curl -sS --max-time 10 --socks5-hostname 127.0.0.1:1080 http://rebind-lo.test:8081/ 2>/dev/null; echo "rebinding: $?"`
	out, err := w.AgentCommand(ctx, "sh", "-c", script).Output()
	if err != nil {
		t.Fatal(err)
	}
	want := "web allowed.test /socks\ndenied name: 97\nraw ip: 97\nrebinding: 97\n"
	if string(out) != want {
		t.Fatalf("through tunwall socks:\n got %q\nwant %q", out, want)
	}
	proxy.Process.Signal(syscall.SIGTERM)
	proxy.Wait()
	seen := map[string]string{}
	for _, r := range records(t, proxyAudit) {
		if r.Kind == "flow" {
			key := r.Host
			if key == "" {
				key = r.Dst.Addr().String()
			}
			seen[key] = r.Verdict + " " + r.HostFrom
			if r.Comm != "curl" {
				t.Errorf("socks flow not attributed to curl: %+v", r)
			}
		}
	}
	for k, v := range map[string]string{
		"allowed.test": "allow socks", "evil.test": "deny socks", "192.0.2.66": "deny none", "rebind-lo.test": "deny socks",
	} {
		if seen[k] != v {
			t.Errorf("audit for %s = %q, want %q (all: %v)", k, seen[k], v, seen)
		}
	}
	if w.DNS.Asked("evil.test") {
		t.Error("the proxy resolved a denied name")
	}
	w.noArrivals("evil", "agent-lo")
}

func TestRunThroughAnUpstreamSocksProxySendsTheCheckedAddress(t *testing.T) {
	requireTools(t, "curl", "python3")
	w := newWorld(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// tunwall resolves and checks every name; the proxy is sent the address,
	// so it needs cidr rules for what it should let through.
	proxy, proxyAudit, _ := w.startBackground(ctx, "socks", runOpts{
		flags: []string{"--listen", "127.0.0.1:1081", "--allow", "192.0.2.10:80", "--allow", "192.0.2.20:7/udp"},
	}, "SOCKS5 proxy on")
	r := w.mustRun(0, runOpts{
		flags: []string{"--upstream", "socks5://127.0.0.1:1081", "--allow", "allowed.test:80", "--allow", "echo.test:7/udp", "--allow", "api.allowed.test:80"},
		script: `curl -sS http://allowed.test/chained
curl -sS --max-time 10 http://api.allowed.test/ 2>/dev/null; echo "refused by the proxy: $?"
python3 - <<'PY'
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(5)
s.connect(("echo.test", 7))
s.send(b"udp through socks")
print(s.recv(100).decode())
PY`,
	})
	wantLines(t, r, "web allowed.test /chained", "refused by the proxy: 7", "udp through socks")
	proxy.Process.Signal(syscall.SIGTERM)
	proxy.Wait()
	got := map[string]string{}
	for _, rec := range records(t, proxyAudit) {
		if rec.Kind == "flow" {
			if rec.Host != "" {
				t.Errorf("the proxy was given a name, not the checked address: %+v", rec)
			}
			got[rec.Dst.String()+"/"+rec.Proto] = rec.Verdict
		}
	}
	for k, v := range map[string]string{"192.0.2.10:80/tcp": "allow", "192.0.2.20:7/udp": "allow", "192.0.2.11:80/tcp": "deny"} {
		if got[k] != v {
			t.Errorf("proxy audit for %s = %q, want %q (all %v)", k, got[k], v, got)
		}
	}
}
