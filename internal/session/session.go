package session

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tunwall/tunwall/dnsintercept"
	"github.com/tunwall/tunwall/internal/approve"
	"github.com/tunwall/tunwall/internal/audit"
	"github.com/tunwall/tunwall/internal/control"
	"github.com/tunwall/tunwall/internal/engine"
	"github.com/tunwall/tunwall/internal/l7"
	"github.com/tunwall/tunwall/internal/procattr"
	"github.com/tunwall/tunwall/policy"
	"github.com/tunwall/tunwall/stack"
)

// Session is one served sandbox. Its methods may be called from any
// goroutine, but Start and Close each at most once.
type Session struct {
	o Options

	pool     *dnsintercept.Pool
	resolver *dnsintercept.Resolver
	audit    *audit.Writer // nil with Audit.Off
	// auditNow is audit while it is open, for the control socket's
	// goroutines (undo clears it before closing the log).
	auditNow    atomic.Pointer[audit.Writer]
	counts      *control.Counts
	started0    time.Time
	controlOnce sync.Once // serveControl
	controlErr  error
	metricsSrv  *http.Server
	metricsDone chan struct{}
	attr        *procattr.Resolver
	engine      *engine.Engine
	approvals   *approve.Queue // nil without --ask
	// deciderTaken: approvals owns Options.Ask.Decider (and stops it)
	deciderTaken bool
	stack        *stack.Stack // nil until Start
	// memHigh is where the stack's memory watch says whether memory in
	// use is past its mark, for the engine's name checks to read.
	memHigh  atomic.Bool
	run      string
	auditLog string // the log's path; "" with Audit.Off
	// phase and polSHA are the phase in effect and the SHA-256 of the
	// policy it came from ("" none); steerMu serialises changes of the
	// policy (steer.go).
	phase, polSHA atomic.Pointer[string]
	steerMu       sync.Mutex
	pruned        string // what pruning the audit folder said, for WriteBanner

	mu        sync.Mutex // guards started, closed, stack and attr
	started   bool
	closed    bool
	closeOnce sync.Once
	report    Report
	closeErr  error
}

// ErrStarted and ErrClosed are Start's errors when the session is serving
// already, or closed.
var (
	ErrStarted = errors.New("session: already started")
	ErrClosed  = errors.New("session: closed")
)

// AuditLostError is Close's error when the audit log is incomplete:
// records were lost, or the log could not be closed.
type AuditLostError struct {
	Lost int   // records that could not be written
	Err  error // the log's first error, if any
}

func (e *AuditLostError) Error() string {
	return fmt.Sprintf("the audit log is incomplete: %d audit records were lost (%v)", e.Lost, e.Err)
}

func (e *AuditLostError) Unwrap() error { return e.Err }

// New builds a session from o: the fake pool, the resolver, the audit log
// (its header records every setting), process attribution and the engine.
// Nothing is served until Start. On error, everything New built is undone
// and o.DiagFD is closed.
func New(o Options) (s *Session, err error) {
	diag := o.DiagFD
	if diag < 1 {
		diag = -1
	}
	s = &Session{counts: control.NewCounts(), started0: time.Now()}
	if o.Rules != nil {
		phase, sha := o.Rules.Phase(), ""
		if o.PolicySource != nil {
			sum := sha256.Sum256(o.PolicySource)
			sha = hex.EncodeToString(sum[:])
		}
		s.phase.Store(&phase)
		s.polSHA.Store(&sha)
	}
	defer func() {
		// The one place the descriptor is closed, unless attribution
		// took it: on error, unaudited, or attribution failing.
		if diag >= 0 {
			closeFD(diag)
		}
		if err != nil {
			s.undo()
			// What the session would have owned, it closes.
			if d := o.Ask.Decider; d != nil && !s.deciderTaken {
				d.In.Close()
				d.Kill()
				d.Wait()
				d.Out.Close()
			}
			if o.Control != nil {
				o.Control.Close()
			}
			if o.Metrics != nil {
				o.Metrics.Close()
			}
			s = nil
		}
	}()
	if o, err = o.withDefaults(); err != nil {
		return s, err
	}
	s.o = o
	if err = s.newDNS(); err != nil {
		return s, err
	}
	s.run = o.Run
	if s.run == "" {
		s.run = audit.NewRunID()
	} else if !validRun(s.run) {
		return s, fmt.Errorf("%w: Run %q is not a run id (letters, digits, '-' and '_', at most 64)", ErrOptions, s.run)
	}
	if o.Audit.Off {
		// No audit log, no attribution: the engine records nothing.
		return s, s.newEngine(nil)
	}
	if err = s.openAudit(); err != nil {
		return s, err
	}
	if diag >= 0 {
		a, aerr := procattr.New(procattr.Config{DiagFD: diag, NetNS: o.NetNS})
		if aerr != nil {
			o.Logger.Warn("process attribution off", "err", aerr)
		} else {
			s.attr, diag = a, -1 // the Resolver owns it now
		}
	}
	return s, s.newEngine(s.audit)
}

