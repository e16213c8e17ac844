package main

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
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
	upstream    string
	learn       bool
	quiet       bool
	jsonLog     bool
	verbose     bool
	mtu         int
	sniff       time.Duration
	limits      limitFlags
}

func (c *commonFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&c.policyFile, "policy", "", "policy `FILE` (YAML, version 1)")
	fs.Var(&c.allow, "allow", "allow `HOST[:PORT][/udp]`, *.SUFFIX, IP, CIDR or [IPv6]:PORT (repeatable; port defaults to 443, * means any)")
	fs.StringVar(&c.phase, "phase", "", "policy phase `NAME` (required when the policy has more than one)")
	fs.StringVar(&c.auditFile, "audit", "", "audit log `FILE` (default: $XDG_STATE_HOME/tunwall/RUN.jsonl); \"off\" runs unaudited (for measuring its cost)")
	fs.StringVar(&c.dnsUpstream, "dns-upstream", "", "resolver `IP:PORT` for allowed names (default: the policy's dns.upstream, else the host's resolv.conf)")
	fs.StringVar(&c.upstream, "upstream", "", "send allowed flows through `socks5://[user:pass@]HOST:PORT`")
	fs.BoolVar(&c.learn, "learn", false, "learn mode: allow every flow the private-range guard allows, and record what the policy would have said")
	fs.BoolVar(&c.quiet, "quiet", false, "print no denials and no end-of-run summary")
	fs.BoolVar(&c.jsonLog, "json-log", false, "write tunwall's own diagnostics to stderr as JSON")
	fs.BoolVar(&c.verbose, "v", false, "verbose diagnostics")
	fs.IntVar(&c.mtu, "mtu", tun.DefaultMTU, "MTU of the sandbox's TUN")
	fs.DurationVar(&c.sniff, "sniff-timeout", 300*time.Millisecond, "how long to wait for a client's TLS ClientHello or HTTP request before judging by its fake IP's name alone")
	c.limits.register(fs)
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
	start    time.Time
}

func newLogger(c *commonFlags, stderr io.Writer) *slog.Logger {
	level := slog.LevelWarn
	if c.verbose {
		level = slog.LevelDebug
	}
	opts := &slog.HandlerOptions{Level: level}
	if c.jsonLog {
		return slog.New(slog.NewJSONHandler(stderr, opts))
	}
	return slog.New(slog.NewTextHandler(stderr, opts))
}

// loadRules builds the run's rule set from --policy, --phase and --allow.
func loadRules(c *commonFlags, extraGuard []netip.Prefix) (*policy.Policy, *policy.RuleSet, []byte, error) {
	var (
		p   *policy.Policy
		src []byte
		err error
	)
	if c.policyFile != "" {
		if src, err = os.ReadFile(c.policyFile); err != nil {
			return nil, nil, nil, err
		}
		if p, err = policy.Parse(c.policyFile, src); err != nil {
			return nil, nil, nil, err
		}
	}
	var extra []policy.Rule
	for _, a := range c.allow {
		r, err := policy.ParseAllow(a)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("--allow %s: %w", a, err)
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

	if c.upstream != "" {
		if s.upstream, err = socks5.ParseURL(c.upstream); err != nil {
			return s, fmt.Errorf("--upstream: %w", err)
		}
	}
	if s.pool, err = dnsintercept.NewPool(fakePool4, fakePool6); err != nil {
		return s, err
	}
	up, upFrom, err := dnsUpstream(c, p)
	if err != nil {
		return s, err
	}
	if s.resolver, err = dnsintercept.NewResolver(dnsintercept.ResolverConfig{Server: up}); err != nil {
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
		Path:   path,
		Header: hdr,
		OnError: func(err error) {
			fmt.Fprintf(stderr, "tunwall: audit log %s cannot be written: %v; denying new flows\n", path, err)
		},
	})
	if err != nil {
		return s, fmt.Errorf("audit log: %w", err)
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
	s.engine, err = engine.New(engine.Config{
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
	})
	return err
}

func closeFD(fd int) { os.NewFile(uintptr(fd), "").Close() }

// knobs lists every setting in effect, for the audit header.
func (s *session) knobs(up netip.AddrPort, upFrom string) map[string]string {
	c := s.flags
	k := map[string]string{
		"phase":         s.rules.Phase(),
		"learn":         strconv.FormatBool(c.learn),
		"dns_upstream":  up.String() + " (" + upFrom + ")",
		"mtu":           strconv.Itoa(c.mtu),
		"sniff_timeout": c.sniff.String(),
		"allow":         strings.Join(c.allow, " "),
		"fake_pool4":    fakePool4.String(),
		"fake_pool6":    fakePool6.String(),
		"rules":         strconv.Itoa(len(s.rules.Rules())),
	}
	if s.upstream != nil {
		k["upstream"] = "socks5://" + s.upstream.Addr // credentials are not recorded
	}
	c.limits.knobs(k)
	return k
}

// dnsUpstream picks the resolver for allowed names.
func dnsUpstream(c *commonFlags, p *policy.Policy) (netip.AddrPort, string, error) {
	if c.dnsUpstream != "" {
		ap, err := netip.ParseAddrPort(c.dnsUpstream)
		if err != nil {
			ip, err2 := netip.ParseAddr(c.dnsUpstream)
			if err2 != nil {
				return ap, "", fmt.Errorf("--dns-upstream %q: want IP:PORT", c.dnsUpstream)
			}
			ap = netip.AddrPortFrom(ip, 53)
		}
		return ap, "--dns-upstream", nil
	}
	if p != nil && p.DNSUpstream().IsValid() {
		return p.DNSUpstream(), "policy", nil
	}
	ap, err := dnsintercept.HostResolvConf("/etc/resolv.conf")
	if err != nil {
		return ap, "", fmt.Errorf("no DNS upstream: give --dns-upstream IP:PORT or dns.upstream in the policy (%w)", err)
	}
	return ap, "/etc/resolv.conf", nil
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

// netConfig is the sandbox side of the TUN.
func (c *commonFlags) netConfig() sandbox.NetConfig {
	return sandbox.NetConfig{
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
	return nil
}

// close stops serving in order: the stack (every flow ends and is recorded),
// then the audit log (trailer, fsync), and prints the end-of-run summary.
func (s *session) close() {
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
		}
		s.stack = nil
	}
	if s.attr != nil {
		s.attr.Close()
		s.attr = nil
	}
	if s.audit == nil {
		return
	}
	totals := s.audit.Totals()
	sum, err := s.audit.Close()
	if err != nil {
		fmt.Fprintf(s.stderr, "tunwall: closing audit log: %v\n", err)
	}
	if !s.flags.quiet {
		s.printSummary(totals, sum)
	}
	s.audit = nil
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
		fmt.Fprintf(w, "tunwall:   %-40s %-5s %d flows, %d DNS\n", h.Host, h.Verdicts(), h.Flows(), h.DNS())
	}
	if sum.Lost > 0 {
		fmt.Fprintf(w, "tunwall: WARNING: %d audit records could not be written\n", sum.Lost)
	}
	fmt.Fprintf(w, "tunwall: audit log %s (%d records, last sha256 %s); check it with: tunwall audit verify %s\n",
		s.audit.Path(), sum.Count, shortHash(sum.Last), s.audit.Path())
}

func shortHash(h string) string {
	if len(h) > 16 {
		return h[:16]
	}
	return h
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
