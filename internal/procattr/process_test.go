package procattr

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tunwall/tunwall/internal/testenv"
)

func TestKernelQuirkUDPDiagTreatsSrcAsThePacketSource(t *testing.T) {
	requireRoot(t)
	// Pins the empirical fact exactOrders relies on: for UDP the socket's
	// remote goes into id.src; for TCP its local address does.
	r := newTestResolver(t, Config{})
	u := udpConnected(t, "udp4", "127.0.0.1:0")
	tc := tcpClient(t, "tcp4", "127.0.0.1:0")
	tests := []struct {
		name     string
		flow     testFlow
		ipProto  uint8
		src, dst netip.AddrPort
		found    bool
	}{
		{"UDP with the remote side in id.src finds the socket", u, unix.IPPROTO_UDP, u.remote, u.local, true},
		{"UDP with the local side in id.src does not find it", u, unix.IPPROTO_UDP, u.local, u.remote, false},
		{"TCP with the local side in id.src finds the socket", tc, unix.IPPROTO_TCP, tc.local, tc.remote, true},
		{"TCP with the remote side in id.src does not find it", tc, unix.IPPROTO_TCP, tc.remote, tc.local, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r.mu.Lock()
			s, err := r.exactLocked(unix.AF_INET, tt.ipProto, tt.src, tt.dst, farDeadline())
			r.mu.Unlock()
			found := err == nil && s.inode == tt.flow.inode
			if found != tt.found {
				t.Fatalf("exact lookup src=%v dst=%v: socket %+v err %v; found=%v, want %v", tt.src, tt.dst, s, err, found, tt.found)
			}
		})
	}
}

func TestLookupAttributesASocketHeldOnlyByAChildProcess(t *testing.T) {
	requireRoot(t)
	srv := udpServer(t, "udp4", "127.0.0.1:0")
	uc, err := net.DialUDP("udp4", nil, srv.LocalAddr().(*net.UDPAddr))
	if err != nil {
		t.Fatal(err)
	}
	c := testFlow{"udp", addrPortOf(t, uc.LocalAddr()), addrPortOf(t, uc.RemoteAddr()), connInode(t, uc)}
	// Hand a dup of the socket to `sleep`, then drop every copy we hold.
	f, err := uc.File()
	if err != nil {
		t.Fatal(err)
	}
	uc.Close()
	cmd := startHolder(t, f)
	f.Close()

	r := newTestResolver(t, Config{})
	got := r.Lookup("udp", c.local, c.remote)
	sleepPath, _ := filepath.EvalSymlinks(cmd.Path)
	want := Owner{PID: cmd.Process.Pid, NSPID: cmd.Process.Pid, Comm: "sleep", Exe: sleepPath, UID: 0, Inode: c.inode}
	if got != want {
		t.Fatalf("Lookup = %+v, want %+v", got, want)
	}
}

func TestLookupAttributesAFlowACurlSubprocessOpened(t *testing.T) {
	requireRoot(t)
	curl, err := exec.LookPath("curl")
	if err != nil {
		testenv.Skip(t, "no curl: %v", err)
	}
	ln := mustListen(t, "tcp4", "127.0.0.1:0")
	cmd := exec.Command(curl, "-s", "--max-time", "20", "-o", "/dev/null", "http://"+ln.Addr().String()+"/")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	ln.(*net.TCPListener).SetDeadline(time.Now().Add(10 * time.Second))
	conn, err := ln.Accept()
	if err != nil {
		t.Fatalf("accept: %v", err)
	}
	defer conn.Close()
	// From the "sandbox" side, curl's flow goes from its local port to us.
	r := newTestResolver(t, Config{})
	got := r.Lookup("tcp", addrPortOf(t, conn.RemoteAddr()), addrPortOf(t, conn.LocalAddr()))
	if got.PID != cmd.Process.Pid || got.Comm != "curl" || got.Note != "" || got.Inode == 0 {
		t.Fatalf("Lookup = %+v, want pid %d comm curl", got, cmd.Process.Pid)
	}
	if got.Inode == connInode(t, conn.(*net.TCPConn)) {
		t.Fatalf("Lookup returned our accepted socket, not curl's")
	}
}