// newDNS builds the Session's fake-address pool and its upstream
// resolver from o.Plan and o.DNS.
func (s *Session) newDNS() (err error) {
	o := s.o
	reuse := o.DNS.PoolIdle
	if reuse < 0 {
		reuse = -1 // never
	}
	s.pool, err = dnsintercept.NewPoolWith(o.Plan.Fake4, o.Plan.Fake6, o.Plan.Reserved, dnsintercept.PoolOptions{
		Size:       o.DNS.PoolSize,
		Pinned:     exactNames(o.Rules),
		ReuseAfter: reuse,
	})
	if err != nil {
		return fmt.Errorf("--dns-pool-size %d: %w", o.DNS.PoolSize, err)
	}
	if o.DNS.Resolver != nil {
		s.resolver = o.DNS.Resolver // shared, not ours: never closed or changed here
		return nil
	}
	s.resolver, err = dnsintercept.NewResolver(dnsintercept.ResolverConfig{
		Servers:       o.DNS.Upstream,
		HostsFile:     o.DNS.HostsFile,
		Search:        o.DNS.Search,
		ServerTimeout: o.DNS.ServerTimeout,
	})
	return err
}

// auditHeader is the audit log's header line for run s.run.
func (s *Session) auditHeader() audit.Header {
	o := s.o
	hdr := audit.Header{
		Run:     s.run,
		Phase:   o.Rules.Phase(),
		Version: o.Version,
		Policy:  o.PolicyFile,
		Argv:    o.Argv,
		Config:  s.knobs(),
		Labels:  o.Audit.Labels,
	}
	if o.PolicySource != nil {
		sum := sha256.Sum256(o.PolicySource)
		hdr.PolicySHA256 = hex.EncodeToString(sum[:])
	}
	return hdr
}

// openAudit opens the run's audit log (o.Audit.Path, or a per-run file
// in the state directory, whose old runs it then prunes) and sets
// s.audit and s.auditLog. A write error or a bound reached is said on
// o.Stderr.
func (s *Session) openAudit() (err error) {
	o := s.o
	stderr := o.Stderr
	path := o.Audit.Path
	if path == "" && o.Audit.Stream != nil {
		path = "<stream " + o.Audit.Stream.ID() + ">"
	}
	if path == "" {
		if path, err = DefaultAuditPath(s.run); err != nil {
			return err
		}
	}
	file := path
	if o.Audit.Stream != nil {
		file = "" // audit.Open takes one or the other
	}
	s.audit, err = audit.Open(audit.Options{
		Path:    file,
		Stream:  o.Audit.Stream,
		Header:  s.auditHeader(),
		MaxSize: o.Audit.MaxSize,
		MaxRate: o.Audit.MaxRate,
		Domain:  registrableDomain,
		OnError: func(err error) {
			fmt.Fprintf(stderr, "tunwall: audit log %s cannot be written: %v; denying new flows\n", path, err)
		},
		// Said once per bound, even when quiet: it changes what the
		// sandbox may do.
		OnLimit: func(err error) {
			switch {
			case errors.Is(err, audit.ErrSizeCap):
				fmt.Fprintf(stderr, "tunwall: audit log %s reached its size cap of %s (--audit-max-size): new flows and DNS queries are denied for the rest of the run\n",
					path, HumanBytes(o.Audit.MaxSize))
			default:
				fmt.Fprintf(stderr, "tunwall: audit log %s: more than %d lines a second (--audit-max-rate rate bound): new flows and DNS queries are denied whenever that is so\n",
					path, o.Audit.MaxRate)
			}
		},
	})
	if err != nil {
		// audit.Open's errors say "audit: ..." already.
		return err
	}
	s.auditLog = path
	s.auditNow.Store(s.audit)
	if o.Audit.Path == "" && o.Audit.Stream == nil {
		// Only the state directory's own per-run files, never a given path.
		// Said once (WriteBanner), and not at all under --quiet.
		var said strings.Builder
		PruneAuditDir(filepath.Dir(path), path, o.Audit.Keep, o.Audit.KeepDays, time.Now(), &said)
		s.pruned = said.String()
	}
	return nil
}

