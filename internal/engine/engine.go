// Package engine is where tunwall decides. It implements stack.Handler: every
// new flow from the sandbox gets a name (from the fake IP our DNS handed out,
// or sniffed from the first bytes), a verdict from the policy, a dial to the
// real address (checked again by the rebinding guard), a relay, and an audit
// record. DNS queries are answered by dnsintercept with the same policy. It
// is the one place where the stack, the policy, DNS, the audit log and
// process attribution meet; cmd/tunwall only wires it up.
//
// Words (docs/development.md, Glossary): a flow's verdict names its rule;
// the inspector (internal/inspect, driven here by inspectConn) checks every
// name a client sends; the terminator (internal/l7) ends TLS for hosts
// with http or inject rules; the guard is the rebinding guard
// (policy.Guard); the dialLimiter enforces DialLimits; held bytes are a
// budget (Config.MaxHeld).
package engine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/tunwall/tunwall/dnsintercept"
	"github.com/tunwall/tunwall/flow"
	"github.com/tunwall/tunwall/internal/l7"
	"github.com/tunwall/tunwall/internal/secrets"
	"github.com/tunwall/tunwall/policy"
	"github.com/tunwall/tunwall/stack"
)

// Config configures an Engine. Zero values mean the documented defaults.
type Config struct {
	// Rules is the policy in effect at first (one phase, --allow rules
	// included); SetRules changes it. Required. In learn mode it is what
	// flows are compared against.
	Rules *policy.RuleSet
	// Learn allows every flow the rebinding guard does not forbid, and
	// records the verdict Rules would have given.
	Learn bool
	// Pool hands out fake addresses. Required.
	Pool *dnsintercept.Pool
	// Resolver resolves allowed names to real addresses at dial time and
	// answers the DNS record types not answered locally. Required.
	Resolver Resolver
	// Upstream, when set, carries every allowed flow through a SOCKS5
	// proxy. The proxy is sent the address tunwall resolved and the
	// rebinding guard checked, never a name (it could resolve it again to
	// somewhere else).
	Upstream Upstream
	// Dial makes direct connections; nil means a net.Dialer.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// Audit receives one record per flow and per DNS query. nil means no
	// audit log and no process attribution (tunwall run --audit off, for
	// measuring what auditing costs).
	Audit Recorder
	// Attr finds the process behind a flow; nil records none.
	Attr Attributor
	// Logger is tunwall's operational log; nil discards.
	Logger *slog.Logger
	// Denials receives one human line per denial; nil prints none.
	Denials io.Writer
	// SniffTimeout bounds how long a client has to complete a TLS
	// ClientHello or an HTTP request head once it has begun to send it,
	// and, on a connection to a raw IP, to send one at all; a client that
	// takes longer is reset. There is no limit on when the first byte
	// comes (the flow's idle timeout applies): whenever it comes, it is
	// checked. It also bounds how long the server may take to finish
	// answering earlier requests on a connection whose later request is
	// refused. 0 means 10s.
	SniffTimeout time.Duration
	// MaxHeld bounds the bytes the name checks hold at once, over all
	// flows, while they wait for a ClientHello or request head to complete
	// (each flow's is bounded anyway, by the parsers): a flow that would
	// take more is refused. 0 means 16 MiB.
	MaxHeld int64
	// MemoryHigh, if not nil, reports whether tunwall's live memory is
	// past the mark where new flows are refused (stack.Stack.MemoryHigh).
	// While it is, no name check grows its buffer beyond the first: a
	// flow whose first message needs more is refused, so that the flows
	// already admitted cannot take memory on past the mark.
	MemoryHigh func() bool
	// DialTimeout bounds one upstream dial. 0 means 10s.
	DialTimeout time.Duration
	// DialLimits bound the TCP dials in progress and new dials per
	// destination (diallimit.go); zero values mean their defaults.
	DialLimits DialLimits
	// TCPIdle closes a TCP flow with no traffic either way for this long.
	// 0 means 2h.
	TCPIdle time.Duration
	// UDPIdle ends a UDP session with no traffic either way for this long.
	// 0 means 60s.
	UDPIdle time.Duration
	// DNSLimits bound the DNS sessions and queries the sandbox can make
	// tunwall hold; zero values mean dnsintercept's defaults.
	DNSLimits dnsintercept.Limits
	// L7 terminates the TCP flows of hosts whose rules have http or
	// inject (l7.go). Required when Rules has such a rule; flows of other
	// hosts never reach it.
	L7 *l7.Terminator
	// Secrets are the run's secrets, whose placeholders are refused in
	// DNS names, sniffed names and plain HTTP to hosts that do not
	// receive them; nil means none.
	Secrets *secrets.Store
	// Ask, if set, holds what only the default rule denies for a
	// decision (tunwall --ask; ask.go); nil denies it at once.
	Ask Asker
}

