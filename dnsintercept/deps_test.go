package dnsintercept

import (
	"os/exec"
	"strings"
	"testing"
)

// TestDependencies keeps the package off the netstack side and independent
// of the policy engine (ARCHITECTURE "Packages", STYLE 2.1).
func TestDependencies(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s (a guard that cannot run must not pass)", err, out)
	}
	forbidden := []string{
		"gvisor.dev/",
		"github.com/tunwall/tunwall/stack",
		"github.com/tunwall/tunwall/policy",
		"github.com/tunwall/tunwall/tun",
		"net/http",
	}
	for _, dep := range strings.Fields(string(out)) {
		for _, f := range forbidden {
			if dep == f || strings.HasPrefix(dep, f) && (strings.HasSuffix(f, "/") || strings.HasPrefix(dep[len(f):], "/")) {
				t.Errorf("dnsintercept depends on %s (forbidden: %s)", dep, f)
			}
		}
	}
	if !strings.Contains(string(out), "github.com/miekg/dns") {
		t.Error("go list -deps output does not mention miekg/dns; the check is not looking at the right package")
	}
}