// dial is the engine's direct dial of what the stack's flows do not dial
// themselves (a TCP flow from the sandbox dials through its request:
// stack.TCPRequest.Dial): UDP, and the SOCKS5 front end's flows.
func (s *Session) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, network, addr)
}

// newEngine builds the terminator (when a rule terminates flows) and the
// engine; w nil means no audit log.
func (s *Session) newEngine(w *audit.Writer) error {
	o := s.o
	var term *l7.Terminator
	if ca := o.Credentials.caOrNil(); ca != nil {
		var err error
		if term, err = l7.New(l7.Config{
			CA:      ca,
			Rules:   o.Rules,
			Secrets: o.Credentials.secrets(),
			Roots:   o.Roots,
			CARoots: o.CARoots,
			Logger:  o.Logger,
			Learn:   o.Learn,
		}); err != nil {
			return err
		}
	}
	cfg := engine.Config{
		L7:           term,
		Secrets:      o.Credentials.secrets(),
		Rules:        o.Rules,
		Learn:        o.Learn,
		Pool:         s.pool,
		Resolver:     s.resolver,
		Logger:       o.Logger,
		SniffTimeout: o.Limits.SniffTimeout,
		MaxHeld:      o.Limits.MaxMemory / 16,
		MemoryHigh:   s.memHigh.Load,
		DialTimeout:  o.Limits.DialTimeout,
		Dial:         s.dial,
		DialLimits: engine.DialLimits{
			Pending: o.Limits.MaxTCPHandshakes,
			PerDest: o.Limits.MaxDialsPerDest,
			Rate:    o.Limits.DialRate,
		},
		DNSLimits: dnsintercept.Limits{MaxTCPConns: o.DNS.MaxTCP, MaxUDPSessions: o.DNS.MaxUDP},
	}
	// Interfaces holding a nil pointer are not nil: set them only when set.
	if o.upstream != nil {
		cfg.Upstream = o.upstream
	}
	if w != nil {
		cfg.Audit = countingRecorder{w: w, counts: s.counts, phase: &s.phase}
	}
	if s.attr != nil {
		cfg.Attr = s.attr
	}
	if !o.Quiet {
		cfg.Denials = o.Stderr
	}
	if o.Ask.On {
		ac := approve.Config{Timeout: o.Ask.Timeout, Stderr: o.Stderr, Logger: o.Logger}
		if o.Ask.Decider != nil {
			ac.Decider = approve.NewProcess(*o.Ask.Decider, 0)
		}
		if o.Ask.Overlay != "" {
			ac.Overlay = &approve.Overlay{Path: o.Ask.Overlay}
		}
		if cfg.Audit != nil {
			ac.Record = cfg.Audit.Write
		}
		q, err := approve.New(ac)
		if err != nil {
			return err
		}
		s.approvals, s.deciderTaken = q, true
		cfg.Ask = q
	} else if o.Ask.Decider != nil {
		return fmt.Errorf("%w: Ask.Decider without Ask.On", ErrOptions)
	}
	var err error
	s.engine, err = engine.New(cfg)
	return err
}

