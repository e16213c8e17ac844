package procattr

import (
	"cmp"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// The fd index answers "which process holds socket inode N" without reading
// every descriptor of every process for every flow. For each process in the
// sandbox's network namespace that it has met, it remembers which
// descriptor holds which socket, and how far the descriptor table was read.
// A lookup, cheapest first:
//
//  1. the remembered descriptor of the inode, confirmed with one readlink
//     (none when it was read in this batch, after the sock_diag lookups);
//  2. the descriptors opened above the highest one read so far (a process
//     that opens sockets and keeps them gets ever higher numbers), listed
//     from that number on and read newest first;
//  3. the few descriptors where a socket is likely to have reappeared: those
//     whose flows ended (hints), the free numbers below the highest (the
//     kernel hands out the lowest free number), those where sockets were
//     found last, the oldest socket first (a client that closes one
//     connection and opens the next gets the same number back; with
//     several going, the oldest is the next to end), and the ones around
//     the last of those (a client that keeps replacing its oldest
//     connection);
//  4. only then the expensive steps: a look at the processes started since
//     the last look, newest first (newest.go: a new process's first socket,
//     found from a few entries of /proc), listing /proc for processes not
//     met yet, and reading a whole descriptor table again. Their cost is
//     charged to a budget (a share of the time), so no pattern of sockets
//     can make attribution take more than that share of a CPU: a lookup
//     that needs them while the budget is spent waits for it, and is
//     answered "unknown: overloaded" if that takes too long. A lookup that
//     has just started and that the look at the newest processes has not
//     answered waits for hints (hintGrace) before listing /proc.
//
// Each process is pinned by descriptors of its /proc/PID and /proc/PID/fd
// directories: once the process exits they read as gone, so a reused pid is
// met as a new process, never mistaken for the old one.

const (
	// maxProcs bounds the processes indexed at once (each holds two
	// descriptors of tunwall's); the least recently useful is dropped.
	maxProcs = 128
	// maxIndexed bounds the socket entries of all indexed processes
	// together; beyond it, descriptors are still read and compared but not
	// remembered.
	maxIndexed = 1 << 18
	// maxNewPerStep bounds the new descriptors one lookup reads (step 2);
	// the rest wait, listed, for the next lookups; at most maxUnread wait
	// (the newest; older ones are found by the later steps).
	maxNewPerStep = 4096
	maxUnread     = 1 << 16
	// maxCandidates bounds the remembered free and hinted descriptor
	// numbers of a process, and maxCandidateReads the ones one lookup
	// reads (step 3).
	maxCandidates     = 1024
	maxCandidateReads = 64
	maxFreeReads      = 4
	// recentFDs is how many descriptors where sockets were last found are
	// read first, and seqWindow how far on either side of the last one.
	recentFDs  = 8
	nearWindow = 4
	seqWindow  = 256
	// budgetShare: expensive steps may take 1/budgetShare of the time.
	budgetShare = 4
)

// procEntry is what the index knows about one process.
type procEntry struct {
	pid   int
	dir   int // /proc/PID, O_PATH: pins the process
	fdDir int // /proc/PID/fd, for listing

	sockAt map[int32]sockRead // descriptor -> socket inode, as last read
	fdOf   map[uint64]int32   // socket inode -> descriptor
	// high is the highest descriptor number listed (-1: none yet); unread
	// are listed numbers above the previous high not read yet, ascending.
	high   int32
	unread []int32
	// cands are descriptor numbers worth reading when a socket is not
	// where step 1 and 2 look: free ones, and ones whose flows ended.
	// Ascending, at most maxCandidates (the lowest: the kernel fills
	// those first).
	cands  []int32
	recent [recentFDs]recentFD // fd -1 when unused
	last   int32               // the descriptor where a socket was found last; -1 none
	reuses bool                // the last socket found by step 3 took a descriptor another had held

	desc   description
	descOK bool
	descAt time.Time // when desc was last confirmed: it holds for flows started before

	listedBatch uint64 // batch in which step 2 last listed the table
	fullSeq     uint64 // ix.seq when the whole table was last read
	used        uint64 // index clock of the last hit, for eviction
}

// sockRead is what a descriptor held when it was last read.
type sockRead struct {
	ino   uint64
	batch uint64 // fdIndex.batch of the read
	seen  uint64 // fdIndex.reads when ino was first read there
}

// recentFD is a descriptor where a socket was found. Step 3 reads the
// recent descriptors oldest socket first: in a client that keeps several
// connections going (threads, goroutines), the connection that ends next,
// and whose descriptor the next one gets, is usually the oldest. One read
// several times with the same socket (a long-lived connection) is read
// after the others.
type recentFD struct {
	fd     int32
	misses uint8 // reads in a row that found the same socket
}

// maxMisses is the misses after which a recent descriptor is read after
// the few nearest the last found.
const maxMisses = 3

// costGate is the budget of the expensive steps: it grows by 1/budgetShare of
// the time that passes, up to gateBurst, and each expensive step spends what
// it took. A step may start while the budget is positive.
type costGate struct {
	balance time.Duration
	at      time.Time // when balance was last brought up to date
}

// gateBurst bounds the budget saved up while idle.
const gateBurst = 20 * time.Millisecond

func (g *costGate) refill(now time.Time) {
	if g.at.IsZero() {
		g.balance, g.at = gateBurst, now
		return
	}
	if now.After(g.at) {
		g.balance = min(g.balance+now.Sub(g.at)/budgetShare, gateBurst)
		g.at = now
	}
}

func (g *costGate) allow(now time.Time) bool {
	g.refill(now)
	return g.balance > 0
}

// charge spends the time since start.
func (g *costGate) charge(start time.Time) {
	now := time.Now()
	g.refill(now)
	g.balance -= now.Sub(start)
}

// next is when a step may start.
func (g *costGate) next() time.Time {
	if g.balance > 0 {
		return g.at
	}
	return g.at.Add((-g.balance + time.Microsecond) * budgetShare)
}

// fdIndex is the index. It is not safe for concurrent use: the Resolver's
// worker owns it.
type fdIndex struct {
	pt      procTable
	procfs  bool // pt.root is a real procfs: fd directories can be read from a number on
	procs   map[int]*procEntry
	indexed int // socket entries over all procs
	clock   uint64
	batch   uint64
	reads   uint64    // descriptor reads so far, for sockRead.seen
	lists   uint64    // step 2 listings, for tests
	gate    *costGate // the Resolver's
	// seq counts expensive steps; a lookup that resumes after waiting for
	// the budget skips those done since it started (see resolve).
	seq         uint64
	discoverSeq uint64 // seq of the last listing of /proc
	lastDenied  []int  // what that listing could not read
	// quit is closed when the Resolver closes: long table reads stop.
	quit <-chan struct{}
	// newest is the state of the looks at the newest processes
	// (newest.go).
	newest newest

	// scratch buffers
	dirent []byte
	link   []byte
	exe    []byte
	target []byte

	stats *stats
}

func newFDIndex(pt procTable, gate *costGate, st *stats) *fdIndex {
	ix := &fdIndex{
		pt:     pt,
		gate:   gate,
		procs:  map[int]*procEntry{},
		dirent: make([]byte, direntBufSize),
		link:   make([]byte, 64),
		exe:    make([]byte, unix.PathMax),
		target: make([]byte, 0, 32),
		stats:  st,
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(pt.root, &fs); err == nil && fs.Type == unix.PROC_SUPER_MAGIC {
		ix.procfs = true
	}
	ix.initNewest()
	return ix
}

func (ix *fdIndex) stopping() bool {
	select {
	case <-ix.quit:
		return true
	default:
		return false
	}
}

// close releases every pinned process.
func (ix *fdIndex) close() {
	for _, e := range ix.procs {
		ix.drop(e)
	}
	for _, y := range ix.newest.young {
		ix.closeEntry(y.e)
	}
	ix.newest.young = nil
}

// drop removes e from the index and releases it.
func (ix *fdIndex) drop(e *procEntry) {
	ix.closeEntry(e)
	delete(ix.procs, e.pid)
}

// startBatch marks the start of a worker batch: step 2 lists a table at most
// once per batch, and a process's description is confirmed once per batch.
func (ix *fdIndex) startBatch() { ix.batch++ }

// hint says the flow of socket inode, found in process pid, ended: its
// descriptor is worth reading first when a new socket is looked for.
func (ix *fdIndex) hint(pid int, inode uint64) {
	e := ix.procs[pid]
	if e == nil {
		return
	}
	if fd, ok := e.fdOf[inode]; ok {
		e.addCand(fd)
	}
}

// resolveResult is the answer of resolve.
type resolveResult struct {
	pids   []int // holders, ascending
	denied []int // processes in scope whose descriptors could not be read
	// more is set when an expensive step was needed but the budget was
	// spent: the answer may be incomplete; ask again later.
	more bool
	err  error // listing /proc failed
}

// resolve finds the processes holding socket inode. ix.startBatch must have
// been called for the batch the lookup is part of. since is ix.seq when the
// socket was known to exist: expensive steps done after that are not done
// again, so a lookup that waited for the budget resumes where it stopped.
// With young, a lookup that the cheap steps cannot answer is not taken to
// the expensive ones yet (more is set): the hint of the flow whose
// descriptor the socket took may be about to arrive.
func (ix *fdIndex) resolve(inode uint64, since uint64, young bool) resolveResult {
	ix.clock++
	ix.target = appendBracketInode(ix.target[:0], "socket", inode)
	var res resolveResult

	// Step 1 over every known process: also finds a socket shared with
	// another process already indexed (ambiguous).
	for _, e := range ix.procs {
		if ix.checkKnown(e, inode) {
			res.pids = append(res.pids, e.pid)
		}
	}
	if len(res.pids) > 0 {
		return ix.found(res, inode)
	}
	// Steps 2 and 3, most recently useful process first.
	for _, e := range ix.byRecency() {
		if ix.cheapSearch(e, inode) {
			res.pids = append(res.pids, e.pid)
			return ix.found(res, inode)
		}
	}
	// Step 4, first the processes started since the last look, newest
	// first (newest.go): a socket the cheap steps cannot place is most
	// often a new process's, and this costs a few entries of /proc, not
	// a listing of every process, nor the wait for hints.
	if ix.newest.ok {
		if !ix.gate.allow(time.Now()) {
			res.more = true
			return res
		}
		start := time.Now()
		pids := ix.lookNewest()
		ix.gate.charge(start)
		if len(pids) > 0 {
			res.pids = pids
			return ix.found(res, inode)
		}
	}
	if young {
		res.more = true
		return res
	}
	// Step 4a: processes not met yet; once in a while without the cache of
	// processes outside the netns.
	for pass := 0; pass < 2; pass++ {
		if !ix.gate.allow(time.Now()) {
			res.more = true
			return res
		}
		cached := pass == 0
		if cached && ix.discoverSeq > since {
			res.denied = ix.lastDenied // listed since: nothing new to meet
			continue
		}
		if !cached && (ix.pt.scope == nil || ix.pt.netns == 0 || !ix.pt.scope.fullDue()) {
			break
		}
		start := time.Now()
		pids, denied, err := ix.discover(cached)
		ix.gate.charge(start)
		ix.stats.discoveries.Add(1)
		ix.seq++
		ix.discoverSeq, ix.lastDenied = ix.seq, denied
		if err != nil {
			res.err = err
			return res
		}
		res.denied = denied
		if len(pids) > 0 {
			res.pids = pids
			return ix.found(res, inode)
		}
	}
	// Step 4b: read whole tables again, most recently useful first.
	for _, e := range ix.byRecency() {
		if e.fullSeq > since {
			continue // read whole since the lookup started
		}
		if !ix.gate.allow(time.Now()) {
			res.more = true
			return res
		}
		start := time.Now()
		found, err := ix.fullRead(e)
		ix.gate.charge(start)
		ix.stats.rescans.Add(1)
		if err != nil {
			ix.drop(e)
			continue
		}
		if found {
			res.pids = append(res.pids, e.pid)
			return ix.found(res, inode)
		}
	}
	return res
}

// found notes where inode was found, for the next lookups.
func (ix *fdIndex) found(res resolveResult, inode uint64) resolveResult {
	slices.Sort(res.pids)
	for _, pid := range res.pids {
		if e := ix.procs[pid]; e != nil {
			e.used = ix.clock
			if fd, ok := e.fdOf[inode]; ok {
				e.remember(fd)
			}
		}
	}
	return res
}

// byRecency lists the known processes, most recently useful first.
func (ix *fdIndex) byRecency() []*procEntry {
	es := make([]*procEntry, 0, len(ix.procs))
	for _, e := range ix.procs {
		es = append(es, e)
	}
	slices.SortFunc(es, func(a, b *procEntry) int {
		switch {
		case a.used > b.used:
			return -1
		case a.used < b.used:
			return 1
		}
		return a.pid - b.pid
	})
	return es
}

// checkKnown is step 1: is inode at the descriptor remembered for it?
func (ix *fdIndex) checkKnown(e *procEntry, inode uint64) bool {
	fd, ok := e.fdOf[inode]
	if !ok {
		return false
	}
	if e.sockAt[fd].batch == ix.batch {
		// Read in this batch, so after the sock_diag lookups that
		// found the sockets of its flows: it held the socket then.
		return true
	}
	return ix.readFD(e, fd) == readTarget
}

// cheapSearch is steps 2 and 3 for one process.
func (ix *fdIndex) cheapSearch(e *procEntry, inode uint64) bool {
	// The recent ones that keep their sockets are read after the few
	// nearest the last found (see below): in a process that holds many
	// connections and replaces the oldest, all recent ones do.
	var demoted [recentFDs]bool
	for i := range e.recent {
		demoted[i] = e.recent[i].misses >= maxMisses
	}
	// A process whose last socket took a descriptor another had held
	// (step 3) most likely does so again (a client that closes each
	// connection and opens the next): the few likeliest places are read
	// before the table is listed (step 2), which is then not needed.
	early := e.reuses && len(e.unread) == 0
	if early && (ix.readCands(e) || ix.readRecent(e, &demoted, false)) {
		return true
	}
	found, ok := ix.readNew(e)
	switch {
	case !ok:
		return false // the process is gone
	case found:
		e.reuses = false
		return true
	}
	// Step 3: where sockets reappear. First the hinted and free numbers,
	// lowest first (the kernel hands out the lowest free number), then
	// the recent ones, oldest socket first (a client that closes a
	// connection and opens the next gets the same number back).
	if !early && (ix.readCands(e) || ix.readRecent(e, &demoted, false)) {
		e.reuses = true
		return true
	}
	// A client that replaces its oldest connection with a new one (a pool,
	// a churn) gets the descriptor of that oldest one, which it opened
	// around the time it opened the one found last: read around that one,
	// nearest first, as far back as forward (connections complete out of
	// order). What this reads is indexed, so the lookups after this one
	// find their sockets in step 1.
	if ix.readAround(e, 1, nearWindow) || ix.readRecent(e, &demoted, true) || ix.readAround(e, nearWindow+1, seqWindow) {
		e.reuses = true
		return true
	}
	return false
}

// readNew is step 2: it reads the descriptors above the highest one read
// (listed once a batch). ok is false when the process is gone (then it is
// dropped).
func (ix *fdIndex) readNew(e *procEntry) (found, ok bool) {
	if e.listedBatch == ix.batch && len(e.unread) == 0 {
		return false, true
	}
	if e.listedBatch != ix.batch {
		e.listedBatch = ix.batch
		if err := ix.listAbove(e); err != nil {
			ix.drop(e)
			return false, false
		}
	}
	n := 0
	for len(e.unread) > 0 && n < maxNewPerStep {
		fd := e.unread[len(e.unread)-1] // newest first
		e.unread = e.unread[:len(e.unread)-1]
		n++
		if ix.readFD(e, fd) == readTarget {
			found = true
		}
	}
	return found, true
}

// readCands reads the hinted and free numbers, lowest first, until one
// holds ix.target. A number still free means the sockets opened since went
// below it (lowest first): after a few, the rest are not worth reading now.
func (ix *fdIndex) readCands(e *procEntry) bool {
	reads, free := 0, 0
	for i := 0; i < len(e.cands) && reads < maxCandidateReads && free < maxFreeReads; {
		fd := e.cands[i]
		reads++
		switch ix.readFD(e, fd) {
		case readTarget:
			e.cands = slices.Delete(e.cands, i, i+1)
			return true
		case readFree:
			free++
			i++ // still free: stays a candidate
		default:
			e.cands = slices.Delete(e.cands, i, i+1)
		}
	}
	return false
}

// readAround reads the descriptors from lo to hi numbers away from the one
// found last, nearest first, until one holds ix.target.
func (ix *fdIndex) readAround(e *procEntry, lo, hi int32) bool {
	if e.last < 0 {
		return false
	}
	for d := lo; d <= hi; d++ {
		if fd := e.last + d; fd <= e.high && ix.readFD(e, fd) == readTarget {
			return true
		}
		if fd := e.last - d; fd >= 0 && ix.readFD(e, fd) == readTarget {
			return true
		}
	}
	return false
}

// readRecent reads the recent descriptors (see recentFD) that are demoted
// or not, as given, oldest socket first, until one holds ix.target.
func (ix *fdIndex) readRecent(e *procEntry, demoted *[recentFDs]bool, which bool) bool {
	var order [recentFDs]int
	n := 0
	for i := range e.recent {
		if e.recent[i].fd >= 0 && demoted[i] == which {
			order[n] = i
			n++
		}
	}
	slices.SortFunc(order[:n], func(a, b int) int {
		// No socket known there (seen 0): free, read first.
		return cmp.Compare(e.sockAt[e.recent[a].fd].seen, e.sockAt[e.recent[b].fd].seen)
	})
	for _, i := range order[:n] {
		r := &e.recent[i]
		old, had := e.sockAt[r.fd]
		switch ix.readFD(e, r.fd) {
		case readTarget:
			return true // found remembers it
		case readSocket:
			if had && e.sockAt[r.fd].ino == old.ino {
				r.misses = min(r.misses+1, maxMisses)
			} else {
				r.misses = 0
			}
		case readFree:
			r.misses = 0 // the next socket may take it
		default:
			r.misses = maxMisses
		}
	}
	return false
}

// readOutcome is what reading one descriptor found.
type readOutcome int

const (
	readTarget readOutcome = iota // the socket looked for
	readSocket                    // another socket
	readOther                     // not a socket
	readFree                      // no such descriptor
	readGone                      // the process is gone or unreadable
)

// readFD reads descriptor fd of e, updates the index, and compares it with
// ix.target.
func (ix *fdIndex) readFD(e *procEntry, fd int32) readOutcome {
	ix.stats.fdReads.Add(1)
	ix.reads++
	var num [12]byte
	name := strconv.AppendInt(num[:0], int64(fd), 10)
	n, err := unix.Readlinkat(e.fdDir, string(name), ix.link)
	if err != nil {
		ix.forget(e, fd)
		if errors.Is(err, unix.ENOENT) {
			// A free descriptor, or a process that is gone (then
			// every read fails and step 2 drops it).
			return readFree
		}
		return readGone
	}
	l := ix.link[:n]
	if string(l) == string(ix.target) {
		ino, _ := parseBracketInode(l, "socket")
		ix.set(e, fd, ino)
		return readTarget
	}
	if ino, ok := parseBracketInode(l, "socket"); ok {
		ix.set(e, fd, ino)
		return readSocket
	}
	ix.forget(e, fd)
	return readOther
}

func (ix *fdIndex) set(e *procEntry, fd int32, ino uint64) {
	if old, ok := e.sockAt[fd]; ok {
		if old.ino == ino {
			e.sockAt[fd] = sockRead{ino: ino, batch: ix.batch, seen: old.seen}
			return
		}
		delete(e.fdOf, old.ino)
		ix.indexed--
	}
	if ix.indexed >= maxIndexed {
		delete(e.sockAt, fd)
		return
	}
	if prev, ok := e.fdOf[ino]; ok && prev != fd {
		// The same socket at two descriptors (dup): remember the
		// newer.
		delete(e.sockAt, prev)
		ix.indexed--
	}
	e.sockAt[fd] = sockRead{ino: ino, batch: ix.batch, seen: ix.reads}
	e.fdOf[ino] = fd
	ix.indexed++
}

func (ix *fdIndex) forget(e *procEntry, fd int32) {
	if old, ok := e.sockAt[fd]; ok {
		delete(e.sockAt, fd)
		if e.fdOf[old.ino] == fd {
			delete(e.fdOf, old.ino)
		}
		ix.indexed--
	}
}

// remember puts fd among the recent descriptors, where a socket was just
// found: in place of an unused one, else of the one that missed most and
// holds the oldest socket.
func (e *procEntry) remember(fd int32) {
	e.last = fd
	slot := -1
	for i := range e.recent {
		r := &e.recent[i]
		if r.fd == fd {
			slot = i
			break
		}
		if slot >= 0 && e.recent[slot].fd < 0 {
			continue
		}
		if slot < 0 || r.fd < 0 || e.worseRecent(r, &e.recent[slot]) {
			slot = i
		}
	}
	e.recent[slot] = recentFD{fd: fd}
}

// worseRecent reports whether a is less worth keeping than b.
func (e *procEntry) worseRecent(a, b *recentFD) bool {
	if a.misses != b.misses {
		return a.misses > b.misses
	}
	return e.sockAt[a.fd].seen < e.sockAt[b.fd].seen
}

// addCand adds fd to the candidates, keeping the lowest maxCandidates.
func (e *procEntry) addCand(fd int32) {
	i, ok := slices.BinarySearch(e.cands, fd)
	if ok {
		return
	}
	if len(e.cands) >= maxCandidates {
		if i >= len(e.cands) {
			return
		}
		e.cands = e.cands[:len(e.cands)-1]
	}
	e.cands = slices.Insert(e.cands, i, fd)
}

// listAbove lists the descriptors above e.high into e.unread and raises
// e.high. On a procfs it reads from e.high+1 on (a /proc/PID/fd directory's
// offset is the descriptor number plus 2); elsewhere (test trees) it lists
// everything and keeps the numbers above e.high.
func (ix *fdIndex) listAbove(e *procEntry) error {
	ix.lists++
	from := int64(0)
	if ix.procfs {
		from = int64(e.high) + 1 + 2
	}
	if _, err := unix.Seek(e.fdDir, from, unix.SEEK_SET); err != nil {
		return err
	}
	high := e.high
	var added []int32
	err := walkDir(e.fdDir, ix.dirent, func(name []byte) {
		fd, ok := parseFD(name)
		if !ok || fd <= e.high {
			return
		}
		added = append(added, fd)
		high = max(high, fd)
	})
	if err != nil {
		return err
	}
	if !ix.procfs {
		slices.Sort(added)
	}
	// Free numbers between the old high and the new one are candidates.
	prev := e.high
	for _, fd := range added {
		for f := prev + 1; f < fd && len(e.cands) < maxCandidates; f++ {
			e.addCand(f)
		}
		prev = fd
	}
	e.unread = append(e.unread, added...)
	if over := len(e.unread) - maxUnread; over > 0 {
		e.unread = slices.Delete(e.unread, 0, over)
	}
	e.high = high
	return nil
}

// fullRead reads e's whole descriptor table again, and reports whether it
// holds ix.target.
func (ix *fdIndex) fullRead(e *procEntry) (found bool, err error) {
	if _, err := unix.Seek(e.fdDir, 0, unix.SEEK_SET); err != nil {
		return false, err
	}
	var fds []int32
	err = walkDir(e.fdDir, ix.dirent, func(name []byte) {
		if fd, ok := parseFD(name); ok {
			fds = append(fds, fd)
		}
	})
	if err != nil {
		return false, err
	}
	slices.Sort(fds)
	// Start over: what is not read now is not there.
	ix.indexed -= len(e.fdOf)
	clear(e.sockAt)
	clear(e.fdOf)
	e.unread = e.unread[:0]
	e.cands = e.cands[:0]
	e.high = -1
	ix.seq++
	e.fullSeq, e.listedBatch = ix.seq, ix.batch
	prev := int32(-1)
	for i, fd := range fds {
		if i%1024 == 1023 && ix.stopping() {
			return false, errors.New("resolver closed")
		}
		for f := prev + 1; f < fd && len(e.cands) < maxCandidates; f++ {
			e.cands = append(e.cands, f)
		}
		prev = fd
		switch ix.readFD(e, fd) {
		case readTarget:
			found = true
		case readGone:
			return false, errors.New("descriptors unreadable")
		}
		e.high = fd
	}
	return found, nil
}

// discover lists /proc for processes in scope not indexed yet and reads their
// tables. Those holding sockets are indexed. It returns the new processes
// holding ix.target, and the processes in scope it could not read.
func (ix *fdIndex) discover(cached bool) (pids, denied []int, err error) {
	var fresh []int
	h, err := ix.pt.listScope(func(pid int) bool {
		_, known := ix.procs[pid]
		return known
	}, func(pid int) { fresh = append(fresh, pid) }, cached)
	if err != nil {
		return nil, nil, err
	}
	denied = h.denied
	for _, pid := range fresh {
		e, err := ix.open(pid)
		if err != nil {
			if isPermission(err) {
				denied = append(denied, pid)
			}
			continue
		}
		found, err := ix.fullRead(e)
		if err != nil {
			if isPermission(err) {
				denied = append(denied, pid)
			}
			ix.closeEntry(e)
			continue
		}
		if found {
			pids = append(pids, pid)
		}
		if len(e.fdOf) == 0 {
			ix.closeEntry(e) // holds no socket: nothing to remember
			continue
		}
		ix.insert(e)
	}
	slices.Sort(pids)
	slices.Sort(denied)
	return pids, denied, nil
}

// open pins process pid. The entry is not in the index until insert.
func (ix *fdIndex) open(pid int) (*procEntry, error) {
	path := filepath.Join(ix.pt.root, strconv.Itoa(pid))
	dir, err := unix.Open(path, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	fdDir, err := unix.Openat(dir, "fd", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		unix.Close(dir)
		return nil, err
	}
	e := &procEntry{
		pid: pid, dir: dir, fdDir: fdDir,
		sockAt: map[int32]sockRead{}, fdOf: map[uint64]int32{},
		high: -1,
	}
	e.last = -1
	for i := range e.recent {
		e.recent[i].fd = -1
	}
	return e, nil
}

// insert adds e to the index, dropping the least recently useful process
// when full.
func (ix *fdIndex) insert(e *procEntry) {
	if len(ix.procs) >= maxProcs {
		es := ix.byRecency()
		ix.drop(es[len(es)-1])
	}
	ix.procs[e.pid] = e
}

// closeEntry releases an entry that is not in the index.
func (ix *fdIndex) closeEntry(e *procEntry) {
	ix.indexed -= len(e.fdOf)
	unix.Close(e.dir)
	unix.Close(e.fdDir)
}

// fill sets o.PID, NSPID, Comm, Exe and Note for the socket o.Inode of a
// flow that started at start. It reports false, changing nothing, when the
// answer needs expensive steps the budget does not allow now, or that a
// young lookup does not take yet (see resolve).
func (ix *fdIndex) fill(o *Owner, since uint64, young bool, start time.Time) bool {
	res := ix.resolve(o.Inode, since, young)
	switch {
	case res.more:
		return false
	case res.err != nil:
		o.Note = NoteUnknownPrefix + res.err.Error()
	case len(res.pids) == 1:
		ix.describe(res.pids[0], o, start)
	case len(res.pids) > 1:
		o.Note = ambiguousNote(res.pids)
	case len(res.denied) > 0:
		o.Note = NoteUnknownPrefix + deniedReason(res.denied)
	default:
		o.Note = NoteGone
	}
	return true
}

// describe fills the process fields of o for holder pid, for a flow that
// started at start, from the cached description while the process's
// executable is unchanged: confirmed after the flow started (so after its
// socket was opened, and after any exec before that), once for all the
// flows that started before.
func (ix *fdIndex) describe(pid int, o *Owner, start time.Time) {
	o.PID = pid
	e := ix.procs[pid]
	if e == nil {
		o.Note = NoteGone
		return
	}
	if e.descOK && !e.descAt.Before(start) {
		o.Comm, o.Exe, o.NSPID = e.desc.comm, e.desc.exe, e.desc.nspid
		return
	}
	now := time.Now()
	n, exeErr := unix.Readlinkat(e.dir, "exe", ix.exe)
	if e.descOK && exeErr == nil && string(ix.exe[:n]) == e.desc.exe {
		e.descAt = now
		o.Comm, o.Exe, o.NSPID = e.desc.comm, e.desc.exe, e.desc.nspid
		return
	}
	var exe string
	if exeErr == nil {
		exe = string(ix.exe[:n])
	}
	comm, err := readFileAt(e.dir, "comm", 64)
	if err != nil {
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ESRCH) {
			o.Note = NoteGone
		} else {
			o.Note = NoteUnknownPrefix + "read comm: " + err.Error()
		}
		return
	}
	o.Comm = trimNewline(comm)
	if exeErr == nil {
		o.Exe = exe
	}
	if status, err := readFileAt(e.dir, "status", 8<<10); err == nil {
		o.NSPID = parseNSpid(status)
	}
	if o.Exe != "" {
		e.desc = description{comm: o.Comm, exe: o.Exe, nspid: o.NSPID}
		e.descOK, e.descAt = true, now
	}
}

func trimNewline(b []byte) string {
	if n := len(b); n > 0 && b[n-1] == '\n' {
		b = b[:n-1]
	}
	return string(b)
}

// readFileAt reads at most limit bytes of dir/name.
func readFileAt(dir int, name string, limit int) ([]byte, error) {
	fd, err := unix.Openat(dir, name, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	buf := make([]byte, limit)
	n := 0
	for n < limit {
		m, err := f.Read(buf[n:])
		n += m
		if err != nil || m == 0 {
			break
		}
	}
	return buf[:n], nil
}

// parseFD parses a descriptor directory entry name.
func parseFD(b []byte) (int32, bool) {
	if !isDigits(b) || len(b) > 9 {
		return 0, false
	}
	n := int32(0)
	for _, c := range b {
		n = n*10 + int32(c-'0')
	}
	return n, true
}
