package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestTheCLIImportsAtMostEightOfTunwallsPackages keeps cmd/tunwall thin
// (issue 22): it parses flags, calls the session and prints; what is built
// below the session is built by the session (docs/development.md, Layout).
func TestTheCLIImportsAtMostEightOfTunwallsPackages(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("go tool not found: %v", err)
	}
	out, err := exec.Command(goBin, "list", "-f", "{{join .Imports \"\\n\"}}", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	var ours []string
	for l := range strings.Lines(string(out)) {
		if l = strings.TrimSpace(l); strings.HasPrefix(l, "github.com/tunwall/tunwall/") {
			ours = append(ours, strings.TrimPrefix(l, "github.com/tunwall/tunwall/"))
		}
	}
	if len(ours) < 2 {
		t.Fatalf("go list found only %q of tunwall's packages:\n%s", ours, out)
	}
	if len(ours) > 8 {
		t.Errorf("cmd/tunwall imports %d of tunwall's packages, at most 8: %q (let internal/session build what cmd builds itself)", len(ours), ours)
	}
}
