package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/net/publicsuffix"

	"github.com/tunwall/tunwall/internal/audit"
	"github.com/tunwall/tunwall/internal/engine"
	"github.com/tunwall/tunwall/policy"
)

const policyUsage = `usage: tunwall policy SUBCOMMAND [args] [flags]

Subcommands:
  check FILE                                 validate a policy file (every error, file:line each)
  explain FILE (HOST[:PORT] | URL [--method M]) [--phase P] [--udp]
                                             say what the policy decides for a destination or request
  suggest AUDIT.jsonl [--phase P]            write a policy allowing what a (learn-mode) run used

Run 'tunwall policy SUBCOMMAND --help' for its flags.
`

var policySubcommands = []string{"check", "explain", "suggest"}

func cmdPolicy(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, policyUsage)
		return exitUsage
	}
	switch args[0] {
	case "check":
		return policyCheck(args[1:], stdout, stderr)
	case "explain":
		return policyExplain(args[1:], stdout, stderr)
	case "suggest":
		return policySuggest(args[1:], stdout, stderr)
	case "-h", "--help", "-help", "help":
		if args[0] == "help" && len(args) > 1 {
			return cmdPolicy([]string{args[1], "--help"}, stdout, stderr)
		}
		fmt.Fprint(stdout, policyUsage)
		return exitOK
	}
	return unknownSubcommand("policy", args[0], policySubcommands, stderr)
}

// unknownSubcommand says that sub is not a subcommand of cmd, suggests the
// closest one, and returns exitUsage.
func unknownSubcommand(cmd, sub string, subs []string, stderr io.Writer) int {
	fmt.Fprintf(stderr, "tunwall %s: unknown subcommand %q (%s)\n", cmd, sub, strings.Join(subs, ", "))
	if m := didYouMean(sub, subs); m != "" {
		fmt.Fprintf(stderr, "(did you mean 'tunwall %s %s'? 'tunwall %s --help' shows the usage)\n", cmd, m, cmd)
	} else {
		fmt.Fprintf(stderr, "('tunwall %s --help' shows the usage)\n", cmd)
	}
	return exitUsage
}

func policyCheck(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("policy check", "tunwall policy check FILE [--secret NAME=env:VAR|file:PATH ...]", stderr)
	var secretFlags secretFlags
	fs.Var(&secretFlags, "secret", "a secret `NAME=env:VAR|file:PATH` declared as run's --secret would (repeatable)")
	pos, _, err := parseFlagsInterspersed(fs, args)
	if err != nil {
		return flagExit(fs, err, stdout, stderr)
	}
	if len(pos) != 1 {
		return usageError(fs, stderr, "want exactly one FILE")
	}
	p, _, err := readPolicy(pos[0])
	if err != nil {
		printErrors(stderr, "", err)
		return exitFail
	}
	var parts []string
	for _, ph := range p.Phases() {
		part := fmt.Sprintf("%s (%d rules", ph, len(p.Rules(ph)))
		if n := len(p.DenyRules(ph)); n > 0 {
			part += fmt.Sprintf(", %d deny", n)
		}
		if p.Default(ph) == policy.DefaultPublic {
			part += ", default: public"
		}
		parts = append(parts, part+")")
	}
	// An inject of an undeclared secret fails, as run fails on it.
	srcs, err := declaredSecrets(secretFlags, p)
	if err != nil {
		return usageError(fs, stderr, "%v", err)
	}
	for _, ph := range p.Phases() {
		rs, err := policy.Select(p, ph, nil, policy.Guard{})
		if err == nil {
			err = checkSecretsDeclared(rs, srcs)
		}
		if err != nil {
			fmt.Fprintf(stderr, "%s: %s\n", pos[0], strings.TrimPrefix(err.Error(), "policy: "))
			return exitFail
		}
	}
	fmt.Fprintf(stdout, "%s: ok: phases %s\n", pos[0], strings.Join(parts, ", "))
	if !checkOverlay(pos[0], p, stdout, stderr) {
		return exitFail
	}
	for _, s := range uninjected(p, nil, srcs) {
		fmt.Fprintf(stdout, "%s: warning: %s\n", pos[0], uninjectedWarning(s))
	}
	for _, ph := range p.Phases() {
		for _, r := range p.Rules(ph) {
			if w := ruleWarning(r); w != "" {
				fmt.Fprintf(stdout, "%s: warning: %s\n", r.Source, w)
			}
		}
		if rs, err := policy.Select(p, ph, nil, policy.Guard{}); err == nil {
			for _, w := range rs.DenyWarnings() {
				fmt.Fprintf(stdout, "%s: warning: %s\n", w.Source, w.Msg)
			}
		}
	}
	return exitOK
}

