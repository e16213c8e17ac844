package procattr

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tunwall/tunwall/internal/testenv"
)

// newTestIndex is an fd index over pt, released when the test ends.
func newTestIndex(t testing.TB, pt procTable) *fdIndex {
	t.Helper()
	ix := newFDIndex(pt, &costGate{}, &stats{})
	t.Cleanup(ix.close)
	return ix
}

// fillNow answers for inode as one worker batch would, with the budget of
// expensive steps available (tests of the budget set ix.gate themselves).
// The budget is wall-clock time (20 ms at once): on a machine loaded enough
// that one step outlasts it, the fill is deferred as a worker's would be,
// and goes on with the budget given again, as the worker's next batch.
func (ix *fdIndex) fillNow(inode uint64) Owner {
	ix.startBatch()
	o := Owner{Inode: inode}
	start := time.Now()
	for range 1000 {
		*ix.gate = costGate{}
		if ix.fill(&o, ix.seq, false, start) {
			return o
		}
	}
	panic("fill deferred 1000 times with the budget given again each time")
}

// fakeFD makes descriptor fd of fake process pid a link to target
// ("socket:[N]", "/dev/null"), replacing what was there; "" closes it.
func fakeFD(t *testing.T, root string, pid, fd int, target string) {
	t.Helper()
	p := filepath.Join(root, strconv.Itoa(pid), "fd", strconv.Itoa(fd))
	if err := os.Remove(p); err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	if target != "" {
		if err := os.Symlink(target, p); err != nil {
			t.Fatal(err)
		}
	}
}

func sock(ino uint64) string { return fmt.Sprintf("socket:[%d]", ino) }

const testNS = 4026532000

func TestIndexFindsANewSocketByReadingOnlyTheNewDescriptors(t *testing.T) {
	inodes := make([]uint64, 500)
	for i := range inodes {
		inodes[i] = uint64(1000 + i)
	}
	root := buildFakeProc(t, []fakeProc{{pid: 40, netns: testNS, comm: "python3", exe: "/usr/bin/python3", sockets: inodes}})
	ix := newTestIndex(t, procTable{root: root, netns: testNS, scope: newScopeCache()})
	if o := ix.fillNow(1000); o.PID != 40 {
		t.Fatalf("first lookup = %+v, want pid 40", o)
	}
	// Ten more sockets above the highest descriptor (3+500 = 503 on).
	for i := 0; i < 10; i++ {
		fakeFD(t, root, 40, 503+i, sock(uint64(5000+i)))
	}
	before := ix.stats.fdReads.Load()
	if o := ix.fillNow(5009); o.PID != 40 || o.Note != "" {
		t.Fatalf("lookup of the newest = %+v, want pid 40", o)
	}
	if n := ix.stats.fdReads.Load() - before; n != 10 {
		t.Errorf("the newest socket took %d descriptor reads, want 10 (only the new ones)", n)
	}
	// The other new ones were read on the way: one read each to confirm.
	before = ix.stats.fdReads.Load()
	for i := 0; i < 9; i++ {
		if o := ix.fillNow(uint64(5000 + i)); o.PID != 40 {
			t.Fatalf("lookup of socket %d = %+v, want pid 40", 5000+i, o)
		}
	}
	if n := ix.stats.fdReads.Load() - before; n != 9 {
		t.Errorf("nine known sockets took %d descriptor reads, want 9 (one each)", n)
	}
	if r := ix.stats.rescans.Load(); r != 0 {
		t.Errorf("%d whole tables read again, want 0", r)
	}
}

