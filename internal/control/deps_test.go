package control

import (
	"testing"

	"github.com/tunwall/tunwall/internal/testenv"
)

// TestDepsDecideNothing keeps the control plane a client of the session:
// it asks (Source) and never reaches the engine, the stack, the policy or
// the session itself, nor parses flags.
func TestDepsDecideNothing(t *testing.T) {
	const mod = "github.com/tunwall/tunwall"
	for _, d := range testenv.Deps(t) {
		for _, f := range []string{mod + "/cmd", mod + "/internal/session", mod + "/internal/engine", mod + "/stack", mod + "/policy", mod + "/dnsintercept", "os/exec"} {
			if testenv.Under(d.Path, f) {
				t.Errorf("control depends on %s (forbidden: %s)", d.Path, f)
			}
		}
	}
}
