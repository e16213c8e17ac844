package main

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/tunwall/tunwall/dnsintercept"
	"github.com/tunwall/tunwall/internal/audit"
	"github.com/tunwall/tunwall/internal/engine"
	"github.com/tunwall/tunwall/internal/procattr"
	"github.com/tunwall/tunwall/internal/sandbox"
	"github.com/tunwall/tunwall/internal/socks5"
	"github.com/tunwall/tunwall/policy"
	"github.com/tunwall/tunwall/stack"
	"github.com/tunwall/tunwall/tun"
)

// Addresses tunwall uses inside every sandbox (README: "Addresses").
var (
	resolver4 = netip.MustParseAddr("198.18.0.1")
	resolver6 = netip.MustParseAddr("fd74:756e:7761:6c6c::1")
	fakePool4 = netip.MustParsePrefix("198.18.0.0/15")
	fakePool6 = netip.MustParsePrefix("fd74:756e:7761:6c6d::/64")
	// ours6 covers the sandbox's own /64 and the fake pool's.
	ours6 = netip.MustParsePrefix("fd74:756e:7761:6c6c::/63")
)

// allowFlags collects repeatable --allow values.
type allowFlags []string

func (a *allowFlags) String() string     { return strings.Join(*a, ",") }
func (a *allowFlags) Set(s string) error { *a = append(*a, s); return nil }

// commonFlags are the flags of every command that serves a sandbox.
type commonFlags struct {
	policyFile  string
	allow       allowFlags
	phase       string
	auditFile   string
	dnsUpstream string
	resolvConf  string // the host's resolv.conf (--resolv-conf)
	hostsFile   string // the host's hosts file (--hosts-file)
	hostResolv  *dnsintercept.ResolvConf
	resolvErr   error
	upstream    string
	learn       bool
	quiet       bool
	jsonLog     bool
	verbose     bool
	mtu         int
	sniff       time.Duration
	limits      limitFlags
	auditSize   byteSize
	auditRate   positiveInt
	// DNS limits (dnsintercept.PoolOptions, dnsintercept.Limits)
	dnsPoolSize int
	dnsPoolIdle time.Duration
	dnsMaxTCP   int
	dnsMaxUDP   int
	// upstream dial limits (engine.DialLimits) and timeout
	maxDialsPerDest int
	dialRate        float64
	dialTimeout     time.Duration
	// credentials (creds.go): --secret flags, and the run's secrets and CA
	// once loaded
	secrets secretFlags
	creds   *credentials
	// retention of the default audit directory (retention.go)
	auditKeep     int
	auditKeepDays int
	// the policy file, read and parsed once (loadRules)
	loaded bool
	pol    *policy.Policy
	polSrc []byte
	polErr error
}

