package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
)

// steerScript is the sandbox's side of the steering demo: a long download
// from a host only the setup phase allows, a line that asks for the
// switch, and, once it came, what each phase allows. release is the file
// the demo creates after the switch.
func steerScript(release string) string {
	return `echo '$ curl --limit-rate 200k https://a.cdn.allowed.test/bytes/100000000 -o /dev/null &   (setup only: a long download)'
curl -sS --limit-rate 200k -o /dev/null https://a.cdn.allowed.test/bytes/100000000 2>&1 & pid=$!
sleep 1; echo SWITCH-NOW
n=0; while [ ! -e ` + shellQuote(release) + ` ] && [ $n -lt 300 ]; do sleep 0.1; n=$((n+1)); done
(sleep 5; kill $pid 2>/dev/null) & wait $pid; echo "the download ended: curl exit $?"
echo '$ curl https://a.cdn.allowed.test/   (setup only)'
curl -sS --max-time 5 https://a.cdn.allowed.test/ 2>&1; echo "curl exit $?"
echo '$ curl https://api.allowed.test/     (exec)'
curl -sS --max-time 5 https://api.allowed.test/ 2>&1; echo "curl exit $?"
`
}

// steering runs one sandbox through both phases of the policy: it starts in
// setup with a download running, and `tunwall ctl phase exec`, from
// outside, cuts the download and shuts the setup hosts; the exec host
// still answers, and the audit log has the switch and the cut flow.
func (d *demo) steering(ctx context.Context, dir, policy string, env []string) {
	heading("Steering a running sandbox: tunwall ctl phase exec, while a setup download runs")
	xdg := filepath.Join(dir, "xdg")
	if err := os.Mkdir(xdg, 0o700); err != nil {
		d.check(false, "make %s: %v", xdg, err)
		return
	}
	env = append(env, "XDG_RUNTIME_DIR="+xdg)
	audit := filepath.Join(dir, "steer.jsonl")
	release := filepath.Join(dir, "switched")
	c := d.agentCommand(ctx, "run", "--policy", policy, "--phase", "setup", "--audit", audit, "--", "sh", "-c", steerScript(release))
	c.Env = env
	var mu sync.Mutex // one line at a time on stdout
	say := func(s string) {
		mu.Lock()
		fmt.Println(s)
		mu.Unlock()
	}
	stderr := &lineWriter{fn: func(l string) { say("  " + l) }}
	c.Stderr = stderr
	pipe, err := c.StdoutPipe()
	if err != nil {
		d.check(false, "%v", err)
		return
	}
	if err := d.w.InAgent(c.Start); err != nil {
		d.check(false, "start tunwall run: %v", err)
		return
	}
	defer os.WriteFile(release, nil, 0o644) // never leave the sandbox waiting
	var lines []string
	sc := bufio.NewScanner(pipe)
	for sc.Scan() {
		l := sc.Text()
		if l != "SWITCH-NOW" {
			say("  " + l)
			lines = append(lines, l)
			continue
		}
		flows := d.ctl(ctx, c.Process.Pid, env, xdg, "flows")
		d.check(strings.Contains(flows, "a.cdn.allowed.test"), "ctl flows did not list the running download")
		out := d.ctl(ctx, c.Process.Pid, env, xdg, "phase", "exec")
		d.check(strings.Contains(out, "setup -> exec") && strings.Contains(out, "revoked"), "ctl phase exec did not say what it cut")
		os.WriteFile(release, nil, 0o644)
	}
	err = c.Wait()
	stderr.Flush()
	d.check(err == nil, "tunwall run: %v", err)
	exits := map[string]int{}
	what := ""
	for _, l := range lines {
		switch {
		case strings.HasPrefix(l, "$ "):
			what = l
		case strings.HasPrefix(l, "the download ended: curl exit "):
			exits["download"], _ = strconv.Atoi(strings.TrimPrefix(l, "the download ended: curl exit "))
		case strings.HasPrefix(l, "curl exit "):
			exits[what], _ = strconv.Atoi(strings.TrimPrefix(l, "curl exit "))
		}
	}
	var setupHost, execHost string
	for k := range exits {
		if strings.Contains(k, "(setup only)") {
			setupHost = k
		}
		if strings.Contains(k, "(exec)") {
			execHost = k
		}
	}
	// 143: still running 5 s after the switch, the script's own kill.
	d.check(exits["download"] != 0 && exits["download"] != 143, "the setup download was not cut by the switch (curl exit %d)", exits["download"])
	d.check(setupHost != "" && exits[setupHost] != 0, "the setup-only host answered after the switch")
	d.check(execHost != "" && exits[execHost] == 0, "the exec host did not answer after the switch")
	b, err := os.ReadFile(audit)
	d.check(err == nil, "read the audit log: %v", err)
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, `"kind":"phase"`) {
			fmt.Println("the switch:", l)
		}
		if strings.Contains(l, `"outcome":"revoked"`) {
			fmt.Println("the download:", l)
		}
	}
	d.check(strings.Contains(string(b), `"kind":"phase"`) && strings.Contains(string(b), `"outcome":"revoked"`),
		"the audit log lacks the phase record or the revoked flow")
	d.cmd(0, "audit", "verify", audit)
}

// ctl runs tunwall ctl ARGS against the run whose tunwall is pid, as its
// user and, rootless, in its user namespace (a client in another is
// refused), and shows what it prints.
func (d *demo) ctl(ctx context.Context, pid int, env []string, xdg string, args ...string) string {
	fmt.Printf("\n%s$ tunwall ctl %s%s\n", bold, strings.Join(args, " "), reset)
	argv := append([]string{d.tw, "ctl"}, args...)
	if _, _, ok := invoker(); ok {
		// The demo's root is the invoking user in tunwall's namespace.
		argv = append([]string{"nsenter", "--target", strconv.Itoa(pid), "--user", "--preserve-credentials", "--"}, argv...)
	}
	c := exec.CommandContext(ctx, argv[0], argv[1:]...)
	c.Env = env
	out, err := c.CombinedOutput()
	os.Stdout.Write(out)
	d.check(err == nil, "tunwall ctl %s: %v", strings.Join(args, " "), err)
	return string(out)
}
