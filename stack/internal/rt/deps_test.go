package rt

import (
	"strings"
	"testing"

	"github.com/tunwall/tunwall/internal/testenv"
)

// TestDeps proves the stack's runtime is a leaf: no arrow runs from it
// back up to the stack, gVisor or anything else of tunwall's; the
// standard library and x/sys only.
func TestDeps(t *testing.T) {
	const self = "github.com/tunwall/tunwall/stack/internal/rt"
	testenv.CheckDeps(t, "stack/internal/rt", []string{"gvisor.dev/gvisor"}, []string{self, "golang.org/x/sys"})
	for _, d := range testenv.Deps(t) {
		if strings.HasPrefix(d.Path, "github.com/tunwall/tunwall") && d.Path != self {
			t.Errorf("stack/internal/rt depends on %s", d.Path)
		}
	}
}