func TestIndexFindsASocketThatReusedADescriptor(t *testing.T) {
	// 600 sockets at descriptors 3..602, socket 1000+fd at fd.
	var inodes []uint64
	for fd := 3; fd <= 602; fd++ {
		inodes = append(inodes, uint64(1000+fd))
	}
	root := buildFakeProc(t, []fakeProc{{pid: 40, netns: testNS, comm: "node", exe: "/usr/bin/node", sockets: inodes}})
	ix := newTestIndex(t, procTable{root: root, netns: testNS, scope: newScopeCache()})
	for _, ino := range inodes {
		if o := ix.fillNow(ino); o.PID != 40 {
			t.Fatalf("lookup %d = %+v", ino, o)
		}
	}
	tests := []struct {
		name        string
		fd          int
		hinted      bool
		wantRescans uint64
	}{
		// fd 602 was found last: the recent descriptors are read first.
		{"a client that closes its last socket and opens the next gets the same descriptor", 602, false, 0},
		// fd 3 is not recent; its flow ended (a hint).
		{"an older descriptor whose flow ended is read first", 3, true, 0},
		// fd 4 comes right after fd 3, the one found last.
		{"a client replacing its oldest connection gets a descriptor near the last one found", 4, false, 0},
		// fd 500: neither recent, nor near the last found, nor hinted.
		{"a reused descriptor without any hint is still found, by reading the table again", 500, false, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			old, new := uint64(1000+tt.fd), uint64(5000+tt.fd)
			if tt.hinted {
				ix.hint(40, old)
			}
			fakeFD(t, root, 40, tt.fd, sock(new))
			rescans := ix.stats.rescans.Load()
			if o := ix.fillNow(new); o.PID != 40 || o.Note != "" {
				t.Fatalf("lookup of the new socket = %+v, want pid 40", o)
			}
			if n := ix.stats.rescans.Load() - rescans; n != tt.wantRescans {
				t.Errorf("the table was read whole %d times, want %d", n, tt.wantRescans)
			}
			if o := ix.fillNow(old); o.Note != NoteGone {
				t.Fatalf("lookup of the closed socket = %+v, want gone", o)
			}
		})
	}
}

func TestIndexForgetsAProcessThatExited(t *testing.T) {
	root := buildFakeProc(t, []fakeProc{
		{pid: 40, netns: testNS, comm: "curl", exe: "/usr/bin/curl", sockets: []uint64{100}},
		{pid: 41, netns: testNS, comm: "sh", exe: "/bin/sh", sockets: []uint64{900}},
	})
	ix := newTestIndex(t, procTable{root: root, netns: testNS, scope: newScopeCache()})
	if o := ix.fillNow(100); o.PID != 40 {
		t.Fatalf("lookup = %+v", o)
	}
	if err := os.RemoveAll(filepath.Join(root, "40")); err != nil {
		t.Fatal(err)
	}
	if o := ix.fillNow(100); o.Note != NoteGone || o.PID != 0 {
		t.Fatalf("lookup after exit = %+v, want gone", o)
	}
	if _, ok := ix.procs[40]; ok {
		t.Fatalf("pid 40 still indexed after it exited")
	}
}

func TestIndexNeverMistakesAReusedPIDForTheOldProcess(t *testing.T) {
	root := buildFakeProc(t, []fakeProc{{pid: 40, netns: testNS, comm: "curl", exe: "/usr/bin/curl", nspid: "40\t3", sockets: []uint64{100, 200}}})
	ix := newTestIndex(t, procTable{root: root, netns: testNS, scope: newScopeCache()})
	if o := ix.fillNow(100); o.PID != 40 || o.Comm != "curl" {
		t.Fatalf("lookup = %+v", o)
	}
	// Process 40 exits and a new process gets pid 40, with socket 200 at
	// the same descriptor and a new socket 300.
	if err := os.RemoveAll(filepath.Join(root, "40")); err != nil {
		t.Fatal(err)
	}
	buildFakeProcIn(t, root, []fakeProc{{pid: 40, netns: testNS, comm: "wget", exe: "/usr/bin/wget", nspid: "40\t9", sockets: []uint64{300, 200}}})
	want := Owner{PID: 40, NSPID: 9, Comm: "wget", Exe: "/usr/bin/wget", Inode: 300}
	if o := ix.fillNow(300); o != want {
		t.Fatalf("lookup in the new process = %+v, want %+v", o, want)
	}
	want.Inode = 200
	if o := ix.fillNow(200); o != want {
		t.Fatalf("a socket the new process holds at the old one's descriptor = %+v, want %+v", o, want)
	}
	if o := ix.fillNow(100); o.Note != NoteGone {
		t.Fatalf("the old process's socket = %+v, want gone", o)
	}
}

