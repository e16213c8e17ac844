package procattr

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tunwall/tunwall/internal/testenv"
)

// The netns tests re-execute this test binary under unshare(1) as a stand-in
// for the sandbox: it opens sockets and NETLINK_SOCK_DIAG sockets inside the
// new namespaces and passes the diag fds back over SCM_RIGHTS, exactly as
// tunwall's in-sandbox helper does. No named netns is created; the helper's
// namespaces die with it, and Cleanup ends it by PID.

const netnsHelperEnv = "TUNWALL_PROCATTR_NETNS_HELPER"

// helperReport is what the helper tells the test about its sockets.
type helperReport struct {
	PID                 int // os.Getpid() inside the helper's own pid namespace
	TCPLocal, TCPRemote netip.AddrPort
	TCPInode            uint64
	UDPLocal, UDPRemote netip.AddrPort
	UDPInode            uint64
}

// Rights the helper sends, in order.
const (
	rightDiagSandboxFilter = iota
	rightDiagNoFilter
	rightDiagHostFilter
	rightTCPSocket
	numRights
)

func TestMain(m *testing.M) {
	if os.Getenv(netnsHelperEnv) == "1" {
		os.Exit(runNetnsHelper())
	}
	if addr := os.Getenv(lateSocketEnv); addr != "" {
		os.Exit(runLateSocketHelper(addr))
	}
	os.Exit(m.Run())
}

// runNetnsHelper runs inside the new namespaces with the control socket on
// fd 3. It exits when the test closes its end, or after a minute.
func runNetnsHelper() int {
	fail := func(format string, a ...any) int {
		fmt.Fprintf(os.Stderr, "netns helper: "+format+"\n", a...)
		return 1
	}
	const ctl = 3
	if err := bringLoUp(); err != nil {
		return fail("lo up: %v", err)
	}
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		return fail("listen: %v", err)
	}
	defer ln.Close()
	tc, err := net.Dial("tcp4", ln.Addr().String())
	if err != nil {
		return fail("dial: %v", err)
	}
	defer tc.Close()
	srv, err := ln.Accept()
	if err != nil {
		return fail("accept: %v", err)
	}
	defer srv.Close()
	us, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		return fail("listen udp: %v", err)
	}
	defer us.Close()
	uc, err := net.DialUDP("udp4", nil, us.LocalAddr().(*net.UDPAddr))
	if err != nil {
		return fail("dial udp: %v", err)
	}
	defer uc.Close()

	tf, err := tc.(*net.TCPConn).File()
	if err != nil {
		return fail("tcp file: %v", err)
	}
	defer tf.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(tf.Fd()), &st); err != nil {
		return fail("fstat tcp: %v", err)
	}
	rep := helperReport{
		PID:      os.Getpid(),
		TCPLocal: tc.LocalAddr().(*net.TCPAddr).AddrPort(), TCPRemote: tc.RemoteAddr().(*net.TCPAddr).AddrPort(), TCPInode: st.Ino,
		UDPLocal: uc.LocalAddr().(*net.UDPAddr).AddrPort(), UDPRemote: uc.RemoteAddr().(*net.UDPAddr).AddrPort(),
	}
	uf, err := uc.File()
	if err != nil {
		return fail("udp file: %v", err)
	}
	if err := unix.Fstat(int(uf.Fd()), &st); err != nil {
		return fail("fstat udp: %v", err)
	}
	uf.Close()
	rep.UDPInode = st.Ino

	rights := make([]int, numRights)
	for i := range rightTCPSocket {
		fd, err := OpenDiag()
		if err != nil {
			return fail("%v", err)
		}
		defer unix.Close(fd)
		rights[i] = fd
	}
	rights[rightTCPSocket] = int(tf.Fd())
	msg, err := json.Marshal(rep)
	if err != nil {
		return fail("marshal: %v", err)
	}
	if err := unix.Sendmsg(ctl, msg, unix.UnixRights(rights...), nil, 0); err != nil {
		return fail("sendmsg: %v", err)
	}
	// Hold the sockets until the test hangs up (bounded).
	pfd := []unix.PollFd{{Fd: ctl, Events: unix.POLLIN}}
	_, _ = unix.Poll(pfd, 60_000)
	return 0
}

func bringLoUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return err
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	return unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr)
}

// netnsHelper is a running helper as the test sees it.
type netnsHelper struct {
	hostPID int // from SCM_CREDENTIALS, translated into our pid namespace
	report  helperReport
	rights  []int
}

func startNetnsHelper(t *testing.T, unshareArgs []string) netnsHelper {
	t.Helper()
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		testenv.Skip(t, "no unshare(1): %v", err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	sp, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	parent := sp[0]
	child := os.NewFile(uintptr(sp[1]), "ctl")
	if err := unix.SetsockoptInt(parent, unix.SOL_SOCKET, unix.SO_PASSCRED, 1); err != nil {
		t.Fatal(err)
	}
	args := append(slices.Clone(unshareArgs), exe)
	cmd := exec.Command(unshare, args...)
	cmd.Env = append(os.Environ(), netnsHelperEnv+"=1")
	cmd.ExtraFiles = []*os.File{child}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	t.Logf("running %s %v", unshare, args)
	if err := cmd.Start(); err != nil {
		t.Fatalf("start unshare: %v", err)
	}
	child.Close()
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	t.Cleanup(func() {
		unix.Close(parent) // the helper sees the hang-up and exits
		select {
		case <-waited:
		case <-time.After(5 * time.Second):
			t.Logf("helper (unshare pid %d) did not exit; killing it", cmd.Process.Pid)
			_ = cmd.Process.Kill() // --kill-child takes the forked helper with it
			<-waited
		}
	})

	pfd := []unix.PollFd{{Fd: int32(parent), Events: unix.POLLIN}}
	if n, err := unix.Poll(pfd, 20_000); err != nil || n == 0 {
		t.Fatalf("no message from the netns helper (poll %d, %v); stderr: %s", n, err, stderr.String())
	}
	buf := make([]byte, 4096)
	oob := make([]byte, unix.CmsgSpace(numRights*4)+unix.CmsgSpace(unix.SizeofUcred))
	n, oobn, _, _, err := unix.Recvmsg(parent, buf, oob, unix.MSG_CMSG_CLOEXEC)
	if err != nil || n == 0 {
		t.Fatalf("recvmsg from helper: n=%d err=%v; stderr: %s", n, err, stderr.String())
	}
	var h netnsHelper
	cmsgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil {
		t.Fatalf("parse control messages: %v", err)
	}
	for _, c := range cmsgs {
		if fds, err := unix.ParseUnixRights(&c); err == nil {
			h.rights = append(h.rights, fds...)
		}
		if cred, err := unix.ParseUnixCredentials(&c); err == nil {
			h.hostPID = int(cred.Pid)
		}
	}
	t.Cleanup(func() {
		for _, fd := range h.rights {
			if fd >= 0 {
				unix.Close(fd)
			}
		}
	})
	if len(h.rights) != numRights || h.hostPID == 0 {
		t.Fatalf("helper sent %d fds and pid %d; want %d fds and a pid", len(h.rights), h.hostPID, numRights)
	}
	if err := json.Unmarshal(buf[:n], &h.report); err != nil {
		t.Fatalf("helper report: %v", err)
	}
	t.Logf("helper: host pid %d, report %+v", h.hostPID, h.report)
	return h
}

// takeResolver wraps one of the helper's diag fds; the Resolver owns it.
func (h *netnsHelper) takeResolver(t *testing.T, i int, netns uint64) *Resolver {
	t.Helper()
	r, err := New(Config{DiagFD: h.rights[i], NetNS: netns})
	if err != nil {
		t.Fatalf("New with the helper's diag fd: %v", err)
	}
	h.rights[i] = -1
	t.Cleanup(func() { r.Close() })
	return r
}

func netnsInode(t testing.TB, pid string) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat("/proc/"+pid+"/ns/net", &st); err != nil {
		t.Fatalf("stat netns of %s: %v", pid, err)
	}
	return st.Ino
}

