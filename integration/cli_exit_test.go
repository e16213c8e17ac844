package integration

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCLIExitStatusIsTheCommands runs the rows of the README's exit-status
// table that need a sandbox (the others are cmd/tunwall's
// TestExitStatusTable): run and bwrap exit with the command's status,
// 128+N for a signal, 126 and 127 for a command that cannot run, 125 when
// tunwall cannot serve the sandbox.
func TestCLIExitStatusIsTheCommands(t *testing.T) {
	w := newWorld(t)
	notExec := filepath.Join(w.dir, "not-executable")
	if err := os.WriteFile(notExec, []byte("#!/bin/sh\nexit 0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	allow := []string{"--allow", "allowed.test"}
	cases := []struct {
		name   string
		o      runOpts
		code   int
		stderr string
	}{
		{"run: the command's status", runOpts{flags: allow, script: "exit 42"}, 42, ""},
		{"run: killed by signal 9", runOpts{flags: allow, script: "kill -9 $$"}, 128 + 9, ""},
		{"run: not found", runOpts{flags: allow, argv: []string{"/nonexistent/tunwall-no-such-command"}}, 127, "no such file"},
		{"run: not found in PATH", runOpts{flags: allow, argv: []string{"tunwall-no-such-command"}}, 127, "not found"},
		{"run: not executable", runOpts{flags: allow, argv: []string{notExec}}, 126, "permission denied"},
		{"run: the audit log cannot be opened", runOpts{flags: append([]string{"--audit", "/proc/tunwall-no-such-dir/a.jsonl"}, allow...), script: "true"}, 125, "audit: "},
		{"bwrap: the command's status", runOpts{flags: allow, bwrap: bwrapBase, script: "exit 42"}, 42, ""},
		{"bwrap: killed by signal 9", runOpts{flags: allow, bwrap: bwrapBase, script: "kill -9 $$"}, 128 + 9, ""},
		// README: bwrap's own failure to find the command is its exit 1.
		{"bwrap: not found (bwrap's own status)", runOpts{flags: allow, bwrap: bwrapBase, argv: []string{"/nonexistent/tunwall-no-such-command"}}, 1, "bwrap: execvp"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := w.run(c.o)
			if r.code != c.code {
				t.Errorf("exit %d, want %d\n%s", r.code, c.code, r)
			}
			if c.stderr != "" && !strings.Contains(strings.ToLower(r.stderr), c.stderr) {
				t.Errorf("stderr lacks %q\n%s", c.stderr, r)
			}
		})
	}
}
