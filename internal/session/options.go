package session

import (
	"crypto/x509"
	"errors"
	"fmt"
	"github.com/tunwall/tunwall/internal/approve"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"time"

	"github.com/tunwall/tunwall/dnsintercept"
	"github.com/tunwall/tunwall/internal/audit"
	"github.com/tunwall/tunwall/internal/control"
	"github.com/tunwall/tunwall/internal/engine"
	"github.com/tunwall/tunwall/internal/netplan"
	"github.com/tunwall/tunwall/internal/socks5"
	"github.com/tunwall/tunwall/policy"
	"github.com/tunwall/tunwall/tun"
)

// Defaults of the limits (Limits' zero values); the flags of cmd/tunwall
// default to them too.
const (
	DefaultMaxFlows         = 16384
	DefaultMaxMemory        = 256 << 20
	DefaultHandshakeTimeout = 5 * time.Second
	DefaultSniffTimeout     = 10 * time.Second
	DefaultDialTimeout      = 10 * time.Second
	DefaultMaxDialsPerDest  = 256
)

// DefaultPlan is the address plan a zero Options.Plan means
// (netplan.Default). A front end addresses the sandbox's side of the TUN,
// and names its resolver, from the plan its session serves, and gives
// HostGuard the same plan.
var DefaultPlan = netplan.Default

// Options configure a Session. Zero values mean the documented defaults;
// New copies them, so the caller may reuse the struct.
type Options struct {
	// Rules is the policy in effect: one phase, the command line's rules
	// included, the guard's extra ranges (HostGuard) in place. Required.
	Rules *policy.RuleSet
	// Learn allows every flow the guard allows and records what Rules
	// would have said.
	Learn bool
	// Plan is the sandbox's address plan; zero means DefaultPlan.
	Plan netplan.Plan

	// Stderr receives the banner, denials, warnings and the end-of-run
	// summary; nil discards them.
	Stderr io.Writer
	// Quiet prints no banner, no denials and no summary. Warnings that
	// change what the sandbox may do (the audit log's bounds, --audit off)
	// are printed anyway.
	Quiet bool
	// Logger is the operational log; nil discards.
	Logger *slog.Logger

	// DNS configures the resolver for allowed names and the fake-address
	// pool. DNS.Upstream is required.
	DNS DNSOptions
	// Upstream, when set, carries every allowed flow through the SOCKS5
	// proxy socks5://[user:pass@]HOST:PORT (CheckUpstream says whether a
	// URL is one); "" dials directly.
	Upstream string
	upstream *socks5.Dialer // Upstream, parsed by withDefaults
	// Audit configures the audit log.
	Audit AuditOptions
	// Limits bound what the sandbox can make tunwall hold.
	Limits Limits
	// MTU of the sandbox's TUN; 0 means tun.DefaultMTU.
	MTU int

	// Credentials are the run's secrets and, when a rule terminates flows
	// (http or inject), its CA (NewCredentials); nil means none, and
	// terminates no flow (New fails if a rule needs it). The caller made
	// them before the sandbox existed.
	Credentials *Credentials
	// Roots and CARoots verify the servers of terminated hosts (l7.Config).
	Roots   *x509.CertPool
	CARoots map[string]*x509.CertPool

	// DiagFD is a NETLINK_SOCK_DIAG socket in the sandbox's network
	// namespace, for attributing flows to processes; a value below 1
	// means none (0 is stdin, never such a socket). The session owns it
	// from the moment New is called, whether New succeeds or not, and
	// closes it exactly once.
	DiagFD int
	// NetNS is the inode of the sandbox's network namespace
	// (procattr.Config.NetNS); 0 considers every process.
	NetNS uint64

	// Run is the run's id; "" makes a new one (audit.NewRunID). A front
	// end that names the control socket after the run before the sandbox
	// exists makes it first.
	Run string
	// Control is the run's control socket (control.Listen), made before
	// the sandbox so that the sandbox can be kept from it; the session
	// owns it from New on, serves it from Start and closes it first in
	// Close. nil: none.
	Control *control.Listener
	// Metrics, when set, serves the metrics over HTTP (--metrics-listen);
	// the session owns it from New on, like Control.
	Metrics net.Listener
	// SandboxPidNS is the inode of the sandbox's pid namespace (0 unknown,
	// or the same as tunwall's): no process there may use the control
	// socket, nor may any in NetNS.
	SandboxPidNS uint64
	// Rebuild, when set, builds the rules of phase ("" for the phase in
	// effect) from the policy as it is on disk now, with the command
	// line's rules, and returns them and the policy's bytes; its error
	// names the file and line of what is wrong. The control socket's
	// phase and reload, and Session.Reload, use it. nil: the policy
	// cannot change while the session runs.
	Rebuild func(phase string) (*policy.RuleSet, []byte, error)
	// Ask, when On, holds what only the default rule denies for a decision
	// (tunwall --ask): ctl allow|deny or the decider answers.
	Ask AskOptions

	// Recorded in the audit header, and nowhere else: the policy file's
	// name ("" none) and bytes (their SHA-256; nil none), the command
	// line's rules as written, the command line, and tunwall's version.
	PolicyFile   string
	PolicySource []byte
	AllowFlags   []string
	Argv         []string
	Version      string
}