func (c *commonFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&c.policyFile, "policy", "", "policy `FILE` (YAML, version 1)")
	fs.Var(&c.allow, "allow", "allow `HOST[:PORT][/udp]`, *.SUFFIX, IP, CIDR or [IPv6]:PORT (repeatable; port defaults to 443, * means any)")
	fs.StringVar(&c.phase, "phase", "", "policy phase `NAME` (required when the policy has more than one)")
	fs.StringVar(&c.auditFile, "audit", "", "audit log `FILE` (default: $XDG_STATE_HOME/tunwall/RUN.jsonl); \"off\" runs unaudited (for measuring its cost)")
	fs.StringVar(&c.dnsUpstream, "dns-upstream", "", "resolver `IP:PORT` for allowed names (default: the policy's dns.upstream, else the host's resolv.conf)")
	fs.StringVar(&c.resolvConf, "resolv-conf", "/etc/resolv.conf", "the host's resolver configuration `FILE`: its nameservers (in order, with failover) resolve allowed names unless --dns-upstream or the policy's dns.upstream says otherwise; its search list and options (ndots, timeout, attempts, ...) are written into the sandbox's resolv.conf")
	fs.StringVar(&c.hostsFile, "hosts-file", "/etc/hosts", "hosts `FILE` allowed names are resolved through before DNS, as glibc does (\"\" for none)")
	fs.StringVar(&c.upstream, "upstream", "", "send allowed flows through `socks5://[user:pass@]HOST:PORT`")
	fs.BoolVar(&c.learn, "learn", false, "learn mode: allow every flow the private-range guard allows, and record what the policy would have said")
	fs.BoolVar(&c.quiet, "quiet", false, "print no denials and no end-of-run summary")
	fs.BoolVar(&c.jsonLog, "json-log", false, "write everything tunwall itself prints on stderr (banner, denials, warnings, errors, summary) as JSON objects, one a line; durations in milliseconds (fields ending _ms)")
	fs.BoolVar(&c.verbose, "v", false, "verbose diagnostics")
	fs.IntVar(&c.mtu, "mtu", tun.DefaultMTU, "MTU of the sandbox's TUN")
	fs.DurationVar(&c.sniff, "sniff-timeout", 10*time.Second, "how long a client may take to complete a TLS ClientHello or HTTP request head it has begun (past it, it is reset)")
	c.auditSize, c.auditRate = audit.DefaultMaxSize, audit.DefaultMaxRate
	fs.Var(&c.auditSize, "audit-max-size", "cap on this run's audit log, e.g. 512MiB (`SIZE`: bytes, KiB, MiB, GiB); reaching it denies new flows and DNS queries")
	fs.Var(&c.auditRate, "audit-max-rate", "audit `LINES` a second, sustained, after a burst of 10 s of them; beyond it new flows and DNS queries are denied and repeated records only counted")
	fs.IntVar(&c.dnsPoolSize, "dns-pool-size", dnsintercept.DefaultPoolSize, "fake-address slots (one per name; exact names of the rules always have one); at most 130816")
	fs.DurationVar(&c.dnsPoolIdle, "dns-pool-idle", dnsintercept.DefaultReuseAfter, "a wildcard-matched name's fake address unused (no query, no open flow) this long may go to another name; 0 never")
	fs.IntVar(&c.dnsMaxTCP, "dns-max-tcp", dnsintercept.DefaultMaxTCPConns, "DNS-over-TCP connections served at once (past it the one idle longest is closed)")
	fs.IntVar(&c.dnsMaxUDP, "dns-max-udp", dnsintercept.DefaultMaxUDPSessions, "UDP DNS sessions (client sockets) served at once (past it the one idle longest is ended)")
	fs.IntVar(&c.auditKeep, "audit-keep", defaultAuditKeep, "without --audit: keep the last `N` runs' logs in the state directory, removing older ones when a run starts; 0 keeps all")
	fs.IntVar(&c.auditKeepDays, "audit-keep-days", defaultAuditKeepDays, "without --audit: remove runs' logs older than `DAYS` from the state directory when a run starts; 0 keeps them")
	c.limits.register(fs)
	fs.IntVar(&c.maxDialsPerDest, "max-dials-per-dest", 256, "TCP dials in progress to one destination (name or address, and port); past it new connections to it are reset at once")
	fs.Float64Var(&c.dialRate, "dial-rate", engine.DefaultDialRate, "new TCP dials a second to one destination, after a burst of as many; past it new connections to it are reset at once (0: no limit)")
	fs.DurationVar(&c.dialTimeout, "dial-timeout", 10*time.Second, "how long one upstream dial may take, every address of the name tried included")
	fs.Var(&c.secrets, "secret", "a secret kept outside the sandbox, `NAME=env:VAR|file:PATH` (repeatable): the sandbox gets a placeholder in $NAME; rules' inject puts the value into requests to their hosts")
}

// checkDNS validates the DNS limit flags.
func (c *commonFlags) checkDNS() error {
	if c.dnsPoolSize < 1 || c.dnsMaxTCP < 1 || c.dnsMaxUDP < 1 {
		return errors.New("--dns-pool-size, --dns-max-tcp and --dns-max-udp must be at least 1")
	}
	if c.auditKeep < 0 || c.auditKeepDays < 0 {
		return errors.New("--audit-keep and --audit-keep-days must not be negative")
	}
	if c.dnsPoolIdle < 0 {
		return errors.New("--dns-pool-idle must not be negative")
	}
	return c.checkDial()
}

