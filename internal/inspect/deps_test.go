package inspect

import (
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestImportsNoIO keeps the inspector pure (STYLE 2.1, ARCHITECTURE.md's
// "a pure core wrapped by a thin I/O layer"): its non-test files import
// only these packages, and nothing it depends on is a socket, a clock,
// a lock or a decider above it.
func TestImportsNoIO(t *testing.T) {
	allowed := map[string]bool{
		"fmt": true, "strconv": true,
		"github.com/tunwall/tunwall/flow":           true,
		"github.com/tunwall/tunwall/internal/sniff": true,
		"github.com/tunwall/tunwall/policy":         true, // NormalizeHost; policy is pure (its TestDeps)
	}
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	checked := 0
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		src, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		f, err := parser.ParseFile(fset, name, src, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range f.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			if !allowed[path] {
				t.Errorf("%s imports %q; inspect may import only %v", name, path, allowed)
			}
		}
		checked++
	}
	if checked < 2 {
		t.Fatalf("found %d source files to check", checked)
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("go tool not found: %v (a guard that cannot run must not pass)", err)
	}
	out, err := exec.Command(goBin, "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 5 {
		t.Fatalf("go list printed only %d packages:\n%s", len(deps), out)
	}
	for _, d := range deps {
		switch {
		case d == "net", d == "os/exec", d == "log", d == "log/slog", strings.HasPrefix(d, "net/") && d != "net/netip",
			strings.HasPrefix(d, "github.com/tunwall/tunwall/") && !allowed[d] && d != "github.com/tunwall/tunwall/internal/inspect":
			t.Errorf("inspect depends on %s", d)
		}
	}
}