// Engine implements stack.Handler.
type Engine struct {
	cfg  Config
	live liveRules // the policy in effect (rules.go)
	open openFlows // the flows open now (OpenFlows)
	log  *slog.Logger
	dns  *dnsintercept.Server

	denials denyPrinter
	refused refusals
	held    heldBytes // what the name checks' buffers hold (MaxHeld)
	dials   *dialLimiter

	// owners of live DNS sessions, for attributing their queries
	omu    sync.Mutex
	owners map[netip.AddrPort]*ownerLookup

	bg        sync.WaitGroup // the engine's own goroutines writing records
	closeOnce sync.Once
}

// Close ends the engine's part of a session once the stack has stopped
// (no flow reaches the engine after it): it writes the records of refused
// flows still queued and the summaries of dial-refusal windows still
// open, and waits for every record the engine's own goroutines are
// writing (a UDP denial waiting for its owner among them), so that none
// is lost or counted lost when the caller then closes the audit log. Only
// the first call does anything.
func (e *Engine) Close() {
	e.closeOnce.Do(func() {
		e.drainRefused()
		e.refused.writers.Wait()
		e.bg.Wait()
		e.flushDialRefusals()
	})
}

var _ stack.Handler = (*Engine)(nil)

// New checks cfg and builds an Engine.
func New(cfg Config) (*Engine, error) {
	if cfg.Rules == nil || cfg.Pool == nil {
		return nil, errors.New("engine: Rules and Pool are required")
	}
	if cfg.Audit == nil {
		cfg.Attr = nil // with no audit, nothing would record what it finds
	}
	if cfg.Resolver == nil {
		return nil, errors.New("engine: a Resolver is required (with an Upstream proxy too: names are resolved and checked before the proxy sees them)")
	}
	if cfg.L7 == nil && cfg.Rules.HasHTTP() {
		return nil, errors.New("engine: the rules have http or inject, and there is no terminator to terminate their flows")
	}
	if cfg.SniffTimeout == 0 {
		cfg.SniffTimeout = 10 * time.Second
	}
	if cfg.MaxHeld == 0 {
		cfg.MaxHeld = 16 << 20
	}
	if cfg.DialTimeout == 0 {
		cfg.DialTimeout = 10 * time.Second
	}
	if cfg.TCPIdle == 0 {
		cfg.TCPIdle = 2 * time.Hour
	}
	if cfg.UDPIdle == 0 {
		cfg.UDPIdle = 60 * time.Second
	}
	if cfg.Dial == nil {
		var d net.Dialer
		cfg.Dial = d.DialContext
	}
	e := &Engine{cfg: cfg, log: cfg.Logger, owners: map[netip.AddrPort]*ownerLookup{}, dials: newDialLimiter(cfg.DialLimits)}
	e.live.p.Store(cfg.Rules)
	e.refused.q = make(chan *flowRecord, refusedQueue)
	e.held.max = cfg.MaxHeld
	e.held.high = cfg.MemoryHigh
	if e.log == nil {
		e.log = slog.New(slog.DiscardHandler)
	}
	e.denials.w = cfg.Denials
	srv, err := dnsintercept.NewServer(dnsintercept.Config{
		Pool:     cfg.Pool,
		Filter:   e.dnsFilter,
		Upstream: cfg.Resolver,
		OnQuery:  e.onQuery,
		Limits:   cfg.DNSLimits,
		Hold:     e.holdQuery,
	})
	if err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	e.dns = srv
	return e, nil
}

// DNSStats returns the DNS server's counters.
func (e *Engine) DNSStats() dnsintercept.Stats { return e.dns.Stats() }

// verdict is a decision as the engine applies it: flow's one decision
// type, which the DNS server, the policy and the audit share.
type verdict = flow.Decision