// Start serves the sandbox's TUN: it builds the stack on tunFD, whose
// packets from then on reach the engine. The session owns tunFD from the
// call on, whether Start succeeds or not.
func (s *Session) Start(tunFD int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.closed:
		closeFD(tunFD)
		return ErrClosed
	case s.started:
		closeFD(tunFD)
		return ErrStarted
	}
	s.started = true
	o := s.o
	st, err := stack.New(stack.Config{
		FD:      tunFD,
		MTU:     uint32(o.MTU),
		Handler: s.engine,
		Logger:  o.Logger,
		// The sandbox's own addresses: the only sources its packets may have.
		Sources:        []netip.Prefix{o.Plan.Addr4, o.Plan.Addr6},
		MaxTCPFlows:    o.Limits.MaxTCPFlows,
		MaxUDPSessions: o.Limits.MaxUDPSessions,
		MaxInFlightTCP: o.Limits.MaxTCPHandshakes,
		// A destination may hold four times the dials it may have in
		// progress (1024 by default: a sixteenth of the default slots).
		// Where --max-tcp-handshakes is no larger, its own limit and the
		// engine's per-destination dial limit are what hold.
		MaxInFlightPerDest: 4 * max(o.Limits.MaxDialsPerDest, 1),
		HandshakeTimeout:   o.Limits.HandshakeTimeout,
		BufferBudget:       int(o.Limits.MaxMemory / 16),
		MemoryLimit:        o.Limits.MaxMemory,
		MemoryHigh:         &s.memHigh,
	})
	if err != nil {
		closeFD(tunFD)
		return err // the stack's errors say "stack: ..." already
	}
	s.stack = st
	// Served from now on: the control socket asks the stack for counts.
	return s.serveControl()
}

// PeerGone is closed when the sandbox's end of the TUN goes away (its
// namespace is gone); nil, which never fires, before Start.
func (s *Session) PeerGone() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stack == nil {
		return nil
	}
	return s.stack.PeerGone()
}

// Run is the run's id, as the audit log records it.
func (s *Session) Run() string { return s.run }

// AuditPath is the audit log's path; "" when the run is not audited.
func (s *Session) AuditPath() string { return s.auditLog }

// Stats are the session's counters, for a stats line.
type Stats struct {
	Stack *stack.Stats    // nil before Start
	Attr  *procattr.Stats // nil without attribution
}

// Stats reads the counters.
func (s *Session) Stats() Stats {
	var out Stats
	s.mu.Lock()
	st, attr := s.stack, s.attr
	s.mu.Unlock()
	if st != nil {
		x := st.Stats()
		out.Stack = &x
	}
	if attr != nil {
		a := attr.Stats()
		out.Attr = &a
	}
	return out
}

// WriteBanner writes what a front end says once the session is built:
// that it is not audited (always), else its run, phase and audit log, and
// what pruning the audit folder removed (both unless Options.Quiet).
// New, Start and Close print nothing themselves.
func (s *Session) WriteBanner(w io.Writer) {
	o := s.o
	switch {
	case o.Audit.Off:
		fmt.Fprintf(w, "tunwall: WARNING: run %s is not audited (--audit off): no flow or query is recorded\n", s.run)
	case !o.Quiet:
		mode := ""
		if o.Learn {
			mode = " (learn mode: allowing what the guard allows)"
		}
		fmt.Fprintf(w, "tunwall: run %s, phase %q%s, audit log %s\n", s.run, o.Rules.Phase(), mode, s.auditLog)
		io.WriteString(w, s.pruned)
	}
}

// Report is what a closed session has to say, for its front end to print
// (Write): what the stack and the DNS server dropped or refused, the dial
// limits reached, and the audit log's totals and its end.
type Report struct {
	Stack             *stack.Stats // nil if the session never served
	RefusedUnrecorded uint64
	DNS               dnsintercept.Stats
	Dial              engine.DialStats
	// AuditPath is "" when the run was not audited.
	AuditPath string
	Totals    audit.Totals
	Audit     audit.Summary
	// AuditErr is the audit log's error when closing it failed.
	AuditErr error
}

