package procattr

import (
	"errors"
	"net/netip"
	"runtime"
	"slices"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// Lookups run in batches, by one worker goroutine and by the callers that
// wait for an answer: the flows that arrive together share one listing of
// each process's new descriptors and, when the exact sock_diag lookups miss,
// one sock_diag dump. Start never blocks and never starts a goroutine: it
// queues the lookup, or answers "unknown: overloaded" at once when the queue
// is full. A lookup that waits longer than Config.MaxWait, or whose caller
// gave up (Finish), is dropped without being run.
//
// Whoever runs a batch holds the Resolver's work token, so the index has one
// user at a time. A caller that waits for its answer (Wait, Finish) does not
// only wait: when the token is free it runs a small batch itself, its own
// lookup first. So a lookup's answer does not depend on the worker thread
// being scheduled soon, which on a busy host it is not: the caller that
// needs the answer is running, and the socket it asks about is still open
// (a TCP flow waits for it before the sandbox's handshake completes, see
// the engine), so the answer is found, not "gone".

const (
	// DefaultQueue is Config.Queue's default.
	DefaultQueue = 4096
	// DefaultMaxWait is Config.MaxWait's default.
	DefaultMaxWait = time.Second
	// maxBatch bounds the lookups the worker takes at once.
	maxBatch = 256
	// hintGrace is how long a lookup the cheap steps cannot answer waits
	// for hints (ended flows) before the expensive steps.
	hintGrace = 10 * time.Millisecond
	// hintQueue bounds the hints (ended flows) waiting for the worker.
	hintQueue = 4096
	// helpBatch bounds the lookups a waiting caller runs at once, its own
	// first: enough to help the queue along, little enough that its own
	// flow does not wait for many others'.
	helpBatch = 16
	// workerNice is the worker thread's nice value where it may be raised.
	workerNice = -10
)

// NoteOverloaded is the Note of a lookup that was not run because
// attribution could not keep up: the queue was full, the lookup waited
// longer than Config.MaxWait, or its flow's record was written first.
const NoteOverloaded = NoteUnknownPrefix + "overloaded"

// Pending is a lookup started by Start. Its methods are safe for concurrent
// use; a nil *Pending reports attribution as off.
type Pending struct {
	r             *Resolver
	ipProto       uint8
	local, remote netip.AddrPort
	deadline      time.Time
	done          chan struct{}
	answered      atomic.Bool
	abandoned     atomic.Bool
	hinted        atomic.Bool
	owner         Owner // set before done is closed

	// state of the lookup's work, guarded by the Resolver's work token
	queued  bool // in Resolver.queue (also guarded by qmu)
	stage   stage
	sk      diagSock
	lastErr error
	since   uint64    // the index's seq when the socket was found
	start   time.Time // when Start queued it
	retryAt time.Time // when a deferred lookup is worth trying again
}

type stage uint8

const (
	stageSocket stage = iota // exact sock_diag lookups next
	stageDump                // the dump fallback next
	stageOwner               // the socket is known: find its holder
)

// NoteOff is the Note of lookups on a nil *Pending.
const NoteOff = NoteUnknownPrefix + "attribution off"

// Done is closed once the answer is there.
func (p *Pending) Done() <-chan struct{} {
	if p == nil {
		return closedChan
	}
	return p.done
}

var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// Owner returns the answer and true once it is there.
func (p *Pending) Owner() (Owner, bool) {
	if p == nil {
		return Owner{Note: NoteOff}, true
	}
	select {
	case <-p.done:
		return p.owner, true
	default:
		return Owner{}, false
	}
}

// Wait waits at most d for the answer and returns it, and whether it came.
// While it waits it runs lookups itself whenever no one else is (its own
// first), so the answer does not wait for the worker to be scheduled.
func (p *Pending) Wait(d time.Duration) (Owner, bool) {
	if o, ok := p.Owner(); ok || d <= 0 {
		return o, ok
	}
	deadline := time.Now().Add(d)
	t := time.NewTimer(d)
	defer t.Stop()
	if p.r == nil { // Known or Unanswered: no Resolver to run it
		select {
		case <-p.done:
			return p.owner, true
		case <-t.C:
			return p.Owner()
		}
	}
	for {
		select {
		case <-p.done:
			return p.owner, true
		case <-t.C:
			return p.Owner()
		case p.r.token <- struct{}{}:
		}
		retry := p.r.help(p)
		if o, ok := p.Owner(); ok {
			return o, true
		}
		// Waiting for hints or for the budget (or the Resolver closed):
		// wait for the answer, and run the lookup again when due.
		wait := time.Until(deadline)
		if wait <= 0 {
			return p.Owner()
		}
		if !retry.IsZero() {
			wait = min(wait, max(time.Until(retry), time.Millisecond))
		}
		t.Reset(wait)
		select {
		case <-p.done:
			return p.owner, true
		case <-t.C:
			if !time.Now().Before(deadline) {
				return p.Owner()
			}
			t.Reset(time.Until(deadline))
		}
	}
}

// Finish is called when the flow's record is written: it waits at most d for
// the answer; without one by then the lookup is dropped (the worker will not
// run it) and the answer is NoteOverloaded. A found socket's descriptor is
// remembered as a likely place of the process's next socket. Calling it
// again returns the same answer.
func (p *Pending) Finish(d time.Duration) Owner {
	if p == nil {
		return Owner{Note: NoteOff}
	}
	o, ok := p.Wait(d)
	if !ok {
		p.abandoned.Store(true)
		if p.r == nil && !p.answered.Swap(true) {
			// Unanswered: dropped, as a Resolver's worker answers a
			// dropped lookup.
			p.owner = Owner{Note: NoteOverloaded}
			close(p.done)
		}
		// The answer may have come meanwhile; it is still the answer.
		if o, ok = p.Owner(); !ok {
			return Owner{Note: NoteOverloaded}
		}
	}
	if o.PID != 0 && o.Inode != 0 && !p.hinted.Swap(true) {
		select {
		case p.r.hints <- hint{pid: o.PID, inode: o.Inode}:
		default:
		}
	}
	return o
}

// answer sets the answer once.
func (p *Pending) answer(o Owner) {
	if p.answered.Swap(true) {
		return
	}
	p.owner = o
	p.r.pending.Add(-1)
	switch {
	case o.PID != 0:
		p.r.stats.found.Add(1)
	case o.Note == NoteOverloaded:
		p.r.stats.overloaded.Add(1)
	}
	close(p.done)
}

type hint struct {
	pid   int
	inode uint64
}

// Stats are the Resolver's counters.
type Stats struct {
	Pending     int64         // lookups queued or being worked on now
	Started     uint64        // lookups asked for
	Found       uint64        // answered with a process
	Overloaded  uint64        // answered NoteOverloaded
	Discoveries uint64        // listings of /proc for processes not indexed yet
	Rescans     uint64        // whole descriptor tables read again
	FDReads     uint64        // descriptors read
	Dumps       uint64        // sock_diag dumps
	Batches     uint64        // batches the worker ran
	Deferred    uint64        // times a lookup waited for hints or the budget
	CPU         time.Duration // CPU time the worker thread used, and waiting callers' batches
}

// Stats returns the counters.
func (r *Resolver) Stats() Stats {
	return Stats{
		Pending:     r.pending.Load(),
		Started:     r.stats.started.Load(),
		Found:       r.stats.found.Load(),
		Overloaded:  r.stats.overloaded.Load(),
		Discoveries: r.stats.discoveries.Load(),
		Rescans:     r.stats.rescans.Load(),
		FDReads:     r.stats.fdReads.Load(),
		Dumps:       r.stats.dumps.Load(),
		Batches:     r.stats.batches.Load(),
		Deferred:    r.stats.deferred.Load(),
		CPU:         r.cpu(),
	}
}

// cpu is the CPU time of the worker thread (read from its clock, so that a
// batch costs no clock read) and of the batches waiting callers ran.
func (r *Resolver) cpu() time.Duration {
	d := time.Duration(r.stats.cpu.Load())
	if tid := r.workerTID.Load(); tid != 0 {
		// MAKE_THREAD_CPUCLOCK(tid, CPUCLOCK_SCHED) of <linux/posix-timers.h>.
		var ts unix.Timespec
		if unix.ClockGettime(^tid<<3|6, &ts) == nil {
			d += time.Duration(ts.Nano())
		}
	}
	return d
}

// Start queues a lookup of the owner of the sandbox's socket for a flow and
// returns at once (see Lookup for the arguments). It never blocks.
func (r *Resolver) Start(proto string, local, remote netip.AddrPort) *Pending {
	return r.start(proto, local, remote, false)
}

// StartWaited is Start for a lookup whose caller waits for it (Pending.Wait
// or Finish) within moments, as a TCP flow's handshake does: a lookup alone
// in the queue does not wake the worker (a thread of its own, woken
// through the kernel, which on a busy machine costs more than the lookup),
// and the caller's wait runs it. A lookup queued behind others wakes the
// worker as Start's does, so that a burst is still looked up in batches.
func (r *Resolver) StartWaited(proto string, local, remote netip.AddrPort) *Pending {
	return r.start(proto, local, remote, true)
}

func (r *Resolver) start(proto string, local, remote netip.AddrPort, waited bool) *Pending {
	p := &Pending{r: r, done: make(chan struct{})}
	r.stats.started.Add(1)
	r.pending.Add(1)
	switch proto {
	case "tcp":
		p.ipProto = unix.IPPROTO_TCP
	case "udp":
		p.ipProto = unix.IPPROTO_UDP
	default:
		p.answer(unknown("unsupported protocol " + quote(proto)))
		return p
	}
	local = unmapAddrPort(local)
	remote = unmapAddrPort(remote)
	switch {
	case !local.IsValid() || !remote.IsValid():
		p.answer(unknown("invalid address"))
		return p
	case local.Addr().Is4() != remote.Addr().Is4():
		p.answer(unknown("address families differ: " + local.String() + " and " + remote.String()))
		return p
	}
	p.local = netip.AddrPortFrom(local.Addr().WithZone(""), local.Port())
	p.remote = netip.AddrPortFrom(remote.Addr().WithZone(""), remote.Port())
	p.start = time.Now()
	p.deadline = p.start.Add(r.maxWait)

	r.qmu.Lock()
	switch {
	case r.stopped:
		r.qmu.Unlock()
		p.answer(unknown(resolverClosedReason))
		return p
	case len(r.queue) >= r.queueCap:
		r.qmu.Unlock()
		p.answer(Owner{Note: NoteOverloaded})
		return p
	}
	p.queued = true
	alone := len(r.queue) == 0
	r.queue = append(r.queue, p)
	r.qmu.Unlock()
	if !waited || !alone {
		r.kick()
	}
	return p
}

// kick wakes the worker.
func (r *Resolver) kick() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// takeQueued takes up to n lookups from the queue, oldest first; with own,
// that lookup first if it is still queued.
func (r *Resolver) takeQueued(batch []*Pending, own *Pending, n int) []*Pending {
	r.qmu.Lock()
	defer r.qmu.Unlock()
	if own != nil && own.queued {
		if i := slices.Index(r.queue, own); i >= 0 {
			r.queue = slices.Delete(r.queue, i, i+1)
		}
		own.queued = false
		batch = append(batch, own)
	}
	k := min(max(n-len(batch), 0), len(r.queue))
	for _, p := range r.queue[:k] {
		p.queued = false
		batch = append(batch, p)
	}
	// Move the rest to the front so the backing array does not creep.
	rest := copy(r.queue, r.queue[k:])
	clear(r.queue[rest:])
	r.queue = r.queue[:rest]
	return batch
}

// queueLen is the number of lookups queued.
func (r *Resolver) queueLen() int {
	r.qmu.Lock()
	defer r.qmu.Unlock()
	return len(r.queue)
}

// help runs a small batch for a waiting caller, its own lookup p first. The
// caller holds the work token; help releases it. It returns when p is worth
// running again if it had to wait (zero: nothing to wait for).
func (r *Resolver) help(p *Pending) (retry time.Time) {
	defer func() {
		// The worker's next wake-up may have changed if lookups wait.
		kick := len(r.deferred) > 0
		<-r.token
		if kick {
			r.kick()
		}
	}()
	if p.answered.Load() {
		return time.Time{}
	}
	runtime.LockOSThread() // for the CPU time of the batch
	defer runtime.UnlockOSThread()
	cpu0 := threadCPU()
	r.runBatch(p, helpBatch)
	r.stats.cpu.Add(uint64(threadCPU() - cpu0))
	if !p.answered.Load() {
		return p.retryAt
	}
	return time.Time{}
}

func quote(s string) string {
	if len(s) > 16 {
		s = s[:16] + "..."
	}
	return `"` + s + `"`
}

// runWorker is the lookup worker: it runs batches while lookups are
// queued, and the deferred ones when they are due.
func (r *Resolver) runWorker() {
	defer close(r.workerDone)
	// On a thread of its own, so its CPU time can be read (Stats.CPU),
	// and its priority raised where allowed (root): waiting callers need
	// the token it holds during a batch, so it should not be descheduled
	// for long by the sandbox's processes. Its work is bounded (one
	// thread, expensive steps a share of it), so this cannot starve the
	// rest of tunwall.
	// The goroutine exits locked, so the thread ends with it and no
	// other goroutine ever runs at that priority.
	runtime.LockOSThread()
	tid := unix.Gettid()
	_ = unix.Setpriority(unix.PRIO_PROCESS, tid, workerNice)
	r.workerTID.Store(int32(tid))
	defer func() {
		r.workerTID.Store(0)
		r.stats.cpu.Add(uint64(threadCPU()))
	}()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		select {
		case <-r.wake:
		case <-timer.C:
		case <-r.quit:
			r.token <- struct{}{}
			r.stopWorker()
			return
		}
		if h := r.workerHook.Load(); h != nil {
			(*h)() // tests: a worker the host does not schedule
		}
		select {
		case r.token <- struct{}{}:
		case <-r.quit:
			r.token <- struct{}{}
			r.stopWorker()
			return
		}
		r.runBatch(nil, maxBatch)
		more := r.queueLen() > 0 || r.dueDeferred()
		wake, ok := r.nextDeferred()
		// One batch per turn of the token: a waiting caller gets it
		// between two batches, not after the whole queue.
		<-r.token
		timer.Stop()
		switch {
		case more:
			r.kick()
		case ok:
			timer.Reset(max(time.Until(wake), time.Millisecond))
		}
	}
}

