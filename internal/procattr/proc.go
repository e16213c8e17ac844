package procattr

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

const (
	direntBufSize = 16 << 10
	// maxGetdents bounds every directory walk; /proc with 2^22 pids needs
	// well under this many 16 KiB getdents calls.
	maxGetdents = 1 << 16
)

// procTable finds socket holders in a procfs.
type procTable struct {
	root  string      // procfs root, e.g. "/proc"
	netns uint64      // only processes in this netns; 0 means all
	scope *scopeCache // remembers which pids are outside the netns; nil: no cache
}

// scopeCache remembers the processes found outside the sandbox's network
// namespace, so a lookup reads the namespace link of new processes only
// instead of every process on the host. Entries for pids that no longer
// exist are dropped at each scan. A lookup that finds no holder with the
// cache scans again without it, so a reused pid cannot hide a holder.
type scopeCache struct {
	mu       sync.Mutex
	outside  map[int]bool
	lastFull time.Time // last scan that ignored the cache
	// recent are the last few processes found owning a socket, most recent
	// first. A process that opens one connection usually opens more, so
	// its descriptors are searched before the whole of /proc is listed.
	recent []recentOwner
	descs  map[int]description // of recent owners
}

// recentOwner is a process that owned a socket, and the descriptor number
// it was found at (-1 if unknown).
type recentOwner struct {
	pid, fd int
}

// description is what describe found about a process.
type description struct {
	comm, exe string
	nspid     int
}

// described returns the cached description of pid if its exe is still exe.
func (c *scopeCache) described(pid int, exe string) (description, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	d, ok := c.descs[pid]
	return d, ok && d.exe == exe
}

// describe caches pid's description, for the recent owners only.
func (c *scopeCache) describe(pid int, d description) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.descs == nil {
		c.descs = map[int]description{}
	}
	c.descs[pid] = d
	for p := range c.descs {
		if !c.isRecent(p) && p != pid {
			delete(c.descs, p)
		}
	}
}

// maxRecent is how many recent owners are searched first.
const maxRecent = 4

// recentOwners returns a copy of the recent owners.
func (c *scopeCache) recentOwners() []recentOwner {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]recentOwner(nil), c.recent...)
}

// remember puts pid (found at descriptor fd, or -1) first among the recent
// owners.
func (c *scopeCache) remember(pid, fd int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	r := []recentOwner{{pid, fd}}
	for _, p := range c.recent {
		if p.pid != pid && len(r) < maxRecent {
			r = append(r, p)
		}
	}
	c.recent = r
}

func (c *scopeCache) isRecent(pid int) bool {
	for _, r := range c.recent {
		if r.pid == pid {
			return true
		}
	}
	return false
}

// fullScanEvery bounds how often a miss rescans without the cache: most
// misses are sockets that closed before the lookup, not reused pids.
const fullScanEvery = time.Second

func newScopeCache() *scopeCache { return &scopeCache{outside: map[int]bool{}} }

// fullDue reports whether an uncached rescan may run now, and records it.
func (c *scopeCache) fullDue() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if time.Since(c.lastFull) < fullScanEvery {
		return false
	}
	c.lastFull = time.Now()
	return true
}

// holders is the result of a procfs scan for one socket inode.
type holders struct {
	pids   []int // processes whose fd table holds the socket, ascending
	denied []int // processes in scope whose fd table we could not read
}

// fill sets o.PID, NSPID, Comm, Exe and Note for the socket o.Inode.
func (pt procTable) fill(o *Owner) {
	if pt.scope != nil {
		recent := pt.scope.recentOwners()
		// A process that closes a connection and opens the next usually
		// gets the same descriptor number back (the lowest free one):
		// one readlink settles the common case.
		for _, r := range recent {
			if r.fd >= 0 && pt.holdsAt(r.pid, r.fd, o.Inode) {
				pt.scope.remember(r.pid, r.fd)
				pt.describe(r.pid, o)
				return
			}
		}
		for _, r := range recent {
			if fd := pt.holds(r.pid, o.Inode); fd >= 0 {
				pt.scope.remember(r.pid, fd)
				pt.describe(r.pid, o)
				return
			}
		}
	}
	h, err := pt.scan(o.Inode, true)
	if err == nil && len(h.pids) == 0 && pt.scope != nil && pt.scope.fullDue() {
		h, err = pt.scan(o.Inode, false)
	}
	if err != nil {
		o.Note = NoteUnknownPrefix + err.Error()
		return
	}
	switch len(h.pids) {
	case 0:
		if len(h.denied) > 0 {
			o.Note = NoteUnknownPrefix + deniedReason(h.denied)
			return
		}
		o.Note = NoteGone
	case 1:
		if pt.scope != nil {
			pt.scope.remember(h.pids[0], -1)
		}
		pt.describe(h.pids[0], o)
	default:
		o.Note = ambiguousNote(h.pids)
	}
}