// checkDial validates the dial limit flags.
func (c *commonFlags) checkDial() error {
	if c.maxDialsPerDest < 1 {
		return errors.New("--max-dials-per-dest must be at least 1")
	}
	if c.dialRate < 0 || math.IsNaN(c.dialRate) || math.IsInf(c.dialRate, 0) {
		return errors.New("--dial-rate must be a number of dials a second, or 0 for no limit")
	}
	if c.dialTimeout <= 0 {
		return errors.New("--dial-timeout must be positive")
	}
	return nil
}

// dialLimits are the engine's dial limits from the flags.
func (c *commonFlags) dialLimits() engine.DialLimits {
	l := engine.DialLimits{Pending: c.limits.maxHandshakes, PerDest: c.maxDialsPerDest, Rate: c.dialRate}
	if c.dialRate == 0 {
		l.Rate = -1 // no limit
	}
	return l
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

// byteSize is a flag value of bytes with an optional binary unit.
type byteSize int64

func (b *byteSize) String() string { return humanBytes(int64(*b)) }

func (b *byteSize) Set(s string) error {
	num, mul := strings.TrimSpace(s), int64(1)
	for _, u := range []struct {
		suffix string
		mul    int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}, {"B", 1}} {
		if strings.HasSuffix(num, u.suffix) {
			num, mul = strings.TrimSpace(strings.TrimSuffix(num, u.suffix)), u.mul
			break
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n <= 0 || n > math.MaxInt64/mul {
		return fmt.Errorf("want a positive size such as 1048576, 64KiB, 512MiB or 1GiB, got %q", s)
	}
	*b = byteSize(n * mul)
	return nil
}

// positiveInt is a flag value that must be above zero.
type positiveInt int

func (p *positiveInt) String() string { return strconv.Itoa(int(*p)) }

func (p *positiveInt) Set(s string) error {
	n, err := strconv.Atoi(s)
	if err != nil || n <= 0 {
		return fmt.Errorf("want a positive whole number, got %q", s)
	}
	*p = positiveInt(n)
	return nil
}

// session is everything that serves one sandbox: policy, DNS, audit,
// engine and, once started, the stack.
type session struct {
	flags    *commonFlags
	stderr   io.Writer
	log      *slog.Logger
	rules    *policy.RuleSet
	pool     *dnsintercept.Pool
	resolver *dnsintercept.Resolver
	audit    *audit.Writer
	attr     *procattr.Resolver
	engine   *engine.Engine
	stack    *stack.Stack
	upstream *socks5.Dialer
	creds    *credentials
	start    time.Time
	// stopStats ends the SIGUSR1 stats printer (stats.go); nil before serve.
	stopStats func()
	// auditLost and auditErr are set by close: records the log lost, and
	// its first error.
	auditLost int
	auditErr  error
}

// status is what tunwall exits with when code is the command's status (or
// tunwall's own): exitLost when the audit log is incomplete, saying so
// along with code, even with --quiet.
func (s *session) status(code int, what string) int {
	if s.auditLost == 0 && s.auditErr == nil {
		return code
	}
	fmt.Fprintf(s.stderr, "tunwall: the audit log is incomplete: %d audit records were lost (%v); %s %d; exiting %d\n",
		s.auditLost, s.auditErr, what, code, exitLost)
	return exitLost
}

func newLogger(c *commonFlags, stderr io.Writer) *slog.Logger {
	level := slog.LevelWarn
	if c.verbose {
		level = slog.LevelDebug
	}
	opts := &slog.HandlerOptions{Level: level}
	if c.jsonLog {
		return slog.New(slog.NewJSONHandler(stderr, jsonLogHandlerOptions(level)))
	}
	return slog.New(slog.NewTextHandler(stderr, opts))
}

// loadRules builds the run's rule set from --policy, --phase and --allow.
// The policy file is read and parsed once per run (the first call), so
// --policy /dev/stdin, --policy - and --policy <(...) work: a pipe cannot
// be read twice.
func loadRules(c *commonFlags, extraGuard []netip.Prefix) (*policy.Policy, *policy.RuleSet, []byte, error) {
	if !c.loaded {
		c.loaded = true
		c.pol, c.polSrc, c.polErr = readPolicy(c.policyFile)
	}
	if c.polErr != nil {
		return nil, nil, nil, c.polErr
	}
	p, src := c.pol, c.polSrc
	var extra []policy.Rule
	for _, a := range c.allow {
		r, err := policy.ParseAllow(a) // its errors begin "--allow VALUE:"
		if err != nil {
			return nil, nil, nil, err
		}
		extra = append(extra, r)
	}
	if p == nil && len(extra) == 0 && !c.learn {
		return nil, nil, nil, errors.New("no policy: give --policy FILE and/or --allow rules (or --learn); everything would be denied")
	}
	rs, err := policy.Select(p, c.phase, extra, policy.Guard{Extra: extraGuard})
	if err != nil {
		return nil, nil, nil, err
	}
	return p, rs, src, nil
}

// readPolicy reads and parses the policy file: "" is none, "-" is stdin.
func readPolicy(file string) (*policy.Policy, []byte, error) {
	if file == "" {
		return nil, nil, nil
	}
	var (
		src []byte
		err error
	)
	name := file
	if file == "-" {
		name = "<stdin>"
		if src, err = io.ReadAll(io.LimitReader(os.Stdin, maxPolicySize+1)); err != nil {
			err = fmt.Errorf("read stdin: %w", err)
		}
	} else {
		src, err = readLimited(file, maxPolicySize+1)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("policy: %w", err)
	}
	if len(src) > maxPolicySize {
		return nil, nil, fmt.Errorf("policy %s: larger than %d MiB", name, maxPolicySize>>20)
	}
	p, err := policy.Parse(name, src)
	if err != nil {
		return nil, nil, err
	}
	return p, src, nil
}

// maxPolicySize bounds a policy read from a file or pipe (policy.ParseFile's
// bound too).
const maxPolicySize = 4 << 20

func readLimited(path string, n int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, n))
}