// decideName and decideIP are DecideName and DecideIP (decide.go) as the
// engine applies them.
// rs is the policy a flow was decided under (flowRecord.rs), so that a
// flow is decided by one policy throughout, the one the open-flow registry
// checks when it is admitted (rules.go).
func (e *Engine) decideName(rs *policy.RuleSet, host string, port uint16, proto policy.Proto) verdict {
	if v, found := e.placeholderIn(host, "the name"); found {
		return v
	}
	v := e.granted(rs, DecideName(rs, e.cfg.Learn, host, port, proto), host, port, proto)
	v.Phase = rs.Phase()
	return v
}

func (e *Engine) decideIP(rs *policy.RuleSet, ip netip.Addr, port uint16, proto policy.Proto) verdict {
	v := DecideIP(rs, e.cfg.Learn, ip, port, proto)
	v.Phase = rs.Phase()
	return v
}

// auditHealthy reports the audit log's state; flows are denied while it
// cannot be written (fail closed).
func (e *Engine) auditHealthy() (verdict, bool) {
	if e.cfg.Audit == nil {
		return verdict{}, true
	}
	if err := e.cfg.Audit.Admit(); err != nil {
		return boundVerdict(err), false
	}
	return verdict{}, true
}

// dnsFilter is the DNS server's view of the policy.
func (e *Engine) dnsFilter(qname string) policy.Decision {
	if v, ok := e.auditHealthy(); !ok {
		return v
	}
	if v, found := e.placeholderIn(qname, "a DNS name"); found {
		return v
	}
	rs := e.rules()
	d := DecideQuery(rs, e.cfg.Learn, qname)
	d.Phase = rs.Phase()
	return d
}

// denyPrinter prints one human line per denial, folding identical lines that
// repeat within a second (a resolver's A and AAAA, a client's retries), and
// at most denyBurst lines and then denyRate a second: the lines a flood
// would print are counted and said in one line before the next one shown.
type denyPrinter struct {
	w      io.Writer
	mu     sync.Mutex
	last   string
	at     time.Time
	tokens float64          // lines that may be printed now
	tokAt  time.Time        // when tokens was last refilled
	hidden int              // lines not printed since the last one printed
	now    func() time.Time // nil means time.Now (tests set a clock)
}

const (
	denyBurst = 50
	denyRate  = 5
)

func (p *denyPrinter) printf(format string, args ...any) {
	if p.w == nil {
		return
	}
	line := Printable(fmt.Sprintf(format, args...))
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	if p.now != nil {
		now = p.now()
	}
	if line == p.last && now.Sub(p.at) < time.Second {
		return
	}
	if p.tokAt.IsZero() {
		p.tokens = denyBurst
	} else {
		p.tokens = min(denyBurst, p.tokens+now.Sub(p.tokAt).Seconds()*denyRate)
	}
	p.tokAt = now
	if p.tokens < 1 {
		p.hidden++
		return
	}
	p.tokens--
	p.last, p.at = line, now
	if p.hidden > 0 {
		fmt.Fprintf(p.w, "tunwall: (%d more denials not shown; the audit log has them)\n", p.hidden)
		p.hidden = 0
	}
	fmt.Fprintln(p.w, line)
}

// Printable makes s safe to print as (part of) one line on a terminal: a
// byte that is not valid UTF-8 becomes \xNN, a control character (C0, DEL,
// C1: newline, carriage return, ESC, ...) \xNN or \uNNNN, and any other
// character that is not graphic (bidi overrides, zero-width and other
// format characters) \uNNNN. What the sandbox chooses (names, reasons that
// quote them) then cannot end a line, forge another one or send an escape
// sequence to the user's terminal.
func Printable(s string) string {
	clean := true
	for _, r := range s {
		if r == utf8.RuneError || !unicode.IsPrint(r) {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n <= 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case r < 0x80 && !unicode.IsPrint(r):
			fmt.Fprintf(&b, `\x%02x`, r)
		case !unicode.IsPrint(r):
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String()
}

// target formats host:port for humans, bracketing IPv6 literals.
func target(host string, ip netip.Addr, port uint16) string {
	if host == "" {
		return netip.AddrPortFrom(ip, port).String()
	}
	return net.JoinHostPort(host, fmt.Sprint(port))
}
