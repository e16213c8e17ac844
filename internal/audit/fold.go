package audit

import (
	"cmp"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"
)

// Folding and the rate bound: what keeps a sandbox that repeats itself, or
// floods tunwall with names, from filling the disk (Options.MaxRate,
// FoldWindow, FoldKeys, DenyRate). Everything here but bucket is owned by
// the writer goroutine.
//
// A repeatable record is folded at two grains. Repeats of one record (same
// foldKey) are counted in a fold, written once per window. Denials past
// the denial budget, or beyond the fold table, are counted in a domain fold:
// one per registrable domain, rule and reason, written once per window with
// a few sample names. What finds no line of the budget when its window ends
// is counted per kind and verdict (RuleOverflow).

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
// at once if the rate bound leaves more than half its burst (and, for a
// denial, the denial budget more than half its own), else counted: an
// allowed query as a fold of its own, a denial in its domain's fold. Past
// the size cap it is counted per kind; with the fold table full, an
// allowed query is counted per kind and a denial by domain.
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
	denial := isDenial(r)
	switch {
	case len(w.folds) >= w.foldKeys && denial:
		w.foldDomain(r, 1, r.TS, false, now)
	case len(w.folds) >= w.foldKeys:
		w.count(w.overflow, r.Kind, r.Verdict, 1, r.TS, r.TS, now)
	case w.spend(now, denial, w.bucket.burst/2, w.deny.burst/2):
		w.folds[k] = &fold{expires: now.Add(w.foldWindow)}
		w.emit(r, nil, now)
	case denial:
		w.foldDomain(r, 1, r.TS, false, now)
	default:
		f := &fold{expires: now.Add(w.foldWindow)}
		f.add(r)
		w.folds[k] = f
	}
}

// isDenial reports whether a repeatable record counts against the denial
// budget.
func isDenial(r *Record) bool { return r.Verdict != VerdictAllow }

// spend takes one line of the rate bound, if more than floor is left, and
// for a denial one of the denial budget too, if more than denyFloor is
// left; it takes neither unless both have one. Only the writer goroutine
// takes lines, so what ok saw is still there for take.
func (w *Writer) spend(now time.Time, denial bool, floor, denyFloor float64) bool {
	if denial && !w.deny.ok(now, denyFloor) {
		return false
	}
	if !w.bucket.take(now, floor, false) {
		return false
	}
	if denial {
		w.deny.take(now, denyFloor, true)
	}
	return true
}

// domainKey is what makes denials fold together past the denial budget:
// kind, protocol, verdict, how the name was learnt, rule and reason (with
// the name in it replaced by NameInReason), and the registrable domain of
// the name ("" for a flow to a raw address).
type domainKey struct {
	kind, proto, verdict, hostFrom string
	domain                         string
	rule, reason                   string
}

// domainFold counts the denials of one domainKey within its window.
type domainFold struct {
	first   Record             // the first of them, its names cleared (see foldDomain)
	n       int                // occurrences
	until   time.Time          // time of the last of them
	mixed   bool               // they came from more than one process id
	samples [MaxSamples]string // distinct names, cut to MaxSampleLen; the first ns used
	ns      int
	expires time.Time // end of the window
}

// foldDomain counts n denials like r (the first of them at r.TS, the last
// at until) in the fold of r's domain, which it starts if there is none
// and the domain table has room; otherwise they are counted per kind.
func (w *Writer) foldDomain(r *Record, n int, until time.Time, mixed bool, now time.Time) {
	name := r.Host
	if name == "" {
		name = r.Qname
	}
	domain := ""
	if ip, err := netip.ParseAddr(name); err == nil {
		domain = ip.String() // an address is its own domain, whatever Options.Domain says
	} else if name != "" {
		domain = w.domainFn(name)
	}
	// The reason names the name (or, without one, the address) it was
	// about; folded, it names them in the samples.
	reason := r.Reason
	for _, s := range reasonNames(r, name) {
		reason = strings.ReplaceAll(reason, s, NameInReason)
	}
	k := domainKey{kind: r.Kind, proto: r.Proto, verdict: r.Verdict, hostFrom: r.HostFrom, domain: domain, rule: r.Rule, reason: reason}
	d := w.domains[k]
	if d == nil {
		if len(w.domains) >= w.maxDomains {
			w.count(w.overflow, r.Kind, r.Verdict, n, r.TS, until, now)
			return
		}
		// The names are in the samples: the record names the domain only,
		// and holds no long string of the sandbox's beyond them.
		first := *r
		first.Host, first.Qname, first.SNI, first.HTTPHost, first.Path, first.Reason = domain, "", "", "", "", reason
		if domain == "" {
			first.Dst = netip.AddrPort{} // many addresses: the samples name them
		}
		first.Count, first.Until, first.Samples = 0, time.Time{}, [MaxSamples]string{}
		d = &domainFold{first: first, until: until, expires: now.Add(w.foldWindow)}
		w.domains[k] = d
	}
	if r.PID != d.first.PID {
		mixed = true
	}
	d.n += n
	d.mixed = d.mixed || mixed
	if until.After(d.until) {
		d.until = until
	}
	if d.ns < MaxSamples {
		if s := sampleOf(r); s != "" && !slices.Contains(d.samples[:d.ns], s) {
			d.samples[d.ns] = s
			d.ns++
		}
	}
}

