package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tunwall/tunwall/tun"
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
	// Creds are the run's credentials as the sandbox gets them (creds.go);
	// nil leaves the environment and files as they are.
	Creds *Creds
	// User is who the sandbox runs as when tunwall runs as root; nil
	// means DefaultHostUser(). Rootless, it must be nil.
	User *HostUser
	// Cover are host paths the sandbox must not reach (RunConfig.Cover),
	// wherever the user's binds show them.
	Cover []string
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

// joinsNamespace reports whether a bwrap option (one tunwall knows, or one
// a later bwrap's --help lists) would put the sandbox in a namespace given
// by descriptor or path instead of the one tunwall made: --userns, --pidns
// and any --*ns/--*ns2 or --*net* option that a bwrap may add (a --netns
// would be a way out). --unshare-net and --share-net are handled apart.
func joinsNamespace(opt string) bool {
	switch opt {
	case "--unshare-net", "--share-net", "--disable-userns", "--assert-userns-disabled", "--userns-block-fd":
		return false
	}
	return strings.HasSuffix(opt, "ns") || strings.HasSuffix(opt, "ns2") || strings.Contains(opt, "net")
}

// installedBwrapArity lists the options of the bwrap in $PATH and how many
// arguments each takes, from its --help (one line an option: "--name ARG
// ARG  description", arguments in capitals), so that options of a newer
// bubblewrap (--overlay-src SRC, --tmp-overlay DEST, --level-prefix, ...)
// pass through. Read once; empty if bwrap is missing or says nothing.
var installedBwrapArity = sync.OnceValue(func() map[string]int {
	p, err := exec.LookPath("bwrap")
	if err != nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	out, _ := exec.CommandContext(ctx, p, "--help").Output()
	return parseBwrapHelp(string(out))
})

var bwrapHelpLine = regexp.MustCompile(`^\s+(--[a-z0-9][a-z0-9-]*)((?: [A-Z][A-Z0-9_]*\b)*)(?:\s|$)`)

// parseBwrapHelp reads bwrap --help's option lines.
func parseBwrapHelp(help string) map[string]int {
	m := map[string]int{}
	for line := range strings.SplitSeq(help, "\n") {
		if g := bwrapHelpLine.FindStringSubmatch(line); g != nil && g[1] != "--help" && g[1] != "--version" {
			m[g[1]] = len(strings.Fields(g[2]))
		}
	}
	return m
}

// bwrapFDOptions are the options whose first argument is a descriptor the
// caller passes to bwrap. Those descriptors reach bwrap; no other does.
var bwrapFDOptions = map[string]bool{
	"--seccomp": true, "--add-seccomp-fd": true, "--bind-fd": true, "--ro-bind-fd": true, "--file": true,
	"--bind-data": true, "--ro-bind-data": true, "--info-fd": true, "--json-status-fd": true, "--sync-fd": true,
	"--block-fd": true, "--userns-block-fd": true,
}