func TestIndexReportsASocketTwoProcessesHoldAsAmbiguous(t *testing.T) {
	root := buildFakeProc(t, []fakeProc{
		{pid: 41, netns: testNS, comm: "python3", exe: "/usr/bin/python3", sockets: []uint64{300, 301}},
		{pid: 42, netns: testNS, comm: "sh", exe: "/bin/sh", sockets: []uint64{300}},
	})
	ix := newTestIndex(t, procTable{root: root, netns: testNS, scope: newScopeCache()})
	for i := 0; i < 2; i++ { // found by discovery, then from the index
		if o := ix.fillNow(300); o.Note != "ambiguous: pids 41,42" || o.PID != 0 {
			t.Fatalf("lookup %d = %+v, want ambiguous: pids 41,42", i, o)
		}
	}
	if o := ix.fillNow(301); o.PID != 41 {
		t.Fatalf("the unshared socket = %+v, want pid 41", o)
	}
	// pid 42 closes its copy: the socket is 41's alone.
	fakeFD(t, root, 42, 3, "")
	if o := ix.fillNow(300); o.PID != 41 || o.Note != "" {
		t.Fatalf("after pid 42 closed its copy = %+v, want pid 41", o)
	}
}

func TestIndexDefersExpensiveStepsWhileTheBudgetIsSpent(t *testing.T) {
	root := buildFakeProc(t, []fakeProc{{pid: 40, netns: testNS, comm: "curl", sockets: []uint64{100}}})
	ix := newTestIndex(t, procTable{root: root, netns: testNS, scope: newScopeCache()})
	ix.startBatch()
	ix.gate.balance, ix.gate.at = -time.Hour, time.Now()
	o := Owner{Inode: 100}
	if ix.fill(&o, ix.seq, false, time.Now()) {
		t.Fatalf("fill answered %+v without the budget for listing /proc; want it deferred", o)
	}
	if d := ix.stats.discoveries.Load(); d != 0 {
		t.Fatalf("%d listings of /proc with no budget", d)
	}
	if !ix.gate.next().After(time.Now().Add(time.Hour)) {
		t.Fatalf("a budget spent by an hour is available at %v", ix.gate.next())
	}
	if o := ix.fillNow(100); o.PID != 40 {
		t.Fatalf("fill = %+v", o)
	}
	if ix.gate.balance >= gateBurst {
		t.Fatalf("the listing was not charged: balance %v", ix.gate.balance)
	}
}

// TestIndexListsOnlyNewDescriptorsOfARealProcess checks, on the real
// procfs, that step 2 reads a process's table from a descriptor number on
// (the offset of /proc/PID/fd is the number plus 2) instead of all of it.
func TestIndexListsOnlyNewDescriptorsOfARealProcess(t *testing.T) {
	var ns unix.Stat_t
	if err := unix.Stat("/proc/self/ns/net", &ns); err != nil {
		testenv.Skip(t, "no /proc/self/ns/net: %v", err)
	}
	ix := newTestIndex(t, procTable{root: "/proc", netns: ns.Ino, scope: newScopeCache()})
	if !ix.procfs {
		t.Fatal("/proc is not recognised as a procfs")
	}
	open := func() uint64 {
		t.Helper()
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Close(fd) })
		return fdInode(t, fd)
	}
	var first uint64
	for i := 0; i < 300; i++ {
		ino := open()
		if i == 0 {
			first = ino
		}
	}
	if o := ix.fillNow(first); o.PID != os.Getpid() {
		t.Fatalf("lookup = %+v, want this process (%d)", o, os.Getpid())
	}
	high := ix.procs[os.Getpid()].high
	var last uint64
	for i := 0; i < 5; i++ {
		last = open()
	}
	// The 5 sockets, and whatever else this process opened meanwhile.
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	above := 0
	for _, e := range ents {
		if fd, err := strconv.Atoi(e.Name()); err == nil && int32(fd) > high {
			above++
		}
	}
	before := ix.stats.fdReads.Load()
	if o := ix.fillNow(last); o.PID != os.Getpid() {
		t.Fatalf("lookup of the newest = %+v", o)
	}
	// ReadDir's own descriptor is closed again; one more may appear.
	if n := ix.stats.fdReads.Load() - before; n < 5 || n > uint64(above)+1 || n > 50 {
		t.Errorf("%d descriptors read for 5 new sockets among 300 (%d descriptors above the highest read), want only those", n, above)
	}
}

