package procattr

import (
	"net/netip"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

var (
	poolLocal  = netip.MustParseAddrPort("10.0.0.2:40000")
	poolRemote = netip.MustParseAddrPort("198.51.100.7:443")
)

// stuckKernel is a fake kernel that answers nothing, so the worker sits in
// its first exchange until Config.Timeout.
func stuckKernel(t *testing.T) int {
	fd, _ := startFakeKernel(t, func(decodedReq) [][]byte { return nil })
	return fd
}

func TestStartNeverBlocksAndAnswersOverloadedWhenTheQueueIsFull(t *testing.T) {
	const queue = 4
	r := newResolver(Config{DiagFD: stuckKernel(t), Proc: t.TempDir(), Timeout: 2 * time.Second, Queue: queue})
	t.Cleanup(func() { r.Close() })
	first := r.Start("tcp", poolLocal, poolRemote)
	// Wait (bounded) until the worker has taken the first lookup and is
	// stuck on the kernel: the queue is then empty.
	if !waitFor(time.Second, func() bool { return r.queueLen() == 0 }) {
		t.Fatal("the worker never took the first lookup")
	}
	start := time.Now()
	var ps []*Pending
	for i := 0; i < 100; i++ {
		ps = append(ps, r.Start("tcp", poolLocal, poolRemote))
	}
	if took := time.Since(start); took > 100*time.Millisecond {
		t.Fatalf("100 Starts took %v with the worker stuck; Start must not wait", took)
	}
	overloaded := 0
	for _, p := range ps {
		if o, ok := p.Owner(); ok && o.Note == NoteOverloaded {
			overloaded++
		}
	}
	if overloaded != 100-queue {
		t.Fatalf("%d lookups answered overloaded at once, want %d (100 minus the queue of %d)", overloaded, 100-queue, queue)
	}
	if st := r.Stats(); st.Pending != queue+1 || st.Overloaded != uint64(100-queue) {
		t.Fatalf("stats %+v: want %d pending, %d overloaded", st, queue+1, 100-queue)
	}
	// Close answers what is left and leaves nothing pending.
	r.Close()
	for _, p := range append(ps, first) {
		if _, ok := p.Wait(time.Second); !ok {
			t.Fatal("a lookup was never answered after Close")
		}
	}
	if o := r.Lookup("tcp", poolLocal, poolRemote); o.Note != NoteUnknownPrefix+resolverClosedReason {
		t.Fatalf("Lookup after Close = %+v", o)
	}
	if n := r.Stats().Pending; n != 0 {
		t.Fatalf("%d lookups pending after Close", n)
	}
}

func TestFinishDropsALookupThatHasNotRun(t *testing.T) {
	fd, requests := startFakeKernel(t, func(decodedReq) [][]byte { return nil })
	r := newResolver(Config{DiagFD: fd, Proc: t.TempDir(), Timeout: 3 * time.Second})
	t.Cleanup(func() { r.Close() })
	r.Start("tcp", poolLocal, poolRemote) // keeps the worker in the kernel for 3s
	if !waitFor(time.Second, func() bool { return r.queueLen() == 0 }) {
		t.Fatal("the worker never took the first lookup")
	}
	p := r.Start("tcp", poolLocal, poolRemote)
	start := time.Now()
	if o := p.Finish(10 * time.Millisecond); o.Note != NoteOverloaded {
		t.Fatalf("Finish = %+v, want %q", o, NoteOverloaded)
	}
	if took := time.Since(start); took > time.Second {
		t.Fatalf("Finish(10ms) took %v: it waited for the worker", took)
	}
	// The worker does not run it: the fake kernel sees the first lookup's
	// request only (it gives up at its timeout, on the first order).
	if _, ok := p.Wait(10 * time.Second); !ok {
		t.Fatal("the dropped lookup was never answered")
	}
	if n := len(requests()); n != 1 {
		t.Fatalf("the kernel saw %d requests, want 1: a dropped lookup must not run", n)
	}
	if o := p.Finish(0); o.Note != NoteOverloaded {
		t.Fatalf("Finish again = %+v, want the same answer", o)
	}
	if st := r.Stats(); st.Pending != 0 {
		t.Fatalf("stats %+v: want nothing pending", st)
	}
}

func TestAStallLeavesNoBacklog(t *testing.T) {
	// The worker stalls 500ms (as on a host CPU burst) while 1000 flows
	// arrive: they are answered "overloaded" once they have waited MaxWait,
	// without being run, instead of being worked off late.
	const maxWait = 100 * time.Millisecond
	fd, requests := startFakeKernel(t, func(decodedReq) [][]byte { return nil })
	r := newResolver(Config{DiagFD: fd, Proc: t.TempDir(), Timeout: 500 * time.Millisecond, MaxWait: maxWait, Queue: 2000})
	t.Cleanup(func() { r.Close() })
	r.Start("tcp", poolLocal, poolRemote)
	if !waitFor(time.Second, func() bool { return r.queueLen() == 0 }) {
		t.Fatal("the worker never took the first lookup")
	}
	var ps []*Pending
	for i := 0; i < 1000; i++ {
		ps = append(ps, r.Start("tcp", poolLocal, poolRemote))
	}
	for i, p := range ps {
		o, ok := p.Wait(3 * time.Second)
		if !ok || o.Note != NoteOverloaded {
			t.Fatalf("lookup %d after the stall = %+v (answered %v), want %q", i, o, ok, NoteOverloaded)
		}
	}
	if n := len(requests()); n != 1 {
		t.Fatalf("the kernel saw %d requests, want 1 (the stalled lookup's): the backlog must not be run", n)
	}
	if st := r.Stats(); st.Pending != 0 {
		t.Fatalf("stats %+v: want nothing pending", st)
	}
}

func TestTheWorkerIsTheOnlyGoroutineAndEndsAtClose(t *testing.T) {
	before := runtime.NumGoroutine()
	fd, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd[1])
	r := newResolver(Config{DiagFD: fd[0], Proc: t.TempDir(), Timeout: time.Millisecond, Queue: 64})
	for i := 0; i < 1000; i++ {
		r.Start("udp", poolLocal, poolRemote)
	}
	if n := runtime.NumGoroutine(); n > before+1 {
		t.Errorf("%d goroutines after 1000 Starts, want at most %d (one worker)", n, before+1)
	}
	r.Close()
	if !waitFor(time.Second, func() bool { return runtime.NumGoroutine() <= before }) {
		t.Errorf("%d goroutines after Close, want %d", runtime.NumGoroutine(), before)
	}
}

