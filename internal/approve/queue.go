package approve

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/publicsuffix"

	"github.com/tunwall/tunwall/flow"
	"github.com/tunwall/tunwall/internal/audit"
)

// Scope says how long an approval (or a denial) stands.
type Scope string

// Scopes.
const (
	ScopeOnce   Scope = "once"   // this request (a name: its answer, and connections to it on 443/tcp for OnceFor)
	ScopeRun    Scope = "run"    // the rest of the run
	ScopeAlways Scope = "always" // the rest of the run, and appended to the overlay for the runs after it
)

// ParseScope parses a scope; "" is once.
func ParseScope(s string) (Scope, error) {
	switch Scope(s) {
	case "":
		return ScopeOnce, nil
	case ScopeOnce, ScopeRun, ScopeAlways:
		return Scope(s), nil
	}
	return "", fmt.Errorf("scope %q: want once, run or always", s)
}

// Protos of a Request.
const (
	ProtoDNS = "dns" // a DNS name (Port 0)
	ProtoTCP = "tcp"
	ProtoUDP = "udp"
)

// Request is one question held for a decision. ID and Since are set by
// Ask; the rest by the caller.
type Request struct {
	ID    string    `json:"id"`
	Phase string    `json:"phase"`
	Proto string    `json:"proto"`
	Host  string    `json:"host"`
	Port  uint16    `json:"port"`
	PID   int       `json:"pid"`
	Comm  string    `json:"comm"`
	Exe   string    `json:"exe"`
	Since time.Time `json:"-"`
}

// The ports a name approval covers: those of a rule naming the host
// alone (policy's default, 443/tcp).
const (
	namePort  = 443
	nameProto = ProtoTCP
)

// Rules of the decisions the queue gives.
const (
	RuleApproval = "approval"       // an approval or a denial (its reason says by whom, for how long)
	RuleBound    = "approval-bound" // denied at once: the pending set was full
)

// Defaults of Config.
const (
	DefaultMaxPending   = 64
	DefaultMaxPerDomain = 8
	DefaultMaxWaiters   = 32
	DefaultTimeout      = 30 * time.Second
	DefaultOnceFor      = 60 * time.Second
	maxStanding         = 4096 // standing approvals and denials of a run
)

// Config configures a Queue. Zero values mean the defaults above.
type Config struct {
	// MaxPending bounds the requests pending at once; past it a new one
	// is denied at once, and recorded.
	MaxPending int
	// MaxPerDomain bounds the requests pending at once for names under
	// one registrable domain (a flood of random subdomains of one domain
	// takes at most this many places).
	MaxPerDomain int
	// MaxWaiters bounds the callers waiting on one request; more are told
	// it is still pending at once.
	MaxWaiters int
	// Timeout is how long a request waits for a decision; then it is
	// denied (fail closed).
	Timeout time.Duration
	// OnceFor is how long a name approved once keeps answering (its DNS
	// answer's TTL) and its connections are allowed.
	OnceFor time.Duration
	// Decider is the external decider (package decider's Process); nil
	// for none.
	Decider Decider
	// Overlay is where "always" approvals go; nil when the run has no
	// policy file to put one next to (then "always" is refused).
	Overlay *Overlay
	// Record receives one approval record per request held, answered or
	// denied at once; nil records none.
	Record func(audit.Record)
	// Stderr receives what the queue says once (a dead decider); nil
	// discards.
	Stderr io.Writer
	// Logger is the operational log; nil discards.
	Logger *slog.Logger
}

// pending is one held request.
type pending struct {
	req     Request
	domain  string
	waiters int
	timer   *time.Timer
	done    chan struct{} // closed once dec is set
	dec     flow.Decision
}

// standing is an approval (or a denial) of a run.
type standing struct {
	allow bool
	until time.Time // zero: for the run
	d     flow.Decision
}

// key of a request and of a standing decision: approvals are per phase.
type key struct {
	phase, proto, host string
	port               uint16
}

// Queue is the pending set of one run. It is safe for concurrent use.
type Queue struct {
	cfg Config
	log *slog.Logger

	mu       sync.Mutex
	closed   bool
	pending  map[string]*pending
	byKey    map[key]*pending
	byDomain map[string]int
	grants   map[key]standing // standing decisions
	dec      Decider          // nil: none configured
	deadWhy  string           // why the decider is gone ("" while it runs)
}

