package sandbox

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/tunwall/tunwall/tun"
)

// InitArg is argv[1] of the re-executed tunwall that is born in the
// sandbox's namespaces: pid 1 of a `tunwall run` sandbox, or the process that
// becomes bwrap in a `tunwall bwrap` one. cmd/tunwall calls InitMain when it
// sees it. argv[2], when present, is the control socket's descriptor.
const InitArg = "__tunwall-init"

// controlFD is the descriptor the control socket arrives on in children
// (exec.Cmd.ExtraFiles[0]) unless argv[2] names another.
const controlFD = 3

// InitMain is the body of the process tunwall starts inside the sandbox's
// fresh user and network namespaces (for run also mount and pid ones, where
// it is pid 1). It builds what the sandbox needs (for run: private mounts,
// resolv.conf, its own /proc; rootless: the TUN), hands the TUN to tunwall,
// waits until tunwall's stack is ready, then installs the terminal filter
// and either runs the command and reaps every process (run), exiting with
// the command's status, or becomes the command (bwrap). When pid 1 exits the
// kernel kills whatever is left in the pid namespace.
func InitMain() int {
	// This process holds tunwall's control socket: nothing in the sandbox
	// may read or write its memory (the command also lacks CAP_SYS_PTRACE).
	unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0)
	fd := controlFD
	if len(os.Args) > 2 {
		if n, err := strconv.Atoi(os.Args[2]); err == nil && n > 2 {
			fd = n
		}
	}
	ctl, err := tun.FileConn(os.NewFile(uintptr(fd), "control"))
	if err != nil {
		fmt.Fprintf(os.Stderr, "tunwall init: control socket: %v\n", err)
		return ExitSetup
	}
	var m msg
	if _, err := tun.Recv(ctl, &m); err != nil || m.Type != "config" || m.Config == nil {
		fmt.Fprintf(os.Stderr, "tunwall init: no config from tunwall: %v\n", err)
		return ExitSetup
	}
	cfg := m.Config
	fail := func(err error) int {
		tun.Send(ctl, msg{Type: "error", Error: err.Error()})
		return ExitSetup
	}

	if !cfg.Exec {
		if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
			return fail(fmt.Errorf("make mounts private: %w", err))
		}
		if cfg.ResolvConf != "" {
			if err := bindResolvConf(cfg.ResolvConf); err != nil {
				return fail(err)
			}
		}
		if err := bindFiles(cfg.Binds); err != nil {
			return fail(err)
		}
		if err := coverPaths(cfg.Cover); err != nil {
			return fail(err)
		}
		// A /proc for the new pid namespace: ps and /proc/self inside show
		// the sandbox's own processes, and the host's are out of reach.
		if err := mountProc(); err != nil {
			return fail(err)
		}
		if err := unix.Chdir(cfg.Dir); err != nil {
			tun.Send(ctl, msg{Type: "error", Error: err.Error(), WorkDir: cfg.Dir})
			return ExitSetup
		}
	}
	var fds []int
	if cfg.MakeTUN {
		tunFD, err := tun.Setup(cfg.Net.tunConfig())
		if err != nil {
			return fail(err)
		}
		diagFD, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.NETLINK_SOCK_DIAG)
		if err != nil {
			return fail(fmt.Errorf("sock_diag socket: %w", err))
		}
		fds = []int{tunFD, diagFD}
	}
	err = tun.Send(ctl, msg{Type: "ready"}, fds...)
	for _, fd := range fds {
		unix.Close(fd)
	}
	if err != nil {
		return ExitSetup
	}

	if _, err := tun.Recv(ctl, &m); err != nil || m.Type != "go" {
		// tunwall gave up or died before its stack was up.
		return ExitSetup
	}
	if cfg.Exec {
		return execCommand(ctl, cfg)
	}
	return runCommand(ctl, cfg)
}

// WorkDirError reports a working directory the sandbox's user cannot enter.
type WorkDirError struct {
	Dir string
	Err error
}

func (e *WorkDirError) Error() string {
	return fmt.Sprintf("the sandbox's user cannot enter the working directory %s: %v", e.Dir, e.Err)
}
func (e *WorkDirError) Unwrap() error { return e.Err }

// execCommand replaces this process with the command (bwrap) with no
// capability, no_new_privs, the terminal filter and only the descriptors the
// command is meant to have. It returns only if exec fails.
func execCommand(ctl *net.UnixConn, cfg *initConfig) int {
	// Capabilities are per thread: drop them on the thread that execs.
	runtime.LockOSThread()
	err := installTerminalFilter()
	if err == nil {
		err = closeExtraFDsOnExec(cfg.KeepFDs...)
	}
	if err == nil {
		err = dropAllCaps()
	}
	if err == nil {
		err = syscall.Exec(cfg.Path, cfg.Argv, os.Environ())
	}
	fmt.Fprintf(os.Stderr, "tunwall: %s: %v\n", cfg.Path, err)
	if errors.Is(err, unix.ENOENT) {
		return ExitNotFound
	}
	return ExitCannotExec
}

