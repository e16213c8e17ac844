package sandbox

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/tunwall/tunwall/internal/testenv"
)

func TestUserMayJudgesByOwnerGroupAndOther(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.Skip(t, "needs root to chown")
	}
	base, err := os.MkdirTemp("", "tunwall-usermay-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	os.Chmod(base, 0o755)
	mk := func(name string, mode os.FileMode, uid, gid int) string {
		p := filepath.Join(base, name)
		if err := os.Mkdir(p, mode); err != nil {
			t.Fatal(err)
		}
		os.Chmod(p, mode)
		os.Chown(p, uid, gid)
		return p
	}
	me := HostUser{UID: 4321, GID: 4321}
	for _, c := range []struct {
		p    string
		want bool
	}{
		{mk("root-private", 0o700, 0, 0), false},
		{mk("owned", 0o700, 4321, 0), true},
		{mk("group", 0o770, 0, 4321), true},
		{mk("group-ro", 0o750, 0, 4321), false},
		{mk("sticky-tmp", 0o1777, 0, 0), true},
		{mk("other-ro", 0o755, 0, 0), false},
		{filepath.Join(mk("shut", 0o700, 0, 0), "below"), false},
	} {
		if got := userMay(c.p, me, 2|1); got != c.want {
			t.Errorf("userMay(%s, write) = %v, want %v", c.p, got, c.want)
		}
	}
	inside := filepath.Join(mk("closed", 0o700, 0, 0), "open")
	os.Mkdir(inside, 0o777)
	os.Chmod(inside, 0o777)
	if userMay(inside, me, 2|1) {
		t.Errorf("%s is writable but its parent is not searchable: want false", inside)
	}
}
