package sandbox

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/tunwall/tunwall/tun"
)

// Exit statuses of a sandbox that did not get to run its command, in the
// convention of env(1) and container runtimes.
const (
	ExitSetup       = 125 // tunwall could not build the sandbox
	ExitCannotExec  = 126
	ExitNotFound    = 127
	ExitSignalsBase = 128
)

// RunConfig describes a `tunwall run` sandbox.
type RunConfig struct {
	Argv []string // command and arguments; Argv[0] is looked up in $PATH
	Dir  string   // working directory; "" means the caller's
	Net  NetConfig
	// Self is the tunwall executable to re-execute as the sandbox's init;
	// "" means /proc/self/exe.
	Self string
	// Stdin, Stdout, Stderr of the command; nil means the caller's.
	Stdin, Stdout, Stderr *os.File
	// Creds are the run's credentials as the sandbox gets them (creds.go);
	// nil leaves the environment and files as they are.
	Creds *Creds
	// KeepUID runs the command as the caller's own uid and gid inside (as
	// bwrap does), with no capability at all, instead of as root of its
	// user namespace: for tools that refuse to run as root. false: root
	// inside (Docker's default capability set).
	KeepUID bool
	// User is who the sandbox runs as when tunwall runs as root; nil
	// means DefaultHostUser(). Rootless, it must be nil.
	User *HostUser
	// Cover are host paths the sandbox must not reach (tunwall's control
	// socket, or its directory): a directory is covered by an empty
	// read-only tmpfs, anything else by /dev/null.
	Cover []string
}

// Sandbox is a running `tunwall run` sandbox whose network is ready to be
// served but whose command has not started yet.
type Sandbox struct {
	// TUN is the sandbox's TUN descriptor; the caller owns it.
	TUN int
	// Diag is a NETLINK_SOCK_DIAG socket inside the sandbox's network
	// namespace, for process attribution; the caller owns it.
	Diag int
	// NetNS is the inode of the sandbox's network namespace.
	NetNS uint64
	// User is the host user the sandbox runs as; Home the private HOME
	// made for it ("" when its inherited HOME was its to write). Both are
	// set only when tunwall runs as root.
	User HostUser
	Home string
	// Pid is the host pid of the sandbox's init.
	Pid int

	ctl    *net.UnixConn
	exited chan struct{}
	state  *os.ProcessState
	err    error
	// goFn lets the command start; sigPid is where signals go (0: Pid).
	goFn    func() error
	sigPid  func() int
	cleanup []func()
}

// ErrUserNS explains that unprivileged user namespaces are unavailable.
var ErrUserNS = errors.New("user namespaces are not available to this user")

// Preflight checks what a rootless run needs and says how to fix what is
// missing.
func Preflight() error {
	if err := unix.Access("/dev/net/tun", unix.R_OK|unix.W_OK); err != nil {
		switch {
		case errors.Is(err, unix.ENOENT):
			return fmt.Errorf("/dev/net/tun does not exist: load the tun module ('sudo modprobe tun')")
		default:
			return fmt.Errorf("/dev/net/tun is not usable by uid %d (%v): run 'sudo chmod 0666 /dev/net/tun' (its mode on most distributions)", os.Getuid(), err)
		}
	}
	if os.Getuid() == 0 {
		return nil
	}
	if b, err := os.ReadFile("/proc/sys/kernel/unprivileged_userns_clone"); err == nil && strings.TrimSpace(string(b)) == "0" {
		return fmt.Errorf("%w: enable them with 'sudo sysctl kernel.unprivileged_userns_clone=1'", ErrUserNS)
	}
	if b, err := os.ReadFile("/proc/sys/user/max_user_namespaces"); err == nil && strings.TrimSpace(string(b)) == "0" {
		return fmt.Errorf("%w: enable them with 'sudo sysctl user.max_user_namespaces=15000'", ErrUserNS)
	}
	return nil
}

