package engine

import (
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tunwall/tunwall/internal/audit"
)

// DialLimits bound the upstream TCP dials the sandbox makes tunwall hold
// and make. TCP is dial-first: every SYN to an allowed destination becomes
// a real connection attempt, which holds one of the stack's pending
// handshakes until it ends. A destination is what is dialled: the allowed
// name (or, for a cidr rule, the address) and the port.
//
// A SYN beyond a limit is refused at once (RST, as a full queue would be
// on a real host), counted, and recorded: the first refusal of a
// destination in a window of RefusalWindow as a flow record of its own,
// the rest of that window as one record with a count.
type DialLimits struct {
	// Pending bounds the dials in progress, all destinations together. It
	// should be the stack's pending-handshake limit (stack.Config.
	// MaxInFlightTCP). While half of it is taken, a destination already
	// holding more than its fair share (a quarter of Pending divided among
	// the destinations with dials in progress) gets no new dial; and the
	// last eighth is kept for destinations with no dial in progress. So a
	// few dead destinations cannot take every slot. 0 means 1024.
	Pending int
	// PerDest bounds the dials in progress to one destination. 0 means a
	// quarter of Pending.
	PerDest int
	// Rate bounds the new dials a second to one destination, after a burst
	// of one second's worth. 0 means DefaultDialRate; negative means no
	// bound.
	Rate float64
}

// DefaultDialRate is DialLimits.Rate's default: new dials a second to one
// destination (after a burst of as many).
const DefaultDialRate = 10000

// RefusalWindow is how long the refusals of one destination are summed
// into one audit record after the first of them is recorded on its own.
const RefusalWindow = 5 * time.Second

// maxDialDests bounds the destinations whose dial state is kept at once
// (those with a dial in progress, a rate bucket not yet full again, or a
// refusal window open). A new destination beyond it is refused.
const maxDialDests = 65536

// DialStats counts the dials refused at DialLimits.
type DialStats struct {
	RefusedPending uint64 // a destination's PerDest or fair share was taken, or Pending
	RefusedRate    uint64 // a destination's Rate was exceeded
}

// dialLimiter keeps the per-destination dial state.
type dialLimiter struct {
	lim DialLimits

	mu     sync.Mutex
	dests  map[string]*dialDest
	total  int // dials in progress
	active int // destinations with a dial in progress

	refusedPending, refusedRate atomic.Uint64
}

type dialDest struct {
	pending int
	tokens  float64
	at      time.Time // when tokens was last refilled
	win     *refusalWin
}

// refusalWin sums a destination's refusals after the first one recorded.
type refusalWin struct {
	n           int
	first, last time.Time
	fr          *flowRecord // the first one counted (its src, host, dst)
	reason      string
}

func newDialLimiter(l DialLimits) *dialLimiter {
	if l.Pending <= 0 {
		l.Pending = 1024
	}
	if l.PerDest <= 0 {
		l.PerDest = max(1, l.Pending/4)
	}
	if l.Rate == 0 {
		l.Rate = DefaultDialRate
	}
	return &dialLimiter{lim: l, dests: map[string]*dialDest{}}
}

// dialKey names a flow's destination: the name dialled (or the address)
// and the port.
func dialKey(host string, fr *flowRecord) string {
	port := strconv.Itoa(int(fr.f.Dst.Port()))
	if host == "" {
		return net.JoinHostPort(fr.f.Dst.Addr().String(), port)
	}
	return net.JoinHostPort(strings.ToLower(strings.TrimSuffix(host, ".")), port)
}

// admit takes a dial slot for key, or says why not. now is passed for
// tests.
func (g *dialLimiter) admit(key string, now time.Time) (release func(), why string, rate bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	d := g.dests[key]
	if d == nil {
		if len(g.dests) >= maxDialDests {
			g.sweepLocked(now)
		}
		if len(g.dests) >= maxDialDests {
			return nil, fmt.Sprintf("dials to %d destinations are being tracked (the most tunwall keeps)", maxDialDests), false
		}
		d = &dialDest{tokens: g.burst(), at: now}
		g.dests[key] = d
	}
	if g.lim.Rate > 0 {
		d.tokens = min(g.burst(), d.tokens+now.Sub(d.at).Seconds()*g.lim.Rate)
		d.at = now
	}
	switch {
	case d.pending >= g.lim.PerDest:
		return nil, fmt.Sprintf("%d dials to %s are in progress, the most for one destination (--max-dials-per-dest)", d.pending, key), false
	case g.total >= g.lim.Pending, d.pending > 0 && g.total >= g.lim.Pending-g.reserve():
		return nil, fmt.Sprintf("%d dials are in progress, the most at once", g.total), false
	case g.total >= g.lim.Pending/2 && d.pending >= g.fairShareLocked(d):
		return nil, fmt.Sprintf("%d dials are in progress and %s already has %d of them, its fair share", g.total, key, d.pending), false
	case g.lim.Rate > 0 && d.tokens < 1:
		return nil, fmt.Sprintf("more than %g new dials a second to %s (--dial-rate)", g.lim.Rate, key), true
	}
	if g.lim.Rate > 0 {
		d.tokens--
	}
	if d.pending == 0 {
		g.active++
	}
	d.pending++
	g.total++
	var once sync.Once
	return func() {
		once.Do(func() {
			g.mu.Lock()
			defer g.mu.Unlock()
			d.pending--
			g.total--
			if d.pending == 0 {
				g.active--
			}
		})
	}, "", false
}

