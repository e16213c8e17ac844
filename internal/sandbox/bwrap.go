package sandbox

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

func timeAfter(sec int) <-chan time.Time { return time.After(time.Duration(sec) * time.Second) }

// BwrapConfig describes a `tunwall bwrap` sandbox.
type BwrapConfig struct {
	// Args are the user's bwrap arguments: options, then (after an
	// optional "--") the command.
	Args []string
	Net  NetConfig
	Self string // tunwall executable for the helper; "" means /proc/self/exe
	// Bwrap is the bwrap executable; "" means "bwrap" from $PATH.
	Bwrap string
}

// ErrNoBwrap says bwrap is missing.
var ErrNoBwrap = errors.New("bwrap (bubblewrap) is not installed: install it with 'sudo apt-get install bubblewrap' (Debian/Ubuntu) or 'sudo dnf install bubblewrap' (Fedora)")

// bwrap options and how many arguments each takes (bubblewrap 0.8).
var bwrapArity = map[string]int{
	"--unshare-all": 0, "--share-net": 0, "--unshare-user": 0, "--unshare-user-try": 0, "--unshare-ipc": 0,
	"--unshare-pid": 0, "--unshare-net": 0, "--unshare-uts": 0, "--unshare-cgroup": 0, "--unshare-cgroup-try": 0,
	"--clearenv": 0, "--new-session": 0, "--die-with-parent": 0, "--as-pid-1": 0, "--disable-userns": 0,
	"--assert-userns-disabled": 0,
	"--args":                   1, "--argv0": 1, "--userns": 1, "--userns2": 1, "--pidns": 1, "--uid": 1, "--gid": 1,
	"--hostname": 1, "--chdir": 1, "--unsetenv": 1, "--lock-file": 1, "--sync-fd": 1, "--remount-ro": 1,
	"--exec-label": 1, "--file-label": 1, "--proc": 1, "--dev": 1, "--tmpfs": 1, "--mqueue": 1, "--dir": 1,
	"--seccomp": 1, "--add-seccomp-fd": 1, "--block-fd": 1, "--userns-block-fd": 1, "--info-fd": 1,
	"--json-status-fd": 1, "--cap-add": 1, "--cap-drop": 1, "--perms": 1, "--size": 1,
	"--setenv": 2, "--bind": 2, "--bind-try": 2, "--dev-bind": 2, "--dev-bind-try": 2, "--ro-bind": 2,
	"--ro-bind-try": 2, "--bind-fd": 2, "--ro-bind-fd": 2, "--file": 2, "--bind-data": 2, "--ro-bind-data": 2,
	"--symlink": 2, "--chmod": 2,
}

// bwrapArgs turns the user's arguments into ours: the same options with
// tunwall's own added (and the user-namespace ones replaced, since tunwall
// provides the user namespace), a read-only resolv.conf bound last, then the
// command.
func bwrapArgs(user []string, resolvConf string, uid, gid int) ([]string, error) {
	var opts, command []string
	for i := 0; i < len(user); {
		a := user[i]
		if a == "--" {
			command = user[i+1:]
			break
		}
		n, known := bwrapArity[a]
		if !known {
			if len(a) > 2 && a[:2] == "--" {
				return nil, fmt.Errorf("unknown bwrap option %s (tunwall knows bubblewrap 0.8's options)", a)
			}
			command = user[i:]
			break
		}
		if i+n >= len(user) {
			return nil, fmt.Errorf("bwrap option %s needs %d argument(s)", a, n)
		}
		args := user[i+1 : i+1+n]
		i += 1 + n
		switch a {
		case "--share-net":
			return nil, errors.New("--share-net would give the sandbox the host's network; tunwall bwrap always unshares it")
		case "--userns", "--userns2", "--args", "--info-fd", "--block-fd", "--userns-block-fd":
			return nil, fmt.Errorf("tunwall bwrap uses %s itself; it cannot be passed through", a)
		case "--unshare-user", "--unshare-user-try":
			continue // tunwall provides the user namespace
		case "--unshare-all":
			opts = append(opts, "--unshare-ipc", "--unshare-pid", "--unshare-uts", "--unshare-cgroup-try")
			continue
		case "--uid", "--gid":
			want := uid
			if a == "--gid" {
				want = gid
			}
			if uid != 0 && args[0] != strconv.Itoa(want) {
				return nil, fmt.Errorf("%s %s: rootless tunwall bwrap maps only your own id (%d)", a, args[0], want)
			}
		}
		opts = append(opts, a)
		opts = append(opts, args...)
	}
	if len(command) == 0 {
		return nil, errors.New("no command after the bwrap options")
	}
	out := append([]string{"--unshare-net", "--die-with-parent", "--userns", "5", "--info-fd", "3", "--block-fd", "4"}, opts...)
	out = append(out, "--ro-bind", resolvConf, "/etc/resolv.conf", "--")
	return append(out, command...), nil
}

