// Package testenv holds what tests share about the machine they run on: a
// skip that becomes a failure under CI=true, and the dependency list that
// the packages' dependency guards check. It is imported only by tests.
package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// InCI reports whether the tests run in CI (CI=true), where every tool and
// privilege a test needs is there, so a test that cannot run is a failure.
func InCI() bool { return os.Getenv("CI") == "true" }

// Skip skips t loudly, saying why; under CI=true it fails t instead, so a
// test that did not run cannot pass there.
func Skip(t testing.TB, format string, args ...any) {
	t.Helper()
	why := fmt.Sprintf(format, args...)
	if InCI() {
		t.Fatalf("cannot run, and CI=true refuses to skip: %s", why)
	}
	t.Skipf("!!! SKIPPING: %s !!!", why)
}

// Dep is one package a package depends on.
type Dep struct {
	Path     string
	Standard bool // in the standard library
}

// Deps returns every package the package in the current directory depends
// on (go list -deps ., without test files), itself included. A guard that
// cannot list them fails rather than pass unchecked.
func Deps(t testing.TB) []Dep {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("go tool not found: %v", err)
	}
	out, err := exec.Command(goBin, "list", "-deps", "-f", "{{.ImportPath}} {{.Standard}}", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	var deps []Dep
	for line := range strings.Lines(strings.TrimSpace(string(out))) {
		path, std, _ := strings.Cut(strings.TrimSpace(line), " ")
		deps = append(deps, Dep{Path: path, Standard: std == "true"})
	}
	if len(deps) < 2 {
		t.Fatalf("go list printed only %d packages:\n%s", len(deps), out)
	}
	return deps
}

// Under reports whether path is prefix or a package below it ("gvisor.dev/"
// style prefixes ending in a slash match anything under them).
func Under(path, prefix string) bool {
	if strings.HasSuffix(prefix, "/") {
		return strings.HasPrefix(path, prefix)
	}
	return path == prefix || strings.HasPrefix(path, prefix+"/")
}

// CheckDeps fails t for each dependency of the current directory's package
// under a forbidden prefix, and each third-party one under no allowed prefix.
func CheckDeps(t testing.TB, name string, forbidden, allowedThirdParty []string) {
	t.Helper()
	for _, d := range Deps(t) {
		for _, f := range forbidden {
			if Under(d.Path, f) {
				t.Errorf("%s depends on %s (forbidden: %s)", name, d.Path, f)
			}
		}
		if d.Standard {
			continue
		}
		ok := false
		for _, a := range allowedThirdParty {
			ok = ok || Under(d.Path, a)
		}
		if !ok {
			t.Errorf("%s depends on third-party package %s (allowed: %s)", name, d.Path, strings.Join(allowedThirdParty, ", "))
		}
	}
}
