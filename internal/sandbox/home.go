package sandbox

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// homeFor returns env with a HOME the sandbox's user as may write: the
// inherited one if it may, else a fresh private folder made for it (owned
// by it, mode 0700, removed when the sandbox is closed). Run as root with
// no SUDO_UID, the sandbox is nobody and root's HOME is not nobody's:
// npm, git and pip would fail there with advice that does not fit. It
// records as and the folder in sb.User and sb.Home.
func (sb *Sandbox) homeFor(as HostUser, env []string) ([]string, error) {
	sb.User = as
	if env == nil {
		env = os.Environ()
	}
	home := ""
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "HOME="); ok {
			home = v
		}
	}
	if home != "" && userMay(home, as, 2|1) {
		return env, nil
	}
	parent := os.TempDir()
	if !userMay(parent, as, 2|1) {
		parent = "/tmp" // root's TMPDIR may be private to root
	}
	dir, err := os.MkdirTemp(parent, "tunwall-home-")
	if err != nil {
		return nil, fmt.Errorf("make a HOME for the sandbox's user (uid %d): %w", as.UID, err)
	}
	if err := os.Chown(dir, as.UID, as.GID); err != nil {
		os.Remove(dir)
		return nil, fmt.Errorf("make a HOME for the sandbox's user (uid %d): %w", as.UID, err)
	}
	sb.Home = dir
	sb.cleanup = append(sb.cleanup, func() { os.RemoveAll(dir) })
	out := make([]string, 0, len(env)+1)
	for _, kv := range env {
		if !strings.HasPrefix(kv, "HOME=") {
			out = append(out, kv)
		}
	}
	return append(out, "HOME="+dir), nil
}

// userMay reports whether host user as (no supplementary groups, as the
// sandbox has none) may access directory p with the permission bits (4
// read, 2 write, 1 search), judged by the mode bits of p and the search bit
// of every directory above it (ACLs are not read).
func userMay(p string, as HostUser, bits uint32) bool {
	may := func(fi os.FileInfo, bits uint32) bool {
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			return false
		}
		m := uint32(fi.Mode().Perm())
		switch {
		case int(st.Uid) == as.UID:
			m >>= 6
		case int(st.Gid) == as.GID:
			m >>= 3
		}
		return m&bits == bits
	}
	p, err := filepath.Abs(p)
	if err != nil {
		return false
	}
	fi, err := os.Stat(p)
	if err != nil || !fi.IsDir() || !may(fi, bits) {
		return false
	}
	for dir := filepath.Dir(p); ; dir = filepath.Dir(dir) {
		fi, err := os.Stat(dir)
		if err != nil || !may(fi, 1) {
			return false
		}
		if dir == "/" {
			return true
		}
	}
}
