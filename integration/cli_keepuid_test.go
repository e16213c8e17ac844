package integration

import (
	"strings"
	"testing"
)

// TestCLIRunKeepUID: with --keep-uid the command runs as the caller's own
// uid (rootless, and as root: SUDO_UID or nobody), with no capability, and
// its network is tunwall's as ever; without it, it is root of its user
// namespace.
func TestCLIRunKeepUID(t *testing.T) {
	requireTools(t, "curl", "setpriv")
	w := newWorld(t)
	script := `echo "uid=$(id -u) gid=$(id -g)"; grep -E '^Cap(Eff|Prm|Amb):' /proc/self/status | tr -s '\t' ' '; curl -sS --max-time 10 http://allowed.test/keep`
	for _, c := range []struct {
		name    string
		o       runOpts
		wantUID string
	}{
		{"rootless", runOpts{asUser: 65534, flags: []string{"--keep-uid", "--allow", "allowed.test:80"}, script: script}, "uid=65534 gid=65534"},
		{"as root, SUDO_UID", runOpts{env: []string{"SUDO_UID=4321", "SUDO_GID=4321"}, flags: []string{"--keep-uid", "--allow", "allowed.test:80"}, script: script}, "uid=4321 gid=4321"},
		{"without --keep-uid", runOpts{asUser: 65534, flags: []string{"--allow", "allowed.test:80"}, script: script}, "uid=0 gid=0"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := w.mustRun(0, c.o)
			if !strings.Contains(r.stdout, c.wantUID) || !strings.Contains(r.stdout, "web allowed.test /keep") {
				t.Errorf("want %q and the allowed request\n%s", c.wantUID, r)
			}
			if c.wantUID != "uid=0 gid=0" {
				for _, k := range []string{"CapEff: 0000000000000000", "CapPrm: 0000000000000000", "CapAmb: 0000000000000000"} {
					if !strings.Contains(r.stdout, k) {
						t.Errorf("want %s: the command must hold no capability\n%s", k, r)
					}
				}
			}
		})
	}
}