// warnRules prints a warning for each rule of rs that allows more than its
// author likely meant (warn.go).
func warnRules(rs *policy.RuleSet, stderr io.Writer) {
	for _, r := range rs.Rules() {
		if w := ruleWarning(r); w != "" {
			fmt.Fprintf(stderr, "tunwall: warning: %s: %s\n", r.Source, w)
		}
	}
}

// hostGuard is what the guard adds to the built-in ranges: the fake pools,
// the sandbox's own addresses, and this host's addresses.
func hostGuard() []netip.Prefix {
	g := []netip.Prefix{fakePool4, ours6}
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(n.IP); ok {
				ip = ip.Unmap()
				// Loopback, private and link-local addresses are guarded
				// already, by ranges a cidr rule can name.
				if guarded, _ := (policy.Guard{}).Guarded(ip); guarded {
					continue
				}
				g = append(g, netip.PrefixFrom(ip, ip.BitLen()))
			}
		}
	}
	return g
}

// newSession prepares policy, DNS and audit. argv is recorded in the audit
// header. diagFD (or -1) and netns identify the sandbox for attribution.
func newSession(c *commonFlags, argv []string, diagFD int, netns uint64, stderr io.Writer) (s *session, err error) {
	s = &session{flags: c, stderr: stderr, log: newLogger(c, stderr), start: time.Now()}
	defer func() {
		if err != nil {
			if diagFD >= 0 && s.attr == nil {
				closeFD(diagFD)
			}
			s.close()
		}
	}()
	p, rules, src, err := loadRules(c, hostGuard())
	if err != nil {
		return s, err
	}
	s.rules = rules
	if s.creds, err = c.credentials(stderr); err != nil {
		return s, err
	}

	if c.upstream != "" {
		if s.upstream, err = socks5.ParseURL(c.upstream); err != nil {
			return s, fmt.Errorf("--upstream: %w", err)
		}
	}
	reuse := c.dnsPoolIdle
	if reuse == 0 {
		reuse = -1 // never
	}
	s.pool, err = dnsintercept.NewPoolWith(fakePool4, fakePool6, dnsintercept.DefaultReserved, dnsintercept.PoolOptions{
		Size:       c.dnsPoolSize,
		Pinned:     exactNames(rules),
		ReuseAfter: reuse,
	})
	if err != nil {
		return s, fmt.Errorf("--dns-pool-size %d: %w", c.dnsPoolSize, err)
	}
	up, upFrom, err := dnsUpstream(c, p)
	if err != nil {
		return s, err
	}
	rcfg := dnsintercept.ResolverConfig{Servers: up, HostsFile: c.hostsFile}
	if rc, _ := c.readHostResolv(); rc != nil {
		rcfg.Search = rc.Search // the sandbox's resolv.conf has it too
		if upFrom == c.resolvConf {
			// The host's "options timeout:N" is how long it waits for
			// one server; tunwall waits at most 5 s before the next.
			rcfg.ServerTimeout = min(rc.Timeout, 5*time.Second)
		}
	}
	if s.resolver, err = dnsintercept.NewResolver(rcfg); err != nil {
		return s, err
	}

	hdr := audit.Header{
		Phase:   rules.Phase(),
		Version: version,
		Policy:  c.policyFile,
		Argv:    argv,
		Config:  s.knobs(up, upFrom),
	}
	if src != nil {
		sum := sha256.Sum256(src)
		hdr.PolicySHA256 = hex.EncodeToString(sum[:])
	}
	run := audit.NewRunID()
	hdr.Run = run
	if c.auditFile == "off" {
		fmt.Fprintf(stderr, "tunwall: WARNING: run %s is not audited (--audit off): no flow or query is recorded\n", run)
		closeDiag(diagFD)
		return s, s.newEngine(nil)
	}
	path := c.auditFile
	if path == "" {
		if path, err = defaultAuditPath(run); err != nil {
			return s, err
		}
	}
	s.audit, err = audit.Open(audit.Options{
		Path:    path,
		Header:  hdr,
		MaxSize: int64(c.auditSize),
		MaxRate: int(c.auditRate),
		OnError: func(err error) {
			fmt.Fprintf(stderr, "tunwall: audit log %s cannot be written: %v; denying new flows\n", path, err)
		},
		// Said once per bound, even with --quiet: it changes what the
		// sandbox may do.
		OnLimit: func(err error) {
			switch {
			case errors.Is(err, audit.ErrSizeCap):
				fmt.Fprintf(stderr, "tunwall: audit log %s reached its size cap of %s (--audit-max-size): new flows and DNS queries are denied for the rest of the run\n",
					path, humanBytes(int64(c.auditSize)))
			default:
				fmt.Fprintf(stderr, "tunwall: audit log %s: more than %d lines a second (--audit-max-rate rate bound): new flows and DNS queries are denied whenever that is so\n",
					path, int(c.auditRate))
			}
		},
	})
	if err != nil {
		// audit.Open's errors say "audit: ..." already.
		return s, err
	}
	if c.auditFile == "" {
		// Only the state directory's own per-run files, never a --audit FILE.
		pruneAuditDir(filepath.Dir(path), path, c.auditKeep, c.auditKeepDays, time.Now(), stderr)
	}
	if !c.quiet {
		mode := ""
		if c.learn {
			mode = " (learn mode: allowing what the guard allows)"
		}
		fmt.Fprintf(stderr, "tunwall: run %s, phase %q%s, audit log %s\n", s.audit.Run(), rules.Phase(), mode, path)
	}

	if diagFD >= 0 {
		if s.attr, err = procattr.New(procattr.Config{DiagFD: diagFD, NetNS: netns}); err != nil {
			closeFD(diagFD)
			s.log.Warn("process attribution off", "err", err)
			s.attr = nil
			err = nil
		}
	}
	return s, s.newEngine(s.audit)
}

