package procattr

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// These tests need neither root nor a kernel sock_diag: a fake procfs tree
// stands in for /proc and a socketpair peer stands in for the kernel.

type fakeProc struct {
	pid     int
	netns   uint64
	comm    string
	exe     string // "" means no exe link
	nspid   string // the NSpid line's value; "" means no status file
	sockets []uint64
	noFDDir bool
}

// buildFakeProc writes a procfs-like tree: PID/{comm,status,exe,ns/net,fd/N}.
func buildFakeProc(t testing.TB, procs []fakeProc) string {
	t.Helper()
	root := t.TempDir()
	buildFakeProcIn(t, root, procs)
	return root
}

// buildFakeProcIn adds processes to a fake procfs tree.
func buildFakeProcIn(t testing.TB, root string, procs []fakeProc) {
	t.Helper()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	// Entries that are not processes must be ignored.
	if _, err := os.Stat(filepath.Join(root, "self")); os.IsNotExist(err) {
		must(os.MkdirAll(filepath.Join(root, "self", "fd"), 0o755))
		must(os.Symlink("socket:[1]", filepath.Join(root, "self", "fd", "3")))
		must(os.WriteFile(filepath.Join(root, "uptime"), []byte("1.0 1.0\n"), 0o644))
	}
	for _, p := range procs {
		dir := filepath.Join(root, strconv.Itoa(p.pid))
		must(os.MkdirAll(filepath.Join(dir, "ns"), 0o755))
		must(os.Symlink(fmt.Sprintf("net:[%d]", p.netns), filepath.Join(dir, "ns", "net")))
		must(os.WriteFile(filepath.Join(dir, "comm"), []byte(p.comm+"\n"), 0o644))
		if p.exe != "" {
			must(os.Symlink(p.exe, filepath.Join(dir, "exe")))
		}
		if p.nspid != "" {
			status := "Name:\t" + p.comm + "\nTgid:\t" + strconv.Itoa(p.pid) + "\nNSpid:\t" + p.nspid + "\nUid:\t0\t0\t0\t0\n"
			must(os.WriteFile(filepath.Join(dir, "status"), []byte(status), 0o644))
		}
		if p.noFDDir {
			continue
		}
		must(os.MkdirAll(filepath.Join(dir, "fd"), 0o755))
		must(os.Symlink("/dev/null", filepath.Join(dir, "fd", "0")))
		must(os.Symlink("pipe:[77]", filepath.Join(dir, "fd", "1")))
		for i, ino := range p.sockets {
			must(os.Symlink(fmt.Sprintf("socket:[%d]", ino), filepath.Join(dir, "fd", strconv.Itoa(i+3))))
		}
	}
}

func TestProcTableFillAttributesInodesToProcesses(t *testing.T) {
	const sandboxNS, hostNS = 4026532000, 4026531840
	procs := []fakeProc{
		{pid: 1, netns: hostNS, comm: "init", exe: "/sbin/init", nspid: "1", sockets: []uint64{500, 900}},
		{pid: 40, netns: sandboxNS, comm: "curl", exe: "/usr/bin/curl", nspid: "40\t3", sockets: []uint64{100, 200}},
		{pid: 41, netns: sandboxNS, comm: "python3", exe: "/usr/bin/python3.12", nspid: "41\t4", sockets: []uint64{300}},
		{pid: 42, netns: sandboxNS, comm: "sh", exe: "/bin/sh", nspid: "42\t5", sockets: []uint64{300}},
		{pid: 43, netns: sandboxNS, comm: "zombie", nspid: "43\t6", noFDDir: true},
		{pid: 44, netns: sandboxNS, comm: "kthread", sockets: []uint64{600}},
		{pid: 9, netns: hostNS, comm: "tunwall", exe: "/usr/bin/tunwall", nspid: "9", sockets: []uint64{100}},
	}
	root := buildFakeProc(t, procs)
	tests := []struct {
		name  string
		netns uint64
		inode uint64
		want  Owner
	}{
		{"a single holder in the sandbox netns is reported with comm, exe and innermost NSpid",
			sandboxNS, 200, Owner{PID: 40, NSPID: 3, Comm: "curl", Exe: "/usr/bin/curl"}},
		{"a holder outside the netns filter is ignored",
			sandboxNS, 100, Owner{PID: 40, NSPID: 3, Comm: "curl", Exe: "/usr/bin/curl"}},
		{"without a netns filter a holder outside the sandbox makes it ambiguous",
			0, 100, Owner{Note: "ambiguous: pids 9,40"}},
		{"two holders in the netns are ambiguous, lowest pid first",
			sandboxNS, 300, Owner{Note: "ambiguous: pids 41,42"}},
		{"a socket only a process outside the filter holds is gone",
			sandboxNS, 500, Owner{Note: NoteGone}},
		{"a socket nobody holds is gone",
			0, 12345, Owner{Note: NoteGone}},
		{"a holder without status or exe has NSPID 0 and empty Exe",
			sandboxNS, 600, Owner{PID: 44, Comm: "kthread"}},
		{"non-pid entries such as self are never reported",
			0, 1, Owner{Note: NoteGone}},
		{"the host-netns filter finds host processes only",
			hostNS, 900, Owner{PID: 1, NSPID: 1, Comm: "init", Exe: "/sbin/init"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ix := newTestIndex(t, procTable{root: root, netns: tt.netns})
			got := ix.fillNow(tt.inode)
			tt.want.Inode = tt.inode
			if got != tt.want {
				t.Fatalf("fill = %+v, want %+v", got, tt.want)
			}
			// Asked again, the index answers the same.
			if again := ix.fillNow(tt.inode); again != got {
				t.Fatalf("fill again = %+v, want %+v", again, got)
			}
		})
	}
}