func deniedReason(pids []int) string {
	var b strings.Builder
	b.WriteString("permission denied reading fds of pids ")
	for i, p := range pids {
		if i == maxDeniedPIDsInNote {
			fmt.Fprintf(&b, " and %d more", len(pids)-i)
			break
		}
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(p))
	}
	return b.String()
}

// describe fills the process fields of o for pid. A process that exits
// meanwhile keeps its PID and gets Note "gone".
func (pt procTable) describe(pid int, o *Owner) {
	o.PID = pid
	dir := filepath.Join(pt.root, strconv.Itoa(pid))
	if pt.scope != nil {
		// A process's executable changes only at execve, and its pid
		// namespace never: while exe reads the same, the cached comm and
		// NSpid stand. (pids are not reused within a run in practice:
		// pid_max is in the millions.)
		exe, err := os.Readlink(filepath.Join(dir, "exe"))
		if err == nil {
			if d, ok := pt.scope.described(pid, exe); ok {
				o.Comm, o.Exe, o.NSPID = d.comm, d.exe, d.nspid
				return
			}
		}
		defer func() {
			if o.Note == "" && o.Exe != "" {
				pt.scope.describe(pid, description{comm: o.Comm, exe: o.Exe, nspid: o.NSPID})
			}
		}()
	}
	comm, err := os.ReadFile(filepath.Join(dir, "comm"))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, unix.ESRCH) {
			o.Note = NoteGone
		} else {
			o.Note = NoteUnknownPrefix + "read comm: " + err.Error()
		}
		return
	}
	o.Comm = strings.TrimSuffix(string(comm), "\n")
	if exe, err := os.Readlink(filepath.Join(dir, "exe")); err == nil {
		o.Exe = exe
	}
	if status, err := os.ReadFile(filepath.Join(dir, "status")); err == nil {
		o.NSPID = parseNSpid(status)
	}
}

// scan walks the top level of the procfs (thread-group leaders only, so a
// multi-threaded process is counted once) and returns the processes in scope
// holding "socket:[inode]".
func (pt procTable) scan(inode uint64, cached bool) (holders, error) {
	var h holders
	var seen map[int]bool
	if pt.scope != nil && pt.netns != 0 {
		pt.scope.mu.Lock()
		defer pt.scope.mu.Unlock()
		seen = make(map[int]bool, len(pt.scope.outside))
	} else {
		cached = false
	}
	root, err := unix.Open(pt.root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return h, fmt.Errorf("open procfs %s: %w", pt.root, err)
	}
	defer unix.Close(root)

	target := appendBracketInode(make([]byte, 0, 32), "socket", inode)
	topBuf := make([]byte, direntBufSize)
	fdBuf := make([]byte, direntBufSize)
	link := make([]byte, 64)
	path := make([]byte, 0, 32)

	err = walkDir(root, topBuf, func(name []byte) {
		pid, ok := parsePID(name)
		if !ok {
			return
		}
		if pt.netns != 0 {
			if seen != nil {
				seen[pid] = true
				if cached && pt.scope.outside[pid] {
					return
				}
			}
			path = append(append(path[:0], name...), "/ns/net"...)
			n, err := unix.Readlinkat(root, string(path), link)
			switch {
			case isPermission(err):
				h.denied = append(h.denied, pid)
				return
			case err != nil:
				return // exited, or no netns link: not in scope
			}
			ns, ok := parseBracketInode(link[:n], "net")
			if !ok || ns != pt.netns {
				if seen != nil {
					pt.scope.outside[pid] = true
				}
				return
			}
			if seen != nil {
				delete(pt.scope.outside, pid)
			}
		}
		path = append(append(path[:0], name...), "/fd"...)
		fds, err := unix.Openat(root, string(path), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			if isPermission(err) {
				h.denied = append(h.denied, pid)
			}
			return
		}
		found := false
		// An error here means the process exited mid-walk: it holds nothing.
		_ = walkDir(fds, fdBuf, func(fd []byte) {
			if found || !isDigits(fd) {
				return
			}
			n, err := unix.Readlinkat(fds, string(fd), link)
			if err == nil && n < len(link) && bytes.Equal(link[:n], target) {
				found = true
			}
		})
		unix.Close(fds)
		if found {
			h.pids = append(h.pids, pid)
		}
	})
	if err != nil {
		return h, fmt.Errorf("read procfs %s: %w", pt.root, err)
	}
	if seen != nil {
		for pid := range pt.scope.outside {
			if !seen[pid] {
				delete(pt.scope.outside, pid)
			}
		}
	}
	slices.Sort(h.pids)
	slices.Sort(h.denied)
	return h, nil
}

