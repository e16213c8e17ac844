package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/tunwall/tunwall/internal/session"
)

func TestAuditDirRetention(t *testing.T) {
	dir := t.TempDir()
	now := time.Now()
	var names []string
	for i := range 6 {
		n := filepath.Join(dir, fmt.Sprintf("tw-%016x.jsonl", i))
		os.WriteFile(n, []byte(fmt.Sprintf(`{"ts":"2026-01-0%dT00:00:00Z","phase":"exec","kind":"header"}`+"\n", i+1)), 0o600)
		// i=0 is 40 days old, the others i hours old, newest last.
		age := time.Duration(6-i) * time.Hour
		if i == 0 {
			age = 40 * 24 * time.Hour
		}
		os.Chtimes(n, now.Add(-age), now.Add(-age))
		names = append(names, n)
	}
	other := filepath.Join(dir, "notes.jsonl")
	os.WriteFile(other, []byte("x"), 0o600)
	os.Chtimes(other, now.Add(-400*24*time.Hour), now.Add(-400*24*time.Hour))
	link := filepath.Join(dir, "tw-ffffffffffffffff.jsonl")
	os.Symlink(other, link)
	current := names[1] // the starting run's log is spared, whatever its age
	var stderr bytes.Buffer
	session.PruneAuditDir(dir, current, 3, 30, now, &stderr)
	exists := func(p string) bool { _, err := os.Lstat(p); return err == nil }
	want := map[string]bool{names[0]: false, names[1]: true, names[2]: false, names[3]: false, names[4]: true, names[5]: true, other: true, link: true}
	for p, w := range want {
		if exists(p) != w {
			t.Errorf("%s exists %v, want %v", filepath.Base(p), exists(p), w)
		}
	}
	if !strings.Contains(stderr.String(), "removed 3 old run logs") {
		t.Errorf("stderr: %q", stderr.String())
	}

	// audit ls lists what is left, newest first, within 100 columns.
	var out bytes.Buffer
	stderr.Reset()
	if code := run(context.Background(), []string{"audit", "ls", dir}, &out, &stderr); code != 0 {
		t.Fatalf("audit ls: exit %d\n%s", code, stderr.String())
	}
	lines := strings.Split(strings.TrimRight(out.String(), "\n"), "\n")
	if len(lines) != 5 || !strings.HasPrefix(lines[1], filepath.Base(names[5])[:19]) || !strings.Contains(lines[1], "2026-01-06T00:00:00Z") || !strings.Contains(lines[4], "3 runs") {
		t.Errorf("audit ls:\n%s", out.String())
	}
	for _, l := range lines[:4] {
		if utf8.RuneCountInString(l) > 100 {
			t.Errorf("a line of %d columns: %q", utf8.RuneCountInString(l), l)
		}
	}
}

// Pruning the default audit folder is said the first time it removes
// something, not on every run after: a folder at its limit loses a log on
// every run.
func TestPruningTheAuditFolderIsSaidOnce(t *testing.T) {
	dir := t.TempDir()
	now := time.Now()
	var said []string
	for run := range 4 {
		for i := range 3 {
			n := filepath.Join(dir, fmt.Sprintf("tw-%08x%08x.jsonl", run, i))
			os.WriteFile(n, []byte("{}\n"), 0o600)
			at := now.Add(time.Duration(run*3+i-20) * time.Minute)
			os.Chtimes(n, at, at)
		}
		current := filepath.Join(dir, fmt.Sprintf("tw-%08x%08x.jsonl", run, 2))
		var stderr bytes.Buffer
		session.PruneAuditDir(dir, current, 2, 30, now, &stderr)
		if stderr.Len() > 0 {
			said = append(said, stderr.String())
		}
		if logs, _ := session.RunLogs(dir); len(logs) != 2 {
			t.Fatalf("run %d: %d logs left, want 2", run, len(logs))
		}
	}
	if len(said) != 1 || !strings.Contains(said[0], "removed 1 old run logs") || !strings.Contains(said[0], "--audit-keep") {
		t.Errorf("want the pruning said once, on the first run that pruned; said %q", said)
	}
}

func TestSocksOnANonLoopbackAddressWarns(t *testing.T) {
	for _, c := range []struct {
		listen string
		warn   bool
	}{{"0.0.0.0:0", true}, {"127.0.0.1:0", false}, {"[::1]:0", false}} {
		var stdout, stderr bytes.Buffer
		// The audit log cannot be opened, so socks stops after listening.
		code := run(context.Background(), []string{"socks", "--listen", c.listen, "--allow", "a.test", "--dns-upstream", "192.0.2.53:53",
			"--audit", "/proc/tunwall-none/a.jsonl"}, &stdout, &stderr)
		if code != exitSetup {
			t.Errorf("%s: exit %d\n%s", c.listen, code, stderr.String())
		}
		if got := strings.Contains(stderr.String(), "is not a loopback address"); got != c.warn {
			t.Errorf("%s: warned %v, want %v\n%s", c.listen, got, c.warn, stderr.String())
		}
	}
}
