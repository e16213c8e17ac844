package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tunwall/tunwall/internal/audit"
	"github.com/tunwall/tunwall/internal/control"
	"github.com/tunwall/tunwall/internal/engine"
	"github.com/tunwall/tunwall/internal/sandbox"
	"github.com/tunwall/tunwall/internal/session"
	"github.com/tunwall/tunwall/policy"
	"github.com/tunwall/tunwall/tun"
)

// allowFlags collects repeatable --allow values.
type allowFlags []string

func (a *allowFlags) String() string     { return strings.Join(*a, ",") }
func (a *allowFlags) Set(s string) error { *a = append(*a, s); return nil }

// labelFlags collects repeatable --label KEY=VALUE values.
type labelFlags map[string]string

func (l *labelFlags) String() string {
	var kv []string
	for k, v := range *l {
		kv = append(kv, k+"="+v)
	}
	slices.Sort(kv)
	return strings.Join(kv, ",")
}

func (*labelFlags) repeatable() {}

func (l *labelFlags) Set(s string) error {
	k, v, ok := strings.Cut(s, "=")
	if !ok {
		return fmt.Errorf("%q is not KEY=VALUE", s)
	}
	if err := audit.CheckLabelKey(k); err != nil {
		return err
	}
	if _, dup := (*l)[k]; dup {
		return fmt.Errorf("label %s given twice", k)
	}
	if *l == nil {
		*l = labelFlags{}
	}
	(*l)[k] = v
	return nil
}

// commonFlags are the flags of every command that serves a sandbox.
type commonFlags struct {
	policyFile  string
	allow       allowFlags
	phase       string
	auditFile   string
	labels      labelFlags
	dnsUpstream string
	resolvConf  string // the host's resolv.conf (--resolv-conf)
	hostsFile   string // the host's hosts file (--hosts-file)
	hostResolv  *session.ResolvConf
	resolvErr   error
	upstream    string
	learn       bool
	quiet       bool
	what        string // run, bwrap: the command's name, for the line saying who runs it
	jsonLog     bool
	verbose     bool
	mtu         int
	sniff       time.Duration
	limits      limitFlags
	auditSize   byteSize
	auditRate   positiveInt
	// DNS limits (session.DNSOptions)
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
	inject  injectFlags
	// stablePlaceholders derives placeholders from the project's key
	// (--stable-placeholders)
	stablePlaceholders bool
	creds              *credentials
	// retention of the default audit directory (retention.go)
	auditKeep     int
	auditKeepDays int
	// the control socket (--control, ctl.go) and metrics listener
	// (--metrics-listen), made before the sandbox (controlListeners), with
	// the run id that names the socket and the sandbox's pid namespace
	control       string
	metricsListen string
	// approvals (--ask, --decider, --ask-timeout)
	ask          bool
	decider      string
	askTimeout   time.Duration
	runID        string
	ctl          *control.Listener
	metrics      net.Listener
	sandboxPidNS uint64
	cover        []string // what the sandbox must not see of them
	// the policy file, read and parsed, and the rule set, made once
	// (loadRules)
	loaded bool
	pol    *policy.Policy
	polSrc []byte
	rules  *policy.RuleSet
	polErr error
}