// policyExplain prints the verdict for one destination; exit 0 if allowed, 1
// if denied, 2 if the file does not load or the question is malformed.
func policyExplain(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("policy explain", "tunwall policy explain FILE (HOST[:PORT] | URL [--method M]) [--phase P] [--udp]", stderr)
	phase := fs.String("phase", "", "phase `NAME` (required when the policy has more than one)")
	udp := fs.Bool("udp", false, "ask about UDP instead of TCP")
	method := fs.String("method", "GET", "the request's `METHOD`, when asking about a URL")
	pos, _, err := parseFlagsInterspersed(fs, args)
	if err != nil {
		return flagExit(fs, err, stdout, stderr)
	}
	if len(pos) != 2 {
		return usageError(fs, stderr, "want FILE and HOST[:PORT]")
	}
	// A file that does not load is not a "denied": exit 2, as for run.
	p, _, err := readPolicy(pos[0])
	if err != nil {
		printErrors(stderr, "", err)
		return exitUsage
	}
	rs, err := selectWithOverlay(pos[0], p, *phase, nil, policy.Guard{})
	if err != nil {
		printErrors(stderr, "tunwall: ", err)
		return exitUsage
	}
	var req *url.URL
	if strings.Contains(pos[1], "://") {
		if req, err = parseRequestURL(pos[1]); err != nil {
			return usageError(fs, stderr, "%v", err)
		}
		if *udp {
			return usageError(fs, stderr, "a URL is asked about over TCP; drop --udp")
		}
		pos[1] = req.Host
	}
	host, port, err := splitTarget(pos[1])
	if err != nil {
		return usageError(fs, stderr, "%v", err)
	}
	proto := policy.TCP
	if *udp {
		proto = policy.UDP
	}
	// The engine's own decision functions: explain says what a flow gets.
	var d policy.Decision
	what := net.JoinHostPort(host, strconv.Itoa(int(port))) + "/" + proto.String()
	if ip, err := netip.ParseAddr(host); err == nil {
		d = engine.DecideIP(rs, false, ip.Unmap(), port, proto)
	} else {
		name, err := policy.NormalizeHost(host)
		if err == nil && strings.HasPrefix(name, "*.") {
			err = fmt.Errorf("ask about a concrete name, not a wildcard")
		}
		if err != nil {
			return usageError(fs, stderr, "%q is not a host name or IP: %v", host, err)
		}
		d = engine.DecideName(rs, false, name, port, proto)
		if dns := engine.DecideQuery(rs, false, name); dns.Allowed() {
			fmt.Fprintf(stdout, "dns:  %s is answered (fake A/AAAA)\n", name)
		} else {
			fmt.Fprintf(stdout, "dns:  %s gets NXDOMAIN and is never sent upstream\n", name)
		}
	}
	fmt.Fprintf(stdout, "%s %s in phase %q\n  rule:   %s\n  reason: %s\n", d.Verdict, what, rs.Phase(), d.Rule, d.Reason)
	ok := d.Allowed()
	if req != nil && ok {
		ok = explainRequest(stdout, rs, host, port, req, *method)
	}
	if ok {
		return exitOK
	}
	return exitFail
}