// holdsAt reports whether descriptor fd of process pid is socket inode.
func (pt procTable) holdsAt(pid, fd int, inode uint64) bool {
	link := make([]byte, 64)
	n, err := unix.Readlink(filepath.Join(pt.root, strconv.Itoa(pid), "fd", strconv.Itoa(fd)), link)
	return err == nil && n < len(link) && bytes.Equal(link[:n], appendBracketInode(make([]byte, 0, 32), "socket", inode))
}

// holds returns the descriptor number at which process pid holds socket
// inode, or -1.
func (pt procTable) holds(pid int, inode uint64) int {
	fds, err := unix.Open(filepath.Join(pt.root, strconv.Itoa(pid), "fd"), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1
	}
	defer unix.Close(fds)
	target := appendBracketInode(make([]byte, 0, 32), "socket", inode)
	link := make([]byte, 64)
	found := -1
	_ = walkDir(fds, make([]byte, direntBufSize), func(fd []byte) {
		if found >= 0 || !isDigits(fd) {
			return
		}
		n, err := unix.Readlinkat(fds, string(fd), link)
		if err == nil && n < len(link) && bytes.Equal(link[:n], target) {
			found, _ = strconv.Atoi(string(fd))
		}
	})
	return found
}

func isPermission(err error) bool {
	return errors.Is(err, unix.EACCES) || errors.Is(err, unix.EPERM)
}

// walkDir calls fn with the name of every entry of the open directory fd
// except "." and "..". The name slice is only valid during the call.
func walkDir(fd int, buf []byte, fn func(name []byte)) error {
	for i := 0; i < maxGetdents; i++ {
		n, err := unix.Getdents(fd, buf)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return err
		}
		if n <= 0 {
			return nil
		}
		forEachDirent(buf[:n], fn)
	}
	return fmt.Errorf("directory has more than %d blocks of entries", maxGetdents)
}

// forEachDirent parses struct linux_dirent64 records:
// u64 d_ino; s64 d_off; u16 d_reclen; u8 d_type; char d_name[].
func forEachDirent(b []byte, fn func(name []byte)) {
	const nameOff = 19
	for len(b) >= nameOff {
		reclen := int(binary.NativeEndian.Uint16(b[16:18]))
		if reclen < nameOff || reclen > len(b) {
			return
		}
		name := b[nameOff:reclen]
		if i := bytes.IndexByte(name, 0); i >= 0 {
			name = name[:i]
		}
		if !(len(name) == 1 && name[0] == '.') && !(len(name) == 2 && name[0] == '.' && name[1] == '.') {
			fn(name)
		}
		b = b[reclen:]
	}
}

func isDigits(b []byte) bool {
	if len(b) == 0 {
		return false
	}
	for _, c := range b {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// parsePID parses a /proc entry name that is a positive decimal pid.
func parsePID(b []byte) (int, bool) {
	if !isDigits(b) || len(b) > 10 {
		return 0, false
	}
	n := 0
	for _, c := range b {
		n = n*10 + int(c-'0')
	}
	if n <= 0 || n > 1<<30 {
		return 0, false
	}
	return n, true
}

// appendBracketInode appends "kind:[inode]", the form of socket and
// namespace links in procfs.
func appendBracketInode(b []byte, kind string, inode uint64) []byte {
	b = append(b, kind...)
	b = append(b, ":["...)
	b = strconv.AppendUint(b, inode, 10)
	return append(b, ']')
}

// parseBracketInode parses "kind:[N]" and returns N.
func parseBracketInode(b []byte, kind string) (uint64, bool) {
	if len(b) < len(kind)+4 || string(b[:len(kind)]) != kind {
		return 0, false
	}
	b = b[len(kind):]
	if b[0] != ':' || b[1] != '[' || b[len(b)-1] != ']' {
		return 0, false
	}
	digits := b[2 : len(b)-1]
	if !isDigits(digits) || len(digits) > 20 {
		return 0, false
	}
	n, err := strconv.ParseUint(string(digits), 10, 64)
	if err != nil {
		return 0, false
	}
	return n, true
}

// parseNSpid returns the last field of the "NSpid:" line of a
// /proc/PID/status file: the pid in the process's innermost pid namespace.
// It returns 0 when the line is missing or malformed.
func parseNSpid(status []byte) int {
	for len(status) > 0 {
		line := status
		if i := bytes.IndexByte(status, '\n'); i >= 0 {
			line, status = status[:i], status[i+1:]
		} else {
			status = nil
		}
		rest, ok := bytes.CutPrefix(line, []byte("NSpid:"))
		if !ok {
			continue
		}
		fields := bytes.Fields(rest)
		if len(fields) == 0 {
			return 0
		}
		pid, ok := parsePID(fields[len(fields)-1])
		if !ok {
			return 0
		}
		return pid
	}
	return 0
}
