package node

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const (
	polA = "version: 1\nphases:\n  exec:\n    allow:\n      - host: a.test\n"
	polB = "version: 1\nphases:\n  exec:\n    allow:\n      - host: b.test\n"
)

// write replaces dir/name.yaml and moves its mtime on, as a ConfigMap
// update does (a rename within one clock tick would otherwise look the
// same to a poll that compares mtime and size).
func write(t *testing.T, dir, name, text string, at time.Time) {
	t.Helper()
	p := filepath.Join(dir, name+".yaml")
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(tmp, at, at); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, p); err != nil {
		t.Fatal(err)
	}
}

func TestPoliciesPollSwapsGoodVersionsAndKeepsTheOldOnError(t *testing.T) {
	dir := t.TempDir()
	now := time.Now()
	write(t, dir, "web", polA, now)
	p := newPolicies(dir)
	if !p.exists("web") || p.exists("nope") || p.exists("../web") {
		t.Fatal("exists is wrong")
	}
	v, err := p.get("web")
	if err != nil || !strings.Contains(string(v.src), "a.test") {
		t.Fatalf("get: %v", err)
	}
	var said []string
	report := func(s string) { said = append(said, s) }
	if ch := p.poll(report); len(ch) != 0 {
		t.Fatalf("unchanged file polled as changed")
	}
	// Touched, not changed: no new version.
	write(t, dir, "web", polA, now.Add(time.Second))
	if ch := p.poll(report); len(ch) != 0 {
		t.Errorf("a touched file is a new version")
	}
	// Broken: kept, said once, counted once.
	write(t, dir, "web", "version: 1\nphases: [\n", now.Add(2*time.Second))
	if ch := p.poll(report); len(ch) != 0 {
		t.Errorf("a broken file was swapped in")
	}
	p.poll(report)
	if len(said) != 1 || !strings.Contains(said[0], "keeping the version in effect") || p.reloadErrors()["web"] != 1 {
		t.Errorf("reports %q, errors %v", said, p.reloadErrors())
	}
	if v, _ := p.get("web"); !strings.Contains(string(v.src), "a.test") {
		t.Errorf("the version in effect changed after a broken write")
	}
	// Fixed and changed: swapped in.
	write(t, dir, "web", polB, now.Add(3*time.Second))
	ch := p.poll(report)
	if len(ch) != 1 || !strings.Contains(string(ch[0].src), "b.test") {
		t.Fatalf("the changed file was not swapped in: %v", ch)
	}
	// Gone: kept, reported.
	os.Remove(filepath.Join(dir, "web.yaml"))
	if ch := p.poll(report); len(ch) != 0 {
		t.Errorf("a removed file was swapped")
	}
	if !strings.Contains(said[len(said)-1], "is gone") || p.reloadErrors()["web"] != 2 {
		t.Errorf("removal: %q, errors %v", said, p.reloadErrors())
	}
	if v, _ := p.get("web"); !strings.Contains(string(v.src), "b.test") {
		t.Errorf("the version in effect went with the file")
	}
	p.forget("web")
	if _, err := p.get("web"); err == nil {
		t.Errorf("a forgotten, removed policy still loads")
	}
}
