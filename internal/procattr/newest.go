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
// is kept, pinned, for youngFor after it was first met: the next looks
// read the descriptors it opened since (and the free numbers below them),
// so the socket it opens is found there too.

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
	// maxYoung bounds the processes without a socket looked at again
	// (each pinned by two descriptors).
	maxYoung = 32
)

// youngFor is how long a process met without a socket is looked at again:
// long enough for a program to start and make its first query. (A
// variable for tests on a loaded machine, where a step may take longer.)
var youngFor = time.Second

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

// youngProc is a process in scope met without a socket, pinned (two
// descriptors), its table read.
type youngProc struct {
	e    *procEntry
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
	ix.newest = newest{lastPID: filepath.Join(ix.pt.root, "sys/kernel/ns_last_pid"), buf: make([]byte, 24)}
	ix.newest.ok = ix.readLastPID() != 0
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
// look, newest first, and in the young ones, and returns the holders it
// found. Like the cheap steps, it answers with the holders it finds
// without reading every other process; new processes it has no time for
// (past maxNewestRead) are made young, to be read by the next looks.
func (ix *fdIndex) lookNewest() (pids []int) {
	nw := &ix.newest
	now := time.Now()
	nw.young = slices.DeleteFunc(nw.young, func(y youngProc) bool {
		if now.Sub(y.seen) > youngFor {
			ix.closeEntry(y.e)
			return true
		}
		return false
	})
	last := ix.readLastPID()
	if last == 0 {
		return nil
	}
	if last == nw.mark && len(nw.young) == 0 {
		return nil // no process started since the last look
	}
	ix.stats.newestLooks.Add(1)
	// The young ones first (fewest reads: only what they opened since).
	for i := 0; i < len(nw.young); {
		e := nw.young[i].e
		found, ok := ix.readYoung(e)
		if found {
			pids = append(pids, e.pid)
		}
		switch {
		case !ok:
			ix.closeEntry(e)
		case len(e.fdOf) > 0: // holds sockets now: indexed
			ix.insert(e)
		default:
			i++
			continue
		}
		nw.young = slices.Delete(nw.young, i, i+1)
	}
	if last == nw.mark {
		return pids
	}
	var fresh []int
	known := func(pid int) bool {
		_, ok := ix.procs[pid]
		return ok || slices.ContainsFunc(nw.young, func(y youngProc) bool { return y.e.pid == pid })
	}
	add := func(pid int) { fresh = append(fresh, pid) }
	var err error
	// The first look meets every process there is (the sandbox's first
	// is often the one that asks): those holding no socket are not kept
	// young, as they are not new.
	initial := nw.mark == 0
	switch {
	case initial:
		_, err = ix.listPIDs(1, last, 0, known, add)
	case nw.mark < last:
		_, err = ix.listPIDs(nw.mark+1, last, 0, known, add)
	default: // pids wrapped since the last look
		var listed int
		listed, err = ix.listPIDs(nw.mark+1, 1<<30, 0, known, add)
		if err == nil {
			_, err = ix.listPIDs(1, last, listed, known, add)
		}
	}
	if err != nil {
		if errors.Is(err, errTooMany) {
			// Too many to be cheap: the listing of every process meets
			// them; the next look starts from here.
			nw.mark = last
		}
		return pids
	}
	nw.mark = last
	// Newest first: the fewest pids back from the last one allocated.
	back := func(pid int) int {
		if d := last - pid; d >= 0 {
			return d
		}
		return last - pid + 1<<30
	}
	slices.SortFunc(fresh, func(a, b int) int { return back(a) - back(b) })
	for i, pid := range fresh {
		e, err := ix.open(pid)
		if err != nil {
			continue
		}
		if i >= maxNewestRead {
			if initial {
				ix.closeEntry(e) // the listing of every process meets it
			} else {
				ix.addYoung(e, now) // read whole by the next look
			}
			continue
		}
		found, err := ix.fullRead(e)
		if err != nil {
			ix.closeEntry(e)
			continue
		}
		if found {
			pids = append(pids, pid)
		}
		switch {
		case len(e.fdOf) > 0:
			ix.insert(e)
		case initial:
			ix.closeEntry(e)
		default:
			ix.addYoung(e, now)
		}
	}
	slices.Sort(pids)
	return slices.Compact(pids)
}

// readYoung reads the descriptors young process e opened since it was last
// read, and the free numbers below them, where a socket it opened may be
// (see readNew and readCands). ok is false when it is gone.
func (ix *fdIndex) readYoung(e *procEntry) (found, ok bool) {
	if err := ix.listAbove(e); err != nil {
		return false, false
	}
	for n := 0; len(e.unread) > 0 && n < maxNewPerStep; n++ {
		fd := e.unread[len(e.unread)-1]
		e.unread = e.unread[:len(e.unread)-1]
		switch ix.readFD(e, fd) {
		case readTarget:
			found = true
		case readGone:
			return false, false
		}
	}
	if !found {
		found = ix.readCands(e)
	}
	return found, true
}

// addYoung keeps e, a process in scope holding no socket, for youngFor;
// when maxYoung are kept, the one kept longest makes room.
func (ix *fdIndex) addYoung(e *procEntry, now time.Time) {
	nw := &ix.newest
	if len(nw.young) >= maxYoung {
		ix.closeEntry(nw.young[0].e)
		nw.young = slices.Delete(nw.young, 0, 1)
	}
	nw.young = append(nw.young, youngProc{e: e, seen: now})
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
