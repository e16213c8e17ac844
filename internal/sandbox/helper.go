package sandbox

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/tunwall/tunwall/tun"
)

// HelperArg is argv[1] of a re-executed tunwall that creates the TUN inside
// a network namespace someone else made (bwrap, attach). cmd/tunwall calls
// HelperMain when it sees it.
const HelperArg = "__tunwall-helper"

// helperConfig is what the helper is asked to do.
type helperConfig struct {
	Net NetConfig `json:"net"`
	// RequireIsolated refuses a namespace that already has a way out.
	RequireIsolated bool `json:"require_isolated"`
	// NotIsolatedHint ends the refusal of such a namespace: what the
	// caller's user can do about it ("" none).
	NotIsolatedHint string `json:"not_isolated_hint,omitempty"`
	// Watch opens a netlink socket subscribed to the namespace's link,
	// address and route changes (before the isolation check) and sends it
	// after "ready", in a "watch" message.
	Watch bool `json:"watch,omitempty"`
}

type helperMsg struct {
	Type   string        `json:"type"` // "attach" (parent -> helper, with a netns fd or none), "ready", "error"
	Config *helperConfig `json:"config,omitempty"`
	Error  string        `json:"error,omitempty"`
}

// HelperMain is the body of the helper process. It waits for one "attach"
// message carrying a network namespace descriptor (or none: the namespace it
// is already in, when started by nsenter), creates and configures the TUN
// there, sends back the TUN and a sock_diag socket, and exits.
func HelperMain() int {
	ctl, err := tun.FileConn(os.NewFile(controlFD, "control"))
	if err != nil {
		fmt.Fprintf(os.Stderr, "tunwall helper: control socket: %v\n", err)
		return ExitSetup
	}
	defer ctl.Close()
	var m helperMsg
	fds, err := tun.Recv(ctl, &m)
	if err != nil || m.Type != "attach" || m.Config == nil {
		fmt.Fprintf(os.Stderr, "tunwall helper: no instructions: %v\n", err)
		return ExitSetup
	}
	var tunFD, diagFD, watchFD int = -1, -1, -1
	setup := func() error {
		if m.Config.Watch {
			var err error
			if watchFD, err = tun.OpenWatch(); err != nil {
				return err
			}
		}
		if m.Config.RequireIsolated {
			ok, why, err := tun.Isolated()
			if err != nil {
				return err
			}
			if !ok {
				err := fmt.Errorf("the namespace already has a way out (%s): tunwall would not be its only exit", why)
				if m.Config.NotIsolatedHint != "" {
					err = fmt.Errorf("%w; %s", err, m.Config.NotIsolatedHint)
				}
				return err
			}
		}
		tc := m.Config.Net.tunConfig()
		var err error
		if tunFD, err = tun.Setup(tc); err != nil {
			return err
		}
		if diagFD, err = unix.Socket(unix.AF_NETLINK, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.NETLINK_SOCK_DIAG); err != nil {
			return fmt.Errorf("sock_diag socket: %w", err)
		}
		return nil
	}
	if len(fds) > 0 {
		err = tun.InNetNS(fds[0], setup)
		for _, fd := range fds {
			unix.Close(fd)
		}
	} else {
		runtime.LockOSThread()
		err = setup()
	}
	if err != nil {
		tun.Send(ctl, helperMsg{Type: "error", Error: err.Error()})
		return ExitSetup
	}
	if err := tun.Send(ctl, helperMsg{Type: "ready"}, tunFD, diagFD); err != nil {
		return ExitSetup
	}
	if watchFD >= 0 {
		if err := tun.Send(ctl, helperMsg{Type: "watch"}, watchFD); err != nil {
			return ExitSetup
		}
	}
	return 0
}

// helper is a running helper process.
type helper struct {
	cmd *exec.Cmd
	ctl *net.UnixConn
}

// helperOptions choose how the helper is started.
type helperOptions struct {
	Self string
	// Prefix runs the helper under another program, e.g. nsenter, which
	// puts it into the target's namespaces before it starts.
	Prefix []string
}

// startHelperWith starts the helper with extra descriptors after the control
// socket (fds 4, 5, ...).
func startHelperWith(o helperOptions, extra []*os.File) (_ *helper, err error) {
	if o.Self == "" {
		o.Self = "/proc/self/exe"
		if len(o.Prefix) > 0 {
			// Under nsenter, /proc/self/exe would be nsenter.
			if o.Self, err = os.Executable(); err != nil {
				return nil, err
			}
		}
	}
	ctl, child, err := tun.SocketPair()
	if err != nil {
		return nil, err
	}
	defer child.Close()
	argv := append(append([]string{}, o.Prefix...), o.Self, HelperArg)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stderr = os.Stderr
	cmd.ExtraFiles = append([]*os.File{child}, extra...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: unix.SIGKILL}
	if err := cmd.Start(); err != nil {
		ctl.Close()
		return nil, fmt.Errorf("start helper: %w", err)
	}
	return &helper{cmd: cmd, ctl: ctl}, nil
}

// attach asks the helper to build the TUN in the network namespace netns (an
// open namespace file; nil means the helper's own) and returns the TUN and
// sock_diag descriptors.
func (h *helper) attach(netns *os.File, hc helperConfig) (tunFD, diagFD int, err error) {
	var fds []int
	if netns != nil {
		fds = []int{int(netns.Fd())}
	}
	if err := tun.Send(h.ctl, helperMsg{Type: "attach", Config: &hc}, fds...); err != nil {
		return -1, -1, err
	}
	var m helperMsg
	got, err := tun.Recv(h.ctl, &m)
	if err != nil {
		if errors.Is(err, tun.ErrPeerGone) {
			err = errors.New("the helper that creates the TUN died")
		}
		return -1, -1, err
	}
	if m.Type == "error" {
		return -1, -1, errors.New(m.Error)
	}
	if m.Type != "ready" || len(got) != 2 {
		for _, fd := range got {
			unix.Close(fd)
		}
		return -1, -1, fmt.Errorf("helper: unexpected %q message with %d fds", m.Type, len(got))
	}
	return got[0], got[1], nil
}

// close ends the helper (it exits by itself after attach).
func (h *helper) close() {
	h.ctl.Close()
	done := make(chan struct{})
	go func() { h.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-timeAfter(2):
		h.cmd.Process.Kill()
		<-done
	}
}