func TestIndexBoundsWhatItHolds(t *testing.T) {
	var procs []fakeProc
	for pid := 100; pid < 100+maxProcs+10; pid++ {
		procs = append(procs, fakeProc{pid: pid, netns: testNS, comm: "p", sockets: []uint64{uint64(pid * 10)}})
	}
	root := buildFakeProc(t, procs)
	ix := newTestIndex(t, procTable{root: root, netns: testNS, scope: newScopeCache()})
	if o := ix.fillNow(1000); o.PID != 100 {
		t.Fatalf("lookup = %+v", o)
	}
	if n := len(ix.procs); n > maxProcs {
		t.Fatalf("%d processes indexed, want at most %d", n, maxProcs)
	}
	// Every process is still found, evicted or not.
	for _, p := range procs {
		if o := ix.fillNow(uint64(p.pid * 10)); o.PID != p.pid {
			t.Fatalf("lookup of %d = %+v, want pid %d", p.pid*10, o, p.pid)
		}
	}
}

// fillInBatch answers for each inode within one worker batch (one
// startBatch), as for flows that arrive together.
func (ix *fdIndex) fillInBatch(inodes ...uint64) []Owner {
	ix.startBatch()
	*ix.gate = costGate{}
	out := make([]Owner, len(inodes))
	for i, ino := range inodes {
		out[i] = Owner{Inode: ino}
		if !ix.fill(&out[i], ix.seq, false, time.Now()) {
			panic("fill deferred with the budget available")
		}
	}
	return out
}

// eightConnectionsFound returns a fake /proc with process 40 holding
// sockets 103..110 at fds 3..10 (fd 2 taken, so no lower number is free),
// and an index that has already found each of them.
func eightConnectionsFound(t *testing.T) (string, *fdIndex) {
	t.Helper()
	var inodes []uint64
	for fd := 3; fd <= 10; fd++ {
		inodes = append(inodes, uint64(100+fd))
	}
	root := buildFakeProc(t, []fakeProc{{pid: 40, netns: testNS, comm: "twload", exe: "/usr/bin/twload", sockets: inodes}})
	fakeFD(t, root, 40, 2, "/dev/null") // no free number below: the kernel would hand it out first
	ix := newTestIndex(t, procTable{root: root, netns: testNS, scope: newScopeCache()})
	for _, ino := range inodes {
		if o := ix.fillNow(ino); o.PID != 40 {
			t.Fatalf("lookup %d = %+v", ino, o)
		}
	}
	return root, ix
}

func TestIndexReadsTheDescriptorOfTheOldestConnectionFirst(t *testing.T) {
	// A client with 8 connections going (threads, goroutines) at fds
	// 3..10, each replaced by the next when it ends: the oldest ends
	// first, and the kernel gives its number to the new socket.
	root, ix := eightConnectionsFound(t)
	next := uint64(1000)
	for round := 0; round < 3; round++ {
		for fd := 3; fd <= 10; fd++ {
			next++
			fakeFD(t, root, 40, fd, sock(next))
			before, lists := ix.stats.fdReads.Load(), ix.lists
			if o := ix.fillNow(next); o.PID != 40 || o.Note != "" {
				t.Fatalf("round %d fd %d: lookup = %+v, want pid 40", round, fd, o)
			}
			if n := ix.stats.fdReads.Load() - before; n != 1 {
				t.Errorf("round %d: the socket that replaced the oldest, at fd %d, took %d descriptor reads, want 1", round, fd, n)
			}
			// Found where another socket was, as the one before: the
			// table is not listed for new descriptors.
			if n := ix.lists - lists; n != 0 && (round > 0 || fd > 3) {
				t.Errorf("round %d fd %d: the table was listed %d times, want 0", round, fd, n)
			}
		}
	}
}

