package main

import (
	"bytes"
	"context"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/tunwall/tunwall/internal/audit"
)

// exitFixtures writes the files the exit-status cases use.
type exitFixtures struct {
	good, twoPhase, broken, log, tampered, busy string
}

func newExitFixtures(t *testing.T) exitFixtures {
	t.Helper()
	dir := t.TempDir()
	f := exitFixtures{
		good:     filepath.Join(dir, "good.yaml"),
		twoPhase: filepath.Join(dir, "agent.yaml"),
		broken:   filepath.Join(dir, "broken.yaml"),
		log:      filepath.Join(dir, "run.jsonl"),
		tampered: filepath.Join(dir, "tampered.jsonl"),
	}
	write := func(p, s string) {
		if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(f.good, "version: 1\nphases:\n  exec:\n    allow:\n      - host: allowed.test\n")
	write(f.twoPhase, "version: 1\nphases:\n  setup:\n    allow:\n      - host: a.test\n  exec:\n    allow:\n      - host: b.test\n")
	write(f.broken, "version: 1\nphases:\n  exec:\n    allow:\n      - cidr: 10.0.0.0/33\n")
	w, err := audit.Open(audit.Options{Path: f.log, Header: audit.Header{Run: audit.NewRunID(), Phase: "exec"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Close(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(f.log)
	if err != nil {
		t.Fatal(err)
	}
	write(f.tampered, strings.Replace(string(b), `"phase":"exec"`, `"phase":"exed"`, 1))
	// An address in use: socks cannot bind it (125), though it is well formed.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	f.busy = ln.Addr().String()
	return f
}

// exitCase is one row of the exit-status table run as a unit: tunwall's
// own run() with these arguments.
type exitCase struct {
	name   string
	args   []string
	code   int
	stdout string // a substring stdout must hold ("" for none)
	stderr string // a substring stderr must hold
}

func exitCases(f exitFixtures) []exitCase {
	net := []string{"--dns-upstream", "192.0.2.53:53", "--audit", "off"}
	// with puts the flags every serving command needs right after the
	// command, before its own flags and command line.
	with := func(cmd string, a ...string) []string {
		return append(append([]string{cmd}, net...), a...)
	}
	return []exitCase{
		// 0: ok and help.
		{"version", []string{"version"}, 0, "tunwall ", ""},
		{"help", []string{"help"}, 0, "Commands:", ""},
		{"--help", []string{"--help"}, 0, "Commands:", ""},
		{"help run", []string{"help", "run"}, 0, "--policy FILE", ""},
		{"run -h", []string{"run", "-h"}, 0, "--policy FILE", ""},
		{"run --help", []string{"run", "--help"}, 0, "--dns-upstream IP:PORT", ""},
		{"bwrap --help", []string{"bwrap", "--help"}, 0, "usage: tunwall bwrap", ""},
		{"attach -h", []string{"attach", "-h"}, 0, "--netns PATH", ""},
		{"socks -h", []string{"socks", "-h"}, 0, "--listen ADDR", ""},
		{"policy -h", []string{"policy", "-h"}, 0, "explain FILE", ""},
		{"policy --help", []string{"policy", "--help"}, 0, "suggest AUDIT.jsonl", ""},
		{"policy check -h", []string{"policy", "check", "-h"}, 0, "usage: tunwall policy check", ""},
		{"policy explain FILE --help", []string{"policy", "explain", f.good, "--help"}, 0, "--phase NAME", ""},
		{"help policy suggest", []string{"help", "policy", "suggest"}, 0, "usage: tunwall policy suggest", ""},
		{"audit -h", []string{"audit", "-h"}, 0, "verify FILE", ""},
		{"audit verify -h", []string{"audit", "verify", "-h"}, 0, "--expect HASH", ""},
		{"help audit summary", []string{"help", "audit", "summary"}, 0, "usage: tunwall audit summary", ""},
		{"policy check ok", []string{"policy", "check", f.good}, 0, ": ok:", ""},
		{"policy explain allowed", []string{"policy", "explain", f.good, "allowed.test:443"}, 0, "allow", ""},
		{"audit verify ok", []string{"audit", "verify", f.log}, 0, "chain intact", ""},
		{"audit summary ok", []string{"audit", "summary", f.log}, 0, "integrity  ok", ""},

		// 1: a check failed.
		{"policy check broken", []string{"policy", "check", f.broken}, 1, "", "broken.yaml:5"},
		{"policy explain denied", []string{"policy", "explain", f.good, "evil.test:443"}, 1, "deny", ""},
		{"audit verify tampered", []string{"audit", "verify", f.tampered}, 1, "FAILED", ""},
		{"audit summary tampered", []string{"audit", "summary", f.tampered}, 1, "integrity  FAILED", "integrity check failed"},

		// 2: usage.
		{"no command", nil, 2, "", "usage: tunwall COMMAND"},
		{"unknown command", []string{"polcy"}, 2, "", "did you mean 'tunwall policy'"},
		{"a flag before the command", []string{"--policy", f.good, "run"}, 2, "", "the command comes first"},
		{"unknown flag", []string{"run", "--polcy", f.good, "--", "true"}, 2, "", "did you mean --policy?"},
		{"run: a flag given twice", []string{"run", "--policy", f.good, "--policy", f.good, "--", "true"}, 2, "", "more than once"},
		{"run: no command", []string{"run", "--allow", "allowed.test"}, 2, "", "no command given"},
		{"run: bad --allow", with("run", "--allow", "allowed.test:99999", "--", "true"), 2, "", "--allow"},
		{"run: policy does not load", with("run", "--policy", f.broken, "--", "true"), 2, "", "broken.yaml:5"},
		{"run: two phases, no --phase", with("run", "--policy", f.twoPhase, "--", "true"), 2, "", "--phase"},
		{"run: bad --upstream", with("run", "--allow", "a.test", "--upstream", "socks5h://192.0.2.1:1080", "--", "true"), 2, "", "--upstream"},
		{"run: bad --upstream scheme", with("run", "--allow", "a.test", "--upstream", "http://192.0.2.1:1080", "--", "true"), 2, "", "--upstream"},
		{"run: bad --dns-upstream", []string{"run", "--allow", "a.test", "--dns-upstream", "resolver", "--", "true"}, 2, "", "--dns-upstream"},
		{"run: bad --mtu", with("run", "--allow", "a.test", "--mtu", "100", "--", "true"), 2, "", "--mtu"},
		{"bwrap: options before --", []string{"bwrap", "--allow", "a.test", "--ro-bind", "/", "/"}, 2, "", "bwrap's own options go after --"},
		{"bwrap: bad --upstream", with("bwrap", "--allow", "a.test", "--upstream", "socks5h://192.0.2.1:1080", "--", "--ro-bind", "/", "/", "true"), 2, "", "--upstream"},
		{"attach: neither --pid nor --netns", with("attach", "--allow", "a.test"), 2, "", "--pid"},
		{"attach: policy does not load", with("attach", "--netns", "/nonexistent/ns", "--policy", f.broken), 2, "", "broken.yaml:5"},
		{"attach: bad --upstream", with("attach", "--netns", "/nonexistent/ns", "--allow", "a.test", "--upstream", "socks5h://192.0.2.1:1080"), 2, "", "--upstream"},
		{"attach: bad --dns-upstream", []string{"attach", "--netns", "/nonexistent/ns", "--allow", "a.test", "--dns-upstream", "x"}, 2, "", "--dns-upstream"},
		{"socks: no --listen", with("socks", "--allow", "a.test"), 2, "", "--listen"},
		{"socks: bad --listen", with("socks", "--allow", "a.test", "--listen", "1080"), 2, "", "--listen"},
		{"socks: bad --listen port", with("socks", "--allow", "a.test", "--listen", "127.0.0.1:http-alt"), 2, "", "--listen"},
		{"socks: policy does not load", with("socks", "--listen", "127.0.0.1:0", "--policy", f.broken), 2, "", "broken.yaml:5"},
		{"socks: bad --upstream", with("socks", "--listen", "127.0.0.1:0", "--allow", "a.test", "--upstream", "socks5://192.0.2.1"), 2, "", "--upstream"},
		{"socks: bad --dns-upstream", []string{"socks", "--listen", "127.0.0.1:0", "--allow", "a.test", "--dns-upstream", "x:y"}, 2, "", "--dns-upstream"},
		{"policy: unknown subcommand", []string{"policy", "chek", f.good}, 2, "", "did you mean 'tunwall policy check'"},
		{"policy check: no file", []string{"policy", "check"}, 2, "", "want exactly one FILE"},
		{"policy explain: file does not load", []string{"policy", "explain", f.broken, "allowed.test"}, 2, "", "broken.yaml:5"},
		{"policy explain: bad destination", []string{"policy", "explain", f.good, "allowed.test:0"}, 2, "", "bad port"},
		{"audit: unknown subcommand", []string{"audit", "verfy", f.log}, 2, "", "did you mean 'tunwall audit verify'"},
		{"audit verify: bad --expect", []string{"audit", "verify", f.log, "--expect", "abc"}, 2, "", "SHA-256"},

		// 125: tunwall could not build or serve the sandbox.
		{"attach: no such namespace", with("attach", "--netns", "/nonexistent/ns", "--allow", "a.test"), 125, "", "attach"},
		{"socks: address in use", with("socks", "--listen", f.busy, "--allow", "a.test"), 125, "", "address already in use"},
	}
}

// integrationRows are the rows of the README's exit-status table that need
// a sandbox: each is run by the named integration test.
var integrationRows = map[string]string{
	"the command's": "cli_exit_test.go:TestCLIExitStatusIsTheCommands",
	"3":             "hardening_guard_cli_test.go:TestAttachStopsWhenTheNamespaceGainsAWayOut",
	"125":           "cli_exit_test.go:TestCLIExitStatusIsTheCommands",
	"126":           "cli_exit_test.go:TestCLIExitStatusIsTheCommands",
	"127":           "cli_exit_test.go:TestCLIExitStatusIsTheCommands",
	"122":           "audit_faults_test.go:TestAFullDiskLeavesAVerifiableLogAndAnExitStatusThatSaysSo",
}

func TestExitStatusTable(t *testing.T) {
	f := newExitFixtures(t)
	for _, c := range exitCases(f) {
		t.Run(c.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(context.Background(), c.args, &stdout, &stderr)
			if code != c.code {
				t.Errorf("tunwall %q: exit %d, want %d\n--- stdout\n%s--- stderr\n%s", c.args, code, c.code, stdout.String(), stderr.String())
			}
			if c.stdout != "" && !strings.Contains(stdout.String(), c.stdout) {
				t.Errorf("tunwall %q: stdout lacks %q:\n%s", c.args, c.stdout, stdout.String())
			}
			if c.stderr != "" && !strings.Contains(stderr.String(), c.stderr) {
				t.Errorf("tunwall %q: stderr lacks %q:\n%s", c.args, c.stderr, stderr.String())
			}
			switch {
			case c.code == exitOK && stderr.Len() > 0:
				// Help and results go to stdout, and nothing to stderr.
				t.Errorf("tunwall %q wrote to stderr:\n%s", c.args, stderr.String())
			case c.code == exitUsage && len(c.args) > 0:
				// A usage error is one line and a hint, not the flag list.
				if n := strings.Count(stderr.String(), "\n"); n > 2 {
					t.Errorf("tunwall %q: a usage error of %d lines:\n%s", c.args, n, stderr.String())
				}
				if strings.Contains(stderr.String(), "\n  -") {
					t.Errorf("tunwall %q: a usage error printed the flags:\n%s", c.args, stderr.String())
				}
			}
		})
	}
}

// TestExitStatusTableCoversTheReadme checks that every row of the README's
// exit-status table has cases here or a named integration
// test, so a row added there without a test fails.
func TestExitStatusTableCoversTheReadme(t *testing.T) {
	readme, err := os.ReadFile("../../docs/cli.md")
	if err != nil {
		t.Fatal(err)
	}
	sec := string(readme)
	i := strings.Index(sec, "\n## Exit status\n")
	if i < 0 {
		t.Fatal("docs/cli.md has no Exit status section")
	}
	sec = sec[i+1:]
	if j := strings.Index(sec[3:], "\n## "); j >= 0 {
		sec = sec[:j+3]
	}
	row := regexp.MustCompile(`(?m)^\| ([^|]+?) \|`)
	byCode := map[string]int{}
	for _, c := range exitCases(newExitFixtures(t)) {
		byCode[strconv.Itoa(c.code)]++
	}
	rows := 0
	for _, m := range row.FindAllStringSubmatch(sec, -1) {
		status := m[1]
		if status == "status" || strings.HasPrefix(status, "---") {
			continue
		}
		rows++
		if byCode[status] > 0 {
			continue
		}
		test, ok := integrationRows[status]
		if !ok {
			t.Errorf("README exit status %q has no case in exitCases and no integration test in integrationRows", status)
			continue
		}
		file, fn, _ := strings.Cut(test, ":")
		src, err := os.ReadFile(filepath.Join("../../integration", file))
		if err != nil || !strings.Contains(string(src), "func "+fn+"(") {
			t.Errorf("README exit status %q: integration test %s not found (%v)", status, test, err)
		}
	}
	if rows < 8 {
		t.Errorf("found %d rows in the README's exit-status table, want at least 8", rows)
	}
}