func closeDiag(fd int) {
	if fd >= 0 {
		closeFD(fd)
	}
}

func (s *session) newEngine(w *audit.Writer) (err error) {
	var denials io.Writer = s.stderr
	if s.flags.quiet {
		denials = nil
	}
	gate, err := s.creds.gate(s.flags, s.rules, s)
	if err != nil {
		return err
	}
	s.engine, err = engine.New(engine.Config{
		L7:           gate,
		Secrets:      s.creds.store,
		Rules:        s.rules,
		Learn:        s.flags.learn,
		Pool:         s.pool,
		Resolver:     s.resolver,
		Upstream:     s.upstream,
		Audit:        w,
		Attr:         s.attr,
		Logger:       s.log,
		Denials:      denials,
		SniffTimeout: s.flags.sniff,
		MaxHeld:      int64(s.flags.limits.maxMemory / 16),
		DialTimeout:  s.flags.dialTimeout,
		DialLimits:   s.flags.dialLimits(),
		DNSLimits: dnsintercept.Limits{
			MaxTCPConns:    s.flags.dnsMaxTCP,
			MaxUDPSessions: s.flags.dnsMaxUDP,
		},
	})
	return err
}

func closeFD(fd int) { os.NewFile(uintptr(fd), "").Close() }

// knobs lists every setting in effect, for the audit header.
func (s *session) knobs(up []netip.AddrPort, upFrom string) map[string]string {
	c := s.flags
	k := map[string]string{
		"phase":              s.rules.Phase(),
		"learn":              strconv.FormatBool(c.learn),
		"dns_upstream":       joinAddrPorts(up) + " (" + upFrom + ")",
		"hosts_file":         s.flags.hostsFile,
		"mtu":                strconv.Itoa(c.mtu),
		"sniff_timeout":      c.sniff.String(),
		"allow":              strings.Join(c.allow, " "),
		"fake_pool4":         fakePool4.String(),
		"fake_pool6":         fakePool6.String(),
		"rules":              strconv.Itoa(len(s.rules.Rules())),
		"audit_max_size":     strconv.FormatInt(int64(c.auditSize), 10),
		"audit_max_rate":     strconv.Itoa(int(c.auditRate)),
		"audit_fold_window":  audit.DefaultFoldWindow.String(),
		"dns_pool_size":      strconv.Itoa(s.pool.Cap()),
		"dns_pool_idle":      c.dnsPoolIdle.String(),
		"dns_max_tcp":        strconv.Itoa(c.dnsMaxTCP),
		"dns_max_udp":        strconv.Itoa(c.dnsMaxUDP),
		"max_dials_per_dest": strconv.Itoa(c.maxDialsPerDest),
		"dial_rate":          strconv.FormatFloat(c.dialRate, 'g', -1, 64),
		"dial_timeout":       c.dialTimeout.String(),
	}
	if s.upstream != nil {
		k["upstream"] = "socks5://" + s.upstream.Addr // credentials are not recorded
	}
	c.limits.knobs(k)
	if s.creds != nil {
		var sec []string
		for _, x := range s.creds.store.All() {
			sec = append(sec, x.Name+"="+x.From) // names and sources, never values
		}
		k["secrets"] = strings.Join(sec, " ")
		var term []string
		for _, r := range s.rules.Rules() {
			if r.HTTP != nil || len(r.Inject) > 0 {
				term = append(term, r.Host)
			}
		}
		k["terminated"] = strings.Join(term, " ")
	}
	return k
}

