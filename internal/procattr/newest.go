package procattr

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// The newest processes. A socket the cheap steps cannot place most often
// belongs to a process that started since the index last listed /proc (a
// curl, a git, a test helper: its first DNS query or connection). Instead of
// waiting for hints and then listing every process (see resolve), the index
// looks at the processes started since its last look, newest first: the
// kernel hands out pids in increasing order (wrapping at pid_max) and
// records the last one in /proc/sys/kernel/ns_last_pid, and a procfs root
// directory can be read from a given pid on (its offset is the pid plus
// procPIDOffset), so the look reads only the few entries of those
// processes, one namespace link each, and the descriptor tables of those in
// the sandbox's network namespace. It is charged to the budget of expensive
// steps like the others.
//
// A process met without a socket yet (a shell, a program still starting)
// is looked at again by the next looks for youngFor after it was first
// met, so the socket it opens next is found there too.

const (
	// procPIDOffset is the directory offset of pid 0 in a procfs root:
	// FIRST_PROCESS_ENTRY (256) and the entries "self" and "thread-self"
	// (TGID_OFFSET in fs/proc/base.c).
	procPIDOffset = 256 + 2
	// maxNewestListed bounds the /proc entries one look reads; past it,
	// too many processes started since the last look for it to be cheap,
	// and the lookup goes on as before (hints, then a listing of /proc).
	maxNewestListed = 4096
	// maxNewestRead bounds the descriptor tables one look reads; the
	// processes left over are looked at by the next looks.
	maxNewestRead = 32
	// maxYoung bounds the processes without a socket looked at again.
	maxYoung = 64
	// youngFor is how long a process met without a socket is looked at
	// again: long enough for a program to start and make its first query.
	youngFor = time.Second
)

// newest is the state of the looks at the newest processes.
type newest struct {
	ok      bool   // the procfs is of this pid namespace: ns_last_pid and offsets apply
	lastPID string // path of ns_last_pid
	// mark is the last pid allocated at the last look: processes up to it
	// were met then (0: no look yet).
	mark  int
	young []youngProc
	buf   []byte
}

// youngProc is a process in scope met without a socket.
type youngProc struct {
	pid  int
	seen time.Time // first met
}

// initNewest enables the looks on a procfs whose pids are this process's
// pid namespace's.
func (ix *fdIndex) initNewest() {
	if !ix.procfs {
		return
	}
	self, err := os.Readlink(filepath.Join(ix.pt.root, "self"))
	if err != nil || self != strconv.Itoa(os.Getpid()) {
		return
	}
	ix.newest = newest{ok: true, lastPID: filepath.Join(ix.pt.root, "sys/kernel/ns_last_pid"), buf: make([]byte, 24)}
	if ix.readLastPID() == 0 {
		ix.newest.ok = false
	}
}

// readLastPID returns the last pid the kernel allocated, or 0.
func (ix *fdIndex) readLastPID() int {
	fd, err := unix.Open(ix.newest.lastPID, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0
	}
	defer unix.Close(fd)
	n, err := unix.Read(fd, ix.newest.buf)
	if err != nil || n == 0 {
		return 0
	}
	b := ix.newest.buf[:n]
	if b[n-1] == '\n' {
		b = b[:n-1]
	}
	pid, ok := parsePID(b)
	if !ok {
		return 0
	}
	return pid
}

