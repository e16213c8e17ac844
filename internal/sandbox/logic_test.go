package sandbox

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// The user's bwrap binds decide where a host file shows in the sandbox: the
// last bind covering a path wins, a --tmpfs hides what lies below it, and a
// file is visible only where following the binds back leads to it again.
func TestUserBindsMapSandboxPathsToHostFiles(t *testing.T) {
	binds := userBinds([]string{
		"--ro-bind", "/", "/",
		"--bind", "/home/u/proj/", "/work",
		"--tmpfs", "/work/tmp",
		"--ro-bind-try", "/etc/ssl", "/opt/ssl",
		"--unknown-from-the-future", "x", // unknown: parsing stops here
		"--bind", "/secret", "/etc",
	})
	if len(binds) != 4 {
		t.Fatalf("userBinds = %v, want 4 binds (parsing stops at an unknown option)", binds)
	}
	for _, c := range []struct {
		path, host string
		ok         bool
	}{
		{"/usr/bin/env", "/usr/bin/env", true},
		{"/work/a/b", "/home/u/proj/a/b", true},
		{"/work", "/home/u/proj", true},
		{"/work/tmp/x", "", false}, // a tmpfs shows no host file
		{"/workshop", "/workshop", true},
		{"/opt/ssl/cert.pem", "/etc/ssl/cert.pem", true},
	} {
		h, ok := hostPathOf(binds, c.path)
		if h != c.host || ok != c.ok {
			t.Errorf("hostPathOf(%q) = %q, %v; want %q, %v", c.path, h, ok, c.host, c.ok)
		}
	}
	for _, c := range []struct {
		host, at string
		ok       bool
	}{
		{"/home/u/proj/x", "/work/x", true},
		{"/etc/ssl/cert.pem", "/opt/ssl/cert.pem", true},
		{"/home/u/proj/tmp/y", "/home/u/proj/tmp/y", true}, // via "/" (the tmpfs covers /work/tmp)
	} {
		at, ok := visibleAt(binds, c.host)
		if at != c.at || ok != c.ok {
			t.Errorf("visibleAt(%q) = %q, %v; want %q, %v", c.host, at, ok, c.at, c.ok)
		}
	}
	hidden := userBinds([]string{"--bind", "/home/u", "/home/u", "--tmpfs", "/home/u/.ssh"})
	if at, ok := visibleAt(hidden, "/home/u/.ssh/id"); ok {
		t.Errorf("a file under a tmpfs is visible at %q", at)
	}
}

func TestUnderIsAPathPrefixNotAStringPrefix(t *testing.T) {
	for _, c := range []struct {
		p, d string
		want bool
	}{
		{"/a/b", "/a", true}, {"/a", "/a", true}, {"/ab", "/a", false}, {"/x", "/", true}, {"/", "/a", false},
	} {
		if got := under(c.p, c.d); got != c.want {
			t.Errorf("under(%q, %q) = %v", c.p, c.d, got)
		}
	}
}

// Options that would put the sandbox into a namespace tunwall did not make
// are recognised, today's and those a later bwrap may add by their shape.
func TestJoinsNamespaceKnowsEveryWayIntoAnotherNamespace(t *testing.T) {
	for _, o := range []string{"--userns", "--userns2", "--pidns", "--netns", "--share-netns", "--cgroupns", "--join-net"} {
		if !joinsNamespace(o) {
			t.Errorf("joinsNamespace(%q) = false", o)
		}
	}
	for _, o := range []string{"--unshare-net", "--share-net", "--disable-userns", "--assert-userns-disabled", "--userns-block-fd", "--bind", "--ro-bind", "--setenv", "--chdir"} {
		if joinsNamespace(o) {
			t.Errorf("joinsNamespace(%q) = true", o)
		}
	}
}