func TestLookupReportsAmbiguityWhenTwoProcessesHoldTheSocket(t *testing.T) {
	requireRoot(t)
	ln := mustListen(t, "tcp4", "127.0.0.1:0")
	tc, err := net.Dial("tcp4", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer tc.Close()
	c := testFlow{"tcp", addrPortOf(t, tc.LocalAddr()), addrPortOf(t, tc.RemoteAddr()), connInode(t, tc.(*net.TCPConn))}
	f, err := tc.(*net.TCPConn).File()
	if err != nil {
		t.Fatal(err)
	}
	cmd := startHolder(t, f) // the child and this process now share the socket
	f.Close()

	r := newTestResolver(t, Config{})
	got := r.Lookup("tcp", c.local, c.remote)
	pids := []int{os.Getpid(), cmd.Process.Pid}
	slices.Sort(pids)
	want := Owner{UID: 0, Inode: c.inode, Note: fmt.Sprintf("ambiguous: pids %d,%d", pids[0], pids[1])}
	if got != want {
		t.Fatalf("Lookup = %+v, want %+v", got, want)
	}
}

func TestLookupReportsGoneForClosedSockets(t *testing.T) {
	requireRoot(t)
	tests := []struct {
		name string
		open func(t *testing.T) (testFlow, func())
	}{
		{"a closed connected UDP socket is gone", func(t *testing.T) (testFlow, func()) {
			s := udpServer(t, "udp4", "127.0.0.1:0")
			c, err := net.DialUDP("udp4", nil, s.LocalAddr().(*net.UDPAddr))
			if err != nil {
				t.Fatal(err)
			}
			return testFlow{"udp", addrPortOf(t, c.LocalAddr()), addrPortOf(t, c.RemoteAddr()), connInode(t, c)}, func() { c.Close() }
		}},
		{"a TCP client that closed first (TIME_WAIT) is gone", func(t *testing.T) (testFlow, func()) {
			ln := mustListen(t, "tcp4", "127.0.0.1:0")
			c, err := net.Dial("tcp4", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			srv, err := ln.Accept()
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { srv.Close() })
			return testFlow{"tcp", addrPortOf(t, c.LocalAddr()), addrPortOf(t, c.RemoteAddr()), connInode(t, c.(*net.TCPConn))}, func() { c.Close() }
		}},
		{"a flow that never had a socket is gone", func(t *testing.T) (testFlow, func()) {
			// Port 1 on loopback from port 9: nothing in this test binds them.
			return testFlow{"udp", netip.MustParseAddrPort("127.0.0.1:9"), netip.MustParseAddrPort("127.0.0.1:1"), 0}, func() {}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, closeFn := tt.open(t)
			r := newTestResolver(t, Config{})
			if f.inode != 0 {
				if got := r.Lookup(f.proto, f.local, f.remote); got.Inode != f.inode || got.Note != "" {
					t.Fatalf("before close: Lookup = %+v, want inode %d and no note", got, f.inode)
				}
			}
			closeFn()
			var got Owner
			ok := waitFor(2*time.Second, func() bool {
				got = r.Lookup(f.proto, f.local, f.remote)
				return got.Note == NoteGone
			})
			if !ok || got.PID != 0 || got.Comm != "" {
				t.Fatalf("after close: Lookup = %+v, want Note %q and no process", got, NoteGone)
			}
		})
	}
}

func TestLookupRejectsBadInput(t *testing.T) {
	requireRoot(t)
	r := newTestResolver(t, Config{})
	lo := netip.MustParseAddrPort("127.0.0.1:1000")
	tests := []struct {
		name          string
		proto         string
		local, remote netip.AddrPort
	}{
		{"an unsupported protocol is unknown", "icmp", lo, lo},
		{"an empty local address is unknown", "tcp", netip.AddrPort{}, lo},
		{"mixed address families are unknown", "udp", lo, netip.MustParseAddrPort("[2001:db8::1]:53")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := r.Lookup(tt.proto, tt.local, tt.remote)
			if len(got.Note) <= len(NoteUnknownPrefix) || got.Note[:len(NoteUnknownPrefix)] != NoteUnknownPrefix || got.PID != 0 {
				t.Fatalf("Lookup = %+v, want an %q note", got, NoteUnknownPrefix)
			}
		})
	}
}

func TestLookupAfterCloseIsUnknown(t *testing.T) {
	requireRoot(t)
	fd, err := OpenDiag()
	if err != nil {
		t.Fatal(err)
	}
	r, err := New(Config{DiagFD: fd})
	if err != nil {
		t.Fatal(err)
	}
	c := tcpClient(t, "tcp4", "127.0.0.1:0")
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if got := r.Lookup("tcp", c.local, c.remote); got.Note != NoteUnknownPrefix+resolverClosedReason {
		t.Fatalf("Lookup after Close = %+v", got)
	}
}

func TestLookupIsSafeForConcurrentUse(t *testing.T) {
	requireRoot(t)
	r := newTestResolver(t, Config{})
	var flows []testFlow
	for i := 0; i < 4; i++ {
		flows = append(flows, tcpClient(t, "tcp4", "127.0.0.1:0"), udpConnected(t, "udp4", "127.0.0.1:0"))
	}
	var wg sync.WaitGroup
	errs := make(chan string, 64)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < 25; i++ {
				f := flows[(g+i)%len(flows)]
				if got := r.Lookup(f.proto, f.local, f.remote); got.Inode != f.inode || got.PID != os.Getpid() || got.Note != "" {
					select {
					case errs <- fmt.Sprintf("goroutine %d: Lookup(%v→%v) = %+v, want inode %d", g, f.local, f.remote, got, f.inode):
					default:
					}
					return
				}
			}
		}(g)
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
}

func TestNewValidatesConfig(t *testing.T) {
	requireRoot(t)
	sp, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(sp[0]); unix.Close(sp[1]) })
	diag, err := OpenDiag()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(diag) })
	route, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(route) })
	tests := []struct {
		name string
		cfg  Config
	}{
		{"a negative fd is rejected", Config{DiagFD: -1}},
		{"a unix socket is rejected", Config{DiagFD: sp[0]}},
		{"a NETLINK_ROUTE socket is rejected", Config{DiagFD: route}},
		{"a negative timeout is rejected", Config{DiagFD: diag, Timeout: -time.Second}},
		{"a missing procfs root is rejected", Config{DiagFD: diag, Proc: filepath.Join(t.TempDir(), "nope")}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := New(tt.cfg)
			if err == nil {
				r.Close()
				t.Fatalf("New(%+v) succeeded, want an error", tt.cfg)
			}
		})
	}
	// The caller still owns the fd after a failed New.
	if _, err := unix.GetsockoptInt(diag, unix.SOL_SOCKET, unix.SO_DOMAIN); err != nil {
		t.Fatalf("diag fd closed by a failed New: %v", err)
	}
}
