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

// Lookups run on one worker goroutine, in batches: the flows that arrive
// together share one listing of each process's new descriptors and, when
// the exact sock_diag lookups miss, one sock_diag dump. Start never blocks
// and never starts a goroutine: it queues the lookup, or answers
// "unknown: overloaded" at once when the queue is full. A lookup that waits
// longer than Config.MaxWait, or whose caller gave up (Finish), is dropped
// without being run.

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

	// worker state
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
func (p *Pending) Wait(d time.Duration) (Owner, bool) {
	if o, ok := p.Owner(); ok || d <= 0 {
		return o, ok
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-p.done:
		return p.owner, true
	case <-t.C:
		return Owner{}, false
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
	CPU         time.Duration // CPU time the worker used
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
		CPU:         time.Duration(r.stats.cpu.Load()),
	}
}

// Start queues a lookup of the owner of the sandbox's socket for a flow and
// returns at once (see Lookup for the arguments). It never blocks.
func (r *Resolver) Start(proto string, local, remote netip.AddrPort) *Pending {
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

	r.qmu.RLock()
	defer r.qmu.RUnlock()
	if r.stopped {
		p.answer(unknown(resolverClosedReason))
		return p
	}
	select {
	case r.queue <- p:
	default:
		p.answer(Owner{Note: NoteOverloaded})
	}
	return p
}

func quote(s string) string {
	if len(s) > 16 {
		s = s[:16] + "..."
	}
	return `"` + s + `"`
}

// runWorker is the lookup worker: it takes batches from the queue, and
// retries the lookups that wait for the budget.
func (r *Resolver) runWorker() {
	defer close(r.workerDone)
	// On a thread of its own, so its CPU time can be read (Stats.CPU).
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var deferred []*Pending
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		var batch []*Pending
		if len(deferred) == 0 {
			select {
			case p := <-r.queue:
				batch = append(batch, p)
			case <-r.quit:
				r.stopWorker(nil)
				return
			}
		} else {
			wake := deferred[0].retryAt
			for _, p := range deferred {
				if p.retryAt.Before(wake) {
					wake = p.retryAt
				}
				if p.deadline.Before(wake) {
					wake = p.deadline
				}
			}
			timer.Reset(max(time.Until(wake), time.Millisecond))
			select {
			case p := <-r.queue:
				batch = append(batch, p)
			case <-timer.C:
			case <-r.quit:
				timer.Stop()
				r.stopWorker(deferred)
				return
			}
			timer.Stop()
		}
	fill:
		for len(batch) < maxBatch {
			select {
			case p := <-r.queue:
				batch = append(batch, p)
			default:
				break fill
			}
		}
		// Deferred lookups are tried again when due (or to expire them).
		now := time.Now()
		var later []*Pending
		for _, p := range deferred {
			if p.retryAt.After(now) && !now.After(p.deadline) && !p.abandoned.Load() {
				later = append(later, p)
			} else {
				batch = append(batch, p)
			}
		}
		deferred = append(later, r.process(batch)...)
		// Bound what waits: beyond the queue's size, the oldest give up.
		if over := len(deferred) - cap(r.queue); over > 0 {
			slices.SortFunc(deferred, func(a, b *Pending) int { return a.start.Compare(b.start) })
			for _, p := range deferred[:over] {
				p.answer(Owner{Note: NoteOverloaded})
			}
			deferred = slices.Delete(deferred, 0, over)
		}
	}
}

// stopWorker answers every lookup left.
func (r *Resolver) stopWorker(deferred []*Pending) {
	closed := unknown(resolverClosedReason)
	for _, p := range deferred {
		p.answer(closed)
	}
	for {
		select {
		case p := <-r.queue:
			p.answer(closed)
		default:
			r.ix.close()
			return
		}
	}
}

// process works on one batch and returns the lookups that wait for the
// budget.
func (r *Resolver) process(batch []*Pending) (deferred []*Pending) {
	cpu0 := threadCPU()
	defer func() {
		r.stats.batches.Add(1)
		r.stats.deferred.Add(uint64(len(deferred)))
		r.stats.cpu.Add(uint64(threadCPU() - cpu0))
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
		if !r.ix.fill(&o, p.since, young) {
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