// A descriptor handed to bwrap reaches the command: a network socket or a
// namespace would be a way out, a unix socket or a file is not.
func TestCheckPassedFDRefusesNetworkSocketsAndNamespaces(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	lf, err := ln.(*net.TCPListener).File()
	if err != nil {
		t.Fatal(err)
	}
	defer lf.Close()
	if err := checkPassedFD(int(lf.Fd())); err == nil || !strings.Contains(err.Error(), "network socket") {
		t.Errorf("a TCP socket: %v, want a refusal naming a network socket", err)
	}
	ns, err := os.Open("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	if err := checkPassedFD(int(ns.Fd())); err == nil || !strings.Contains(err.Error(), "namespace") {
		t.Errorf("a namespace descriptor: %v, want a refusal naming a namespace", err)
	}
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fds[0])
	defer unix.Close(fds[1])
	if err := checkPassedFD(fds[0]); err != nil {
		t.Errorf("a unix socket: %v", err)
	}
	f, err := os.CreateTemp(t.TempDir(), "f")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := checkPassedFD(int(f.Fd())); err != nil {
		t.Errorf("a file: %v", err)
	}
	if err := checkPassedFD(1 << 20); err == nil {
		t.Error("a descriptor that is not open passed")
	}
}

// resolv.conf options come from the host's file: none may add a line or a
// comment to the file the sandbox gets.
func TestOneWordsKeepsOnlySingleWords(t *testing.T) {
	got := oneWords([]string{"ndots:2", "", "a b", "x\nnameserver 1.2.3.4", "edns0", "#c", "t;u", "ü", "rotate"})
	want := []string{"ndots:2", "edns0", "rotate"}
	if !slices.Equal(got, want) {
		t.Errorf("oneWords = %q, want %q", got, want)
	}
}

func TestCloneErrorsSayHowToAllowUserNamespaces(t *testing.T) {
	for _, c := range []struct {
		err  error
		want string
	}{
		{unix.EPERM, "unprivileged_userns_clone"},
		{unix.EACCES, "apparmor"},
		{unix.ENOSPC, "max_user_namespaces"},
		{unix.EUSERS, "max_user_namespaces"},
	} {
		err := explainCloneError(c.err)
		if !errors.Is(err, ErrUserNS) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("explainCloneError(%v) = %v, want ErrUserNS and %q", c.err, err, c.want)
		}
	}
	if err := explainCloneError(unix.ENOMEM); errors.Is(err, ErrUserNS) || !errors.Is(err, unix.ENOMEM) {
		t.Errorf("explainCloneError(ENOMEM) = %v, want the error itself and not ErrUserNS", err)
	}
}

func TestIsRegularDoesNotFollowAFinalSymlink(t *testing.T) {
	d := t.TempDir()
	file := filepath.Join(d, "f")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(d, "l")
	if err := os.Symlink(file, link); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(d, "p")
	if err := unix.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]bool{file: true, link: false, fifo: false, d: false, filepath.Join(d, "none"): false} {
		if got := isRegular(p); got != want {
			t.Errorf("isRegular(%s) = %v, want %v", filepath.Base(p), got, want)
		}
	}
}

// As root, whether the sandbox's user may read a host file is judged by
// the mode bits of the file and of every directory above it.
func TestSandboxMayReadFollowsModeBitsOfEveryDirectory(t *testing.T) {
	as := HostUser{UID: 65534, GID: 65534}
	d, err := os.MkdirTemp("", "maread") // t.TempDir's parent is 0700
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(d)
	if err := os.Chmod(d, 0o755); err != nil {
		t.Fatal(err)
	}
	open := filepath.Join(d, "open")
	closed := filepath.Join(d, "closed")
	if err := os.WriteFile(open, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(closed, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	private := filepath.Join(d, "private")
	if err := os.Mkdir(private, 0o700); err != nil {
		t.Fatal(err)
	}
	inPrivate := filepath.Join(private, "f")
	if err := os.WriteFile(inPrivate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() != 0 {
		// Rootless the sandbox's user is tunwall's: what tunwall read, it may.
		if !sandboxMayRead(closed, as) {
			t.Error("rootless, sandboxMayRead said no")
		}
		return
	}
	// The temporary folder's parents must let others through for the rest
	// to mean anything.
	if !sandboxMayRead(open, as) {
		t.Fatalf("a 0644 file in a 0755 directory under %s was judged unreadable", os.TempDir())
	}
	if sandboxMayRead(closed, as) {
		t.Error("a 0600 file of root's was judged readable by uid 65534")
	}
	if sandboxMayRead(inPrivate, as) {
		t.Error("a file in a 0700 directory of root's was judged readable by uid 65534")
	}
	if err := os.Chown(closed, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	if !sandboxMayRead(closed, as) {
		t.Error("a 0600 file the user owns was judged unreadable")
	}
	if sandboxMayRead(filepath.Join(d, "none"), as) {
		t.Error("a missing file was judged readable")
	}
}
