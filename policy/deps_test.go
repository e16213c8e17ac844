package policy

import (
	"os/exec"
	"strings"
	"testing"
)

const modPath = "github.com/tunwall/tunwall"

// TestDeps proves the package stays pure (STYLE 2.1): no netstack, no DNS
// library, no sockets, no HTTP, no logging, and no third-party code beyond
// YAML and IDNA (with the x/text tables IDNA needs).
func TestDeps(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("go tool not found: %v", err)
	}
	out, err := exec.Command(goBin, "list", "-deps", "-f", "{{.ImportPath}} {{.Standard}}", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	forbiddenPrefix := []string{"gvisor.dev/", "github.com/miekg/dns", modPath + "/stack", "net/http"}
	forbiddenExact := []string{"net", "log", "log/slog", "os/exec"}
	allowedThirdParty := []string{"go.yaml.in/yaml/v3", "golang.org/x/net/idna", "golang.org/x/text/", modPath + "/policy", modPath + "/flow"}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) < 10 {
		t.Fatalf("go list printed only %d packages:\n%s", len(lines), out)
	}
	for _, line := range lines {
		pkg, std, _ := strings.Cut(line, " ")
		for _, f := range forbiddenPrefix {
			if strings.HasPrefix(pkg, f) {
				t.Errorf("policy depends on %s (forbidden prefix %q)", pkg, f)
			}
		}
		for _, f := range forbiddenExact {
			if pkg == f {
				t.Errorf("policy depends on %s", pkg)
			}
		}
		if std == "true" {
			continue
		}
		ok := false
		for _, a := range allowedThirdParty {
			if pkg == a || strings.HasSuffix(a, "/") && strings.HasPrefix(pkg, a) {
				ok = true
			}
		}
		if !ok {
			t.Errorf("policy depends on third-party package %s", pkg)
		}
	}
}