// bwrapArgs turns the user's arguments into ours: the same options, with
// tunwall's own added first (--unshare-pid, --die-with-parent), the network
// ones dropped (the sandbox shares the TUN-only network namespace bwrap is
// started in), a read-only resolv.conf bound last (its text read by bwrap
// from descriptor resolvFD: no file of tunwall's on the host), then the
// command. It also returns the descriptors the options name.
func bwrapArgs(user []string, resolvFD string) (args []string, fds []int, err error) {
	var opts, command []string
	for i := 0; i < len(user); {
		a := user[i]
		if a == "--" {
			command = user[i+1:]
			break
		}
		n, known := bwrapArity[a]
		if !known {
			n, known = installedBwrapArity()[a]
		}
		if !known {
			if len(a) > 2 && a[:2] == "--" {
				return nil, nil, fmt.Errorf("unknown bwrap option %s (neither bubblewrap 0.8 nor the installed bwrap's --help lists it)", a)
			}
			command = user[i:]
			break
		}
		if joinsNamespace(a) {
			return nil, nil, fmt.Errorf("%s cannot be used with tunwall bwrap: it would join a namespace tunwall did not make (bwrap runs inside tunwall's)", a)
		}
		if i+n >= len(user) {
			return nil, nil, fmt.Errorf("bwrap option %s needs %d argument(s)", a, n)
		}
		optArgs := user[i+1 : i+1+n]
		i += 1 + n
		switch a {
		case "--unshare-net", "--share-net":
			// bwrap runs inside the TUN-only network namespace: unsharing
			// it would leave the sandbox only lo, and sharing it is what
			// happens anyway.
			continue
		case "--unshare-all":
			opts = append(opts, "--unshare-user-try", "--unshare-ipc", "--unshare-pid", "--unshare-uts", "--unshare-cgroup-try")
			continue
		case "--userns", "--userns2", "--pidns":
			return nil, nil, fmt.Errorf("%s cannot be used with tunwall bwrap: bwrap runs inside the namespaces tunwall made", a)
		case "--args":
			return nil, nil, errors.New("--args cannot be used with tunwall bwrap: tunwall must see every option")
		}
		if bwrapFDOptions[a] {
			fd, err := strconv.Atoi(optArgs[0])
			if err != nil || fd < 0 {
				return nil, nil, fmt.Errorf("bwrap option %s %s: not a descriptor number", a, optArgs[0])
			}
			if fd > 2 && !slices.Contains(fds, fd) {
				fds = append(fds, fd)
			}
		}
		opts = append(opts, a)
		opts = append(opts, optArgs...)
	}
	if len(command) == 0 {
		return nil, nil, errors.New("no command after the bwrap options")
	}
	out := []string{"--die-with-parent"}
	if !slices.Contains(opts, "--unshare-pid") {
		// Without a pid namespace the sandbox could signal and ptrace every
		// process of yours by pid.
		out = append(out, "--unshare-pid")
	}
	out = append(out, opts...)
	out = append(out, "--perms", "0444", "--ro-bind-data", resolvFD, "/etc/resolv.conf", "--")
	return append(out, command...), fds, nil
}

// withCreds inserts the credentials' options after tunwall's resolv.conf
// bind, before the command.
func withCreds(args []string, resolv string, c *Creds, as HostUser) []string {
	if c == nil {
		return args
	}
	for i := 0; i+3 < len(args); i++ {
		if args[i] == "--ro-bind-data" && args[i+1] == resolv && args[i+2] == "/etc/resolv.conf" && args[i+3] == "--" {
			extra := c.bwrapExtra(args[:i], as)
			out := append(append(append([]string(nil), args[:i+3]...), extra...), args[i+3:]...)
			return out
		}
	}
	return args
}

// CheckBwrapArgs reports what is wrong with the user's bwrap arguments, if
// anything, before any namespace is made.
func CheckBwrapArgs(args []string) error {
	_, fds, err := bwrapArgs(args, "3")
	if err != nil {
		return err
	}
	for _, fd := range fds {
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err != nil {
			return fmt.Errorf("the bwrap options name descriptor %d, which is not open", fd)
		}
		if err := checkPassedFD(fd); err != nil {
			return err
		}
	}
	return nil
}

// checkPassedFD refuses a descriptor that would give the sandbox a network
// or a namespace: bwrap's command inherits what bwrap holds, so a network
// socket named by --sync-fd (or any descriptor option) would be a way out
// past the TUN, and a namespace descriptor one into another namespace. Unix
// sockets pass (binds can show the sandbox a socket path as well).
func checkPassedFD(fd int) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("descriptor %d: %w", fd, err)
	}
	if st.Mode&unix.S_IFMT == unix.S_IFSOCK {
		domain, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_DOMAIN)
		if err != nil || domain != unix.AF_UNIX {
			return fmt.Errorf("the bwrap options name descriptor %d, a network socket (family %d): the sandbox would inherit a way out past tunwall", fd, domain)
		}
	}
	var fs unix.Statfs_t
	if err := unix.Fstatfs(fd, &fs); err == nil && fs.Type == unix.NSFS_MAGIC {
		return fmt.Errorf("the bwrap options name descriptor %d, a namespace: the sandbox would get a handle on a namespace tunwall did not make", fd)
	}
	return nil
}