// Write writes r as tunwall says it at the end of a run: unless quiet,
// the malformed packets dropped, the limits reached and the summary of the
// audit log; a log that could not be closed, always.
func (r Report) Write(w io.Writer, quiet bool) {
	if !quiet && r.Stack != nil {
		if r.Stack.Malformed > 0 {
			fmt.Fprintf(w, "tunwall: dropped %d malformed packets from the sandbox\n", r.Stack.Malformed)
		}
		for _, l := range LimitSummary(*r.Stack, r.RefusedUnrecorded) {
			fmt.Fprintf(w, "tunwall: %s\n", l)
		}
		printDNSLimits(w, r.DNS)
		if d := r.Dial; d.RefusedPending+d.RefusedRate > 0 {
			fmt.Fprintf(w, "tunwall: dial limits reached: %d connections reset with too many dials in progress to their destination, %d above --dial-rate\n", d.RefusedPending, d.RefusedRate)
		}
	}
	if r.AuditErr != nil {
		fmt.Fprintf(w, "tunwall: closing audit log: %v\n", r.AuditErr)
	}
	if !quiet && r.AuditPath != "" {
		printSummary(w, r.AuditPath, r.Totals, r.Audit)
	}
}

// Close stops serving, in the order that undoes New and Start: the stack
// first (every flow ends and is recorded), then the engine (the records it
// is still writing), process attribution, and last the audit log
// (trailer, fsync). It returns what the session has to say, and an
// *AuditLostError if the log is incomplete, else nil. Only the first call
// does anything; later ones return its result.
func (s *Session) Close() (Report, error) {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closed = true
		st := s.stack
		s.mu.Unlock()
		// The control socket first: nothing asks the session anything
		// while it closes.
		s.closeControl()
		if st != nil {
			st.Close()
		}
		// Flows refused at the stack's limits just before it stopped, and
		// denials being written, go in before the audit log closes.
		if s.engine != nil {
			s.engine.Close()
		}
		if s.approvals != nil {
			s.approvals.Close() // what is still pending is denied, recorded
		}
		if st != nil {
			stats := st.Stats()
			s.o.Logger.Debug("stack stats", "stats", fmt.Sprintf("%+v", stats))
			s.report.Stack = &stats
			s.report.RefusedUnrecorded = s.engine.RefusedUnrecorded()
			s.report.DNS = s.engine.DNSStats()
			s.report.Dial = s.engine.DialStats()
		}
		s.closeErr = s.undo()
	})
	return s.report, s.closeErr
}

// undo closes what New built, last built first: attribution, then the
// audit log, whose totals and end go in the report.
func (s *Session) undo() error {
	if s.approvals != nil {
		s.approvals.Close()
	}
	s.mu.Lock()
	attr := s.attr
	s.attr = nil
	s.mu.Unlock()
	if attr != nil {
		attr.Close()
	}
	if s.audit == nil {
		return nil
	}
	s.auditNow.Store(nil)
	s.report.AuditPath = s.audit.Path()
	s.report.Totals = s.audit.Totals()
	sum, err := s.audit.Close()
	s.report.Audit, s.report.AuditErr = sum, err
	s.audit = nil
	if sum.Lost > 0 || err != nil {
		return &AuditLostError{Lost: sum.Lost, Err: err}
	}
	return nil
}