func TestProcTableFillReportsAMissingProcfs(t *testing.T) {
	ix := newTestIndex(t, procTable{root: filepath.Join(t.TempDir(), "missing")})
	o := ix.fillNow(1)
	if !strings.HasPrefix(o.Note, NoteUnknownPrefix) || o.PID != 0 {
		t.Fatalf("fill = %+v, want an unknown note", o)
	}
}

func TestDeniedReasonListsAFewPIDs(t *testing.T) {
	tests := []struct {
		name string
		pids []int
		want string
	}{
		{"one pid is listed", []int{7}, "permission denied reading fds of pids 7"},
		{"five pids are listed in full", []int{1, 2, 3, 4, 5}, "permission denied reading fds of pids 1,2,3,4,5"},
		{"more than five pids are counted", []int{1, 2, 3, 4, 5, 6, 7}, "permission denied reading fds of pids 1,2,3,4,5 and 2 more"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := deniedReason(tt.pids); got != tt.want {
				t.Fatalf("deniedReason(%v) = %q, want %q", tt.pids, got, tt.want)
			}
		})
	}
}

// ---- a fake kernel on a socketpair ----

type decodedReq struct {
	seq      uint32
	flags    uint16
	family   uint8
	proto    uint8
	states   uint32
	src, dst netip.AddrPort
}

// decodeDiagRequest is the inverse of encodeDiagRequest.
func decodeDiagRequest(b []byte) (decodedReq, error) {
	if len(b) != sizeofNlMsghdr+sizeofReqV2 {
		return decodedReq{}, fmt.Errorf("request length %d", len(b))
	}
	ne := binary.NativeEndian
	if int(ne.Uint32(b)) != len(b) || ne.Uint16(b[4:]) != unix.SOCK_DIAG_BY_FAMILY {
		return decodedReq{}, errors.New("bad header")
	}
	r := decodedReq{seq: ne.Uint32(b[8:]), flags: ne.Uint16(b[6:])}
	q := b[sizeofNlMsghdr:]
	r.family, r.proto, r.states = q[0], q[1], ne.Uint32(q[4:])
	id := q[8:]
	if ne.Uint32(id[40:]) != inetDiagNoCookie || ne.Uint32(id[44:]) != inetDiagNoCookie {
		return decodedReq{}, errors.New("cookie is not INET_DIAG_NOCOOKIE")
	}
	addr := func(p []byte) netip.Addr {
		if r.family == unix.AF_INET {
			return netip.AddrFrom4([4]byte(p[:4]))
		}
		return netip.AddrFrom16([16]byte(p[:16])).Unmap()
	}
	r.src = netip.AddrPortFrom(addr(id[4:20]), binary.BigEndian.Uint16(id[0:]))
	r.dst = netip.AddrPortFrom(addr(id[20:36]), binary.BigEndian.Uint16(id[2:]))
	return r, nil
}