func TestIndexReadsLongLivedConnectionsAfterTheOnesThatChange(t *testing.T) {
	// Seven long-lived connections at fds 3..9, found first; then a client
	// that closes and opens one connection after another, at fd 10.
	root, ix := eightConnectionsFound(t)
	var reads []uint64
	for i := uint64(0); i < 10; i++ {
		fakeFD(t, root, 40, 10, sock(1000+i))
		before := ix.stats.fdReads.Load()
		if o := ix.fillNow(1000 + i); o.PID != 40 || o.Note != "" {
			t.Fatalf("lookup %d = %+v, want pid 40", i, o)
		}
		reads = append(reads, ix.stats.fdReads.Load()-before)
	}
	// The long-lived ones are read a few times, then after fd 10.
	for i, n := range reads[maxMisses+1:] {
		if n != 1 {
			t.Errorf("connection %d took %d descriptor reads, want 1 (all: %v)", i+maxMisses+1, n, reads)
		}
	}
}

func TestIndexDoesNotReadAgainADescriptorReadInTheSameBatch(t *testing.T) {
	root := buildFakeProc(t, []fakeProc{{pid: 40, netns: testNS, comm: "app", exe: "/usr/bin/app", sockets: []uint64{103, 104}}})
	fakeFD(t, root, 40, 2, "/dev/null")
	ix := newTestIndex(t, procTable{root: root, netns: testNS, scope: newScopeCache()})
	for _, ino := range []uint64{103, 104} {
		if o := ix.fillNow(ino); o.PID != 40 {
			t.Fatalf("lookup %d = %+v", ino, o)
		}
	}
	// Both connections replaced; their flows arrive together, the newer
	// first: looking for it reads fd 3 (the oldest) on the way, so the
	// other needs no read of its own.
	fakeFD(t, root, 40, 3, sock(203))
	fakeFD(t, root, 40, 4, sock(204))
	before := ix.stats.fdReads.Load()
	for _, o := range ix.fillInBatch(204, 203) {
		if o.PID != 40 || o.Note != "" {
			t.Fatalf("lookup = %+v, want pid 40", o)
		}
	}
	if n := ix.stats.fdReads.Load() - before; n != 2 {
		t.Errorf("two new sockets in one batch took %d descriptor reads, want 2", n)
	}
	// In the next batch, a socket read before is confirmed again: it may
	// have been passed on and closed since.
	fakeFD(t, root, 40, 4, "")
	if o := ix.fillNow(204); o.PID != 0 || o.Note != NoteGone {
		t.Fatalf("closed socket in a later batch = %+v, want gone", o)
	}
}

func TestIndexDescribesAProcessAsItWasAfterTheFlowStarted(t *testing.T) {
	root := buildFakeProc(t, []fakeProc{{pid: 40, netns: testNS, comm: "sh", exe: "/bin/sh", sockets: []uint64{100}}})
	ix := newTestIndex(t, procTable{root: root, netns: testNS, scope: newScopeCache()})
	started := time.Now()
	if o := ix.fillNow(100); o.Exe != "/bin/sh" || o.Comm != "sh" {
		t.Fatalf("lookup = %+v, want /bin/sh", o)
	}
	// The process execs curl.
	dir := filepath.Join(root, "40")
	if err := os.Remove(filepath.Join(dir, "exe")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/usr/bin/curl", filepath.Join(dir, "exe")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "comm"), []byte("curl\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// A flow that started before the description was read is answered
	// from it, without reading /proc again.
	ix.startBatch()
	o := Owner{Inode: 100}
	if !ix.fill(&o, ix.seq, false, started) || o.Exe != "/bin/sh" {
		t.Fatalf("flow started before the last look = %+v, want /bin/sh", o)
	}
	// A flow that started later sees the exec.
	if o := ix.fillNow(100); o.Exe != "/usr/bin/curl" || o.Comm != "curl" {
		t.Fatalf("flow started after the exec = %+v, want /usr/bin/curl", o)
	}
}