// lookNewest looks for ix.target in the processes started since the last
// look, and in the young ones, newest first, and returns the holders it
// found. Like the cheap steps, it answers with the holders it finds
// without reading every other process; those it has no time for (past
// maxNewestRead) are young, looked at by the next looks.
func (ix *fdIndex) lookNewest() (pids []int) {
	nw := &ix.newest
	now := time.Now()
	nw.young = slices.DeleteFunc(nw.young, func(y youngProc) bool { return now.Sub(y.seen) > youngFor })
	last := ix.readLastPID()
	if last == 0 {
		return nil
	}
	if last == nw.mark && len(nw.young) == 0 {
		return nil // no process started since the last look
	}
	ix.stats.newestLooks.Add(1)
	var fresh []int
	known := func(pid int) bool {
		_, ok := ix.procs[pid]
		return ok || slices.ContainsFunc(nw.young, func(y youngProc) bool { return y.pid == pid })
	}
	add := func(pid int) { fresh = append(fresh, pid) }
	listed := 0
	var err error
	switch {
	case nw.mark == 0 || nw.mark == last:
		if nw.mark == 0 {
			listed, err = ix.listPIDs(1, last, listed, known, add)
		}
	case nw.mark < last:
		listed, err = ix.listPIDs(nw.mark+1, last, listed, known, add)
	default: // pids wrapped since the last look
		listed, err = ix.listPIDs(nw.mark+1, 1<<30, listed, known, add)
		if err == nil {
			listed, err = ix.listPIDs(1, last, listed, known, add)
		}
	}
	if err != nil {
		return nil // too many, or /proc unreadable: the next steps
	}
	nw.mark = last
	// Newest first: the fewest pids back from the last one allocated.
	back := func(pid int) int {
		if d := last - pid; d >= 0 {
			return d
		}
		return last - pid + 1<<30
	}
	for _, y := range nw.young {
		fresh = append(fresh, y.pid)
	}
	slices.SortFunc(fresh, func(a, b int) int { return back(a) - back(b) })
	for i, pid := range fresh {
		if i == maxNewestRead {
			for _, p := range fresh[i:] {
				ix.addYoung(p, now)
			}
			break
		}
		e, err := ix.open(pid)
		if err != nil {
			ix.dropYoung(pid)
			continue
		}
		if !ix.inScope(e) {
			ix.closeEntry(e)
			ix.dropYoung(pid)
			continue
		}
		found, err := ix.fullRead(e)
		if err != nil {
			ix.closeEntry(e)
			ix.dropYoung(pid)
			continue
		}
		if found {
			pids = append(pids, pid)
		}
		if len(e.fdOf) == 0 {
			ix.closeEntry(e)
			ix.addYoung(pid, now)
			continue
		}
		ix.dropYoung(pid)
		ix.insert(e)
	}
	slices.Sort(pids)
	return pids
}

// inScope reports whether the process pinned by e is in the sandbox's
// network namespace (a young pid may have been reused meanwhile).
func (ix *fdIndex) inScope(e *procEntry) bool {
	if ix.pt.netns == 0 {
		return true
	}
	n, err := unix.Readlinkat(e.dir, "ns/net", ix.link)
	if err != nil {
		return false
	}
	ns, ok := parseBracketInode(ix.link[:n], "net")
	return ok && ns == ix.pt.netns
}

func (ix *fdIndex) addYoung(pid int, now time.Time) {
	nw := &ix.newest
	if slices.ContainsFunc(nw.young, func(y youngProc) bool { return y.pid == pid }) {
		return // keeps the time it was first met
	}
	if len(nw.young) >= maxYoung {
		nw.young = slices.Delete(nw.young, 0, 1) // the longest met
	}
	nw.young = append(nw.young, youngProc{pid: pid, seen: now})
}

func (ix *fdIndex) dropYoung(pid int) {
	ix.newest.young = slices.DeleteFunc(ix.newest.young, func(y youngProc) bool { return y.pid == pid })
}

// errTooMany stops a listing of the newest processes that would not be
// cheap.
var errTooMany = errors.New("too many new processes")

// listPIDs lists the processes from pid lo to hi of the procfs (reading
// from lo on, not the entries before it) and calls fresh for those in scope
// that known does not know. listed counts the entries read, across calls;
// past maxNewestListed it fails with errTooMany.
func (ix *fdIndex) listPIDs(lo, hi, listed int, known func(int) bool, fresh func(int)) (int, error) {
	root, err := unix.Open(ix.pt.root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return listed, err
	}
	defer unix.Close(root)
	if _, err := unix.Seek(root, int64(procPIDOffset+lo), unix.SEEK_SET); err != nil {
		return listed, err
	}
	done := false
	for i := 0; i < maxGetdents && !done; i++ {
		n, err := unix.Getdents(root, ix.dirent)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return listed, err
		}
		if n <= 0 {
			return listed, nil
		}
		forEachDirent(ix.dirent[:n], func(name []byte) {
			pid, ok := parsePID(name)
			if done || !ok || pid < lo {
				return
			}
			if pid > hi {
				done = true
				return
			}
			if listed++; listed > maxNewestListed {
				done = true
				return
			}
			if !known(pid) && ix.pt.newInScope(root, name, pid, ix.link) {
				fresh(pid)
			}
		})
	}
	if listed > maxNewestListed {
		return listed, errTooMany
	}
	return listed, nil
}
