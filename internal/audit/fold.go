package audit

import (
	"net/netip"
	"strings"
	"sync"
	"time"
)

// Folding and the rate bound: what keeps a sandbox that repeats itself, or
// floods tunwall with names, from filling the disk (Options.MaxRate,
// FoldWindow, FoldKeys). Everything here but bucket is owned by the writer
// goroutine.

// repeatable reports whether r may be folded: DNS queries (whatever their
// verdict), denied flows and denied HTTP requests. Allowed flows and start records never are:
// each is a flow that moved bytes, or may.
func repeatable(r *Record) bool {
	return r.Kind == KindDNS || ((r.Kind == KindFlow || r.Kind == KindHTTP) && r.Verdict != VerdictAllow)
}

// foldKey is what makes repeatable records the same: everything but the
// time, the source port, the process id and owner note, and the counters.
type foldKey struct {
	kind, proto, verdict string
	src, dst             netip.Addr
	host, hostFrom       string
	port                 uint16
	rule, reason         string
	comm, exe            string
	sni, httpHost        string
	qname, qtype, rcode  string
	method, path         string
	status               int
}

func foldKeyOf(r *Record) foldKey {
	return foldKey{
		kind: r.Kind, proto: r.Proto, verdict: r.Verdict,
		src: r.Src.Addr(), dst: r.Dst.Addr(),
		host: strings.ToLower(r.Host), hostFrom: r.HostFrom, port: r.Port,
		rule: r.Rule, reason: r.Reason, comm: r.Comm, exe: r.Exe,
		sni: r.SNI, httpHost: r.HTTPHost,
		qname: strings.ToLower(r.Qname), qtype: r.Qtype, rcode: r.Rcode,
		method: r.Method, path: r.Path, status: r.Status,
	}
}

// fold counts the repeats of one record within its window.
type fold struct {
	first   Record    // the first occurrence not yet written
	n       int       // occurrences not yet written
	until   time.Time // time of the last of them
	mixed   bool      // they came from more than one process id
	expires time.Time // end of the window
}

func (f *fold) add(r *Record) {
	if f.n == 0 {
		f.first, f.mixed = *r, false
	} else if r.PID != f.first.PID {
		f.mixed = true
	}
	f.n++
	if r.TS.After(f.until) {
		f.until = r.TS
	}
}

// aggKey and agg count records that are not folded one key at a time.
type aggKey struct{ kind, verdict string }

type agg struct {
	n           int
	first, last time.Time
	expires     time.Time
}

func (w *Writer) count(m map[aggKey]*agg, kind, verdict string, n int, first, last, now time.Time) {
	k := aggKey{kind, verdict}
	a := m[k]
	if a == nil {
		a = &agg{first: first, last: last, expires: now.Add(w.foldWindow)}
		m[k] = a
	}
	a.n += n
	if first.Before(a.first) {
		a.first = first
	}
	if last.After(a.last) {
		a.last = last
	}
}

// fold takes a repeatable record: a repeat is counted; a new one is written
// at once if the rate bound leaves more than half its burst, else counted;
// past the size cap, or with the fold table full, it is counted per kind.
func (w *Writer) fold(r *Record, now time.Time) {
	k := foldKeyOf(r)
	if f := w.folds[k]; f != nil {
		f.add(r)
		return
	}
	if w.capped.Load() {
		w.count(w.afterCap, r.Kind, r.Verdict, 1, r.TS, r.TS, now)
		return
	}
	if len(w.folds) >= w.foldKeys {
		w.count(w.overflow, r.Kind, r.Verdict, 1, r.TS, r.TS, now)
		return
	}
	f := &fold{expires: now.Add(w.foldWindow)}
	w.folds[k] = f
	if w.bucket.take(now, w.bucket.burst/2, false) {
		w.emit(r, nil, now)
	} else {
		f.add(r)
	}
}

// expire writes the folds and counts whose window has ended, or all of
// them when closing. A fold with repeats starts a new window; one without
// is forgotten. A fold is written as its own record only within the rate
// bound, the end of the run included; otherwise it is counted per kind and
// verdict.
func (w *Writer) expire(now time.Time, closing bool) {
	for k, f := range w.folds {
		if !closing && now.Before(f.expires) {
			continue
		}
		switch {
		case f.n == 0:
			delete(w.folds, k)
		case w.capped.Load():
			w.count(w.afterCap, f.first.Kind, f.first.Verdict, f.n, f.first.TS, f.until, now)
			delete(w.folds, k)
		case w.bucket.take(now, w.bucket.burst/2, false):
			r := f.first
			r.Count, r.Until = f.n, f.until
			if f.mixed {
				r.PID, r.Owner = 0, "several processes"
			}
			w.emit(&r, nil, now)
			f.n, f.expires = 0, now.Add(w.foldWindow)
			if closing {
				delete(w.folds, k)
			}
		default:
			w.count(w.overflow, f.first.Kind, f.first.Verdict, f.n, f.first.TS, f.until, now)
			delete(w.folds, k)
		}
	}
	for k, a := range w.overflow {
		if !closing && now.Before(a.expires) {
			continue
		}
		delete(w.overflow, k)
		if w.capped.Load() {
			w.count(w.afterCap, k.kind, k.verdict, a.n, a.first, a.last, now)
			continue
		}
		w.emitCount(k, a, RuleOverflow, "counted, not written one by one: more distinct DNS queries and denials within the fold window "+
			"than are tracked, or more than the rate bound allows", now)
	}
	if closing {
		for k, a := range w.afterCap {
			delete(w.afterCap, k)
			w.emitCount(k, a, RuleMaxSize, "counted, not written one by one: the log had reached its size cap", now)
		}
	}
}

func (w *Writer) emitCount(k aggKey, a *agg, rule, reason string, now time.Time) {
	w.emit(&Record{
		TS: a.first, Run: w.run, Phase: w.phase, Kind: k.kind, Verdict: k.verdict,
		Rule: rule, Reason: reason, Count: a.n, Until: a.last,
	}, nil, now)
}

// bucket is the rate bound: a token bucket of lines, refilled at rate a
// second up to burst. Safe for concurrent use (Admit reads it).
type bucket struct {
	mu          sync.Mutex
	rate, burst float64
	tokens      float64
	at          time.Time
}

func (b *bucket) refillLocked(now time.Time) {
	if d := now.Sub(b.at); d > 0 {
		b.tokens = min(b.burst, b.tokens+d.Seconds()*b.rate)
		b.at = now
	}
}

// take spends one line if more than floor+1 is left, or, with force, in any
// case (down to a debt of one burst).
func (b *bucket) take(now time.Time, floor float64, force bool) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.refillLocked(now)
	if !force && b.tokens < floor+1 {
		return false
	}
	b.tokens = max(b.tokens-1, -b.burst)
	return true
}

// has reports whether a line is left.
func (b *bucket) has(now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.refillLocked(now)
	return b.tokens >= 1
}