func (c *commonFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&c.policyFile, "policy", "", "policy `FILE` (YAML, version 1)")
	fs.Var(&c.allow, "allow", "allow `HOST[:PORT][/udp]`, *.SUFFIX, IP, CIDR or [IPv6]:PORT (repeatable; port defaults to 443, * means any)")
	fs.StringVar(&c.phase, "phase", "", "policy phase `NAME` (required when the policy has more than one)")
	fs.StringVar(&c.auditFile, "audit", "", "audit log `FILE` (default: $XDG_STATE_HOME/tunwall/RUN.jsonl); \"off\" runs unaudited (for measuring its cost)")
	fs.Var(&c.labels, "label", "label the run `KEY=VALUE` (repeatable; KEY of a-z, 0-9, '_', '.', '-'; at most 16): every audit record carries the run's labels, and audit summary --by KEY groups by one")
	fs.StringVar(&c.dnsUpstream, "dns-upstream", "", "resolver `IP:PORT` for allowed names (default: the policy's dns.upstream, else the host's resolv.conf)")
	fs.StringVar(&c.resolvConf, "resolv-conf", "/etc/resolv.conf", "the host's resolver configuration `FILE`: its nameservers (in order, with failover) resolve allowed names unless --dns-upstream or the policy's dns.upstream says otherwise; its search list and options (ndots, timeout, attempts, ...) are written into the sandbox's resolv.conf")
	fs.StringVar(&c.hostsFile, "hosts-file", "/etc/hosts", "hosts `FILE` allowed names are resolved through before DNS, as glibc does (\"\" for none)")
	fs.StringVar(&c.upstream, "upstream", "", "send allowed flows through `socks5://[user:pass@]HOST:PORT`")
	fs.BoolVar(&c.learn, "learn", false, "learn mode: allow every flow the private-range guard allows, and record what the policy would have said")
	fs.BoolVar(&c.quiet, "quiet", false, "print no denials and no end-of-run summary")
	fs.BoolVar(&c.jsonLog, "json-log", false, "write everything tunwall itself prints on stderr (banner, denials, warnings, errors, summary) as JSON objects, one a line; durations in milliseconds (fields ending _ms)")
	fs.BoolVar(&c.verbose, "v", false, "verbose diagnostics")
	fs.IntVar(&c.mtu, "mtu", tun.DefaultMTU, "MTU of the sandbox's TUN")
	fs.DurationVar(&c.sniff, "sniff-timeout", session.DefaultSniffTimeout, "how long a client may take to complete a TLS ClientHello or HTTP request head it has begun (past it, it is reset)")
	c.auditSize, c.auditRate = audit.DefaultMaxSize, audit.DefaultMaxRate
	fs.Var(&c.auditSize, "audit-max-size", "cap on this run's audit log, e.g. 512MiB (`SIZE`: bytes, KiB, MiB, GiB); reaching it denies new flows and DNS queries")
	fs.Var(&c.auditRate, "audit-max-rate", "audit `LINES` a second, sustained, after a burst of 10 s of them; beyond it new flows and DNS queries are denied and repeated records only counted")
	fs.IntVar(&c.dnsPoolSize, "dns-pool-size", session.DefaultDNSPoolSize, "fake-address slots (one per name; exact names of the rules always have one); at most 130816")
	fs.DurationVar(&c.dnsPoolIdle, "dns-pool-idle", session.DefaultDNSPoolIdle, "a wildcard-matched name's fake address unused (no query, no open flow) this long may go to another name; 0 never")
	fs.IntVar(&c.dnsMaxTCP, "dns-max-tcp", session.DefaultDNSMaxTCP, "DNS-over-TCP connections served at once (past it the one idle longest is closed)")
	fs.IntVar(&c.dnsMaxUDP, "dns-max-udp", session.DefaultDNSMaxUDP, "UDP DNS sessions (client sockets) served at once (past it the one idle longest is ended)")
	fs.IntVar(&c.auditKeep, "audit-keep", defaultAuditKeep, "without --audit: keep the last `N` runs' logs in the state directory, removing older ones when a run starts; 0 keeps all")
	fs.IntVar(&c.auditKeepDays, "audit-keep-days", defaultAuditKeepDays, "without --audit: remove runs' logs older than `DAYS` from the state directory when a run starts; 0 keeps them")
	fs.StringVar(&c.control, "control", "", "the run's control socket `PATH` (default: $XDG_RUNTIME_DIR/tunwall/RUN.sock, or /run/tunwall/RUN.sock as root), which 'tunwall ctl' asks; \"off\" for none. Only your user (or root) may use it, never the sandbox")
	fs.StringVar(&c.metricsListen, "metrics-listen", "", "serve the run's metrics (Prometheus text format) over HTTP on `ADDR` (host:port), in tunwall's own network namespace, out of the sandbox's reach")
	fs.BoolVar(&c.ask, "ask", false, "hold a DNS name (or a TCP connection to a name's port) that only the default rule would deny for a decision (tunwall ctl pending, allow ID, deny ID; or --decider) instead of denying it at once; a lookup is answered SERVFAIL after 2 s while it waits, so the client's retry gets the decision; a connection waits up to 10 s")
	fs.StringVar(&c.decider, "decider", "", "with --ask: an external decider `CMD` (run with /bin/sh -c, outside the sandbox) sent one JSON request a line on its stdin (id, phase, proto, host, port, pid, comm, exe), answering one a line on its stdout (id, verdict allow|deny, scope once|run|always, reason); one that dies or writes anything else denies everything, said once")
	fs.DurationVar(&c.askTimeout, "ask-timeout", session.DefaultAskTimeout, "with --ask: how long a request waits for a decision before it is denied (fail closed)")
	c.limits.register(fs)
	fs.IntVar(&c.maxDialsPerDest, "max-dials-per-dest", session.DefaultMaxDialsPerDest, "TCP dials in progress to one destination (name or address, and port); past it new connections to it are reset at once")
	fs.Float64Var(&c.dialRate, "dial-rate", engine.DefaultDialRate, "new TCP dials a second to one destination, after a burst of as many; past it new connections to it are reset at once (0: no limit)")
	fs.DurationVar(&c.dialTimeout, "dial-timeout", session.DefaultDialTimeout, "how long one upstream dial may take, every address of the name tried included")
	fs.Var(&c.secrets, "secret", "a secret kept outside the sandbox, `NAME=env:VAR|file:PATH` (repeatable): the sandbox gets a placeholder in $NAME; rules' inject puts the value into requests to their hosts")
	fs.Var(&c.inject, "inject", "a rule without a policy file, `HOST[:PORT]=SECRET`: allow HOST (port 443 by default) and put SECRET into its requests in place of its placeholder (repeatable; SECRET is read from tunwall's variable of that name unless --secret declares it)")
	fs.BoolVar(&c.stablePlaceholders, "stable-placeholders", false, "give each secret the same placeholder in every run started in this directory (derived from a key kept in $XDG_STATE_HOME/tunwall/placeholder-keys), so that a saved remote URL or config file keeps working")
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

