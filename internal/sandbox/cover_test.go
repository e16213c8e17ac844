package sandbox

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/tunwall/tunwall/internal/testenv"
)

func TestBwrapCoversTheControlSocketWhereverTheUsersBindsShowIt(t *testing.T) {
	dir := t.TempDir()
	ctl := filepath.Join(dir, "tunwall")
	if err := os.Mkdir(ctl, 0o700); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "explicit.sock")
	os.WriteFile(sock, nil, 0o600) // a stand-in: any non-directory is covered with /dev/null
	var as HostUser
	if os.Geteuid() == 0 {
		// As root, the sandbox runs as another user, and only what it
		// could reach is covered: make these its own.
		as = HostUser{UID: 65534, GID: 65534}
		for _, p := range []string{ctl, sock} {
			if err := os.Chown(p, as.UID, as.GID); err != nil {
				t.Fatal(err)
			}
		}
		os.Chmod(dir, 0o755)
		os.Chmod(filepath.Dir(dir), 0o755)
	}
	tail := []string{"--perms", "0444", "--ro-bind-data", "5", "/etc/resolv.conf", "--", "sh"}
	for _, c := range []struct {
		name   string
		opts   []string
		closed bool     // the directory closed to the sandbox's user (as root)
		want   []string // the cover options, in order
	}{
		{"the whole root bound: covered where it is", []string{"--ro-bind", "/", "/"}, false,
			[]string{"--perms", "0500", "--tmpfs", ctl, "--remount-ro", ctl, "--ro-bind", "/dev/null", sock}},
		{"its parent bound elsewhere: covered there", []string{"--bind", dir, "/work"}, false,
			[]string{"--perms", "0500", "--tmpfs", "/work/tunwall", "--remount-ro", "/work/tunwall", "--ro-bind", "/dev/null", "/work/explicit.sock"}},
		{"not bound: nothing to cover", []string{"--ro-bind", "/usr", "/usr"}, false, nil},
		{"unreachable for the sandbox's user: nothing to cover", []string{"--ro-bind", "/", "/"}, true, nil},
		{"bound, then hidden by a later tmpfs: nothing to cover", []string{"--ro-bind", "/", "/", "--tmpfs", dir}, false, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			opts := c.opts
			if c.closed {
				if os.Geteuid() != 0 {
					testenv.Skip(t, "rootless, the sandbox's user is the caller: it reaches what the caller does")
				}
				os.Chmod(dir, 0o700) // root's, closed
				defer os.Chmod(dir, 0o755)
			}
			args := append(slices.Clone(opts), tail...)
			got := withCover(args, "5", []string{ctl, sock}, as)
			want := append(append(slices.Clone(opts), c.want...), tail...)
			if !slices.Equal(got, want) {
				t.Errorf("\n got %s\nwant %s", strings.Join(got, " "), strings.Join(want, " "))
			}
		})
	}
}
