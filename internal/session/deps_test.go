package session

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/tunwall/tunwall/internal/testenv"
)

// TestDeps keeps flags and the CLI out of the session (ARCHITECTURE:
// "session ... must not parse flags"): a node agent drives it with
// Options, not a command line.
func TestDeps(t *testing.T) {
	const mod = "github.com/tunwall/tunwall"
	for _, d := range testenv.Deps(t) {
		for _, f := range []string{mod + "/cmd", "os/signal", "os/exec"} {
			if testenv.Under(d.Path, f) {
				t.Errorf("session depends on %s (forbidden: %s)", d.Path, f)
			}
		}
	}
	// No package of tunwall's below the session imports flag. (The
	// Prometheus client's text format brings in package testing, and so
	// flag, through github.com/pandatix/go-abnf; it parses no flag.)
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}} {{join .Imports \" \"}}", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for l := range strings.Lines(string(out)) {
		f := strings.Fields(l)
		if len(f) == 0 || !testenv.Under(f[0], mod) {
			continue
		}
		for _, imp := range f[1:] {
			if imp == "flag" {
				t.Errorf("%s imports flag", f[0])
			}
		}
	}
}