func TestStartRejectsBadFlowsAtOnce(t *testing.T) {
	r := newResolver(Config{DiagFD: stuckKernel(t), Proc: t.TempDir()})
	t.Cleanup(func() { r.Close() })
	for _, tt := range []struct {
		proto         string
		local, remote netip.AddrPort
		want          string
	}{
		{"sctp", poolLocal, poolRemote, `unknown: unsupported protocol "sctp"`},
		{"tcp", netip.AddrPort{}, poolRemote, "unknown: invalid address"},
		{"udp", poolLocal, netip.MustParseAddrPort("[2001:db8::1]:53"), "unknown: address families differ: 10.0.0.2:40000 and [2001:db8::1]:53"},
	} {
		o, ok := r.Start(tt.proto, tt.local, tt.remote).Owner()
		if !ok || o.Note != tt.want {
			t.Errorf("Start(%s, %v, %v) = %+v (answered %v), want %q at once", tt.proto, tt.local, tt.remote, o, ok, tt.want)
		}
	}
	var nilP *Pending
	if o := nilP.Finish(time.Second); o.Note != NoteOff {
		t.Errorf("a nil Pending = %+v, want %q", o, NoteOff)
	}
}

// On a busy host the worker thread may not run for hundreds of
// milliseconds, longer than a short-lived connection lives: a caller that
// waits for its answer must get it without the worker.
func TestAWaitingCallerFindsItsOwnerWhileTheWorkerIsNotScheduled(t *testing.T) {
	requireRoot(t)
	r := newTestResolver(t, Config{})
	release := make(chan struct{})
	hook := func() { <-release }
	r.workerHook.Store(&hook)
	defer close(release)
	for i := 0; i < 20; i++ {
		f := tcpClient(t, "tcp4", "127.0.0.1:0")
		p := r.Start(f.proto, f.local, f.remote)
		start := time.Now()
		o, ok := p.Wait(2 * time.Second)
		if !ok || o.PID != os.Getpid() || o.Inode != f.inode || o.Note != "" {
			t.Fatalf("flow %d: Wait with the worker held = %+v (answered %v), want pid %d inode %d", i, o, ok, os.Getpid(), f.inode)
		}
		if took := time.Since(start); took > time.Second {
			t.Fatalf("flow %d: the answer took %v", i, took)
		}
	}
	// Finish helps too: a record written while the worker is held names
	// the owner instead of "overloaded".
	f := tcpClient(t, "tcp4", "127.0.0.1:0")
	if o := r.Start(f.proto, f.local, f.remote).Finish(time.Second); o.PID != os.Getpid() {
		t.Fatalf("Finish with the worker held = %+v, want pid %d", o, os.Getpid())
	}
	if st := r.Stats(); st.Pending != 0 || st.Found != 21 {
		t.Fatalf("stats %+v: want 21 found, nothing pending", st)
	}
}