// Start builds the sandbox: it re-executes tunwall as pid 1 of new user,
// network, mount and pid namespaces, which creates the TUN and hands it back.
// The command does not run until Go is called.
func Start(ctx context.Context, cfg RunConfig) (_ *Sandbox, err error) {
	if len(cfg.Argv) == 0 {
		return nil, errors.New("sandbox: no command")
	}
	path, err := exec.LookPath(cfg.Argv[0])
	if err != nil {
		return nil, &ExecError{Name: cfg.Argv[0], Err: err}
	}
	if cfg.Dir == "" {
		if cfg.Dir, err = os.Getwd(); err != nil {
			return nil, err
		}
	}
	sb, err := newSandbox(&cfg.Self)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			sb.Close()
		}
	}()

	ctl, child, err := tun.SocketPair()
	if err != nil {
		return nil, err
	}
	sb.ctl = ctl

	// Nothing tunwall inherited by accident reaches the sandbox.
	if err := closeExtraFDsOnExec(); err != nil {
		return nil, err
	}
	root := os.Geteuid() == 0
	as := orDefault(cfg.User)
	cmd := exec.Command(cfg.Self, InitArg)
	cmd.Args[0] = "tunwall-init"
	cmd.Stdin, cmd.Stdout, cmd.Stderr = orStd(cfg.Stdin, os.Stdin), orStd(cfg.Stdout, os.Stdout), orStd(cfg.Stderr, os.Stderr)
	cmd.ExtraFiles = []*os.File{child}
	// The sandbox's root is mapped to us when rootless, and to an
	// unprivileged id (never host root) when we are root.
	cmd.SysProcAttr = userNSAttr(HostUser{}, unix.CLONE_NEWNET|unix.CLONE_NEWNS|unix.CLONE_NEWPID, as)
	if cfg.KeepUID {
		cmd.SysProcAttr = keepUIDAttr(unix.CLONE_NEWNET|unix.CLONE_NEWNS|unix.CLONE_NEWPID, as)
	}
	binds, bundleAt := cfg.Creds.runBinds()
	cmd.Env = cfg.Creds.environ(bundleAt) // placeholders, never values, from init on
	if root {
		if cmd.Env, err = sb.homeFor(as, cmd.Env); err != nil {
			return nil, err
		}
	}

	err = sb.start(cmd)
	child.Close()
	if err != nil {
		return nil, explainCloneError(err)
	}

	if err := tun.Send(ctl, msg{Type: "config", Config: &initConfig{
		Net: cfg.Net, MakeTUN: !root, ResolvConf: cfg.Net.ResolvConf(), Path: path, Argv: cfg.Argv, Dir: cfg.Dir, Binds: binds,
		KeepUID: cfg.KeepUID, Cover: cfg.Cover,
	}}); err != nil {
		return nil, err
	}
	if err := sb.awaitReady(!root, cfg.Net); err != nil {
		var wd *WorkDirError
		if root && errors.As(err, &wd) {
			err = fmt.Errorf("%w (run as root, tunwall runs the sandbox as host uid %d, --user or SUDO_UID or else nobody: start it from a directory that user may enter, or name its owner with --user)", err, as.UID)
		}
		return nil, err
	}
	if err := sb.noteNetNS(); err != nil {
		return nil, err // the deferred Close ends the sandbox
	}
	return sb, nil
}

// newSandbox is the start Start and StartBwrap share: the binary re-executed
// inside defaults to this one, the host must allow the namespaces, and the
// Sandbox holds no descriptor yet.
func newSandbox(self *string) (*Sandbox, error) {
	if *self == "" {
		*self = "/proc/self/exe"
	}
	if err := Preflight(); err != nil {
		return nil, err
	}
	return &Sandbox{TUN: -1, Diag: -1, exited: make(chan struct{})}, nil
}

// noteNetNS records the inode of the sandbox's network namespace, once its
// process is there. Without it flows cannot be attributed to the sandbox's
// processes (nor its end told), so a failure ends the start.
func (sb *Sandbox) noteNetNS() error {
	var st unix.Stat_t
	path := fmt.Sprintf("/proc/%d/ns/net", sb.Pid)
	if err := unix.Stat(path, &st); err != nil {
		return fmt.Errorf("the sandbox's network namespace: %w", &os.PathError{Op: "stat", Path: path, Err: err})
	}
	sb.NetNS = st.Ino
	return nil
}

// awaitReady waits for the process inside to report its part done. With
// fromInside it sends the TUN and sock_diag descriptors along; otherwise
// tunwall (root) makes them in the sandbox's network namespace itself.
func (sb *Sandbox) awaitReady(fromInside bool, n NetConfig) error {
	var m msg
	fds, err := tun.Recv(sb.ctl, &m)
	if err != nil {
		<-sb.exited
		return fmt.Errorf("sandbox init failed before the network was ready: %w", err)
	}
	if m.Type == "error" {
		if m.WorkDir != "" {
			return &WorkDirError{Dir: m.WorkDir, Err: errors.New(m.Error)}
		}
		return fmt.Errorf("sandbox: %s", m.Error)
	}
	want := 0
	if fromInside {
		want = 2
	}
	if m.Type != "ready" || len(fds) != want {
		for _, fd := range fds {
			unix.Close(fd)
		}
		return fmt.Errorf("sandbox: unexpected %q message with %d fds", m.Type, len(fds))
	}
	if fromInside {
		sb.TUN, sb.Diag = fds[0], fds[1]
		return nil
	}
	sb.TUN, sb.Diag, err = netFromOutside(sb.Pid, n)
	return err
}