// encodeDiagMsg builds a kernel reply carrying socket s.
func encodeDiagMsg(seq uint32, flags uint16, s diagSock) []byte {
	ne := binary.NativeEndian
	withAttr := s.family == unix.AF_INET6
	l := sizeofNlMsghdr + sizeofDiagMsg
	if withAttr {
		l += 8 // INET_DIAG_SKV6ONLY: 4-byte header, 1 byte, padding
	}
	b := make([]byte, l)
	ne.PutUint32(b[0:], uint32(l))
	ne.PutUint16(b[4:], unix.SOCK_DIAG_BY_FAMILY)
	ne.PutUint16(b[6:], flags)
	ne.PutUint32(b[8:], seq)
	m := b[sizeofNlMsghdr:]
	m[0], m[1] = s.family, s.state
	id := m[4:]
	binary.BigEndian.PutUint16(id[0:], s.local.Port())
	binary.BigEndian.PutUint16(id[2:], s.remote.Port())
	putDiagAddr(id[4:20], s.family, s.local.Addr())
	putDiagAddr(id[20:36], s.family, s.remote.Addr())
	rest := m[4+sizeofSockID:]
	ne.PutUint32(rest[12:], s.uid)
	ne.PutUint32(rest[16:], uint32(s.inode))
	if withAttr {
		a := m[sizeofDiagMsg:]
		ne.PutUint16(a[0:], 5)
		ne.PutUint16(a[2:], attrSKV6Only)
		if s.v6only {
			a[4] = 1
		}
	}
	return b
}

func encodeNlError(seq uint32, errno unix.Errno) []byte {
	b := make([]byte, sizeofNlMsghdr+sizeofNlMsgErr)
	ne := binary.NativeEndian
	ne.PutUint32(b[0:], uint32(len(b)))
	ne.PutUint16(b[4:], unix.NLMSG_ERROR)
	ne.PutUint32(b[8:], seq)
	ne.PutUint32(b[sizeofNlMsghdr:], uint32(-int32(errno)))
	return b
}

func encodeDone(seq uint32) []byte {
	b := make([]byte, sizeofNlMsghdr+4)
	ne := binary.NativeEndian
	ne.PutUint32(b[0:], uint32(len(b)))
	ne.PutUint16(b[4:], unix.NLMSG_DONE)
	ne.PutUint16(b[6:], unix.NLM_F_MULTI)
	ne.PutUint32(b[8:], seq)
	return b
}

// startFakeKernel serves requests on the peer of the returned fd with
// respond until the test ends. It records every decoded request.
func startFakeKernel(t *testing.T, respond func(decodedReq) [][]byte) (fd int, requests func() []decodedReq) {
	t.Helper()
	sp, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	// Non-blocking: poll also wakes when the resolver closes its end, and a
	// blocking read would then never return (the test hung for 10 minutes).
	if err := unix.SetNonblock(sp[1], true); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	reqs := make(chan decodedReq, 64)
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		buf := make([]byte, 4096)
		for i := 0; i < 1000; i++ { // 1000 × 20ms polls bounds the goroutine
			select {
			case <-done:
				return
			default:
			}
			pfd := []unix.PollFd{{Fd: int32(sp[1]), Events: unix.POLLIN}}
			if n, _ := unix.Poll(pfd, 20); n == 0 {
				continue
			}
			n, err := unix.Read(sp[1], buf)
			if err != nil {
				continue
			}
			req, err := decodeDiagRequest(buf[:n])
			if err != nil {
				t.Errorf("fake kernel: %v", err)
				continue
			}
			select {
			case reqs <- req:
			default:
			}
			for _, d := range respond(req) {
				if _, err := unix.Write(sp[1], d); err != nil {
					t.Errorf("fake kernel: write: %v", err)
				}
			}
		}
	}()
	t.Cleanup(func() {
		close(done)
		<-exited
		unix.Close(sp[1])
	})
	return sp[0], func() []decodedReq {
		var out []decodedReq
		for {
			select {
			case r := <-reqs:
				out = append(out, r)
			default:
				return out
			}
		}
	}
}