// New builds a Queue and starts its decider, if any.
func New(cfg Config) (*Queue, error) {
	if cfg.MaxPending < 0 || cfg.MaxPerDomain < 0 || cfg.MaxWaiters < 0 || cfg.Timeout < 0 || cfg.OnceFor < 0 {
		return nil, errors.New("approve: negative bound")
	}
	if cfg.MaxPending == 0 {
		cfg.MaxPending = DefaultMaxPending
	}
	if cfg.MaxPerDomain == 0 {
		cfg.MaxPerDomain = DefaultMaxPerDomain
	}
	if cfg.MaxWaiters == 0 {
		cfg.MaxWaiters = DefaultMaxWaiters
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.OnceFor == 0 {
		cfg.OnceFor = DefaultOnceFor
	}
	if cfg.Stderr == nil {
		cfg.Stderr = io.Discard
	}
	q := &Queue{cfg: cfg, log: cfg.Logger, pending: map[string]*pending{}, byKey: map[key]*pending{},
		byDomain: map[string]int{}, grants: map[key]standing{}}
	if q.log == nil {
		q.log = slog.New(slog.DiscardHandler)
	}
	if cfg.Decider != nil {
		q.dec = cfg.Decider
		q.dec.Serve(q)
	}
	return q, nil
}

// Decider is an external decider: it is sent each new request, and
// answers through the Queue's Decide, or gives up through DeciderDied.
type Decider interface {
	// Serve starts the decider's conversation with q; New calls it once.
	Serve(q *Queue)
	// Send sends a new request. It is called with the Queue's lock held
	// and must not block (nor call the Queue).
	Send(r Request)
	// Stop ends the decider; Close calls it.
	Stop()
}

// Close denies every pending request (their waiters return at once) and
// stops the decider. Later Asks are denied. It may be called more than
// once.
func (q *Queue) Close() {
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return
	}
	q.closed = true
	ps := q.sortedLocked()
	d := q.dec
	q.mu.Unlock()
	for _, p := range ps {
		q.Decide(p.req.ID, false, ScopeOnce, "tunwall", "the run ended", audit.OutcomeDenied)
	}
	if d != nil {
		d.Stop()
	}
}

// Granted returns the standing approval of host on port/proto (ProtoDNS:
// of the name) in phase, if there is one.
func (q *Queue) Granted(phase, host string, port uint16, proto string) (flow.Decision, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.grantedLocked(phase, host, port, proto)
}

func (q *Queue) grantedLocked(phase, host string, port uint16, proto string) (flow.Decision, bool) {
	k := key{phase, nameProto, host, namePort}
	if proto != ProtoDNS {
		k = key{phase, proto, host, port}
	}
	g, ok := q.grants[k]
	if !ok || !g.allow {
		return flow.Decision{}, false
	}
	if !g.until.IsZero() && time.Now().After(g.until) {
		delete(q.grants, k)
		return flow.Decision{}, false
	}
	return g.d, true
}

// Ask holds r until it is decided or ctx is done, and returns the
// decision, or pending true when there was none by then (the request
// stays pending: the caller's client asks again). A standing approval or
// denial answers at once; past the bounds r is denied at once.
func (q *Queue) Ask(ctx context.Context, r Request) (flow.Decision, bool) {
	q.mu.Lock()
	if d, ok := q.grantedLocked(r.Phase, r.Host, r.Port, r.Proto); ok {
		q.mu.Unlock()
		return d, false
	}
	k := keyOf(r)
	if g, ok := q.grants[k]; ok && !g.allow {
		q.mu.Unlock()
		return g.d, false
	}
	if q.closed {
		q.mu.Unlock()
		return flow.Decision{Rule: RuleApproval, Reason: "not asked: the run is ending"}, false
	}
	if q.dec != nil && q.deadWhy != "" {
		why := q.deadWhy
		q.mu.Unlock()
		d := flow.Decision{Rule: RuleApproval, Reason: "not asked: " + why}
		q.record(r, audit.OutcomeDenied, d, "decider")
		return d, false
	}
	p := q.byKey[k]
	if p != nil {
		if p.waiters >= q.cfg.MaxWaiters {
			q.mu.Unlock()
			return pendingDecision(p.req.ID), true
		}
	} else {
		dom := registrable(r.Host)
		if len(q.pending) >= q.cfg.MaxPending || q.byDomain[dom] >= q.cfg.MaxPerDomain {
			n, nd := len(q.pending), q.byDomain[dom]
			q.mu.Unlock()
			d := flow.Decision{Rule: RuleBound, Reason: fmt.Sprintf("denied at once: %d requests pending (at most %d), %d under %s (at most %d)", n, q.cfg.MaxPending, nd, dom, q.cfg.MaxPerDomain)}
			q.record(r, audit.OutcomeDenied, d, "bound")
			return d, false
		}
		r.ID = q.newIDLocked()
		r.Since = time.Now()
		p = &pending{req: r, domain: dom, done: make(chan struct{})}
		q.pending[r.ID] = p
		q.byKey[k] = p
		q.byDomain[dom]++
		id := r.ID
		p.timer = time.AfterFunc(q.cfg.Timeout, func() {
			q.Decide(id, false, ScopeOnce, "timeout", fmt.Sprintf("no decision within %v", q.cfg.Timeout), audit.OutcomeTimeout)
		})
		q.record(r, audit.OutcomePending, pendingDecision(r.ID), "")
		if q.dec != nil {
			q.dec.Send(r)
		}
	}
	p.waiters++
	q.mu.Unlock()

	select {
	case <-p.done:
		q.mu.Lock()
		p.waiters--
		q.mu.Unlock()
		return p.dec, false
	case <-ctx.Done():
		q.mu.Lock()
		p.waiters--
		q.mu.Unlock()
		select {
		case <-p.done:
			return p.dec, false
		default:
		}
		return pendingDecision(p.req.ID), true
	}
}