// start starts the sandbox's first process (cmd) and, on a goroutine, waits
// for it, closing sb.exited then. Pdeathsig fires when the thread that forked
// the child exits, so the fork happens on a locked thread that lives exactly
// as long as the child.
func (sb *Sandbox) start(cmd *exec.Cmd) error {
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		err := cmd.Wait()
		sb.state = cmd.ProcessState
		if sb.state == nil {
			sb.err = err
		}
		close(sb.exited)
	}()
	if err := <-started; err != nil {
		return err
	}
	sb.Pid = cmd.Process.Pid
	return nil
}

func orStd(f, def *os.File) *os.File {
	if f != nil {
		return f
	}
	return def
}

func explainCloneError(err error) error {
	switch {
	case errors.Is(err, unix.EPERM), errors.Is(err, unix.EACCES):
		return fmt.Errorf("cannot create the sandbox's namespaces (%v): %w; on Debian/Ubuntu 'sudo sysctl kernel.unprivileged_userns_clone=1', and on Ubuntu 24.04+ also allow them for tunwall in AppArmor ('sudo sysctl kernel.apparmor_restrict_unprivileged_userns=0' or a profile)", err, ErrUserNS)
	case errors.Is(err, unix.ENOSPC), errors.Is(err, unix.EUSERS):
		return fmt.Errorf("cannot create the sandbox's namespaces (%v): %w; raise 'user.max_user_namespaces'", err, ErrUserNS)
	}
	return fmt.Errorf("cannot start the sandbox: %w", err)
}

// ExecError reports a command that cannot be run.
type ExecError struct {
	Name string
	Err  error
}

func (e *ExecError) Error() string { return e.Name + ": " + e.Err.Error() }
func (e *ExecError) Unwrap() error { return e.Err }

// ExitCode is the status tunwall should exit with for e.
func (e *ExecError) ExitCode() int {
	if errors.Is(e.Err, exec.ErrNotFound) || errors.Is(e.Err, os.ErrNotExist) {
		return ExitNotFound
	}
	return ExitCannotExec
}

// Go lets the command start: the caller's stack is serving the TUN.
func (sb *Sandbox) Go() error {
	if sb.goFn != nil {
		return sb.goFn()
	}
	return tun.Send(sb.ctl, msg{Type: "go"})
}

// Signal forwards sig to the sandbox (its init passes it to the command).
func (sb *Sandbox) Signal(sig os.Signal) {
	select {
	case <-sb.exited:
	default:
		pid := sb.Pid
		if sb.sigPid != nil {
			if p := sb.sigPid(); p > 0 {
				pid = p
			}
		}
		unix.Kill(pid, sig.(syscall.Signal))
	}
}

// Exited is closed when the sandbox's init has exited: the command is done
// and every process in the sandbox is gone.
func (sb *Sandbox) Exited() <-chan struct{} { return sb.exited }

// ExitCode waits for the sandbox to exit and returns the command's status
// (128+signal if it was killed by a signal).
func (sb *Sandbox) ExitCode() int {
	<-sb.exited
	if sb.state == nil {
		return ExitSetup
	}
	if ws, ok := sb.state.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return ExitSignalsBase + int(ws.Signal())
	}
	return sb.state.ExitCode()
}

// Kill ends the sandbox at once.
func (sb *Sandbox) Kill() {
	select {
	case <-sb.exited:
	default:
		if sb.Pid > 0 {
			unix.Kill(sb.Pid, unix.SIGKILL)
		}
	}
}

// Close kills the sandbox if it still runs, waits for it, and removes what
// Start made on the host. The TUN and Diag descriptors are the caller's.
func (sb *Sandbox) Close() error {
	if sb.Pid > 0 {
		sb.Kill()
		<-sb.exited
	}
	if sb.ctl != nil {
		sb.ctl.Close()
	}
	for _, f := range sb.cleanup {
		f()
	}
	sb.cleanup = nil
	return nil
}

// netFromOutside creates and configures the TUN and a sock_diag socket in
// the network namespace of process pid, from a thread of ours that joins it
// (root may join any namespace; tun.InNetNS retires the thread after).
func netFromOutside(pid int, n NetConfig) (tunFD, diagFD int, err error) {
	ns, err := os.Open(fmt.Sprintf("/proc/%d/ns/net", pid))
	if err != nil {
		return -1, -1, fmt.Errorf("open the sandbox's network namespace: %w", err)
	}
	defer ns.Close()
	tunFD, diagFD = -1, -1
	err = tun.InNetNS(int(ns.Fd()), func() error {
		var err error
		if tunFD, err = tun.Setup(n.tunConfig()); err != nil {
			return err
		}
		if diagFD, err = unix.Socket(unix.AF_NETLINK, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.NETLINK_SOCK_DIAG); err != nil {
			return fmt.Errorf("sock_diag socket: %w", err)
		}
		return nil
	})
	if err != nil {
		if tunFD >= 0 {
			unix.Close(tunFD)
		}
		return -1, -1, err
	}
	return tunFD, diagFD, nil
}
