package control

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// Namespaces are the inodes of a process's network and pid namespaces; 0
// is unknown.
type Namespaces struct {
	Net, Pid uint64
}

// OwnNamespaces are tunwall's own namespaces.
func OwnNamespaces() (Namespaces, error) {
	return namespacesOf("self")
}

// namespacesOf reads the namespaces of /proc/PID.
func namespacesOf(pid string) (ns Namespaces, err error) {
	if ns.Net, err = nsInode(pid, "net"); err != nil {
		return ns, err
	}
	ns.Pid, err = nsInode(pid, "pid")
	return ns, err
}

// nsInode is the inode of /proc/PID/ns/KIND.
func nsInode(pid, kind string) (uint64, error) {
	fi, err := os.Stat("/proc/" + pid + "/ns/" + kind)
	if err != nil {
		return 0, fmt.Errorf("namespaces of process %s: %w", pid, err)
	}
	return fi.Sys().(*syscall.Stat_t).Ino, nil
}

// Peer is what the kernel and /proc say about a client of the socket.
type Peer struct {
	Pid int32  // SO_PEERCRED, in tunwall's pid namespace
	UID uint32 // SO_PEERCRED, in tunwall's user namespace
	// NS and UserNS are the peer's namespaces; NSErr why they could not
	// be read (then NS and UserNS are zero).
	NS     Namespaces
	UserNS uint64
	NSErr  error
}

// Self is what the checks compare a Peer with.
type Self struct {
	UID    uint32     // tunwall's effective uid
	NS     Namespaces // tunwall's own namespaces
	UserNS uint64     // tunwall's user namespace
	// Sandbox are the sandbox's namespaces (0: unknown, or tunwall's own:
	// not checked).
	Sandbox Namespaces
}

// checkPeer says why p may not use the control socket, or nil. The
// sandbox never may: no process in its network or pid namespace, and
// none in another user namespace than tunwall's (every sandbox has one of
// its own, inside which a process may make new network and pid
// namespaces); nor may another user, except root.
func checkPeer(p Peer, s Self) error {
	switch {
	case p.Pid <= 0:
		return errors.New("the peer's process is not visible from tunwall's pid namespace")
	case p.UID != s.UID && p.UID != 0:
		return fmt.Errorf("uid %d is not tunwall's (%d) nor root", p.UID, s.UID)
	case p.NSErr != nil && p.UID == 0 && s.UID != 0 && errors.Is(p.NSErr, os.ErrPermission):
		// Root's process, which tunwall may not inspect: root is never
		// the sandbox (whose root is mapped to an unprivileged uid).
		return nil
	case p.NSErr != nil:
		return fmt.Errorf("cannot tell where process %d runs: %v", p.Pid, p.NSErr)
	case s.Sandbox.Net != 0 && s.Sandbox.Net != s.NS.Net && p.NS.Net == s.Sandbox.Net:
		return fmt.Errorf("process %d is in the sandbox's network namespace", p.Pid)
	case s.Sandbox.Pid != 0 && s.Sandbox.Pid != s.NS.Pid && p.NS.Pid == s.Sandbox.Pid:
		return fmt.Errorf("process %d is in the sandbox's pid namespace", p.Pid)
	case p.UserNS != s.UserNS:
		return fmt.Errorf("process %d is in another user namespace than tunwall's (a sandbox's, or a container's)", p.Pid)
	}
	return nil
}

// selfFor is tunwall's side of the checks for sandbox sb.
func selfFor(sb Namespaces) (Self, error) {
	ns, err := namespacesOf("self")
	if err != nil {
		return Self{}, err
	}
	user, err := nsInode("self", "user")
	if err != nil {
		return Self{}, err
	}
	return Self{UID: uint32(os.Geteuid()), NS: ns, UserNS: user, Sandbox: sb}, nil
}

// peerOf reads the peer of c: SO_PEERCRED, then the namespaces of its
// process. With SO_PEERPIDFD (Linux 6.5) the process is held while they
// are read, and checked still alive after: a pid reused meanwhile is
// refused.
func peerOf(c *net.UnixConn) (Peer, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return Peer{}, err
	}
	var cred *unix.Ucred
	pidfd := -1
	var credErr error
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
		if credErr == nil {
			if n, err := unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_PEERPIDFD); err == nil {
				pidfd = n
			}
		}
	}); err != nil {
		return Peer{}, err
	}
	if credErr != nil {
		return Peer{}, fmt.Errorf("SO_PEERCRED: %w", credErr)
	}
	if pidfd >= 0 {
		defer unix.Close(pidfd)
	}
	p := Peer{Pid: cred.Pid, UID: cred.Uid}
	if p.Pid <= 0 {
		return p, nil
	}
	pid := strconv.Itoa(int(p.Pid))
	p.NS, p.NSErr = namespacesOf(pid)
	if p.NSErr == nil {
		p.UserNS, p.NSErr = nsInode(pid, "user")
	}
	if p.NSErr == nil && pidfd >= 0 {
		// ESRCH: gone (EPERM, for root's process, means it is alive).
		if err := unix.PidfdSendSignal(pidfd, 0, nil, 0); errors.Is(err, unix.ESRCH) {
			p.NSErr = fmt.Errorf("the process exited while it was checked: %w", err)
		}
	}
	if p.NSErr != nil {
		p.NS, p.UserNS = Namespaces{}, 0
	}
	return p, nil
}

