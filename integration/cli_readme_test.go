package integration

import (
	"bufio"
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tunwall/tunwall/internal/testworld"
)

// readmeNames are the names the README's examples use. The test world's
// resolver serves them, at its web server, so the examples run as written:
// they are the names a reader's own policy would hold, and the world has no
// route out, so no packet can reach the real hosts. egress.example, the
// upstream proxy of the --upstream example, is this namespace's loopback,
// where the README's own socks example listens.
var readmeNames = map[string][]netip.Addr{
	"registry.npmjs.org":     {testworld.Web4},
	"pypi.org":               {testworld.Web4},
	"files.pythonhosted.org": {testworld.Web4},
	"github.com":             {testworld.Web4},
	"api.anthropic.com":      {testworld.Web4},
	"egress.example":         {netip.MustParseAddr("127.0.0.1")},
}

// readmeExample is one command of a fenced sh block of the README.
type readmeExample struct {
	section, line string
}

// docPages are the pages whose examples run, in the order they run: the
// reference's Use and Audit log first (the audit examples read the first
// run's log), then the README's (its learn example writes agent.yaml).
var docPages = []string{"../docs/cli.md", "../docs/audit.md", "../README.md"}

// readmeExamples returns the example command lines of the sections given
// (by heading, of any level) of docPages: continuation lines joined,
// comments dropped.
func readmeExamples(t *testing.T, sections ...string) []readmeExample {
	t.Helper()
	var out []readmeExample
	comment := regexp.MustCompile(`\s+#\s.*$`)
	for _, page := range docPages {
		b, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		section, inSh := "", false
		var cont string
		for line := range strings.SplitSeq(string(b), "\n") {
			switch {
			case inSh && line == "```":
				inSh = false
			case inSh:
				l := strings.TrimSpace(comment.ReplaceAllString(line, ""))
				if l == "" || strings.HasPrefix(l, "#") {
					continue
				}
				if strings.HasSuffix(l, "\\") {
					cont += strings.TrimSuffix(l, "\\") + " "
					continue
				}
				l, cont = cont+l, ""
				for _, s := range sections {
					if section == s {
						out = append(out, readmeExample{section, l})
					}
				}
			case strings.HasPrefix(line, "#"):
				section = strings.TrimLeft(line, "# ")
			case line == "```sh":
				inSh = true
			}
		}
	}
	return out
}

// quickStartDenial is the stderr line the README's quick start shows for
// its denied request.
func quickStartDenial(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)## Quick start\n.*?```\n(tunwall: denied [^\n]*)\n```").FindSubmatch(b)
	if m == nil {
		t.Fatal("README's quick start shows no denial line")
	}
	return string(m[1])
}