// dueDeferred reports whether a deferred lookup is due. The caller holds
// the work token.
func (r *Resolver) dueDeferred() bool {
	now := time.Now()
	for _, p := range r.deferred {
		if !p.retryAt.After(now) || now.After(p.deadline) || p.abandoned.Load() {
			return true
		}
	}
	return false
}

// nextDeferred is when the next deferred lookup is due (or expires). The
// caller holds the work token.
func (r *Resolver) nextDeferred() (time.Time, bool) {
	if len(r.deferred) == 0 {
		return time.Time{}, false
	}
	wake := r.deferred[0].retryAt
	for _, p := range r.deferred {
		wake = minTime(wake, minTime(p.retryAt, p.deadline))
	}
	return wake, true
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// runBatch runs one batch of at most n lookups: own first (if given and not
// answered), then the deferred ones that are due, then the queued ones,
// oldest first. The caller holds the work token.
func (r *Resolver) runBatch(own *Pending, n int) {
	var batch []*Pending
	if own != nil {
		if i := slices.Index(r.deferred, own); i >= 0 {
			r.deferred = slices.Delete(r.deferred, i, i+1)
			batch = append(batch, own)
		}
	}
	now := time.Now()
	later := r.deferred[:0]
	for _, p := range r.deferred {
		due := !p.retryAt.After(now) || now.After(p.deadline) || p.abandoned.Load()
		if due && len(batch) < n {
			batch = append(batch, p)
		} else {
			later = append(later, p)
		}
	}
	clear(r.deferred[len(later):])
	r.deferred = later
	batch = r.takeQueued(batch, own, n)
	if i := slices.Index(batch, own); i > 0 {
		copy(batch[1:i+1], batch[:i])
		batch[0] = own
	}
	if len(batch) == 0 {
		return
	}
	r.deferred = append(r.deferred, r.process(batch)...)
	// Bound what waits: beyond the queue's size, the oldest give up.
	if over := len(r.deferred) - r.queueCap; over > 0 {
		slices.SortFunc(r.deferred, func(a, b *Pending) int { return a.start.Compare(b.start) })
		for _, p := range r.deferred[:over] {
			p.answer(Owner{Note: NoteOverloaded})
		}
		r.deferred = slices.Delete(r.deferred, 0, over)
	}
}

// stopWorker answers every lookup left and releases the index. The caller
// holds the work token, and keeps it: no batch runs after this.
func (r *Resolver) stopWorker() {
	closed := unknown(resolverClosedReason)
	for _, p := range r.deferred {
		p.answer(closed)
	}
	r.deferred = nil
	r.qmu.Lock()
	q := r.queue
	r.queue = nil
	r.qmu.Unlock()
	for _, p := range q {
		p.answer(closed)
	}
	r.ix.close()
}

// process works on one batch and returns the lookups that wait for the
// budget.
func (r *Resolver) process(batch []*Pending) (deferred []*Pending) {
	defer func() {
		r.stats.batches.Add(1)
		r.stats.deferred.Add(uint64(len(deferred)))
	}()
	r.ix.startBatch()
	r.takeHints()
	now := time.Now()
	live := batch[:0]
	for _, p := range batch {
		switch {
		case p.abandoned.Load() || now.After(p.deadline):
			p.answer(Owner{Note: NoteOverloaded})
		default:
			live = append(live, p)
		}
	}
	if len(live) == 0 {
		return nil
	}

	// Sockets: exact lookups; then one dump per protocol for the misses.
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		for _, p := range live {
			p.answer(unknown(resolverClosedReason))
		}
		return nil
	}
	r.drainLocked()
	deadline := now.Add(r.timeout)
	var dump [2][]*dumpFlow
	var dumpJobs [2][]*Pending
	for _, p := range live {
		if p.stage == stageSocket {
			s, err := r.exactFindLocked(p.ipProto, p.local, p.remote, deadline)
			var nf *notFoundError
			switch {
			case err == nil:
				p.sk, p.stage, p.since = s, stageOwner, r.ix.seq
			case errors.As(err, &nf):
				p.lastErr, p.stage = nf.last, stageDump
			default:
				p.answer(unknown(err.Error()))
				continue
			}
		}
		if p.stage == stageDump {
			i := 0
			if p.ipProto == unix.IPPROTO_UDP {
				i = 1
			}
			dump[i] = append(dump[i], &dumpFlow{ipProto: p.ipProto, local: p.local, remote: p.remote})
			dumpJobs[i] = append(dumpJobs[i], p)
		}
	}
	for i, flows := range dump {
		if len(flows) == 0 {
			continue
		}
		if !r.gate.allow(time.Now()) {
			for _, p := range dumpJobs[i] {
				p.retryAt = r.gate.next()
			}
			deferred = append(deferred, dumpJobs[i]...)
			continue
		}
		start := time.Now()
		err := r.dumpFindLocked(flows[0].ipProto, flows, start.Add(r.timeout))
		r.gate.charge(start)
		r.stats.dumps.Add(1)
		for k, f := range flows {
			p := dumpJobs[i][k]
			switch {
			case f.score >= 0:
				p.sk, p.stage, p.since = f.best, stageOwner, r.ix.seq
			case err != nil:
				p.answer(unknown(err.Error()))
			case p.lastErr != nil:
				p.answer(unknown(p.lastErr.Error()))
			default:
				p.answer(Owner{Note: NoteGone})
			}
		}
	}
	r.mu.Unlock()

	// Holders.
	for _, p := range live {
		if p.stage != stageOwner || p.answered.Load() {
			continue
		}
		o := Owner{UID: p.sk.uid, Inode: p.sk.inode}
		if p.sk.inode == 0 {
			// TIME_WAIT, NEW_SYN_RECV or an orphaned socket: no file
			// refers to it.
			o.Note = NoteGone
			p.answer(o)
			continue
		}
		young := time.Since(p.start) < hintGrace
		if !r.ix.fill(&o, p.since, young, p.start) {
			p.retryAt = r.gate.next()
			if young {
				p.retryAt = p.start.Add(hintGrace)
			}
			deferred = append(deferred, p)
			continue
		}
		p.answer(o)
	}
	return deferred
}

// threadCPU is the CPU time the calling thread has used.
func threadCPU() time.Duration {
	var ts unix.Timespec
	if unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts) != nil {
		return 0
	}
	return time.Duration(ts.Nano())
}

// takeHints applies the hints that arrived since the last batch.
func (r *Resolver) takeHints() {
	for {
		select {
		case h := <-r.hints:
			r.ix.hint(h.pid, h.inode)
		default:
			return
		}
	}
}