// readHostResolv reads --resolv-conf once. A missing or unreadable file
// leaves the sandbox without a search list; it is an error only when its
// nameservers are needed (dnsUpstream).
func (c *commonFlags) readHostResolv() (*dnsintercept.ResolvConf, error) {
	if c.hostResolv == nil && c.resolvErr == nil {
		path := c.resolvConf
		if path == "" {
			path = "/etc/resolv.conf"
		}
		b, err := os.ReadFile(path)
		if err == nil {
			c.hostResolv, err = dnsintercept.ParseResolvConf(b)
		}
		if err != nil {
			c.resolvErr = fmt.Errorf("%s: %w", path, err)
		}
	}
	return c.hostResolv, c.resolvErr
}

// dnsUpstream picks the resolvers for allowed names, in the order they are
// tried.
func dnsUpstream(c *commonFlags, p *policy.Policy) ([]netip.AddrPort, string, error) {
	if c.dnsUpstream != "" {
		ap, err := netip.ParseAddrPort(c.dnsUpstream)
		if err != nil {
			ip, err2 := netip.ParseAddr(c.dnsUpstream)
			if err2 != nil {
				return nil, "", fmt.Errorf("--dns-upstream %q: want IP:PORT", c.dnsUpstream)
			}
			ap = netip.AddrPortFrom(ip, 53)
		}
		return []netip.AddrPort{ap}, "--dns-upstream", nil
	}
	if p != nil && p.DNSUpstream().IsValid() {
		return []netip.AddrPort{p.DNSUpstream()}, "policy", nil
	}
	rc, err := c.readHostResolv()
	if err == nil && len(rc.Servers) == 0 {
		err = fmt.Errorf("%s: no valid nameserver line", c.resolvConf)
	}
	if err != nil {
		return nil, "", fmt.Errorf("no DNS upstream: give --dns-upstream IP:PORT or dns.upstream in the policy (%w)", err)
	}
	return rc.Servers, c.resolvConf, nil
}