func TestLookupAgainstAFakeKernel(t *testing.T) {
	const ns = 4026532999
	root := buildFakeProc(t, []fakeProc{
		{pid: 50, netns: ns, comm: "node", exe: "/usr/bin/node", nspid: "50\t2", sockets: []uint64{4242, 4343}},
	})
	local := netip.MustParseAddrPort("10.0.0.2:40000")
	remote := netip.MustParseAddrPort("198.51.100.7:443")
	good := diagSock{family: unix.AF_INET, state: 1, local: local, remote: remote, uid: 1000, inode: 4242}
	wrong := diagSock{family: unix.AF_INET, state: 1, local: remote, remote: local, uid: 1, inode: 9}
	dual := diagSock{family: unix.AF_INET6, state: 7, local: netip.AddrPortFrom(netip.IPv6Unspecified(), 40000), remote: netip.AddrPortFrom(netip.IPv6Unspecified(), 0), uid: 1000, inode: 4343}
	v6only := dual
	v6only.v6only, v6only.inode = true, 77

	tests := []struct {
		name      string
		proto     string
		respond   func(decodedReq) [][]byte
		want      Owner
		wantFirst decodedReq // the first request's family/proto/src/dst
	}{
		{"a TCP exact reply is attributed, and the request puts the local side in id.src",
			"tcp",
			func(q decodedReq) [][]byte { return [][]byte{encodeDiagMsg(q.seq, 0, good)} },
			Owner{PID: 50, NSPID: 2, Comm: "node", Exe: "/usr/bin/node", UID: 1000, Inode: 4242},
			decodedReq{family: unix.AF_INET, proto: unix.IPPROTO_TCP, src: local, dst: remote}},
		{"a UDP request puts the remote side in id.src",
			"udp",
			func(q decodedReq) [][]byte { return [][]byte{encodeDiagMsg(q.seq, 0, good)} },
			Owner{PID: 50, NSPID: 2, Comm: "node", Exe: "/usr/bin/node", UID: 1000, Inode: 4242},
			decodedReq{family: unix.AF_INET, proto: unix.IPPROTO_UDP, src: remote, dst: local}},
		{"stale replies with other sequence numbers are skipped",
			"tcp",
			func(q decodedReq) [][]byte {
				return [][]byte{encodeDiagMsg(q.seq-1, 0, wrong), encodeNlError(q.seq+7, unix.EIO), encodeDiagMsg(q.seq, 0, good)}
			},
			Owner{PID: 50, NSPID: 2, Comm: "node", Exe: "/usr/bin/node", UID: 1000, Inode: 4242},
			decodedReq{family: unix.AF_INET, proto: unix.IPPROTO_TCP, src: local, dst: remote}},
		{"an exact reply for a different socket is not trusted and ENOENT everywhere is gone",
			"udp",
			func(q decodedReq) [][]byte {
				if q.flags&unix.NLM_F_DUMP != 0 {
					return [][]byte{encodeDone(q.seq)}
				}
				return [][]byte{encodeDiagMsg(q.seq, 0, wrong)}
			},
			Owner{Note: NoteGone},
			decodedReq{family: unix.AF_INET, proto: unix.IPPROTO_UDP, src: remote, dst: local}},
		{"the dump fallback matches an unconnected dual-stack socket by local port",
			"udp",
			func(q decodedReq) [][]byte {
				if q.flags&unix.NLM_F_DUMP == 0 {
					return [][]byte{encodeNlError(q.seq, unix.ENOENT)}
				}
				if q.family == unix.AF_INET {
					return [][]byte{append(encodeDiagMsg(q.seq, unix.NLM_F_MULTI, wrong), encodeDone(q.seq)...)}
				}
				return [][]byte{encodeDiagMsg(q.seq, unix.NLM_F_MULTI, v6only), encodeDiagMsg(q.seq, unix.NLM_F_MULTI, dual), encodeDone(q.seq)}
			},
			Owner{PID: 50, NSPID: 2, Comm: "node", Exe: "/usr/bin/node", UID: 1000, Inode: 4343},
			decodedReq{family: unix.AF_INET, proto: unix.IPPROTO_UDP, src: remote, dst: local}},
		{"a kernel error other than ENOENT is reported as unknown",
			"tcp",
			func(q decodedReq) [][]byte { return [][]byte{encodeNlError(q.seq, unix.EINVAL)} },
			Owner{Note: "unknown: sock_diag: invalid argument"},
			decodedReq{family: unix.AF_INET, proto: unix.IPPROTO_TCP, src: local, dst: remote}},
		{"a TIME_WAIT reply without an inode is gone",
			"tcp",
			func(q decodedReq) [][]byte {
				tw := good
				tw.inode, tw.state = 0, 6
				return [][]byte{encodeDiagMsg(q.seq, 0, tw)}
			},
			Owner{UID: 1000, Note: NoteGone},
			decodedReq{family: unix.AF_INET, proto: unix.IPPROTO_TCP, src: local, dst: remote}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fd, requests := startFakeKernel(t, tt.respond)
			r := newResolver(Config{DiagFD: fd, NetNS: ns, Proc: root, Timeout: time.Second})
			t.Cleanup(func() { r.Close() })
			got := r.Lookup(tt.proto, local, remote)
			if got != tt.want {
				t.Fatalf("Lookup = %+v, want %+v", got, tt.want)
			}
			reqs := requests()
			if len(reqs) == 0 {
				t.Fatal("the fake kernel saw no request")
			}
			first := reqs[0]
			if first.family != tt.wantFirst.family || first.proto != tt.wantFirst.proto ||
				first.src != tt.wantFirst.src || first.dst != tt.wantFirst.dst ||
				first.states != allStates || first.flags != unix.NLM_F_REQUEST {
				t.Fatalf("first request = %+v, want %+v with all states and NLM_F_REQUEST only", first, tt.wantFirst)
			}
		})
	}
}

