package control

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

// Dir is the directory of this user's control sockets:
// $XDG_RUNTIME_DIR/tunwall when XDG_RUNTIME_DIR is a directory of this
// user, else /run/tunwall as root, else $TMPDIR/tunwall-UID. It does not
// create it (EnsureDir does).
func Dir() string {
	uid := os.Geteuid()
	if x := os.Getenv("XDG_RUNTIME_DIR"); filepath.IsAbs(x) && ownedDir(x, uid) {
		return filepath.Join(x, "tunwall")
	}
	if uid == 0 {
		return "/run/tunwall"
	}
	return filepath.Join(os.TempDir(), "tunwall-"+strconv.Itoa(uid))
}

// ownedDir reports whether dir is a directory owned by uid.
func ownedDir(dir string, uid int) bool {
	fi, err := os.Stat(dir)
	if err != nil || !fi.IsDir() {
		return false
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	return ok && int(st.Uid) == uid
}

// SocketPath is the control socket of run in dir.
func SocketPath(dir, run string) string { return filepath.Join(dir, run+".sock") }

// EnsureDir creates dir (mode 0700) if it does not exist, and refuses one
// that is not a directory of this user closed to everyone else.
func EnsureDir(dir string) error {
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("control socket directory: %w", err)
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("control socket directory: %w", err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	switch {
	case !fi.IsDir():
		return fmt.Errorf("control socket directory %s is not a directory", dir)
	case !ok || int(st.Uid) != os.Geteuid():
		return fmt.Errorf("control socket directory %s is not owned by uid %d", dir, os.Geteuid())
	case fi.Mode().Perm()&0o077 != 0:
		return fmt.Errorf("control socket directory %s is open to others (mode %04o; want 0700)", dir, fi.Mode().Perm())
	}
	return nil
}

// PruneDead removes the sockets in dir that nobody listens on any more
// (those of a tunwall that was killed), at most maxRuns of them looked at.
// It returns how many it removed.
func PruneDead(dir string) int {
	names, _ := filepath.Glob(filepath.Join(dir, "*.sock"))
	if len(names) > maxRuns {
		names = names[:maxRuns]
	}
	n := 0
	for _, p := range names {
		c, err := net.DialTimeout("unix", p, time.Second)
		if err == nil {
			c.Close()
			continue
		}
		if errors.Is(err, syscall.ECONNREFUSED) && os.Remove(p) == nil {
			n++
		}
	}
	return n
}