func defaultAuditPath(run string) (string, error) {
	dir := os.Getenv("XDG_STATE_HOME")
	if dir == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", fmt.Errorf("no audit path: give --audit FILE (%w)", err)
		}
		dir = filepath.Join(home, ".local", "state")
	}
	return filepath.Join(dir, "tunwall", run+".jsonl"), nil
}

// joinAddrPorts lists addresses separated by spaces.
func joinAddrPorts(aps []netip.AddrPort) string {
	ss := make([]string, len(aps))
	for i, ap := range aps {
		ss[i] = ap.String()
	}
	return strings.Join(ss, " ")
}

// netConfig is the sandbox side of the TUN, with the host's search list and
// resolver options.
func (c *commonFlags) netConfig() sandbox.NetConfig {
	var search, opts []string
	if rc, _ := c.readHostResolv(); rc != nil {
		search, opts = rc.Search, rc.Options
	}
	return sandbox.NetConfig{
		Search:    search,
		Options:   opts,
		Name:      "tun0",
		MTU:       c.mtu,
		Addr4:     tun.DefaultAddr4,
		Addr6:     tun.DefaultAddr6,
		Resolver4: resolver4,
		Resolver6: resolver6,
	}
}

// serve starts the stack on the sandbox's TUN. The session owns tunFD from
// now on.
func (s *session) serve(tunFD int) error {
	cfg := stack.Config{
		FD:      tunFD,
		MTU:     uint32(s.flags.mtu),
		Handler: s.engine,
		Logger:  s.log,
	}
	nc := s.flags.netConfig()
	s.flags.limits.stackConfig(&cfg, nc.Addr4, nc.Addr6)
	s.flags.limits.applyMemoryLimit()
	st, err := stack.New(cfg)
	if err != nil {
		closeFD(tunFD)
		return err
	}
	s.stack = st
	stopStats, stopRelease := s.watchStats(), releaseIdleMemory()
	s.stopStats = func() { stopStats(); stopRelease() }
	return nil
}