// parseRequestURL parses an http or https URL for explain; its port
// defaults to the scheme's.
func parseRequestURL(s string) (*url.URL, error) {
	u, err := url.Parse(s)
	if err != nil {
		return nil, fmt.Errorf("bad URL %q: %v", s, err)
	}
	if u.Scheme != "https" && u.Scheme != "http" {
		return nil, fmt.Errorf("bad URL %q: want https:// or http://", s)
	}
	if u.Hostname() == "" {
		return nil, fmt.Errorf("bad URL %q: no host", s)
	}
	if u.Port() == "" {
		port := "443"
		if u.Scheme == "http" {
			port = "80"
		}
		u.Host = net.JoinHostPort(u.Hostname(), port)
	}
	return u, nil
}

// explainRequest prints what happens to one request to a host that is
// allowed: passed through untouched, or terminated and decided.
func explainRequest(w io.Writer, rs *policy.RuleSet, host string, port uint16, u *url.URL, method string) bool {
	name, err := policy.NormalizeHost(host)
	if err != nil {
		return false
	}
	v := rs.HTTPFor(name, port)
	if !v.Terminate {
		fmt.Fprintf(w, "http: %s is not terminated (no rule of it has http or inject): its TLS passes end to end, never decrypted, and no request is checked\n", name)
		return true
	}
	path := u.EscapedPath()
	if path == "" {
		path = "/"
	}
	d := rs.DecideRequest(name, port, method, path)
	hp := name
	if (u.Scheme == "https" && port != 443) || (u.Scheme == "http" && port != 80) {
		hp = net.JoinHostPort(name, strconv.Itoa(int(port)))
	}
	fmt.Fprintf(w, "http: %s %s://%s%s: %s\n  rule:   %s\n  reason: %s\n", strings.ToUpper(method), u.Scheme, hp, path, d.Verdict, d.Rule, d.Reason)
	if d.Hint != "" {
		fmt.Fprintf(w, "  hint:   %s\n", d.Hint)
	}
	if len(v.Inject) > 0 {
		var names []string
		for _, in := range v.Inject {
			if in.Header != "" {
				names = append(names, in.Secret+" (as "+in.Header+": "+in.Value+")")
			} else {
				names = append(names, in.Secret+" (in place of its placeholder)")
			}
		}
		fmt.Fprintf(w, "  inject: %s\n", strings.Join(names, ", "))
	}
	if v.CA != "" {
		fmt.Fprintf(w, "  ca:     the server is verified against %s\n", v.CA)
	}
	return d.Allowed()
}

// splitTarget parses HOST, HOST:PORT, IP, [IPv6]:PORT; the port defaults to
// 443.
func splitTarget(s string) (string, uint16, error) {
	if ip, err := netip.ParseAddr(s); err == nil {
		return ip.String(), 443, nil
	}
	host, ps, err := net.SplitHostPort(s)
	if err != nil {
		if strings.Contains(s, ":") {
			return "", 0, fmt.Errorf("bad destination %q: want HOST[:PORT] or [IPv6]:PORT", s)
		}
		return s, 443, nil
	}
	p, err := strconv.ParseUint(ps, 10, 16)
	if err != nil || p == 0 {
		return "", 0, fmt.Errorf("bad port %q", ps)
	}
	return host, uint16(p), nil
}