func pendingDecision(id string) flow.Decision {
	return flow.Decision{Rule: RuleApproval, Reason: "awaiting approval (request " + id + ")"}
}

func keyOf(r Request) key { return key{r.Phase, r.Proto, r.Host, r.Port} }

// newIDLocked returns an unused random ID: 8 hex digits, short enough to
// type, never a counter (a sandbox learns nothing from one it saw).
func (q *Queue) newIDLocked() string {
	for {
		var b [4]byte
		rand.Read(b[:])
		id := hex.EncodeToString(b[:])
		if _, ok := q.pending[id]; !ok {
			return id
		}
	}
}

// ErrUnknown is Decide's error for an ID that is not pending (never was,
// or already decided).
var ErrUnknown = errors.New("no such pending request (decided already, timed out, or never asked)")

// Decide answers the pending request id: allow or deny, for scope, by
// whom (for the record: "decider", "ctl uid 1000 pid 42", "timeout", ...)
// and why. Its waiters return at once. An "always" approval is appended
// to the overlay; if that fails the approval stands for the run and the
// error is returned. outcome is the approval record's outcome ("" for
// the default: approved or denied).
func (q *Queue) Decide(id string, allow bool, scope Scope, by, why, outcome string) error {
	if scope == ScopeAlways && allow && q.cfg.Overlay == nil {
		return errors.New("--always needs the run's policy file (--policy FILE), next to which the overlay is written; use --run")
	}
	q.mu.Lock()
	p := q.pending[id]
	if p == nil {
		q.mu.Unlock()
		return ErrUnknown
	}
	delete(q.pending, id)
	k := keyOf(p.req)
	delete(q.byKey, k)
	if q.byDomain[p.domain]--; q.byDomain[p.domain] <= 0 {
		delete(q.byDomain, p.domain)
	}
	p.timer.Stop()
	d := flow.Decision{Rule: RuleApproval + ":" + string(scope)}
	verb := "denied"
	if allow {
		d.Verdict = flow.Allow
		verb = "allowed"
	}
	d.Reason = fmt.Sprintf("%s (%s) by %s", verb, scope, by)
	if why != "" {
		d.Reason += ": " + why
	}
	if outcome == "" {
		outcome = audit.OutcomeDenied
		if allow {
			outcome = audit.OutcomeApproved
		}
	}
	switch {
	case allow && p.req.Proto == ProtoDNS:
		// A name approval covers the name's answers and its connections
		// on 443/tcp, as a rule naming the host alone would.
		st := standing{allow: true, d: d}
		if scope == ScopeOnce {
			st.until = time.Now().Add(q.cfg.OnceFor)
		}
		q.standLocked(key{p.req.Phase, nameProto, p.req.Host, namePort}, st)
	case allow && scope != ScopeOnce:
		q.standLocked(k, standing{allow: true, d: d})
	case !allow && scope != ScopeOnce:
		q.standLocked(k, standing{d: d})
	}
	p.dec = d
	q.mu.Unlock()
	// The record comes before the waiters wake: the flow a waiter goes on
	// to record is never in the chain ahead of the decision it rests on.
	q.record(p.req, outcome, d, by)
	close(p.done)
	if allow && scope == ScopeAlways {
		if err := q.cfg.Overlay.Add(p.req, by); err != nil {
			fmt.Fprintf(q.cfg.Stderr, "tunwall: --ask: %s approved for this run, but not saved: %v\n", p.req.Host, err)
			return fmt.Errorf("approved for this run, but not saved: %w", err)
		}
	}
	return nil
}