// close stops serving in order: the stack (every flow ends and is recorded),
// then the audit log (trailer, fsync), and prints the end-of-run summary.
func (s *session) close() {
	if s.stopStats != nil {
		s.stopStats()
		s.stopStats = nil
	}
	if s.stack != nil {
		s.stack.Close()
		st := s.stack.Stats()
		s.log.Debug("stack stats", "stats", fmt.Sprintf("%+v", st))
		if st.Malformed > 0 && !s.flags.quiet {
			fmt.Fprintf(s.stderr, "tunwall: dropped %d malformed packets from the sandbox\n", st.Malformed)
		}
		if !s.flags.quiet {
			for _, l := range limitSummary(st, s.engine.RefusedUnrecorded()) {
				fmt.Fprintf(s.stderr, "tunwall: %s\n", l)
			}
			printDNSLimits(s.stderr, s.engine.DNSStats())
		}
		s.engine.FlushDialRefusals()
		if d := s.engine.DialStats(); !s.flags.quiet && d.RefusedPending+d.RefusedRate > 0 {
			fmt.Fprintf(s.stderr, "tunwall: dial limits reached: %d connections reset with too many dials in progress to their destination, %d above --dial-rate\n", d.RefusedPending, d.RefusedRate)
		}
		s.stack = nil
	}
	if s.attr != nil {
		s.attr.Close()
		s.attr = nil
	}
	s.creds.close()
	if s.audit == nil {
		return
	}
	totals := s.audit.Totals()
	sum, err := s.audit.Close()
	if err != nil {
		fmt.Fprintf(s.stderr, "tunwall: closing audit log: %v\n", err)
	}
	s.auditLost, s.auditErr = sum.Lost, err
	if !s.flags.quiet {
		s.printSummary(totals, sum)
	}
	s.audit = nil
}

// printDNSLimits says which DNS limits were reached, if any.
func printDNSLimits(w io.Writer, d dnsintercept.Stats) {
	var parts []string
	for _, p := range []struct {
		n    uint64
		what string
	}{
		{d.Evicted, "idle sessions closed to make room"},
		{d.Refused, "sessions refused with every one busy"},
		{d.Overrun, "UDP queries dropped with too many in flight"},
		{d.UpstreamBusy, "queries answered SERVFAIL with the upstream busy"},
		{d.Exhausted, "refused with the fake-address pool full"},
	} {
		if p.n > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", p.n, p.what))
		}
	}
	if len(parts) > 0 {
		fmt.Fprintf(w, "tunwall: DNS limits reached: %s\n", strings.Join(parts, ", "))
	}
}

func (s *session) printSummary(t audit.Totals, sum audit.Summary) {
	w := s.stderr
	fmt.Fprintf(w, "tunwall: %d flows allowed, %d denied; %d DNS queries answered, %d denied; %s out, %s in\n",
		t.FlowsAllowed, t.FlowsDenied, t.DNSAllowed, t.DNSDenied, humanBytes(t.BytesOut), humanBytes(t.BytesIn))
	hosts := append([]audit.HostTotals(nil), t.Hosts...)
	sort.SliceStable(hosts, func(i, j int) bool {
		if hosts[i].Denied() != hosts[j].Denied() {
			return hosts[i].Denied()
		}
		return hosts[i].Flows()+hosts[i].DNS() > hosts[j].Flows()+hosts[j].DNS()
	})
	for i, h := range hosts {
		if i == 5 {
			fmt.Fprintf(w, "tunwall:   ... and %d more hosts\n", len(hosts)-5+t.OtherHosts)
			break
		}
		fmt.Fprintf(w, "tunwall:   %-40s %-5s %d flows, %d DNS\n", truncateMiddle(engine.Printable(h.Host), 40), h.Verdicts(), h.Flows(), h.DNS())
	}
	if sum.Lost > 0 {
		fmt.Fprintf(w, "tunwall: WARNING: %d audit records could not be written\n", sum.Lost)
	}
	fmt.Fprintf(w, "tunwall: audit log %s (%d records, last sha256 %s); check it with: tunwall audit verify %s --expect %s\n",
		s.audit.Path(), sum.Count, sum.Last, s.audit.Path(), sum.Last)
}

func humanBytes(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

// truncateMiddle shortens s to at most n characters (runes) by cutting its
// middle, so that a table fits 100 columns and both ends of a long name
// (the subdomain and the registered domain) stay readable.
func truncateMiddle(s string, n int) string {
	r := []rune(s)
	if len(r) <= n || n < 3 {
		return s
	}
	head := (n - 1) / 2
	tail := n - 1 - head
	return string(r[:head]) + "…" + string(r[len(r)-tail:])
}