// reasonNames returns what in r's reason names the denial's name: the name
// with and without its trailing dot, or, for a flow with no name, its
// destination with and without its port. Longest first.
func reasonNames(r *Record, name string) []string {
	switch {
	case name != "" && strings.HasSuffix(name, ".") && len(name) > 1:
		return []string{name, name[:len(name)-1]}
	case name != "":
		return []string{name}
	case r.Dst.IsValid():
		return []string{r.Dst.String(), r.Dst.Addr().String()}
	}
	return nil
}

// sampleOf is how a record folded by domain is named among its samples: a
// query's name, a flow's host (or address) and port, a request's host and
// path; cut to MaxSampleLen bytes, at a character boundary, ending in
// "..." when cut.
func sampleOf(r *Record) string {
	var s string
	switch {
	case r.Kind == KindDNS && r.Qname != "":
		s = r.Qname
	case r.Kind == KindHTTP:
		s = r.Host + r.Path
	case r.Host != "":
		s = r.Host + ":" + strconv.Itoa(int(r.Port))
	case r.Dst.IsValid():
		s = r.Dst.String()
	}
	if len(s) <= MaxSampleLen {
		return strings.Clone(s)
	}
	cut := MaxSampleLen - len("...")
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "..."
}

// RegistrableDomain approximates a name's registrable domain (eTLD+1)
// without a public suffix list: its last two labels, in lower case without
// a trailing dot (a.b.example.com: example.com), or the name itself if it
// has fewer labels or is an IP address. Under a multi-label public suffix
// it names the suffix instead (x.example.co.uk: co.uk), which folds more
// domains together than the list would; Options.Domain replaces it.
func RegistrableDomain(name string) string {
	name = strings.ToLower(strings.TrimSuffix(name, "."))
	if _, err := netip.ParseAddr(name); err == nil {
		return name
	}
	i := strings.LastIndexByte(name, '.')
	if i <= 0 {
		return name
	}
	if j := strings.LastIndexByte(name[:i], '.'); j >= 0 {
		return name[j+1:]
	}
	return name
}

// expire writes the folds and counts whose window has ended, or all of
// them when closing. A fold with repeats starts a new window; one without
// is forgotten. A fold is written as its own record only within the rate
// bound (and a denial's within the denial budget), the end of the run
// included; otherwise a denial's repeats go to its domain's fold, and
// other repeats are counted per kind and verdict. Then the domain folds
// whose window has ended are written, the largest first, as far as the
// budgets go; the rest are counted per kind and verdict.
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
		case w.spend(now, isDenial(&f.first), w.bucket.burst/2, 0):
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
		case isDenial(&f.first):
			w.foldDomain(&f.first, f.n, f.until, f.mixed, now)
			delete(w.folds, k)
		default:
			w.count(w.overflow, f.first.Kind, f.first.Verdict, f.n, f.first.TS, f.until, now)
			delete(w.folds, k)
		}
	}
	w.expireDomains(now, closing)
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
			"than are tracked, or more than the rate bound or the denial budget allows", now)
	}
	if closing {
		for k, a := range w.afterCap {
			delete(w.afterCap, k)
			w.emitCount(k, a, RuleMaxSize, "counted, not written one by one: the log had reached its size cap", now)
		}
	}
}

// expireDomains writes the domain folds whose window has ended (all of
// them when closing), largest first, while the budgets last, and counts
// the others per kind and verdict.
func (w *Writer) expireDomains(now time.Time, closing bool) {
	var due []*domainFold
	for k, d := range w.domains {
		if closing || !now.Before(d.expires) {
			due = append(due, d)
			delete(w.domains, k)
		}
	}
	slices.SortFunc(due, func(a, b *domainFold) int {
		return cmp.Or(cmp.Compare(b.n, a.n), a.first.TS.Compare(b.first.TS))
	})
	for _, d := range due {
		switch {
		case w.capped.Load():
			w.count(w.afterCap, d.first.Kind, d.first.Verdict, d.n, d.first.TS, d.until, now)
		case w.spend(now, true, w.bucket.burst/2, 0):
			r := d.first
			r.Count, r.Until, r.Samples = d.n, d.until, d.samples
			if d.mixed {
				r.PID, r.Owner = 0, "several processes"
			}
			w.emit(&r, nil, now)
		default:
			w.count(w.overflow, d.first.Kind, d.first.Verdict, d.n, d.first.TS, d.until, now)
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
func (b *bucket) has(now time.Time) bool { return b.ok(now, 0) }

// ok reports whether take would spend a line above floor, without taking it.
func (b *bucket) ok(now time.Time, floor float64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.refillLocked(now)
	return b.tokens >= floor+1
}