// CheckBwrapArgs reports what is wrong with the user's bwrap arguments, if
// anything, before any namespace is made.
func CheckBwrapArgs(args []string) error {
	_, err := bwrapArgs(args, "/etc/resolv.conf", os.Getuid(), os.Getgid())
	return err
}

// StartBwrap runs bwrap with the user's arguments plus --unshare-net, in a
// user namespace tunwall made, builds the TUN in the sandbox's network
// namespace, and holds the command back (--block-fd) until Go is called.
func StartBwrap(ctx context.Context, cfg BwrapConfig) (_ *Sandbox, err error) {
	if cfg.Bwrap == "" {
		p, err := exec.LookPath("bwrap")
		if err != nil {
			return nil, ErrNoBwrap
		}
		cfg.Bwrap = p
	}
	if err := Preflight(); err != nil {
		return nil, err
	}
	sb := &Sandbox{TUN: -1, Diag: -1, exited: make(chan struct{})}
	defer func() {
		if err != nil {
			sb.Close()
		}
	}()
	if sb.tmpDir, err = os.MkdirTemp("", "tunwall-"); err != nil {
		return nil, err
	}
	os.Chmod(sb.tmpDir, 0o755)
	resolv := filepath.Join(sb.tmpDir, "resolv.conf")
	if err := os.WriteFile(resolv, []byte(cfg.Net.ResolvConf()), 0o644); err != nil {
		return nil, err
	}
	args, err := bwrapArgs(cfg.Args, resolv, os.Getuid(), os.Getgid())
	if err != nil {
		return nil, err
	}

	h, err := startHelper(helperOptions{Self: cfg.Self, UserNS: true})
	if err != nil {
		return nil, err
	}
	sb.cleanup = append(sb.cleanup, h.close)
	userns, err := h.userNS()
	if err != nil {
		return nil, fmt.Errorf("helper's user namespace: %w", err)
	}
	defer userns.Close()

	infoR, infoW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer infoR.Close()
	blockR, blockW, err := os.Pipe()
	if err != nil {
		infoW.Close()
		return nil, err
	}
	sb.cleanup = append(sb.cleanup, func() { blockW.Close() })

	cmd := exec.Command(cfg.Bwrap, args...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.ExtraFiles = []*os.File{infoW, blockR, userns} // fds 3, 4, 5
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: unix.SIGKILL}
	err = sb.start(cmd)
	infoW.Close()
	blockR.Close()
	if err != nil {
		return nil, fmt.Errorf("start bwrap: %w", err)
	}

	// bwrap writes {"child-pid": N} once the sandbox's namespaces exist.
	var info struct {
		ChildPid int `json:"child-pid"`
	}
	infoc := make(chan error, 1)
	go func() { infoc <- json.NewDecoder(bufio.NewReader(infoR)).Decode(&info) }()
	select {
	case err := <-infoc:
		if err != nil || info.ChildPid <= 0 {
			<-sb.exited
			return nil, fmt.Errorf("bwrap failed before its sandbox existed (exit %d)", sb.ExitCode())
		}
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	var child atomic.Int64
	child.Store(int64(info.ChildPid))
	sb.sigPid = func() int { return int(child.Load()) }

	netns, err := os.Open(fmt.Sprintf("/proc/%d/ns/net", info.ChildPid))
	if err != nil {
		return nil, fmt.Errorf("open the sandbox's network namespace: %w", err)
	}
	defer netns.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(netns.Fd()), &st); err == nil {
		sb.NetNS = st.Ino
	}
	if sb.TUN, sb.Diag, err = h.attach(netns, helperConfig{Net: cfg.Net, BwrapLoopback: true}); err != nil {
		return nil, err
	}
	sb.goFn = func() error {
		_, err := blockW.Write([]byte{1})
		blockW.Close()
		return err
	}
	return sb, nil
}