// byteSize is a flag value of bytes with an optional binary unit.
type byteSize int64

func (b *byteSize) String() string { return session.HumanBytes(int64(*b)) }

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

// loadRules builds the run's rule set from --policy, --phase and --allow,
// with the guard's extra ranges for this host (session.HostGuard). The
// policy file is read and parsed, and the rule set selected, once per run
// (the first call; preflight makes it): --policy /dev/stdin, --policy - and
// --policy <(...) work, since a pipe cannot be read twice, and every part
// of the run sees the same rules.
func (c *commonFlags) loadRules() (*policy.Policy, *policy.RuleSet, []byte, error) {
	if !c.loaded {
		c.loaded = true
		c.pol, c.polSrc, c.rules, c.polErr = c.selectRules(session.HostGuard(session.DefaultPlan))
	}
	return c.pol, c.rules, c.polSrc, c.polErr
}

func (c *commonFlags) selectRules(extraGuard []netip.Prefix) (*policy.Policy, []byte, *policy.RuleSet, error) {
	p, src, err := readPolicy(c.policyFile)
	if err != nil {
		return nil, nil, nil, err
	}
	extra, err := c.extraRules()
	if err != nil {
		return nil, nil, nil, err
	}
	if p == nil && len(extra) == 0 && !c.learn {
		return nil, nil, nil, errors.New("no policy: give --policy FILE and/or --allow (or --inject) rules, or --learn; everything would be denied")
	}
	rs, err := selectWithOverlay(c.policyFile, p, c.phase, extra, policy.Guard{Extra: extraGuard})
	if err != nil {
		return nil, nil, nil, err
	}
	return p, src, rs, nil
}

// extraRules are the command line's rules: --allow and --inject.
func (c *commonFlags) extraRules() ([]policy.Rule, error) {
	var extra []policy.Rule
	for _, a := range c.allow {
		r, err := policy.ParseAllow(a) // its errors begin "--allow VALUE:"
		if err != nil {
			return nil, err
		}
		extra = append(extra, r)
	}
	for _, v := range c.inject {
		r, err := policy.ParseInject(v) // its errors begin "--inject VALUE:"
		if err != nil {
			return nil, err
		}
		extra = append(extra, r)
	}
	return extra, nil
}

// everyPhase returns the rules of every phase of p, each with the command
// line's rules; rs, the run's, stands for its own phase.
func (c *commonFlags) everyPhase(p *policy.Policy, rs *policy.RuleSet) ([]*policy.RuleSet, error) {
	all := []*policy.RuleSet{rs}
	if p == nil {
		return all, nil
	}
	extra, err := c.extraRules()
	if err != nil {
		return nil, err
	}
	for _, ph := range p.Phases() {
		if ph == rs.Phase() {
			continue
		}
		o, err := policy.Select(p, ph, extra, policy.Guard{Extra: session.HostGuard(session.DefaultPlan)})
		if err != nil {
			return nil, err
		}
		all = append(all, o)
	}
	return all, nil
}