func (g *dialLimiter) burst() float64 { return max(1, g.lim.Rate) }

// reserve is how many of Pending only a destination with no dial in
// progress may take: a healthy destination's dials end quickly, so it
// finds a slot even while dead ones hold the rest.
func (g *dialLimiter) reserve() int { return max(1, g.lim.Pending/8) }

// fairShareLocked is how many dials in progress a destination may hold
// while the pool is under pressure: a quarter of Pending divided among the
// destinations with dials in progress (d counted among them).
func (g *dialLimiter) fairShareLocked(d *dialDest) int {
	n := g.active
	if d.pending == 0 {
		n++
	}
	return max(1, g.lim.Pending/(4*n))
}

// sweepLocked forgets destinations with nothing to remember.
func (g *dialLimiter) sweepLocked(now time.Time) {
	for k, d := range g.dests {
		if d.pending > 0 || d.win != nil {
			continue
		}
		if g.lim.Rate > 0 && d.tokens+now.Sub(d.at).Seconds()*g.lim.Rate < g.burst() {
			continue
		}
		delete(g.dests, k)
	}
}

// admitDial takes a dial slot for fr's destination (host, or fr's address
// when host is ""). When it cannot, the flow is refused: counted, recorded
// (alone or in its destination's window summary), and admitDial reports
// false; the caller returns without accepting, which resets the sandbox's
// connection. release must be called when the dial has ended.
func (e *Engine) admitDial(fr *flowRecord, host string) (release func(), ok bool) {
	key := dialKey(host, fr)
	now := time.Now()
	release, why, rate := e.dials.admit(key, now)
	if release != nil {
		return release, true
	}
	if rate {
		e.dials.refusedRate.Add(1)
	} else {
		e.dials.refusedPending.Add(1)
	}
	v := verdict{Rule: "dial-limit", Reason: why + ": new connections to it are refused"}
	g := e.dials
	g.mu.Lock()
	d := g.dests[key]
	if d != nil && d.win != nil {
		w := d.win
		if w.n == 0 {
			w.first, w.fr, w.reason = now, fr, why
		}
		w.n++
		w.last = now
		g.mu.Unlock()
		if w.fr != fr && fr.owner != nil && fr.owner.p != nil {
			fr.owner.p.Finish(0) // this one is only counted
		}
		return nil, false
	}
	if d != nil {
		d.win = &refusalWin{}
		time.AfterFunc(RefusalWindow, func() { e.flushRefusals(key, d) })
	}
	g.mu.Unlock()
	e.deny(fr, v)
	return nil, false
}

// flushRefusals writes the summary of a destination's refusal window, if
// it counted any.
func (e *Engine) flushRefusals(key string, d *dialDest) {
	g := e.dials
	g.mu.Lock()
	w := d.win
	d.win = nil
	g.mu.Unlock()
	if w == nil || w.n == 0 {
		return
	}
	what := target(w.fr.Host, w.fr.f.Dst.Addr(), w.fr.f.Dst.Port())
	e.denials.printf("tunwall: denied %d more connections to %s %s within %s: %s", w.n, what, w.fr.f.Proto, RefusalWindow, w.reason)
	if e.cfg.Audit == nil {
		return
	}
	fr := w.fr
	fr.v = verdict{Rule: "dial-limit", Reason: fmt.Sprintf("%d connections to %s refused within %s: %s (the last: %s)",
		w.n, key, RefusalWindow, w.reason, w.last.UTC().Format(time.RFC3339Nano))}
	r := fr.record(audit.KindFlow)
	r.TS = w.first
	r.Count, r.Until = w.n, w.last
	setOwner(&r, fr.owner.wait())
	e.cfg.Audit.Write(r)
}

// flushDialRefusals writes the summary of every refusal window still
// open, at once (Close).
func (e *Engine) flushDialRefusals() {
	g := e.dials
	g.mu.Lock()
	var open []*dialDest
	var keys []string
	for k, d := range g.dests {
		if d.win != nil {
			open = append(open, d)
			keys = append(keys, k)
		}
	}
	g.mu.Unlock()
	for i, d := range open {
		e.flushRefusals(keys[i], d)
	}
}

// DialStats returns the counts of dials refused at Config.DialLimits.
func (e *Engine) DialStats() DialStats {
	return DialStats{RefusedPending: e.dials.refusedPending.Load(), RefusedRate: e.dials.refusedRate.Load()}
}