// bindResolvConf shows text read-only at /etc/resolv.conf (following a
// symlink such as systemd-resolved's to the file it names), from a tmpfs
// mounted nowhere else (bindData): no file on the host.
func bindResolvConf(text string) error {
	target := "/etc/resolv.conf"
	if t, err := filepath.EvalSymlinks(target); err == nil {
		target = t
	} else if errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("/etc/resolv.conf (or the file its symlink names) does not exist; create it on the host, any content")
	}
	if err := bindData([]byte(text), target); err != nil {
		return fmt.Errorf("resolv.conf: %w", err)
	}
	// Read-only, so the sandbox cannot point itself elsewhere (not that it
	// would help it: every query to port 53 is ours).
	unix.Mount("", target, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, "")
	return nil
}

// bindFiles binds each Src read-only over Dst (the file a symlink at Dst
// names). A missing Dst is an error: tunwall only asks for paths that
// exist.
func bindFiles(binds []fileBind) error {
	for _, b := range binds {
		if b.IfReadable && unix.Access(b.Dst, unix.R_OK) != nil {
			continue // the sandbox's user cannot read it: nothing to cover
		}
		target := b.Dst
		if t, err := filepath.EvalSymlinks(target); err == nil {
			target = t
		}
		if err := unix.Mount(b.Src, target, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind %s over %s: %w", b.Src, target, err)
		}
		if err := unix.Mount("", target, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
			return fmt.Errorf("make %s read-only: %w", target, err)
		}
	}
	return nil
}

// coverPaths hides each path from the sandbox: a directory under an empty
// read-only tmpfs, anything else under /dev/null. The command cannot undo
// it: it has no CAP_SYS_ADMIN, and a user namespace it makes itself locks
// these mounts.
func coverPaths(paths []string) error {
	for _, p := range paths {
		fi, err := os.Lstat(p)
		if errors.Is(err, os.ErrPermission) || errors.Is(err, os.ErrNotExist) {
			// The sandbox cannot reach it: its uid (root of its user
			// namespace included, whose capabilities stop at the
			// namespace's unmapped files) may not search a directory
			// on the way.
			continue
		}
		if err != nil {
			return fmt.Errorf("cover %s: %w", p, err)
		}
		if fi.IsDir() {
			if err := unix.Mount("tunwall-cover", p, "tmpfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=0500,size=4k,nr_inodes=1"); err != nil {
				return fmt.Errorf("cover %s: %w", p, err)
			}
			continue
		}
		if err := unix.Mount("/dev/null", p, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("cover %s: %w", p, err)
		}
		if err := unix.Mount("", p, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
			return fmt.Errorf("cover %s: %w", p, err)
		}
	}
	return nil
}

// runCommand starts the command, forwards signals to it, reaps every child
// (pid 1's job), and returns the command's exit status.
func runCommand(ctl *net.UnixConn, cfg *initConfig) int {
	sigc := make(chan os.Signal, 16)
	signal.Notify(sigc, unix.SIGINT, unix.SIGTERM, unix.SIGHUP, unix.SIGQUIT, unix.SIGUSR1, unix.SIGUSR2, unix.SIGWINCH, unix.SIGCONT, unix.SIGTSTP)

	// The command is root in the sandbox's user namespace: what it may do
	// there is bounded by the bounding set of the thread that starts it,
	// which stays locked (and is never given back) for that.
	runtime.LockOSThread()
	if err := limitBoundingSet(commandCaps); err != nil {
		fmt.Fprintf(os.Stderr, "tunwall init: %v\n", err)
		return ExitSetup
	}
	if err := installTerminalFilter(); err != nil {
		fmt.Fprintf(os.Stderr, "tunwall init: %v\n", err)
		return ExitSetup
	}
	if err := closeExtraFDsOnExec(); err != nil {
		fmt.Fprintf(os.Stderr, "tunwall init: %v\n", err)
		return ExitSetup
	}
	if cfg.KeepUID {
		// Not root inside: the command gets no capability (ambient ones
		// would survive its exec), as any process of the caller's.
		if err := dropAllCaps(); err != nil {
			fmt.Fprintf(os.Stderr, "tunwall init: %v\n", err)
			return ExitSetup
		}
	}
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