func TestLookupInsideAnotherNetworkNamespace(t *testing.T) {
	requireRoot(t)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name      string
		unshare   []string
		wantNSPID func(h netnsHelper) int
	}{
		{"a plain network namespace (sandbox shares our pid namespace)",
			[]string{"--net"},
			func(h netnsHelper) int { return h.hostPID }},
		{"user, network and pid namespaces as tunwall run makes them (sandbox is pid 1 inside)",
			[]string{"--user", "--map-root-user", "--net", "--pid", "--fork", "--kill-child"},
			func(netnsHelper) int { return 1 }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := startNetnsHelper(t, tt.unshare)
			sandboxNS := netnsInode(t, fmt.Sprint(h.hostPID))
			ourNS := netnsInode(t, "self")
			if sandboxNS == ourNS {
				t.Fatalf("helper pid %d is in our netns %d; unshare did not isolate it", h.hostPID, ourNS)
			}
			if want := tt.wantNSPID(h); h.report.PID != want {
				t.Fatalf("helper sees itself as pid %d, want %d", h.report.PID, want)
			}
			rep := h.report
			inSandbox := h.takeResolver(t, rightDiagSandboxFilter, sandboxNS)
			unfiltered := h.takeResolver(t, rightDiagNoFilter, 0)
			hostFiltered := h.takeResolver(t, rightDiagHostFilter, ourNS)
			ourDiag := newTestResolver(t, Config{}) // a diag socket of our own netns

			sandboxOwner := func(inode uint64) Owner {
				return Owner{PID: h.hostPID, NSPID: rep.PID, Comm: expectedComm(exe), Exe: exe, UID: 0, Inode: inode}
			}
			both := []int{h.hostPID, os.Getpid()} // we hold a dup of the TCP socket too
			slices.Sort(both)
			checks := []struct {
				name string
				r    *Resolver
				flow testFlow
				want Owner
			}{
				{"the sandbox's TCP socket is attributed to the sandbox process by the netns filter",
					inSandbox, testFlow{"tcp", rep.TCPLocal, rep.TCPRemote, rep.TCPInode}, sandboxOwner(rep.TCPInode)},
				{"the sandbox's UDP socket is attributed to the sandbox process",
					inSandbox, testFlow{"udp", rep.UDPLocal, rep.UDPRemote, rep.UDPInode}, sandboxOwner(rep.UDPInode)},
				{"without the filter our dup of the TCP socket makes it ambiguous",
					unfiltered, testFlow{"tcp", rep.TCPLocal, rep.TCPRemote, rep.TCPInode},
					Owner{UID: 0, Inode: rep.TCPInode, Note: fmt.Sprintf("ambiguous: pids %d,%d", both[0], both[1])}},
				{"filtering on our netns finds only our dup of the TCP socket",
					hostFiltered, testFlow{"tcp", rep.TCPLocal, rep.TCPRemote, rep.TCPInode},
					Owner{PID: os.Getpid(), NSPID: os.Getpid(), Comm: expectedComm(exe), Exe: exe, UID: 0, Inode: rep.TCPInode}},
			}
			for _, c := range checks {
				if got := c.r.Lookup(c.flow.proto, c.flow.local, c.flow.remote); got != c.want {
					t.Errorf("%s:\n Lookup = %+v\n want    %+v", c.name, got, c.want)
				}
			}
			// Filtering on our netns finds no holder of the sandbox's UDP socket.
			// The Note is "gone", or, when some process of our netns cannot be
			// inspected (on this VM pid 1 is not readable even by root), an
			// "unknown: permission denied" that must not name the helper.
			got := hostFiltered.Lookup("udp", rep.UDPLocal, rep.UDPRemote)
			deniedPrefix := NoteUnknownPrefix + "permission denied reading fds of pids "
			denied, isDenied := strings.CutPrefix(got.Note, deniedPrefix)
			helperListed := slices.Contains(strings.Split(strings.Fields(denied + " ")[0], ","), fmt.Sprint(h.hostPID))
			if got.PID != 0 || got.Inode != rep.UDPInode || !(got.Note == NoteGone || (isDenied && !helperListed)) {
				t.Errorf("filtering on our netns: Lookup of the sandbox's UDP flow = %+v, want no process and Note gone", got)
			}
			// A diag socket of our own netns cannot see the sandbox's sockets.
			if got := ourDiag.Lookup("udp", rep.UDPLocal, rep.UDPRemote); got.Inode == rep.UDPInode {
				t.Errorf("our netns's diag socket found the sandbox's UDP socket: %+v", got)
			}
		})
	}
}