// knobs lists every setting in effect, for the audit header.
func (s *Session) knobs() map[string]string {
	o := s.o
	l, d := o.Limits, o.DNS
	poolIdle := d.PoolIdle
	if poolIdle < 0 {
		poolIdle = 0 // "never", as --dns-pool-idle spells it
	}
	dialRate := l.DialRate
	if dialRate < 0 {
		dialRate = 0 // "no limit", as --dial-rate spells it
	}
	k := map[string]string{
		"phase":                 o.Rules.Phase(),
		"learn":                 strconv.FormatBool(o.Learn),
		"dns_upstream":          joinAddrPorts(d.Upstream) + " (" + d.UpstreamFrom + ")",
		"hosts_file":            d.HostsFile,
		"mtu":                   strconv.Itoa(o.MTU),
		"sniff_timeout":         l.SniffTimeout.String(),
		"allow":                 strings.Join(o.AllowFlags, " "),
		"fake_pool4":            o.Plan.Fake4.String(),
		"fake_pool6":            o.Plan.Fake6.String(),
		"rules":                 strconv.Itoa(len(o.Rules.Rules())),
		"deny_rules":            strconv.Itoa(len(o.Rules.DenyRules())),
		"default":               map[bool]string{false: policy.DefaultDeny, true: policy.DefaultPublic}[o.Rules.Open()],
		"audit_max_size":        strconv.FormatInt(o.Audit.MaxSize, 10),
		"audit_max_rate":        strconv.Itoa(o.Audit.MaxRate),
		"audit_fold_window":     audit.DefaultFoldWindow.String(),
		"dns_pool_size":         strconv.Itoa(s.pool.Cap()),
		"dns_pool_idle":         poolIdle.String(),
		"dns_max_tcp":           strconv.Itoa(d.MaxTCP),
		"dns_max_udp":           strconv.Itoa(d.MaxUDP),
		"max_dials_per_dest":    strconv.Itoa(l.MaxDialsPerDest),
		"dial_rate":             strconv.FormatFloat(dialRate, 'g', -1, 64),
		"dial_timeout":          l.DialTimeout.String(),
		"max_tcp_flows":         strconv.Itoa(l.MaxTCPFlows),
		"max_udp_sessions":      strconv.Itoa(l.MaxUDPSessions),
		"max_tcp_handshakes":    strconv.Itoa(l.MaxTCPHandshakes),
		"tcp_handshake_timeout": l.HandshakeTimeout.String(),
		"max_memory":            strconv.FormatInt(l.MaxMemory, 10),
	}
	if o.upstream != nil {
		k["upstream"] = "socks5://" + o.upstream.Addr // credentials are not recorded
	}
	if o.Ask.On {
		k["ask"] = "true"
		k["ask_timeout"] = cmp.Or(o.Ask.Timeout, approve.DefaultTimeout).String()
		k["ask_decider"] = strconv.FormatBool(o.Ask.Decider != nil) // its command is in argv
		k["ask_overlay"] = o.Ask.Overlay
	}
	var sec []string
	for _, x := range o.Credentials.secrets().All() {
		sec = append(sec, x.Name+"="+x.From) // names and sources, never values
	}
	k["secrets"] = strings.Join(sec, " ")
	var term []string
	for _, r := range o.Rules.Rules() {
		if r.HTTP != nil || len(r.Inject) > 0 {
			term = append(term, r.Host)
		}
	}
	k["terminated"] = strings.Join(term, " ")
	// Where the policy injects which secrets: policy suggest proposes an
	// inject only where the learn run's header granted it.
	var inj []string
	for _, r := range o.Rules.Rules() {
		if len(r.Inject) == 0 {
			continue
		}
		var names []string
		for _, in := range r.Inject {
			if !slices.Contains(names, in.Secret) {
				names = append(names, in.Secret)
			}
		}
		inj = append(inj, r.Host+"="+strings.Join(names, ","))
	}
	k["inject"] = strings.Join(inj, " ")
	return k
}

// exactNames lists the names of the rules that allow one exact host: their
// fake addresses are pinned, so no flood of wildcard names can take them.
func exactNames(rs *policy.RuleSet) []string {
	var out []string
	for _, r := range rs.Rules() {
		if r.Host != "" && !strings.HasPrefix(r.Host, "*.") {
			out = append(out, r.Host)
		}
	}
	return out
}

// joinAddrPorts lists addresses separated by spaces.
func joinAddrPorts(aps []netip.AddrPort) string {
	ss := make([]string, len(aps))
	for i, ap := range aps {
		ss[i] = ap.String()
	}
	return strings.Join(ss, " ")
}

func closeFD(fd int) { os.NewFile(uintptr(fd), "").Close() }