func TestLookupGivesUpAtTheTimeout(t *testing.T) {
	fd, _ := startFakeKernel(t, func(decodedReq) [][]byte { return nil }) // never answers
	const timeout = 50 * time.Millisecond
	r := newResolver(Config{DiagFD: fd, Proc: t.TempDir(), Timeout: timeout})
	t.Cleanup(func() { r.Close() })
	start := time.Now()
	got := r.Lookup("tcp", netip.MustParseAddrPort("10.0.0.2:1000"), netip.MustParseAddrPort("192.0.2.1:80"))
	took := time.Since(start)
	if got.Note != NoteUnknownPrefix+errTimeout.Error() {
		t.Fatalf("Lookup = %+v, want a timeout note", got)
	}
	if took < timeout || took > timeout+500*time.Millisecond {
		t.Fatalf("Lookup took %v, want about %v", took, timeout)
	}
}

func TestScopeCacheRemembersOutsidersAndNeverHidesAHolder(t *testing.T) {
	const sandboxNS, hostNS = 4026532000, 4026531840
	root := buildFakeProc(t, []fakeProc{
		{pid: 1, netns: hostNS, comm: "init", sockets: []uint64{500}},
		{pid: 40, netns: sandboxNS, comm: "curl", sockets: []uint64{100}},
	})
	pt := procTable{root: root, netns: sandboxNS, scope: newScopeCache()}
	ix := newTestIndex(t, pt)
	o := ix.fillNow(100)
	if o.PID != 40 {
		t.Fatalf("fill = %+v, want pid 40", o)
	}
	if !pt.scope.outside[1] || pt.scope.outside[40] {
		t.Fatalf("cache = %v, want only pid 1 outside", pt.scope.outside)
	}
	// Pid 1 is reused by a process inside the sandbox holding a new socket:
	// the cached "outside" must not hide it.
	dir := filepath.Join(root, "1")
	os.Remove(filepath.Join(dir, "ns", "net"))
	os.Symlink(fmt.Sprintf("net:[%d]", sandboxNS), filepath.Join(dir, "ns", "net"))
	os.Symlink("socket:[700]", filepath.Join(dir, "fd", "9"))
	pt.scope.lastFull = time.Time{} // an uncached listing is due
	o = ix.fillNow(700)
	if o.PID != 1 {
		t.Fatalf("fill after pid reuse = %+v, want pid 1", o)
	}
	// A process that is gone is dropped from the cache.
	os.RemoveAll(filepath.Join(root, "1"))
	o = ix.fillNow(12345) // a miss lists /proc again
	if _, ok := pt.scope.outside[1]; ok || o.Note != NoteGone {
		t.Fatalf("fill = %+v, cache = %v: want gone and pid 1 forgotten", o, pt.scope.outside)
	}
}