// checkConn returns the peer of c, or why it may not use the socket.
func (l *Listener) checkConn(c *net.UnixConn, cfg ServeConfig) (Peer, error) {
	self, err := selfFor(cfg.Sandbox)
	if err != nil {
		return Peer{}, err
	}
	p, err := peerOf(c)
	if err != nil {
		return Peer{}, err
	}
	return p, checkPeer(p, self)
}

// requester says who p is, for the record of a change it asks for with
// cmd: its uid and pid, and, as far as /proc shows them, its comm and exe.
func (p Peer) requester(cmd string) Requester {
	r := Requester{UID: p.UID, PID: p.Pid, Via: "ctl " + cmd}
	if p.Pid > 0 {
		pid := strconv.Itoa(int(p.Pid))
		if b, err := os.ReadFile("/proc/" + pid + "/comm"); err == nil {
			r.Comm = strings.TrimSpace(string(b))
		}
		r.Exe, _ = os.Readlink("/proc/" + pid + "/exe")
	}
	return r
}

// NamespacesOf are the namespaces of process pid.
func NamespacesOf(pid int) (Namespaces, error) {
	return namespacesOf(strconv.Itoa(pid))
}

// CheckRootPeer returns the peer of c, and why it may not use a socket
// only root may use (the node agent's, which the CNI plugin calls), or
// nil: the peer must be uid 0 in tunwall's own user namespace. Root in a
// container's user namespace is someone else. The caller checks the
// peer's network namespace against its own sandboxes (Peer.NS.Net).
//
// The peer's namespaces are read through its pidfd (SO_PEERPIDFD and the
// PIDFD_GET_*_NAMESPACE ioctls, Linux 6.11), which names the process
// itself even when tunwall's pid namespace does not show it (an agent in
// a pod without hostPID; the kernel then asks for CAP_SYS_PTRACE, as the
// peer, the container runtime's plugin, holds capabilities the agent
// lacks), else through /proc. A peer whose namespaces cannot be read is
// refused.
func CheckRootPeer(c *net.UnixConn) (Peer, error) {
	self, err := selfFor(Namespaces{})
	if err != nil {
		return Peer{}, err
	}
	p, viaPidfd, err := peerByPidfd(c)
	if err != nil {
		return Peer{}, err
	}
	if !viaPidfd {
		if p, err = peerOf(c); err != nil {
			return Peer{}, err
		}
	}
	if p.UID != 0 {
		return p, fmt.Errorf("uid %d is not root", p.UID)
	}
	if p.NSErr != nil || (!viaPidfd && p.Pid <= 0) {
		why := "its process is not visible from tunwall's pid namespace"
		if p.NSErr != nil {
			why = p.NSErr.Error()
		}
		return p, fmt.Errorf("cannot tell where the peer (pid %d) runs: %s (run the agent with the host's pid namespace, or with CAP_SYS_PTRACE to read its namespaces through its pidfd)", p.Pid, why)
	}
	if p.UserNS != self.UserNS {
		return p, fmt.Errorf("process %d is in another user namespace than tunwall's (a container's)", p.Pid)
	}
	return p, nil
}

// peerByPidfd reads the peer of c through its pidfd: SO_PEERCRED, then
// its network, pid and user namespaces by PIDFD_GET_*_NAMESPACE. ok is
// false (and err nil) when the kernel cannot do that, or refuses it: the
// caller then reads /proc.
func peerByPidfd(c *net.UnixConn) (p Peer, ok bool, err error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return Peer{}, false, err
	}
	var cred *unix.Ucred
	var credErr error
	pidfd := -1
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
		if credErr == nil {
			if n, err := unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_PEERPIDFD); err == nil {
				pidfd = n
			}
		}
	}); err != nil {
		return Peer{}, false, err
	}
	if credErr != nil {
		return Peer{}, false, fmt.Errorf("SO_PEERCRED: %w", credErr)
	}
	if pidfd < 0 {
		return Peer{}, false, nil
	}
	defer unix.Close(pidfd)
	p = Peer{Pid: cred.Pid, UID: cred.Uid}
	inode := func(req uint) (uint64, error) {
		fd, err := unix.IoctlRetInt(pidfd, req)
		if err != nil {
			return 0, err
		}
		defer unix.Close(fd)
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			return 0, err
		}
		return st.Ino, nil
	}
	for _, x := range []struct {
		req uint
		to  *uint64
	}{{unix.PIDFD_GET_NET_NAMESPACE, &p.NS.Net}, {unix.PIDFD_GET_PID_NAMESPACE, &p.NS.Pid}, {unix.PIDFD_GET_USER_NAMESPACE, &p.UserNS}} {
		if *x.to, err = inode(x.req); err != nil {
			return Peer{}, false, nil
		}
	}
	return p, true, nil
}
