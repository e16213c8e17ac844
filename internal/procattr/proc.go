package procattr

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

const (
	direntBufSize = 16 << 10
	// maxGetdents bounds every directory walk; /proc with 2^22 pids needs
	// well under this many 16 KiB getdents calls.
	maxGetdents = 1 << 16
)

// procTable is a procfs and the network namespace whose processes are in
// scope.
type procTable struct {
	root  string      // procfs root, e.g. "/proc"
	netns uint64      // only processes in this netns; 0 means all
	scope *scopeCache // remembers which pids are outside the netns; nil: no cache
}

// scopeCache remembers the processes found outside the sandbox's network
// namespace, so listing /proc reads the namespace link of new processes only
// instead of every process on the host. Entries for pids that no longer
// exist are dropped at each listing. A lookup that finds no holder with the
// cache lists again without it (at most every fullScanEvery), so a reused
// pid cannot hide a holder for long.
type scopeCache struct {
	outside  map[int]bool
	lastFull time.Time // last listing that ignored the cache
}

// description is what is known about a process besides its pid.
type description struct {
	comm, exe string
	nspid     int
}

// fullScanEvery bounds how often a miss lists /proc without the cache: most
// misses are sockets that closed before the lookup, not reused pids.
const fullScanEvery = time.Second

func newScopeCache() *scopeCache { return &scopeCache{outside: map[int]bool{}} }

// fullDue reports whether an uncached listing may run now, and records it.
func (c *scopeCache) fullDue() bool {
	if time.Since(c.lastFull) < fullScanEvery {
		return false
	}
	c.lastFull = time.Now()
	return true
}

// holders is the result of a search for one socket inode.
type holders struct {
	denied []int // processes in scope whose fd table we could not read
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

// listScope walks the top level of the procfs (thread-group leaders only, so
// a multi-threaded process is counted once) and calls fresh for every process
// in scope for which known returns false. With cached, processes remembered
// as outside the netns are skipped without reading their namespace link. It
// returns the processes whose namespace could not be read (in denied).
func (pt procTable) listScope(known func(pid int) bool, fresh func(pid int), cached bool) (holders, error) {
	var h holders
	var seen map[int]bool
	if pt.scope != nil && pt.netns != 0 {
		seen = make(map[int]bool, len(pt.scope.outside))
	} else {
		cached = false
	}
	root, err := unix.Open(pt.root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return h, fmt.Errorf("open procfs %s: %w", pt.root, err)
	}
	defer unix.Close(root)

	topBuf := make([]byte, direntBufSize)
	link := make([]byte, 64)
	path := make([]byte, 0, 32)
	err = walkDir(root, topBuf, func(name []byte) {
		pid, ok := parsePID(name)
		if !ok {
			return
		}
		if seen != nil {
			seen[pid] = true
		}
		if known(pid) {
			return
		}
		if pt.netns != 0 {
			if cached && pt.scope.outside[pid] {
				return
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
		fresh(pid)
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
	return h, nil
}

// newInScope reports whether new process pid (name, its entry in the open
// procfs root) is in the network namespace. Its pid was allocated since the
// last listing, so the cache of processes outside is not trusted for it
// (the pid may have been reused), only brought up to date.
func (pt procTable) newInScope(root int, name []byte, pid int, link []byte) bool {
	if pt.netns == 0 {
		return true
	}
	n, err := unix.Readlinkat(root, string(name)+"/ns/net", link)
	if err != nil {
		return false // exited, or unreadable: the listing of /proc says which
	}
	ns, ok := parseBracketInode(link[:n], "net")
	if pt.scope != nil {
		if ok && ns == pt.netns {
			delete(pt.scope.outside, pid)
		} else {
			pt.scope.outside[pid] = true
		}
	}
	return ok && ns == pt.netns
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
