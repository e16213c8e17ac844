package dnsintercept

import (
	"context"
	"sync"
)

// Session is a place among the DNS conns (TCP) or sessions (UDP) a Server
// serves at once, reserved by Server.Admit before the conn is accepted. It is
// served by Session.Serve, which releases it, or released unserved by
// Session.Release.
type Session struct {
	l     *limiter
	srv   *Server
	proto string

	// Guarded by l.mu.
	prev, next *Session // the limiter's idle list
	idle       bool     // on the idle list
	busy       int      // queries being answered
	evicted    bool     // told to end to make room; still counted until released
	released   bool
	cancel     context.CancelFunc
}

// limiter counts the sessions of one protocol. Sessions with no query being
// answered are kept on a list, least recently active first, so that a new
// session past the limit can take the place of the one idle longest.
//
// An evicted session is counted until it has ended (its Serve returned), so
// that sessions slow to end (a query's audit record still being written,
// say) cannot pile up: at most max sessions are active, and at most 2*max
// exist at all; past that Admit refuses.
type limiter struct {
	max int

	mu         sync.Mutex
	live       int // admitted, not yet released (ending ones included)
	ending     int // evicted, not yet released
	head, tail *Session
	refused    uint64
	evicted    uint64
}

type limiterStats struct{ live, refused, evicted uint64 }

func (l *limiter) stats() limiterStats {
	l.mu.Lock()
	defer l.mu.Unlock()
	return limiterStats{live: uint64(l.live), refused: l.refused, evicted: l.evicted}
}

// admit reserves a session. At the limit it evicts the session idle longest;
// when every session is busy it refuses.
func (l *limiter) admit(proto string) (*Session, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.live >= 2*l.max {
		l.refused++ // too many evicted sessions have not ended yet
		return nil, false
	}
	if l.live-l.ending >= l.max {
		v := l.head
		if v == nil {
			l.refused++
			return nil, false
		}
		l.unlinkLocked(v)
		v.evicted = true
		l.evicted++
		if v.cancel != nil {
			v.cancel() // Serve unblocks its read, closes the conn and returns
			l.ending++
		} else {
			// Not served yet (or never will be, if its conn could not
			// be made): its place is free now, and its Serve, if it
			// comes, returns at once.
			v.released = true
			l.live--
		}
	}
	l.live++
	ss := &Session{l: l, proto: proto}
	l.pushLocked(ss)
	return ss, true
}

// start records how to end the session's Serve. It reports false if the
// session was evicted before it started.
func (ss *Session) start(cancel context.CancelFunc) bool {
	ss.l.mu.Lock()
	defer ss.l.mu.Unlock()
	ss.cancel = cancel
	return !ss.evicted && !ss.released
}

// begin marks a query as being answered, which keeps the session from being
// evicted. It reports false if the session was evicted: the query is
// dropped.
func (ss *Session) begin() bool {
	l := ss.l
	l.mu.Lock()
	defer l.mu.Unlock()
	if ss.evicted || ss.released {
		return false
	}
	ss.busy++
	l.unlinkLocked(ss)
	return true
}

// end marks a query begun with begin as answered.
func (ss *Session) end() {
	l := ss.l
	l.mu.Lock()
	defer l.mu.Unlock()
	ss.busy--
	if ss.busy == 0 && !ss.evicted && !ss.released {
		l.pushLocked(ss) // most recently active
	}
}

// Hold keeps the session from being closed to make room for another, as a
// query being answered does, until release is called: for a short wait
// before it is served (finding the client's process, say). The caller must
// bound how many sessions it holds this way, or a flood of held sessions
// would leave no room. It reports false if the session was already
// evicted.
func (ss *Session) Hold() (release func(), ok bool) {
	if !ss.begin() {
		return nil, false
	}
	var once sync.Once
	return func() { once.Do(ss.end) }, true
}

// Evicted reports whether the session was told to end to make room for
// another: it is idle, with no answer pending, so its connection may be
// reset rather than closed (nothing of it lingers in the stack).
func (ss *Session) Evicted() bool {
	ss.l.mu.Lock()
	defer ss.l.mu.Unlock()
	return ss.evicted
}

// Release gives up the session's place. Serve calls it when it returns; a
// caller that admitted a session and then could not serve it (the conn
// could not be accepted) must call it. It may be called more than once.
func (ss *Session) Release() {
	l := ss.l
	l.mu.Lock()
	defer l.mu.Unlock()
	if ss.released {
		return
	}
	ss.released = true
	l.unlinkLocked(ss)
	l.live--
	if ss.evicted {
		l.ending--
	}
}

func (l *limiter) pushLocked(ss *Session) {
	if ss.idle {
		return
	}
	ss.idle = true
	ss.prev, ss.next = l.tail, nil
	if l.tail != nil {
		l.tail.next = ss
	} else {
		l.head = ss
	}
	l.tail = ss
}

func (l *limiter) unlinkLocked(ss *Session) {
	if !ss.idle {
		return
	}
	if ss.prev != nil {
		ss.prev.next = ss.next
	} else {
		l.head = ss.next
	}
	if ss.next != nil {
		ss.next.prev = ss.prev
	} else {
		l.tail = ss.prev
	}
	ss.prev, ss.next, ss.idle = nil, nil, false
}