// standLocked keeps a standing decision, within maxStanding (past it an
// expired one makes room, or none is kept: the request alone was decided).
func (q *Queue) standLocked(k key, st standing) {
	if _, ok := q.grants[k]; !ok && len(q.grants) >= maxStanding {
		now := time.Now()
		for k2, g := range q.grants {
			if !g.until.IsZero() && now.After(g.until) {
				delete(q.grants, k2)
			}
		}
		if len(q.grants) >= maxStanding {
			q.log.Warn("approvals: too many standing decisions; this one is for its request only", "host", k.host)
			return
		}
	}
	q.grants[k] = st
}

// SetPhase denies what is pending for another phase than phase, the one
// now in effect: approving it would allow nothing now (approvals are per
// phase), and its lookups should not wait for that.
func (q *Queue) SetPhase(phase string) {
	q.mu.Lock()
	var other []string
	for _, p := range q.sortedLocked() {
		if p.req.Phase != phase {
			other = append(other, p.req.ID)
		}
	}
	q.mu.Unlock()
	for _, id := range other {
		q.Decide(id, false, ScopeOnce, "tunwall", "the phase changed to "+phase, audit.OutcomeDenied)
	}
}

// Len is how many requests are pending.
func (q *Queue) Len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.pending)
}

// Pending returns the pending requests, oldest first.
func (q *Queue) Pending() []Request {
	q.mu.Lock()
	defer q.mu.Unlock()
	var out []Request
	for _, p := range q.sortedLocked() {
		out = append(out, p.req)
	}
	return out
}

func (q *Queue) sortedLocked() []*pending {
	ps := make([]*pending, 0, len(q.pending))
	for _, p := range q.pending {
		ps = append(ps, p)
	}
	slices.SortFunc(ps, func(a, b *pending) int { return a.req.Since.Compare(b.req.Since) })
	return ps
}

// DeciderDied denies every pending request and, from then on, every new
// one; it says so on stderr once. why completes "the decider ...".
func (q *Queue) DeciderDied(why string) {
	q.mu.Lock()
	if q.deadWhy != "" || q.closed {
		q.mu.Unlock()
		return
	}
	q.deadWhy = "the decider " + why
	ps := q.sortedLocked()
	q.mu.Unlock()
	fmt.Fprintf(q.cfg.Stderr, "tunwall: --decider %s: every request it was asked and will be asked is denied (fail closed); tunwall ctl allow|deny still answer those pending\n", why)
	for _, p := range ps {
		q.Decide(p.req.ID, false, ScopeOnce, "decider", "it "+why, audit.OutcomeDenied)
	}
}

// record writes an approval record for r.
func (q *Queue) record(r Request, outcome string, d flow.Decision, by string) {
	if q.cfg.Record == nil {
		return
	}
	rec := audit.Record{
		TS:       time.Now(),
		Kind:     audit.KindApproval,
		Proto:    r.Proto,
		Host:     r.Host,
		HostFrom: audit.HostFromDNS,
		Port:     r.Port,
		Verdict:  audit.VerdictDeny,
		Rule:     d.Rule,
		Reason:   d.Reason,
		PID:      r.PID,
		Comm:     r.Comm,
		Exe:      r.Exe,
		Outcome:  outcome,
		Qname:    r.Host,
	}
	if r.Proto != ProtoDNS {
		rec.HostFrom, rec.Qname = audit.HostFromNone, ""
	}
	if d.Allowed() {
		rec.Verdict = audit.VerdictAllow
	}
	if by != "" && !strings.Contains(rec.Reason, by) {
		rec.Reason += " (" + by + ")"
	}
	q.cfg.Record(rec)
}

// registrable is name's registrable domain (the public suffix plus one
// label), or name itself when it has none.
func registrable(name string) string {
	if d, err := publicsuffix.EffectiveTLDPlusOne(name); err == nil {
		return d
	}
	return name
}