// DNSOptions configure the resolver for allowed names and the fake pool.
type DNSOptions struct {
	// Upstream are the resolvers for allowed names, in the order they are
	// tried. Required.
	Upstream []netip.AddrPort
	// UpstreamFrom says where Upstream came from, for the audit header
	// ("--dns-upstream", "policy", a resolv.conf path).
	UpstreamFrom string
	// Search is the host's search list (the sandbox's resolv.conf has it
	// too).
	Search []string
	// ServerTimeout is how long one upstream server is waited for before
	// the next; 0 means the resolver's default.
	ServerTimeout time.Duration
	// HostsFile is read before DNS, as glibc does; "" means none.
	HostsFile string
	// PoolSize is how many fake-address slots there are; 0 means
	// dnsintercept.DefaultPoolSize.
	PoolSize int
	// PoolIdle is how long a wildcard-matched name's slot must go unused
	// before it may go to another name; 0 means
	// dnsintercept.DefaultReuseAfter, negative never.
	PoolIdle time.Duration
	// MaxTCP and MaxUDP bound the DNS-over-TCP connections and UDP DNS
	// sessions served at once; 0 means dnsintercept's defaults.
	MaxTCP, MaxUDP int
	// Resolver, when set, is the upstream resolver (and its answer
	// cache) to use instead of building one: shared with other sessions
	// (a node agent's pods of one trust boundary), not owned, so closing
	// the session leaves it as it is. Upstream, Search, ServerTimeout and
	// HostsFile must then be the config it was built with: they are
	// recorded in the audit header. A live session's resolver never
	// changes: a new upstream takes a new session.
	Resolver *dnsintercept.Resolver
}

// AuditOptions configure the audit log.
type AuditOptions struct {
	// Off runs unaudited: no flow or query is recorded, and a warning
	// says so. The other fields are then ignored.
	Off bool
	// Path is the log file; "" means DefaultAuditPath of the run, in the
	// state directory, whose older logs are then pruned (Keep, KeepDays).
	Path string
	// Stream, when set, is where the run goes instead of a file
	// (audit.Options.Stream: a node agent's stdout, which its pods' runs
	// share, whole lines interleaved); Path then only names it in
	// messages, and nothing is pruned.
	Stream *audit.Stream
	// Keep and KeepDays bound the state directory's logs when Path is "":
	// the newest Keep runs, none older than KeepDays days; 0 is no bound.
	Keep, KeepDays int
	// MaxSize caps the log's bytes; 0 means audit.DefaultMaxSize.
	MaxSize int64
	// Labels are written on the header and every record (--label; a node
	// agent's pod identity).
	Labels audit.Labels
	// MaxRate bounds the lines a second; 0 means audit.DefaultMaxRate.
	MaxRate int
}

// Limits bound what a sandbox can make tunwall hold (README "Resource
// limits", "The upstream dial").
type Limits struct {
	// MaxTCPFlows, MaxUDPSessions and MaxTCPHandshakes bound concurrent
	// TCP flows, UDP sessions and TCP handshakes; 0 means DefaultMaxFlows.
	MaxTCPFlows, MaxUDPSessions, MaxTCPHandshakes int
	// HandshakeTimeout is how long the sandbox has to complete a TCP
	// handshake; 0 means DefaultHandshakeTimeout.
	HandshakeTimeout time.Duration
	// MaxMemory is tunwall's memory target: flow buffers share a sixteenth
	// of it, the name checks hold at most a sixteenth; 0 means
	// DefaultMaxMemory. (The Go runtime's soft limit is the caller's to
	// set: it is process-wide.)
	MaxMemory int64
	// SniffTimeout bounds how long a client may take to finish a
	// ClientHello or request head; 0 means DefaultSniffTimeout.
	SniffTimeout time.Duration
	// MaxDialsPerDest bounds the dials in progress to one destination; 0
	// means DefaultMaxDialsPerDest.
	MaxDialsPerDest int
	// DialRate bounds new dials a second to one destination; 0 means
	// engine.DefaultDialRate, negative no bound.
	DialRate float64
	// DialTimeout bounds one upstream dial; 0 means DefaultDialTimeout.
	DialTimeout time.Duration
}

// CheckUpstream returns why url cannot be Options.Upstream, or nil.
func CheckUpstream(url string) error {
	_, err := socks5.ParseURL(url)
	return err
}

// ErrOptions is wrapped by New's errors about the Options themselves.
var ErrOptions = errors.New("session: invalid options")