// rebuild returns the session's Rebuild: the rules of a phase of the
// policy file as it is on disk now, with the command line's rules. What
// the run made at its start for the policy it had then (the secrets it
// read, the hosts its CA may sign for, the ca files it trusts) does not
// change: rules that need more are refused, and say so.
func (c *commonFlags) rebuild(cr *credentials) func(phase string) (*policy.RuleSet, []byte, error) {
	if c.policyFile == "" || c.policyFile == "-" {
		return nil
	}
	if fi, err := os.Stat(c.policyFile); err != nil || !fi.Mode().IsRegular() {
		return nil // a pipe (--policy <(...)) cannot be read again
	}
	var secrets []policy.SecretSource
	for _, s := range cr.creds.Secrets() {
		secrets = append(secrets, policy.SecretSource{Name: s.Name})
	}
	startRules := c.rules
	return func(phase string) (*policy.RuleSet, []byte, error) {
		p, src, err := readPolicy(c.policyFile)
		if err != nil {
			return nil, nil, err
		}
		extra, err := c.extraRules()
		if err != nil {
			return nil, nil, err
		}
		rs, err := selectWithOverlay(c.policyFile, p, phase, extra, policy.Guard{Extra: session.HostGuard(session.DefaultPlan)})
		if err != nil {
			return nil, nil, err
		}
		if err := checkSecretsDeclared(rs, secrets); err != nil {
			return nil, nil, fmt.Errorf("%w; this run read its secrets when it started: restart it to add one", err)
		}
		all, err := c.everyPhase(c.pol, startRules)
		if err != nil {
			return nil, nil, err
		}
		ready := terminatedHosts(all)
		for _, h := range terminatedHosts([]*policy.RuleSet{rs}) {
			if !slices.Contains(ready, h) {
				return nil, nil, fmt.Errorf("policy %s: phase %s terminates %s, which this run's CA was not made for when it started (it signs only for %s): restart the run to add it",
					c.policyFile, rs.Phase(), h, strings.Join(ready, ", "))
			}
		}
		trusted := caFiles(all)
		for _, f := range rs.CAFiles() {
			if !slices.Contains(trusted, f) {
				return nil, nil, fmt.Errorf("policy %s: phase %s names ca %s, which this run did not read when it started: restart the run to add it", c.policyFile, rs.Phase(), f)
			}
		}
		return rs, src, nil
	}
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

// readHostResolv reads --resolv-conf once. A missing or unreadable file
// leaves the sandbox without a search list; it is an error only when its
// nameservers are needed (dnsUpstream).
func (c *commonFlags) readHostResolv() (*session.ResolvConf, error) {
	if c.hostResolv == nil && c.resolvErr == nil {
		path := c.resolvConf
		if path == "" {
			path = "/etc/resolv.conf"
		}
		b, err := os.ReadFile(path)
		if err == nil {
			c.hostResolv, err = session.ParseResolvConf(b)
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
		Addr4:     session.DefaultPlan.Addr4,
		Addr6:     session.DefaultPlan.Addr6,
		Resolver4: session.DefaultPlan.Resolver4,
		Resolver6: session.DefaultPlan.Resolver6,
	}
}

// sessionOptions maps the flags (and the policy, rules and credentials
// loaded by preflight) to the session's options. argv is recorded in the
// audit header; diagFD (or -1) and netns identify the sandbox for
// attribution.
func (c *commonFlags) sessionOptions(argv []string, diagFD int, netns uint64, stderr io.Writer) (session.Options, error) {
	p, rules, src, err := c.loadRules()
	if err != nil {
		return session.Options{}, err
	}
	cr, err := c.credentials(stderr)
	if err != nil {
		return session.Options{}, err
	}
	dns, err := c.dnsOptions(p)
	if err != nil {
		return session.Options{}, err
	}
	labels, err := audit.NewLabels(c.labels)
	if err != nil {
		return session.Options{}, fmt.Errorf("--label: %w", err)
	}
	dialRate := c.dialRate
	if dialRate == 0 {
		dialRate = -1 // --dial-rate 0: no limit
	}
	o := session.Options{
		Rules:    rules,
		Learn:    c.learn,
		Stderr:   stderr,
		Quiet:    c.quiet,
		Logger:   newLogger(c, stderr),
		DNS:      dns,
		Upstream: c.upstream,
		Audit: session.AuditOptions{
			Off:      c.auditFile == "off",
			Path:     c.auditFile,
			Keep:     c.auditKeep,
			KeepDays: c.auditKeepDays,
			MaxSize:  int64(c.auditSize),
			MaxRate:  int(c.auditRate),
			Labels:   labels,
		},
		Limits: session.Limits{
			MaxTCPFlows:      c.limits.maxTCP,
			MaxUDPSessions:   c.limits.maxUDP,
			MaxTCPHandshakes: c.limits.maxHandshakes,
			HandshakeTimeout: c.limits.handshake,
			MaxMemory:        int64(c.limits.maxMemory),
			SniffTimeout:     c.sniff,
			MaxDialsPerDest:  c.maxDialsPerDest,
			DialRate:         dialRate,
			DialTimeout:      c.dialTimeout,
		},
		MTU:          c.mtu,
		Credentials:  cr.creds,
		Roots:        cr.roots,
		CARoots:      cr.caRoots,
		DiagFD:       diagFD,
		NetNS:        netns,
		PolicyFile:   c.policyFile,
		PolicySource: src,
		AllowFlags:   c.allow,
		Argv:         argv,
		Version:      version,
		Run:          c.runID,
		Control:      c.ctl,
		Metrics:      c.metrics,
		SandboxPidNS: c.sandboxPidNS,
		Rebuild:      c.rebuild(cr),
	}
	if o.Ask, err = c.askOptions(stderr); err != nil {
		return session.Options{}, err
	}
	if o.Audit.Off {
		o.Audit.Path = ""
	}
	return o, nil
}

// dnsOptions maps the DNS flags (and the upstream servers from the
// policy, the flags or the host's resolv.conf, whose search list and
// timeout the sandbox shares) to the session's DNS options.
func (c *commonFlags) dnsOptions(p *policy.Policy) (session.DNSOptions, error) {
	ups, upFrom, err := dnsUpstream(c, p)
	if err != nil {
		return session.DNSOptions{}, err
	}
	dns := session.DNSOptions{
		Upstream:     ups,
		UpstreamFrom: upFrom,
		HostsFile:    c.hostsFile,
		PoolSize:     c.dnsPoolSize,
		PoolIdle:     c.dnsPoolIdle,
		MaxTCP:       c.dnsMaxTCP,
		MaxUDP:       c.dnsMaxUDP,
	}
	if dns.PoolIdle == 0 {
		dns.PoolIdle = -1 // --dns-pool-idle 0: never
	}
	if rc, _ := c.readHostResolv(); rc != nil {
		dns.Search = rc.Search // the sandbox's resolv.conf has it too
		if upFrom == c.resolvConf {
			// The host's "options timeout:N" is how long it waits for
			// one server; tunwall waits at most 5 s before the next.
			dns.ServerTimeout = min(rc.Timeout, 5*time.Second)
		}
	}
	return dns, nil
}

// newSession builds the session that serves one sandbox, and says so
// (its banner). It owns diagFD (or -1) from the call on.
func newSession(c *commonFlags, argv []string, diagFD int, netns uint64, stderr io.Writer) (*servedSession, error) {
	o, err := c.sessionOptions(argv, diagFD, netns, stderr)
	if err != nil {
		closeDiag(diagFD)
		closeListeners(c.ctl, c.metrics)
		return nil, err
	}
	s, err := session.New(o)
	if err != nil {
		return nil, err
	}
	s.WriteBanner(stderr)
	return &servedSession{Session: s, quiet: c.quiet, stderr: stderr}, nil
}

// servedSession is a session as a front end holds it: closing it prints
// the session's report (what limits were reached, the end-of-run summary)
// as tunwall says it, once.
type servedSession struct {
	*session.Session
	quiet  bool
	stderr io.Writer
	once   sync.Once
	err    error
}

// Close closes the session and prints its report; it returns Close's
// error (an *session.AuditLostError when the log is incomplete).
func (s *servedSession) Close() error {
	s.once.Do(func() {
		var r session.Report
		r, s.err = s.Session.Close()
		r.Write(s.stderr, s.quiet)
	})
	return s.err
}

// startSession serves tunFD (the session owns it from the call on) with
// the process-wide parts: the Go runtime's memory limit, the SIGUSR1
// stats line and the release of idle memory. stop ends the last two; call
// it before the session's Close.
func startSession(s *servedSession, c *commonFlags, tunFD int, stderr io.Writer) (stop func(), err error) {
	c.limits.applyMemoryLimit()
	if err := s.Start(tunFD); err != nil {
		return func() {}, err
	}
	stopStats, stopRelease := watchStats(s.Session, stderr), releaseIdleMemory()
	return func() { stopStats(); stopRelease() }, nil
}

// exitStatus is what tunwall exits with when code is the command's status
// (or tunwall's own) and closeErr the session's Close error: exitLost when
// the audit log is incomplete, saying so along with code, even with
// --quiet.
func exitStatus(closeErr error, code int, what string, stderr io.Writer) int {
	if closeErr == nil {
		return code
	}
	var lost *session.AuditLostError
	if !errors.As(closeErr, &lost) {
		lost = &session.AuditLostError{Err: closeErr}
	}
	fmt.Fprintf(stderr, "tunwall: %v; %s %d; exiting %d\n", lost, what, code, exitLost)
	return exitLost
}

func closeDiag(fd int) {
	if fd >= 0 {
		closeFD(fd)
	}
}

func closeFD(fd int) { os.NewFile(uintptr(fd), "").Close() }
