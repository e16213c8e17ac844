package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tunwall/tunwall/tun"
)

// AttachConfig describes `tunwall attach`: an existing network namespace,
// named by a process in it or by a namespace file.
type AttachConfig struct {
	Pid   int    // a process in the namespace (and its user namespace)
	NetNS string // or a namespace file, e.g. /run/netns/NAME
	// or an open namespace file (the caller keeps it): what a CNI plugin
	// passes the node agent, whose mount namespace may not show the path
	NetNSFile *os.File
	Force     bool // attach even if the namespace already has a way out
	// NotIsolatedHint ends the error for a namespace that already has a
	// way out: what the user can do about it ("" none).
	NotIsolatedHint string
	Net             NetConfig
	Self            string
}

// Attached is a namespace tunwall now serves.
type Attached struct {
	TUN, Diag int    // the caller owns both
	NetNS     uint64 // inode of the namespace
	// Watch is a netlink socket in the namespace, subscribed to its link,
	// address and route changes since before the isolation check (see
	// tun.NewWatcher). The caller owns it.
	Watch int
}

// nsGetUserNS is NS_GET_USERNS (_IO(0xb7, 0x1)): the user namespace that owns
// a namespace.
const nsGetUserNS = 0xb701

// nsGetNSType is NS_GET_NSTYPE (_IO(0xb7, 0x3)): the kind of a namespace.
const nsGetNSType = 0xb703

// Attach creates the TUN in an existing network namespace. It refuses one
// that has any interface but lo, in any state, or an address or route not on
// lo, unless cfg.Force.
func Attach(ctx context.Context, cfg AttachConfig) (*Attached, error) {
	given := 0
	for _, set := range []bool{cfg.Pid != 0, cfg.NetNS != "", cfg.NetNSFile != nil} {
		if set {
			given++
		}
	}
	if given != 1 {
		return nil, errors.New("give exactly one of --pid PID or --netns PATH")
	}
	if err := Preflight(); err != nil {
		return nil, err
	}
	netns := cfg.NetNSFile
	if netns == nil {
		path := cfg.NetNS
		if cfg.Pid != 0 {
			path = fmt.Sprintf("/proc/%d/ns/net", cfg.Pid)
		}
		f, err := os.Open(path)
		if err != nil {
			return nil, fmt.Errorf("open network namespace %s: %w", path, err)
		}
		defer f.Close()
		netns = f
	}
	if t, err := unix.IoctlRetInt(int(netns.Fd()), nsGetNSType); err != nil || t != unix.CLONE_NEWNET {
		return nil, fmt.Errorf("%s is not a network namespace", netns.Name())
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(netns.Fd()), &st); err != nil {
		return nil, err
	}
	var self unix.Stat_t
	if err := unix.Stat("/proc/self/ns/net", &self); err == nil && self.Ino == st.Ino {
		return nil, errors.New("that is tunwall's own network namespace (the host's?): refusing to attach to it")
	}
	a := &Attached{TUN: -1, Diag: -1, Watch: -1, NetNS: st.Ino}

	// Whose user namespace owns it? Root (in the initial user namespace)
	// may enter any; anyone may enter one their own user namespace owns.
	// Otherwise the helper must join the owner first, which a Go process
	// cannot do once it runs: nsenter does it before starting the helper.
	var prefix []string
	var extra []*os.File
	if os.Geteuid() != 0 {
		ufd, _, errno := unix.Syscall(unix.SYS_IOCTL, netns.Fd(), nsGetUserNS, 0)
		if errno != 0 {
			return nil, fmt.Errorf("find the namespace's owner: %w", errno)
		}
		owner := os.NewFile(ufd, "userns")
		defer owner.Close()
		var ost, mine unix.Stat_t
		unix.Fstat(int(owner.Fd()), &ost)
		unix.Stat("/proc/self/ns/user", &mine)
		if ost.Ino != mine.Ino {
			nsenter, err := exec.LookPath("nsenter")
			if err != nil {
				return nil, errors.New("attaching to a namespace in another user namespace needs nsenter (util-linux)")
			}
			// ExtraFiles become fds 4 and 5 in nsenter (3 is the control socket).
			extra = []*os.File{owner, netns}
			prefix = []string{nsenter, "--preserve-credentials", "--user=/proc/self/fd/4", "--net=/proc/self/fd/5", "--"}
		}
	}
	h, err := startHelperWith(helperOptions{Self: cfg.Self, Prefix: prefix}, extra)
	if err != nil {
		return nil, err
	}
	defer h.close()
	target := netns
	if prefix != nil {
		target = nil // already inside
	}
	a.TUN, a.Diag, err = h.attach(target, helperConfig{Net: cfg.Net, RequireIsolated: !cfg.Force, NotIsolatedHint: cfg.NotIsolatedHint, Watch: true})
	if err != nil {
		if prefix != nil {
			err = fmt.Errorf("%w (entering another user namespace works when it maps root, as rootless container runtimes and 'unshare -r' do)", err)
		}
		return nil, err
	}
	var m helperMsg
	fds, err := tun.Recv(h.ctl, &m)
	if err != nil || m.Type != "watch" || len(fds) != 1 {
		for _, fd := range append(fds, a.TUN, a.Diag) {
			unix.Close(fd)
		}
		return nil, fmt.Errorf("helper: no watch socket (%q message with %d fds): %v", m.Type, len(fds), err)
	}
	a.Watch = fds[0]
	return a, nil
}

// NetNSEmpty reports whether no process is left in the network namespace
// with inode ino (as far as /proc shows this user).
func NetNSEmpty(ino uint64) bool {
	paths, _ := filepath.Glob("/proc/[0-9]*/ns/net")
	self := strconv.Itoa(os.Getpid())
	for _, p := range paths {
		if filepath.Base(filepath.Dir(filepath.Dir(p))) == self {
			continue
		}
		var st unix.Stat_t
		if unix.Stat(p, &st) == nil && st.Ino == ino {
			return false
		}
	}
	return true
}

// WatchEmpty closes the returned channel once the namespace has no process
// left, checking every interval until ctx ends.
func WatchEmpty(ctx context.Context, ino uint64, interval time.Duration) <-chan struct{} {
	c := make(chan struct{})
	go func() {
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if NetNSEmpty(ino) {
					close(c)
					return
				}
			}
		}
	}()
	return c
}
