package sandbox

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/tunwall/tunwall/tun"
)

// InitArg is argv[1] of the re-executed tunwall that becomes pid 1 of a
// `tunwall run` sandbox. cmd/tunwall calls InitMain when it sees it.
const InitArg = "__tunwall-init"

// controlFD is the descriptor the control socket arrives on in children
// (exec.Cmd.ExtraFiles[0]).
const controlFD = 3

// InitMain is the body of pid 1 inside a `tunwall run` sandbox. It is born
// inside fresh user, network, mount and pid namespaces. It builds the
// network (lo, the TUN, addresses, routes, resolv.conf), hands the TUN to
// tunwall, waits for tunwall's stack to be ready, then runs the command,
// reaps every process, and exits with the command's status. When it exits
// the kernel kills whatever is left in the pid namespace.
func InitMain() int {
	ctl, err := tun.FileConn(os.NewFile(controlFD, "control"))
	if err != nil {
		fmt.Fprintf(os.Stderr, "tunwall init: control socket: %v\n", err)
		return 125
	}
	var m msg
	if _, err := tun.Recv(ctl, &m); err != nil || m.Type != "config" || m.Config == nil {
		fmt.Fprintf(os.Stderr, "tunwall init: no config from tunwall: %v\n", err)
		return 125
	}
	cfg := m.Config
	fail := func(err error) int {
		tun.Send(ctl, msg{Type: "error", Error: err.Error()})
		return 125
	}

	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fail(fmt.Errorf("make mounts private: %w", err))
	}
	tunFD, err := tun.Setup(cfg.Net.tunConfig())
	if err != nil {
		return fail(err)
	}
	diagFD, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.NETLINK_SOCK_DIAG)
	if err != nil {
		return fail(fmt.Errorf("sock_diag socket: %w", err))
	}
	if cfg.ResolvConf != "" {
		if err := bindResolvConf(cfg.ResolvConf); err != nil {
			return fail(err)
		}
	}
	// A /proc for the new pid namespace, so ps and /proc/self inside show
	// the sandbox's own processes. Not fatal: some hosts forbid it.
	unix.Mount("proc", "/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "")

	if err := tun.Send(ctl, msg{Type: "ready"}, tunFD, diagFD); err != nil {
		return 125
	}
	unix.Close(tunFD)
	unix.Close(diagFD)

	if _, err := tun.Recv(ctl, &m); err != nil || m.Type != "go" {
		// tunwall gave up or died before its stack was up.
		return 125
	}
	return runCommand(ctl, cfg)
}

// bindResolvConf bind-mounts src read-only over /etc/resolv.conf (following
// a symlink such as systemd-resolved's to the file it names).
func bindResolvConf(src string) error {
	target := "/etc/resolv.conf"
	if t, err := filepath.EvalSymlinks(target); err == nil {
		target = t
	} else if errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("/etc/resolv.conf (or the file its symlink names) does not exist; create it on the host, any content")
	}
	if err := unix.Mount(src, target, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind %s over %s: %w", src, target, err)
	}
	// Read-only, so the sandbox cannot point itself elsewhere (not that it
	// would help it: every query to port 53 is ours).
	unix.Mount("", target, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, "")
	return nil
}

// runCommand starts the command, forwards signals to it, reaps every child
// (pid 1's job), and returns the command's exit status.
func runCommand(ctl *net.UnixConn, cfg *initConfig) int {
	sigc := make(chan os.Signal, 16)
	signal.Notify(sigc, unix.SIGINT, unix.SIGTERM, unix.SIGHUP, unix.SIGQUIT, unix.SIGUSR1, unix.SIGUSR2, unix.SIGWINCH, unix.SIGCONT, unix.SIGTSTP)

	pid, err := syscall.ForkExec(cfg.Path, cfg.Argv, &syscall.ProcAttr{
		Dir:   cfg.Dir,
		Env:   os.Environ(),
		Files: []uintptr{0, 1, 2},
	})
	if err != nil {
		fmt.Fprintf(os.Stderr, "tunwall: %s: %v\n", cfg.Argv[0], err)
		if errors.Is(err, unix.ENOENT) {
			return 127
		}
		return 126
	}

	go func() {
		for s := range sigc {
			unix.Kill(pid, s.(syscall.Signal))
		}
	}()
	// If tunwall dies, take everything down with us: the TUN is gone with
	// tunwall's descriptor already, and nothing may outlive it.
	go func() {
		var m msg
		for {
			if _, err := tun.Recv(ctl, &m); err != nil {
				unix.Kill(-1, unix.SIGKILL)
				os.Exit(137)
			}
		}
	}()

	for {
		var ws unix.WaitStatus
		wpid, err := unix.Wait4(-1, &ws, 0, nil)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "tunwall init: wait: %v\n", err)
			return 125
		}
		if wpid != pid {
			continue
		}
		switch {
		case ws.Exited():
			return ws.ExitStatus()
		case ws.Signaled():
			return 128 + int(ws.Signal())
		}
	}
}