// threadsAtNice counts this process's threads at nice value n.
func threadsAtNice(t *testing.T, n int) int {
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	count := 0
	for _, task := range tasks {
		b, err := os.ReadFile("/proc/self/task/" + task.Name() + "/stat")
		if err != nil {
			continue // ended meanwhile
		}
		// Fields after the command's closing parenthesis; nice is the
		// 19th field of stat, the 17th after ")".
		s := string(b)
		fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(fields) > 16 && fields[16] == strconv.Itoa(n) {
			count++
		}
	}
	return count
}

// The worker holds the token that waiting callers need; raised above the
// sandbox's processes it is not descheduled for long while it does. Its
// thread ends with it, so no other goroutine inherits the priority.
func TestTheWorkerThreadRunsAtARaisedPriorityAndEndsWithIt(t *testing.T) {
	requireRoot(t)
	// Workers of the tests before this one end after their Close, on their
	// own time: count from the moment no thread at the raised priority is
	// left (or, bounded, whatever stays).
	waitFor(2*time.Second, func() bool { return threadsAtNice(t, workerNice) == 0 })
	before := threadsAtNice(t, workerNice)
	fd, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd[1])
	r := newResolver(Config{DiagFD: fd[0], Proc: t.TempDir(), Timeout: time.Millisecond})
	if !waitFor(time.Second, func() bool { return threadsAtNice(t, workerNice) == before+1 }) {
		t.Fatalf("%d threads at nice %d with a worker running, want %d", threadsAtNice(t, workerNice), workerNice, before+1)
	}
	r.Close()
	if !waitFor(time.Second, func() bool { return threadsAtNice(t, workerNice) == before }) {
		t.Fatalf("%d threads at nice %d after Close, want %d: the worker's thread outlived it", threadsAtNice(t, workerNice), workerNice, before)
	}
}

// A TCP flow's handshake waits for its lookup within moments: a lookup
// alone in the queue is run by that wait, without waking the worker's
// thread (a wake-up through the kernel per connection); one queued behind
// others still wakes it, so a burst is looked up in batches; Start always
// wakes it.
func TestAWaitedLookupAloneDoesNotWakeTheWorker(t *testing.T) {
	requireRoot(t)
	r := newTestResolver(t, Config{})
	var wakes atomic.Int32
	woke := make(chan struct{}, 1)
	hook := func() {
		wakes.Add(1)
		select {
		case woke <- struct{}{}:
		default:
		}
	}
	r.workerHook.Store(&hook)
	// The first lookup finds the index cold, waits for it once, and that
	// wait is the worker's to end: warm it up.
	f0 := tcpClient(t, "tcp4", "127.0.0.1:0")
	if _, ok := r.StartWaited(f0.proto, f0.local, f0.remote).Wait(2 * time.Second); !ok {
		t.Fatal("the first lookup was not answered")
	}
	// Let the worker finish with it: no wake-up for 50ms.
	settle := time.After(5 * time.Second)
quiet:
	for {
		select {
		case <-woke:
		case <-time.After(50 * time.Millisecond):
			break quiet
		case <-settle:
			t.Fatal("the worker kept waking after the warm-up lookup")
		}
	}
	wakes.Store(0)
	for i := 0; i < 20; i++ {
		f := tcpClient(t, "tcp4", "127.0.0.1:0")
		o, ok := r.StartWaited(f.proto, f.local, f.remote).Wait(2 * time.Second)
		if !ok || o.PID != os.Getpid() || o.Inode != f.inode {
			t.Fatalf("flow %d: %+v (answered %v), want pid %d inode %d", i, o, ok, os.Getpid(), f.inode)
		}
	}
	if n := wakes.Load(); n != 0 {
		t.Fatalf("the worker woke %d times for 20 lookups each alone and waited for, want 0", n)
	}

	waitWake := func(what string) {
		t.Helper()
		select {
		case <-woke:
		case <-time.After(2 * time.Second):
			t.Fatalf("%s did not wake the worker", what)
		}
		wakes.Store(0)
	}
	f1 := tcpClient(t, "tcp4", "127.0.0.1:0")
	f2 := tcpClient(t, "tcp4", "127.0.0.1:0")
	p1 := r.StartWaited(f1.proto, f1.local, f1.remote)
	p2 := r.StartWaited(f2.proto, f2.local, f2.remote)
	waitWake("a lookup queued behind another")
	for i, p := range []*Pending{p1, p2} {
		if o, ok := p.Wait(2 * time.Second); !ok || o.PID != os.Getpid() {
			t.Fatalf("burst lookup %d: %+v (answered %v)", i, o, ok)
		}
	}
	f3 := tcpClient(t, "tcp4", "127.0.0.1:0")
	p3 := r.Start(f3.proto, f3.local, f3.remote)
	waitWake("Start")
	if o, ok := p3.Wait(2 * time.Second); !ok || o.PID != os.Getpid() {
		t.Fatalf("Start's lookup: %+v (answered %v)", o, ok)
	}
}
