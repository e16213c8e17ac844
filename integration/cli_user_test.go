package integration

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
)

// rootOnlyHome is a HOME as root has one: a folder only root may write.
func rootOnlyHome(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("", "tunwall-roothome-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	if err := os.Chmod(d, 0o700); err != nil {
		t.Fatal(err)
	}
	return d
}

// firstLine is the first line tunwall printed on stderr.
func firstLine(r result) string {
	l, _, _ := strings.Cut(r.stderr, "\n")
	return l
}

var homeLine = regexp.MustCompile(`(?m)^home=(\S+)$`)

// TestRootRunsTheCommandAsASaidUserWithAHomeItCanWrite: run as root with
// no SUDO_UID, tunwall says in its first line that the command runs as
// nobody, and gives it a HOME it can write (root's is not nobody's), which
// is gone after the run; --user runs it as the owner of a workspace; uid 0
// is refused.
func TestRootRunsTheCommandAsASaidUserWithAHomeItCanWrite(t *testing.T) {
	requireTools(t, "curl")
	w := newWorld(t)
	rootHome := rootOnlyHome(t)
	noSudo := []string{"SUDO_UID=", "SUDO_GID=", "SUDO_USER=", "HOME=" + rootHome}
	script := `echo "uid=$(id -u)"; echo "home=$HOME"; touch "$HOME/x" && echo "home is writable"; curl -sS --max-time 10 http://allowed.test/user`

	t.Run("no SUDO_UID: nobody, said first, with a writable HOME", func(t *testing.T) {
		r := w.mustRun(0, runOpts{env: noSudo, flags: []string{"--allow", "allowed.test:80"}, script: script})
		if l := firstLine(r); !strings.Contains(l, "as nobody (uid 65534") || !strings.Contains(l, "HOME=") {
			t.Errorf("first line %q does not say the command runs as nobody, nor its HOME\n%s", l, r)
		}
		if !strings.Contains(r.stdout, "home is writable") || !strings.Contains(r.stdout, "web allowed.test /user") {
			t.Errorf("the command could not write its HOME\n%s", r)
		}
		m := homeLine.FindStringSubmatch(r.stdout)
		if m == nil || m[1] == rootHome {
			t.Fatalf("HOME is still root's %s\n%s", rootHome, r)
		}
		if !strings.Contains(firstLine(r), "HOME="+m[1]) {
			t.Errorf("first line %q does not name HOME=%s", firstLine(r), m[1])
		}
		if _, err := os.Stat(m[1]); !os.IsNotExist(err) {
			t.Errorf("the private HOME %s is still there after the run (%v)", m[1], err)
		}
	})

	t.Run("--user UID: the workspace owner's files", func(t *testing.T) {
		ws := filepath.Join(w.dir, "workspace")
		if err := os.Mkdir(ws, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(ws, 4321, 4321); err != nil {
			t.Fatal(err)
		}
		r := w.mustRun(0, runOpts{env: noSudo, flags: []string{"--user", "4321", "--keep-uid", "--allow", "allowed.test:80"},
			script: script + `; echo built > ` + ws + `/out && echo "workspace is writable"`})
		if l := firstLine(r); !strings.Contains(l, "uid 4321") {
			t.Errorf("first line %q does not name uid 4321\n%s", l, r)
		}
		for _, want := range []string{"uid=4321", "home is writable", "workspace is writable", "web allowed.test /user"} {
			if !strings.Contains(r.stdout, want) {
				t.Errorf("want %q\n%s", want, r)
			}
		}
		fi, err := os.Stat(filepath.Join(ws, "out"))
		if err != nil {
			t.Fatal(err)
		}
		if st := fi.Sys().(*syscall.Stat_t); st.Uid != 4321 || st.Gid != 4321 {
			t.Errorf("the workspace file is owned by %d:%d, want 4321:4321", st.Uid, st.Gid)
		}
	})

	t.Run("--user NAME:GID", func(t *testing.T) {
		r := w.mustRun(0, runOpts{env: noSudo, flags: []string{"--user", "nobody:4322", "--keep-uid", "--allow", "allowed.test:80"},
			script: `echo "ids=$(id -u):$(id -g)"`})
		if !strings.Contains(r.stdout, "ids=65534:4322") {
			t.Errorf("want ids=65534:4322\n%s", r)
		}
	})

	for _, bad := range []string{"0", "root", "0:0", "4321:0", "no-such-user-here", "12x"} {
		t.Run("--user "+bad+" is refused", func(t *testing.T) {
			r := w.mustRun(2, runOpts{env: noSudo, flags: []string{"--user", bad, "--allow", "allowed.test:80"}, script: "echo the command ran"})
			if strings.Contains(r.stdout, "the command ran") || !strings.Contains(r.stderr, "--user") {
				t.Errorf("want a refusal naming --user\n%s", r)
			}
		})
	}

	t.Run("bwrap says who too", func(t *testing.T) {
		requireTools(t, "bwrap")
		r := w.mustRun(0, runOpts{env: noSudo, flags: []string{"--allow", "allowed.test:80"},
			bwrap: []string{"--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--bind", "/tmp", "/tmp"}, script: script})
		if l := firstLine(r); !strings.Contains(l, "as nobody (uid 65534") {
			t.Errorf("first line %q does not say the command runs as nobody\n%s", l, r)
		}
		if !strings.Contains(r.stdout, "home is writable") {
			t.Errorf("the command could not write its HOME\n%s", r)
		}
		r = w.mustRun(0, runOpts{env: noSudo, flags: []string{"--user", "4321:4322", "--allow", "allowed.test:80"},
			bwrap: []string{"--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--bind", "/tmp", "/tmp"}, script: `echo "ids=$(id -u):$(id -g)"`})
		if !strings.Contains(r.stdout, "ids=4321:4322") {
			t.Errorf("bwrap --user 4321:4322: want ids=4321:4322\n%s", r)
		}
	})
}
