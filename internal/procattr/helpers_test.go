package procattr

import (
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tunwall/tunwall/internal/testenv"
)

// requireRoot skips loudly when not root, but fails under CI=true.
func requireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("procattr: this test needs root and CI=true; refusing to skip")
	}
	t.Skip("!!! SKIPPING procattr test: needs root (sock_diag of other netns, /proc/PID/fd of other processes) !!!")
}

// newTestResolver opens a diag socket in the current netns and wraps it.
func newTestResolver(t testing.TB, cfg Config) *Resolver {
	t.Helper()
	fd, err := OpenDiag()
	if err != nil {
		t.Fatalf("OpenDiag: %v", err)
	}
	cfg.DiagFD = fd
	r, err := New(cfg)
	if err != nil {
		unix.Close(fd)
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		if err := r.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return r
}

// fdInode returns the inode of the socket behind fd.
func fdInode(t testing.TB, fd int) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		t.Fatalf("fstat %d: %v", fd, err)
	}
	return st.Ino
}

// connInode returns the socket inode of a net.Conn-like value.
func connInode(t testing.TB, c syscall.Conn) uint64 {
	t.Helper()
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatalf("SyscallConn: %v", err)
	}
	var ino uint64
	if err := rc.Control(func(fd uintptr) { ino = fdInode(t, int(fd)) }); err != nil {
		t.Fatalf("Control: %v", err)
	}
	return ino
}

func addrPortOf(t testing.TB, a net.Addr) netip.AddrPort {
	t.Helper()
	switch a := a.(type) {
	case *net.TCPAddr:
		return a.AddrPort()
	case *net.UDPAddr:
		return a.AddrPort()
	}
	t.Fatalf("unexpected address type %T", a)
	return netip.AddrPort{}
}

func sockaddrAddrPort(t testing.TB, sa unix.Sockaddr) netip.AddrPort {
	t.Helper()
	switch sa := sa.(type) {
	case *unix.SockaddrInet4:
		return netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), uint16(sa.Port))
	case *unix.SockaddrInet6:
		return netip.AddrPortFrom(netip.AddrFrom16(sa.Addr), uint16(sa.Port))
	}
	t.Fatalf("unexpected sockaddr %T", sa)
	return netip.AddrPort{}
}

// expectedComm is what the kernel puts in /proc/PID/comm for a binary.
func expectedComm(path string) string {
	c := filepath.Base(path)
	if len(c) > 15 {
		c = c[:15]
	}
	return c
}

// mustListen is net.Listen that skips the test when the family is missing.
func mustListen(t testing.TB, network, addr string) net.Listener {
	t.Helper()
	ln, err := net.Listen(network, addr)
	if err != nil {
		testenv.Skip(t, "cannot listen on %s %s: %v", network, addr, err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// startHolder starts `sleep 60` holding files as fds 3.. and kills it (by
// pid) in Cleanup.
func startHolder(t testing.TB, files ...*os.File) *exec.Cmd {
	t.Helper()
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		testenv.Skip(t, "no sleep binary: %v", err)
	}
	cmd := exec.Command(sleep, "60")
	cmd.ExtraFiles = files
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", sleep, err)
	}
	t.Logf("started %s as pid %d", sleep, cmd.Process.Pid)
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return cmd
}

// waitFor polls cond every 5ms until it holds or d passes.
func waitFor(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if cond() {
			return true
		}
		time.Sleep(5 * time.Millisecond)
	}
	return cond()
}

// farDeadline is a generous deadline for direct findSocket calls in tests.
func farDeadline() time.Time { return time.Now().Add(2 * time.Second) }
