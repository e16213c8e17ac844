package session

import (
	"testing"

	"github.com/tunwall/tunwall/internal/testenv"
)

// TestDeps keeps flags and the CLI out of the session (ARCHITECTURE:
// "session ... must not parse flags"): a node agent drives it with
// Options, not a command line.
func TestDeps(t *testing.T) {
	const mod = "github.com/tunwall/tunwall"
	for _, d := range testenv.Deps(t) {
		for _, f := range []string{"flag", mod + "/cmd", "os/signal", "os/exec"} {
			if testenv.Under(d.Path, f) {
				t.Errorf("session depends on %s (forbidden: %s)", d.Path, f)
			}
		}
	}
}