// TestCLIReadmeExamples runs the README's example commands of "Use", "Audit
// log" and "Building an allowlist" as written, in the test world, with the
// README's own agent.yaml: each must be accepted and serve its sandbox.
// The commands they run (npm, pip, ./agent) are stand-ins that fetch what
// the example's phase allows through the sandbox's network.
func TestCLIReadmeExamples(t *testing.T) {
	requireTools(t, "curl", "bwrap", "unshare")
	w := newWorld(t, testworld.Options{Names: readmeNames})
	examples := readmeExamples(t, "Use", "Audit log", "Quick start", "Learn, suggest, enforce")
	if len(examples) < 18 {
		t.Fatalf("found %d examples, want the 18 or more of Use, Audit log, Quick start and Learn, suggest, enforce:\n%q", len(examples), examples)
	}
	denial := quickStartDenial(t)

	// The README's agent.yaml, from its Policy section.
	readme, _ := os.ReadFile("../README.md")
	m := regexp.MustCompile("(?s)```yaml\n(# agent.yaml — a coding agent.*?)```").FindSubmatch(readme)
	if m == nil {
		t.Fatal("README has no agent.yaml block")
	}
	dir := w.dir
	write := func(name, s string, mode os.FileMode) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(s), mode); err != nil {
			t.Fatal(err)
		}
	}
	write("agent.yaml", string(m[1]), 0o644)
	// Stand-ins for the commands, and sudo (we are root).
	bin := filepath.Join(dir, "bin")
	os.Mkdir(bin, 0o755)
	stub := func(name, body string) {
		if err := os.WriteFile(filepath.Join(bin, name), []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	stub("npm", `case "$1" in
test) exec curl -sS --max-time 20 https://github.com/npm-test ;;
ci) exec curl -sS --max-time 20 https://registry.npmjs.org/npm-ci ;;
esac
exit 64`)
	// pip as Debian and Ubuntu ship it (PEP 668): it refuses to install
	// into the system's Python unless told where else to.
	stub("pip", `case " $* " in
*" --target "*|*" --prefix "*|*" --root "*|*" --break-system-packages "*) ;;
*) echo "error: externally-managed-environment (PEP 668): use a venv, or --target DIR" >&2; exit 1 ;;
esac
exec curl -sS --max-time 20 https://pypi.org/simple/requests/`)
	stub("sudo", `exec "$@"`)
	write("agent", "#!/bin/sh\necho agent ran\n", 0o755)
	// The host's resolv.conf, as the agent namespace sees it (ip netns exec
	// binds /etc/netns/NAME/resolv.conf): the world's resolver, for the
	// examples without dns.upstream or --dns-upstream.
	etc := filepath.Join("/etc/netns", w.AgentNS)
	if err := os.MkdirAll(etc, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(etc) })
	if err := os.WriteFile(filepath.Join(etc, "resolv.conf"), []byte("nameserver 192.0.2.53\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// job1 is a host-wide name (/run/netns); this world's is its own.
	job := "job1-" + w.ID
	t.Cleanup(func() { exec.Command("ip", "netns", "del", job).Run() })

	env := append(os.Environ(), "PATH="+bin+":"+filepath.Dir(tunwallBin)+":"+os.Getenv("PATH"),
		"HOME="+dir, "XDG_STATE_HOME="+filepath.Join(dir, "state"), "CURL_CA_BUNDLE="+w.caPEM, "SSL_CERT_FILE="+w.caPEM)
	shell := func(ctx context.Context, line string) *exec.Cmd {
		cmd := w.AgentCommand(ctx, "sh", "-c", line)
		cmd.Env, cmd.Dir = env, dir
		cmd.WaitDelay = 5 * time.Second
		return cmd
	}
	// background starts a long-running example and waits for ready.
	background := func(ctx context.Context, line, ready string) (*exec.Cmd, *strings.Builder) {
		t.Helper()
		cmd := shell(ctx, "exec "+line)
		pipe, _ := cmd.StderrPipe()
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if cmd.ProcessState == nil {
				cmd.Process.Kill()
				cmd.Wait()
			}
		})
		var log strings.Builder
		found := make(chan bool, 1)
		go func() {
			sc, ok := bufio.NewScanner(pipe), false
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
				t.Fatalf("%s: exited before %q:\n%s", line, ready, log.String())
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("%s: never printed %q:\n%s", line, ready, log.String())
		}
		return cmd, &log
	}
	stop := func(cmd *exec.Cmd, log *strings.Builder, line string) {
		t.Helper()
		cmd.Process.Signal(syscall.SIGTERM)
		if err := cmd.Wait(); err != nil {
			t.Errorf("%s: after SIGTERM: %v\n%s", line, err, log.String())
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var socks *exec.Cmd
	var socksLog *strings.Builder
	ran := 0
	for _, ex := range examples {
		line := ex.line
		t.Logf("README (%s): %s", ex.section, line)
		switch {
		case strings.HasPrefix(line, "sudo ip netns add job1"):
			line = strings.Replace(line, "job1", job, 1)
			// On the host: a namespace made inside ip netns exec's own
			// mount namespace would not be seen by the next command.
			mk := exec.CommandContext(ctx, "sh", "-c", line)
			mk.Env = env
			if out, err := mk.CombinedOutput(); err != nil {
				t.Fatalf("%s: %v\n%s", line, err, out)
			}
		case strings.Contains(line, "tunwall attach --netns"):
			line = strings.Replace(line, "/run/netns/job1", "/run/netns/"+job, 1)
			cmd, log := background(ctx, line, "serving the namespace")
			// The namespace has tunwall's network: a raw IP with an allowed
			// SNI is dialled by that name (README, What happens to each flow).
			out, err := exec.CommandContext(ctx, "ip", "netns", "exec", job, "curl", "-sS", "--max-time", "20", "--cacert", w.caPEM,
				"--resolve", "github.com:443:192.0.2.10", "https://github.com/attached").CombinedOutput()
			if err != nil || !strings.Contains(string(out), "web github.com /attached") {
				t.Errorf("%s: curl in the attached namespace: %v\n%s", line, err, out)
			}
			stop(cmd, log, line)
		case strings.Contains(line, "tunwall attach --pid 4242"):
			holder := w.AgentCommand(ctx, "unshare", "--net", "sleep", "300")
			if err := holder.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { holder.Process.Kill(); holder.Wait() })
			// ip netns exec runs unshare, which execs sleep: the same pid.
			pid := holder.Process.Pid
			line = strings.Replace(line, "4242", fmt.Sprint(pid), 1)
			cmd, log := background(ctx, line, "serving the namespace")
			holder.Process.Kill()
			holder.Wait()
			if err := cmd.Wait(); err != nil {
				t.Errorf("%s: when the namespace's last process exited: %v\n%s", line, err, log.String())
			}
		case strings.Contains(line, "tunwall node "):
			// The node agent serves until SIGTERM; its folders, in this
			// world's folder, hold the README's agent.yaml as the default.
			policies, logs := filepath.Join(dir, "etc-tunwall-policies"), filepath.Join(dir, "var-log-tunwall")
			for _, d := range []string{policies, logs} {
				if err := os.MkdirAll(d, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			if b, err := os.ReadFile(filepath.Join(dir, "agent.yaml")); err != nil {
				t.Fatal(err)
			} else if err := os.WriteFile(filepath.Join(policies, "default.yaml"), b, 0o644); err != nil {
				t.Fatal(err)
			}
			line = strings.NewReplacer("/etc/tunwall/policies", policies, "/var/log/tunwall", logs).Replace(line)
			// Its socket too: the host's /run/tunwall is not this test's.
			line += " --socket " + filepath.Join(dir, "node.sock") + " --control-dir off"
			cmd, log := background(ctx, line, "serving pods on")
			stop(cmd, log, line)
		case strings.HasPrefix(line, "kubectl ") && strings.Contains(line, " logs "):
			// kubectl logs of a node agent: a real agent's --audit-stdout,
			// two pods served through the CNI plugin, one fetching what its
			// policy allows and one what it denies.
			capture := filepath.Join(dir, "agent-stdout.jsonl")
			s := newNodeSetup(t, w, map[string]string{"default": "version: 1\nphases:\n  exec:\n    allow:\n      - host: github.com\n        ports: [80]\n"})
			a := startNode(t, w, s, "--audit-stdout")
			n := newCNINet(t, w, a.socket, "default")
			for _, c := range []struct{ name, url string }{{"web-0", "http://github.com/pod"}, {"web-1", "http://pypi.org/pod"}} {
				p := newPod(t, w, "team-a", c.name)
				n.mustAdd(p)
				p.curl(c.url)
				if err := n.del(p); err != nil {
					t.Fatalf("DEL %s: %v", c.name, err)
				}
			}
			a.stop()
			if err := os.WriteFile(capture, []byte(a.stdout.String()), 0o644); err != nil {
				t.Fatal(err)
			}
			stub("kubectl", "exec cat "+capture)
			out, err := shell(ctx, line).CombinedOutput()
			if err != nil {
				t.Fatalf("%s: %v\n%s", line, err, out)
			}
		case strings.HasPrefix(line, "tunwall audit summary --by k8s_pod capture.jsonl"):
			out, err := shell(ctx, line).CombinedOutput()
			if err != nil || !regexp.MustCompile(`k8s_pod +web-0`).MatchString(string(out)) || !regexp.MustCompile(`k8s_pod +web-1`).MatchString(string(out)) {
				t.Errorf("%s: want both pods in the summary: %v\n%s", line, err, out)
			}
			t.Logf("%s", out)
		case strings.HasPrefix(line, "tunwall socks "):
			socks, socksLog = background(ctx, line, "SOCKS5 proxy on")
			out, err := exec.CommandContext(ctx, "ip", "netns", "exec", w.AgentNS, "curl", "-sS", "--max-time", "20", "--cacert", w.caPEM,
				"--socks5-hostname", "127.0.0.1:1080", "https://github.com/socks").CombinedOutput()
			if err != nil || !strings.Contains(string(out), "web github.com /socks") {
				t.Errorf("%s: curl through it: %v\n%s", line, err, out)
			}
		case ex.section == "Quick start" && strings.Contains(line, "https://pypi.org/"):
			// The denied request: curl fails, tunwall says what the README says.
			out, err := shell(ctx, line).CombinedOutput()
			if err == nil || !strings.Contains(string(out), denial) {
				t.Errorf("README quick start %q: want it to fail with %q; got %v:\n%s", line, denial, err, out)
			}
		case strings.HasPrefix(line, "tunwall audit verify run.jsonl --expect HASH"):
			line = strings.Replace(line, "HASH", lastHash(t, filepath.Join(dir, "run.jsonl")), 1)
			fallthrough
		default:
			// The learn log's root-owned folder, in this world's folder.
			line = strings.ReplaceAll(line, "/var/lib/tunwall", filepath.Join(dir, "var-lib-tunwall"))
			if strings.Contains(line, "--upstream") && socks == nil {
				t.Fatalf("%s: the README's socks example, its egress proxy, has not run", line)
			}
			if strings.Contains(line, " run.jsonl") {
				// The audit examples read the log of the Use section's first run.
				if _, err := os.Stat(filepath.Join(dir, "run.jsonl")); err != nil {
					t.Fatalf("%s: no run.jsonl: %v", line, err)
				}
			}
			out, err := shell(ctx, line).CombinedOutput()
			if err != nil {
				t.Errorf("README example %q failed: %v\n%s", line, err, out)
				continue
			}
			t.Logf("%s", out)
			want := map[string]string{"npm test": "web github.com /npm-test", "npm ci": "web registry.npmjs.org /npm-ci",
				"pip install": "web pypi.org /simple/requests/", "./agent": "agent ran",
				"curl -sS https://github.com/": "web github.com /", "audit summary denied.jsonl": "pypi.org"}
			for k, v := range want {
				if strings.HasSuffix(line, k) || strings.Contains(line, k+" ") {
					if !strings.Contains(string(out), v) {
						t.Errorf("README example %q: want %q in its output:\n%s", line, v, out)
					}
				}
			}
			if ran == 0 && strings.HasPrefix(line, "tunwall run ") {
				// Keep the first run's log as the audit examples' run.jsonl.
				copyNewestLog(t, filepath.Join(dir, "state", "tunwall"), filepath.Join(dir, "run.jsonl"))
			}
		}
		ran++
	}
	if socks != nil {
		stop(socks, socksLog, "tunwall socks")
	}
}

// lastHash is the SHA-256 of a log's last line, as a run prints it.
func lastHash(t *testing.T, path string) string {
	t.Helper()
	out, err := exec.Command(tunwallBin, "audit", "verify", path).Output()
	if err != nil {
		t.Fatalf("audit verify %s: %v\n%s", path, err, out)
	}
	m := regexp.MustCompile(`last sha256 ([0-9a-f]{64})`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("audit verify printed no hash:\n%s", out)
	}
	return string(m[1])
}

func copyNewestLog(t *testing.T, dir, to string) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil || len(ents) == 0 {
		t.Fatalf("no audit log in %s: %v", dir, err)
	}
	b, err := os.ReadFile(filepath.Join(dir, ents[len(ents)-1].Name()))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o644); err != nil {
		t.Fatal(err)
	}
}