// StartBwrap starts bwrap inside a user and a network namespace tunwall
// made, with the user's arguments (less the network ones) and
// --unshare-pid --die-with-parent. bwrap itself, its monitor process
// included, lives in the TUN-only network namespace, and builds its sandbox
// in a user namespace of its own below tunwall's, as an unprivileged bwrap
// does. bwrap starts only when Go is called, after the TUN exists.
func StartBwrap(ctx context.Context, cfg BwrapConfig) (_ *Sandbox, err error) {
	if cfg.Bwrap == "" {
		p, err := exec.LookPath("bwrap")
		if err != nil {
			return nil, ErrNoBwrap
		}
		cfg.Bwrap = p
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
	_, userFDs, err := bwrapArgs(cfg.Args, "3")
	if err != nil {
		return nil, err
	}
	for _, fd := range userFDs {
		if err := checkPassedFD(fd); err != nil {
			return nil, err
		}
	}

	// The child gets the descriptors the user's options name, at their
	// numbers, and the control socket in the first free place; nothing
	// else of ours.
	if err := closeExtraFDsOnExec(); err != nil {
		return nil, err
	}
	ctl, child, err := tun.SocketPair()
	if err != nil {
		return nil, err
	}
	defer child.Close()
	sb.ctl = ctl
	extra, ctlFD := childFiles(userFDs, child)
	as := orDefault(cfg.User)
	args, extra, resolvFile, err := bwrapCommand(cfg, extra, as)
	if err != nil {
		return nil, err
	}
	defer resolvFile.Close()

	root := os.Geteuid() == 0
	cmd := exec.Command(cfg.Self, InitArg, strconv.Itoa(ctlFD))
	cmd.Args[0] = "tunwall-bwrap"
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.ExtraFiles = extra
	cmd.SysProcAttr = userNSAttr(insideIDs(as), unix.CLONE_NEWNET, as)
	cmd.Env = cfg.Creds.environ(BundlePaths[0]) // placeholders, never values (--setenv points the bundle variables)
	if root {
		if cmd.Env, err = sb.homeFor(as, cmd.Env); err != nil {
			return nil, err
		}
	}
	if !root {
		// Not root inside either: keep the one capability the TUN needs
		// across exec (dropped again before bwrap runs).
		cmd.SysProcAttr.AmbientCaps = []uintptr{unix.CAP_NET_ADMIN}
	}
	err = sb.start(cmd)
	if err != nil {
		return nil, explainCloneError(err)
	}
	if err := tun.Send(ctl, msg{Type: "config", Config: &initConfig{
		Net: cfg.Net, MakeTUN: !root, Exec: true, Path: cfg.Bwrap, Argv: append([]string{"bwrap"}, args...), KeepFDs: append(slices.Clone(userFDs), len(extra)+2),
	}}); err != nil {
		return nil, err
	}
	if err := sb.awaitReady(!root, cfg.Net); err != nil {
		return nil, err
	}
	if err := sb.noteNetNS(); err != nil {
		return nil, err // the deferred Close ends the sandbox
	}
	asPid1 := slices.Contains(args, "--as-pid-1")
	sb.sigPid = func() int { return bwrapCommandPid(sb.Pid, asPid1) }
	return sb, nil
}

// bwrapCommand returns bwrap's arguments: the user's, with the sandbox's
// resolv.conf read from a memfd placed after extra's descriptors (tunwall
// leaves no file behind, whatever ends it) and the credentials' options;
// and extra with that memfd appended, which the caller closes once bwrap
// has started.
func bwrapCommand(cfg BwrapConfig, extra []*os.File, as HostUser) (args []string, _ []*os.File, resolv *os.File, err error) {
	resolv, err = dataFile("resolv.conf", []byte(cfg.Net.ResolvConf()))
	if err != nil {
		return nil, nil, nil, err
	}
	extra = append(extra, resolv)
	resolvFD := strconv.Itoa(len(extra) + 2)
	if args, _, err = bwrapArgs(cfg.Args, resolvFD); err != nil {
		resolv.Close()
		return nil, nil, nil, err
	}
	args = withCover(args, resolvFD, cfg.Cover, as)
	return withCreds(args, resolvFD, cfg.Creds, as), extra, resolv, nil
}

// withCover inserts, after the user's options and before tunwall's
// resolv.conf bind, a cover over every sandbox path through which the user's binds
// show a path of cover that its user could reach: an empty tmpfs over a directory, /dev/null over
// anything else.
func withCover(args []string, resolv string, cover []string, as HostUser) []string {
	for i := 0; i+3 < len(args); i++ {
		if args[i] != "--ro-bind-data" || args[i+1] != resolv || args[i+2] != "/etc/resolv.conf" || args[i+3] != "--" {
			continue
		}
		if i >= 2 && args[i-2] == "--perms" {
			i -= 2 // the resolv.conf bind's own --perms
		}
		binds := userBinds(args[:i])
		var extra []string
		for _, h := range cover {
			fi, err := os.Lstat(h)
			if err != nil || !sandboxMayRead(h, as) {
				continue // the sandbox's user cannot reach it: nothing to cover
			}
			for _, b := range binds {
				if b.src == "" || !under(h, b.src) {
					continue
				}
				p := filepath.Join(b.dst, strings.TrimPrefix(h, b.src))
				if b.src == "/" {
					p = filepath.Join(b.dst, h)
				}
				if hp, ok := hostPathOf(binds, p); !ok || hp != h {
					continue
				}
				if fi.IsDir() {
					extra = append(extra, "--perms", "0500", "--tmpfs", p, "--remount-ro", p)
				} else {
					extra = append(extra, "--ro-bind", "/dev/null", p)
				}
			}
		}
		return append(append(append([]string(nil), args[:i]...), extra...), args[i:]...)
	}
	return args
}

// childFiles lays out the child's descriptors from 3 on (exec.Cmd's
// ExtraFiles): the user's descriptors userFDs at their own numbers, and
// the control socket ctl in the first free place, which it returns.
func childFiles(userFDs []int, ctl *os.File) (extra []*os.File, ctlFD int) {
	for _, fd := range userFDs {
		for len(extra) < fd-2 {
			extra = append(extra, nil)
		}
		extra[fd-3] = os.NewFile(uintptr(fd), "user-fd")
	}
	for i, f := range extra {
		if f == nil {
			extra[i] = ctl
			return extra, i + 3
		}
	}
	return append(extra, ctl), len(extra) + 3
}

// bwrapCommandPid finds the host pid of the command bwrap (pid) runs: the
// child of the sandbox's pid 1, bwrap's own reaper, unless the command is
// pid 1 itself (--as-pid-1). 0 while there is none yet.
func bwrapCommandPid(pid int, asPid1 bool) int {
	kids := childrenOf(pid)
	if len(kids) == 0 {
		return 0
	}
	if asPid1 {
		return kids[0]
	}
	if g := childrenOf(kids[0]); len(g) > 0 {
		return g[0]
	}
	return 0
}

// childrenOf lists the children of pid's main thread.
func childrenOf(pid int) []int {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
	var out []int
	for _, f := range strings.Fields(string(b)) {
		if n, err := strconv.Atoi(f); err == nil {
			out = append(out, n)
		}
	}
	return out
}