// withDefaults validates o and fills its zero values.
func (o Options) withDefaults() (Options, error) {
	bad := func(format string, args ...any) (Options, error) {
		return o, fmt.Errorf("%w: %s", ErrOptions, fmt.Sprintf(format, args...))
	}
	if o.Rules == nil {
		return bad("Rules is required")
	}
	if len(o.DNS.Upstream) == 0 {
		return bad("DNS.Upstream is required")
	}
	if r := o.DNS.Resolver; r != nil {
		// The header records DNS.Upstream: it must be what the shared
		// resolver asks.
		want, err := dnsintercept.NewResolver(dnsintercept.ResolverConfig{Servers: o.DNS.Upstream, Search: o.DNS.Search})
		if err != nil {
			return bad("DNS.Upstream: %v", err)
		}
		if !slices.Equal(r.Servers(), want.Servers()) || !slices.Equal(r.Search(), want.Search()) {
			return bad("DNS.Resolver asks %v (search %v), not DNS.Upstream %v (search %v)", r.Servers(), r.Search(), want.Servers(), want.Search())
		}
	}
	if o.Upstream != "" {
		up, err := socks5.ParseURL(o.Upstream)
		if err != nil {
			return bad("Upstream: %v", err)
		}
		o.upstream = up
	}
	if o.Plan == (netplan.Plan{}) {
		o.Plan = DefaultPlan
	}
	if o.Stderr == nil {
		o.Stderr = io.Discard
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.MTU == 0 {
		o.MTU = tun.DefaultMTU
	}
	l, d := &o.Limits, &o.DNS
	for _, n := range []struct {
		name string
		v    int64
	}{
		{"MTU", int64(o.MTU)}, {"Limits.MaxTCPFlows", int64(l.MaxTCPFlows)}, {"Limits.MaxUDPSessions", int64(l.MaxUDPSessions)},
		{"Limits.MaxTCPHandshakes", int64(l.MaxTCPHandshakes)}, {"Limits.HandshakeTimeout", int64(l.HandshakeTimeout)},
		{"Limits.MaxMemory", l.MaxMemory}, {"Limits.SniffTimeout", int64(l.SniffTimeout)},
		{"Limits.MaxDialsPerDest", int64(l.MaxDialsPerDest)}, {"Limits.DialTimeout", int64(l.DialTimeout)},
		{"DNS.PoolSize", int64(d.PoolSize)}, {"DNS.MaxTCP", int64(d.MaxTCP)}, {"DNS.MaxUDP", int64(d.MaxUDP)},
		{"DNS.ServerTimeout", int64(d.ServerTimeout)}, {"Audit.MaxSize", o.Audit.MaxSize},
		{"Audit.MaxRate", int64(o.Audit.MaxRate)}, {"Audit.Keep", int64(o.Audit.Keep)}, {"Audit.KeepDays", int64(o.Audit.KeepDays)},
	} {
		if n.v < 0 {
			return bad("%s is negative (%d)", n.name, n.v)
		}
	}
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	defDur := func(v *time.Duration, d time.Duration) {
		if *v == 0 {
			*v = d
		}
	}
	def(&l.MaxTCPFlows, DefaultMaxFlows)
	def(&l.MaxUDPSessions, DefaultMaxFlows)
	def(&l.MaxTCPHandshakes, DefaultMaxFlows)
	def(&l.MaxDialsPerDest, DefaultMaxDialsPerDest)
	defDur(&l.HandshakeTimeout, DefaultHandshakeTimeout)
	defDur(&l.SniffTimeout, DefaultSniffTimeout)
	defDur(&l.DialTimeout, DefaultDialTimeout)
	if l.MaxMemory == 0 {
		l.MaxMemory = DefaultMaxMemory
	}
	if l.DialRate == 0 {
		l.DialRate = engine.DefaultDialRate
	}
	def(&d.PoolSize, dnsintercept.DefaultPoolSize)
	def(&d.MaxTCP, dnsintercept.DefaultMaxTCPConns)
	def(&d.MaxUDP, dnsintercept.DefaultMaxUDPSessions)
	defDur(&d.PoolIdle, dnsintercept.DefaultReuseAfter)
	if o.Audit.MaxSize == 0 {
		o.Audit.MaxSize = audit.DefaultMaxSize
	}
	def(&o.Audit.MaxRate, audit.DefaultMaxRate)
	if o.DiagFD < 1 {
		o.DiagFD = -1
	}
	return o, nil
}

// AskOptions configure the approvals of --ask (package approve).
type AskOptions struct {
	On bool
	// Timeout is how long a request waits for a decision before it is
	// denied; 0 means approve.DefaultTimeout.
	Timeout time.Duration
	// Decider is the external decider's process, started by the caller
	// (the session starts no process); the session owns it from New on,
	// and kills it in Close. nil: none.
	Decider *DeciderIO
	// Overlay is the path "always" approvals are appended to; "" when
	// there is no policy file (then "always" is refused).
	Overlay string
}

// DeciderIO is an external decider's process (approve.DeciderIO).
type DeciderIO = approve.DeciderIO

// DefaultAskTimeout is AskOptions.Timeout's default.
const DefaultAskTimeout = approve.DefaultTimeout

// OverlayPath is the overlay of a policy file: where --ask's "always"
// approvals go (approve.OverlayPath).
func OverlayPath(policyFile string) string { return approve.OverlayPath(policyFile) }

// ReadOverlay reads the overlay at path; nil when there is none.
func ReadOverlay(path string) (*policy.Policy, error) { return approve.ReadOverlay(path) }