// policySuggest turns a (learn-mode) audit log into a policy allowing what
// the run used. It reads only what verifies: the log's chain first (with
// --expect, only the lines up to the last anchor), so that records a
// sandbox appended to a log it could write are refused, not learnt; and it
// proposes an inject only where the header of the record's run says the
// learn run's policy injected that secret.
func policySuggest(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("policy suggest", "tunwall policy suggest AUDIT.jsonl [--phase NAME] [--expect HASH]... [--verified-prefix]", stderr)
	phase := fs.String("phase", "exec", "name of the phase to write")
	var expect hashFlags
	fs.Var(&expect, "expect", "a `HASH` the log must hold (the last sha256 the learn run printed, kept elsewhere): only the lines up to it are used (repeatable)")
	prefix := fs.Bool("verified-prefix", false, "when the chain breaks (or a killed run has no trailer), use the lines before the break instead of refusing the log")
	pos, _, err := parseFlagsInterspersed(fs, args)
	if err != nil {
		return flagExit(fs, err, stdout, stderr)
	}
	if len(pos) != 1 {
		return usageError(fs, stderr, "want exactly one AUDIT.jsonl")
	}
	name := pos[0]
	f, err := os.Open(name)
	if err != nil {
		fmt.Fprintf(stderr, "tunwall: %v\n", err)
		return exitFail
	}
	defer f.Close()
	// One pass: the chain is verified while the headers and records are
	// read; what was read is used only up to the line that verified.
	var headers []suggestHeader
	var records []seen
	res, verr := audit.VerifyEach(f, audit.VerifyOptions{Expect: expect},
		func(line int, h audit.Header) { headers = append(headers, suggestHeader{line, h}) },
		func(line int, r audit.Record) {
			if o, ok := observation(r); ok {
				records = append(records, seen{line, r.Run, o})
			}
		})
	lines, code := verifiedLines(res, verr, name, expect, *prefix, stderr)
	if code != exitOK {
		return code
	}
	known, granted := runGrants(headers, lines, name, stderr)
	var obs []policy.Observation
	refused := map[string]bool{}
	for _, sr := range records {
		if sr.line > lines {
			break
		}
		o := sr.o
		kept := o.Secrets[:0]
		for _, sec := range o.Secrets {
			if grantedTo(granted[sr.run], o.Host, sec) {
				kept = append(kept, sec)
			} else if k := o.Host + " " + sec; !refused[k] {
				refused[k] = true
				fmt.Fprintf(stderr, "tunwall: WARNING: %s: a record says run %s injected %s into %s, which that run's policy does not inject into: no inject is proposed for it\n", name, sr.run, sec, o.Host)
			}
		}
		o.Secrets = kept
		obs = append(obs, o)
	}
	if len(obs) == 0 {
		fmt.Fprintf(stderr, "tunwall: %s has no allowed flows to learn from\n", name)
		return exitFail
	}
	gen := fmt.Sprintf("%s from %s", time.Now().UTC().Format(time.RFC3339), name)
	stdout.Write(policy.SuggestWithSecrets(obs, *phase, gen, publicsuffix.PublicSuffix, known))
	return exitOK
}

// suggestHeader and seen are a run's header and an observation of a record,
// with the line they were read from.
type suggestHeader struct {
	line int
	h    audit.Header
}

type seen struct {
	line int
	run  string
	o    policy.Observation
}

// runGrants returns, from the headers up to line lines, the runs' secrets
// (names and sources, for the secrets section) and, by run, where its
// policy injected them.
func runGrants(headers []suggestHeader, lines int, name string, stderr io.Writer) ([]policy.SecretSource, map[string][]grant) {
	var known []policy.SecretSource
	granted := map[string][]grant{}
	for _, rh := range headers {
		if rh.line > lines {
			break
		}
		h := rh.h
		l, err := policy.ParseSecretList(h.Config["secrets"], name+" header of run "+h.Run)
		if err != nil {
			fmt.Fprintf(stderr, "tunwall: WARNING: %v\n", err)
		}
		known = append(known, l...)
		granted[h.Run] = parseGrants(h.Config["inject"])
	}
	return known, granted
}

// verifiedLines takes what verifying the log (named name) gave and returns
// how many of its lines suggest may use: all of them when the chain holds;
// with expect, those up to the last anchor; with prefix, those before a
// break (said on stderr). A log that does not verify is refused with
// verify's message otherwise (exit 1).
func verifiedLines(res audit.VerifyResult, err error, name string, expect hashFlags, prefix bool, stderr io.Writer) (int, int) {
	var ve *audit.VerifyError
	switch {
	case err == nil:
	case prefix && errors.As(err, &ve) && len(expect) == 0:
		n := max(ve.Line-1, 0)
		fmt.Fprintf(stderr, "tunwall: WARNING: %s: %s; suggesting from the %d verified lines before it only (--verified-prefix)\n", name, strings.TrimPrefix(err.Error(), "audit: "), n)
		return n, exitOK
	default:
		hint := ""
		if errors.As(err, &ve) && len(expect) == 0 {
			hint = " (--verified-prefix suggests from the lines before it)"
		}
		fmt.Fprintf(stderr, "tunwall: %s: %s: the log is not what tunwall wrote, so nothing is suggested from it%s\n", name, strings.TrimPrefix(err.Error(), "audit: "), hint)
		return 0, exitFail
	}
	lines := res.Lines
	if len(expect) > 0 {
		last := slices.Max(res.Anchors)
		if last < lines {
			fmt.Fprintf(stderr, "tunwall: %s: the %d lines after the last expected hash (line %d) are not pinned: suggesting from the lines up to it only\n", name, lines-last, last)
		}
		lines = last
	}
	return lines, exitOK
}

// grant is one rule of a run's header config "inject": the host (or
// *.suffix) the run's policy injected the secrets into.
type grant struct {
	host    string
	secrets []string
}

// parseGrants parses "HOST=S1,S2 HOST2=S3".
func parseGrants(s string) []grant {
	var out []grant
	for _, f := range strings.Fields(s) {
		h, list, ok := strings.Cut(f, "=")
		if ok {
			out = append(out, grant{host: strings.ToLower(h), secrets: strings.Split(list, ",")})
		}
	}
	return out
}

// grantedTo reports whether a grant injects secret into host.
func grantedTo(gs []grant, host, secret string) bool {
	host = strings.ToLower(host)
	for _, g := range gs {
		match := g.host == host
		if suffix, ok := strings.CutPrefix(g.host, "*."); ok {
			match = strings.HasSuffix(host, "."+suffix)
		}
		if match && slices.Contains(g.secrets, secret) {
			return true
		}
	}
	return false
}

// observation is what a flow record teaches: flows the run was allowed to
// make (in learn mode, every flow the guard allowed).
func observation(r audit.Record) (policy.Observation, bool) {
	if r.Kind == audit.KindHTTP && r.Verdict == audit.VerdictAllow && r.Host != "" {
		// A request on a terminated flow: it becomes the host's http list.
		o := policy.Observation{Host: r.Host, Port: r.Port, Proto: policy.TCP, Method: r.Method, Path: r.Path}
		if r.Secrets != "" {
			o.Secrets = strings.Split(r.Secrets, ",")
		}
		return o, true
	}
	if r.Kind != audit.KindFlow || r.Verdict != audit.VerdictAllow {
		return policy.Observation{}, false
	}
	proto, err := policy.ParseProto(r.Proto)
	if err != nil {
		return policy.Observation{}, false
	}
	o := policy.Observation{Port: r.Port, Proto: proto}
	if r.Host != "" {
		o.Host = r.Host
	} else {
		o.IP = r.Dst.Addr()
	}
	return o, true
}

// maxErrorLines bounds how many errors of one file are printed.
const maxErrorLines = 50

// printErrors prints err one error a line (a policy file's errors are
// joined, one per bad rule), at most maxErrorLines of them.
func printErrors(w io.Writer, prefix string, err error) {
	var flat []error
	var walk func(error)
	walk = func(e error) {
		if j, ok := e.(interface{ Unwrap() []error }); ok {
			for _, x := range j.Unwrap() {
				walk(x)
			}
			return
		}
		flat = append(flat, e)
	}
	walk(err)
	for i, e := range flat {
		if i == maxErrorLines {
			fmt.Fprintf(w, "%s(%d more errors not shown)\n", prefix, len(flat)-i)
			break
		}
		fmt.Fprintf(w, "%s%v\n", prefix, e)
	}
}
