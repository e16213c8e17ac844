package main

import (
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/tunwall/tunwall/internal/audit"
	"github.com/tunwall/tunwall/policy"
)

func cmdPolicy(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, "usage: tunwall policy (check FILE | explain FILE HOST[:PORT] [--phase P] [--udp] | suggest AUDIT.jsonl [--phase P])\n")
		return exitUsage
	}
	switch args[0] {
	case "check":
		return policyCheck(args[1:], stdout, stderr)
	case "explain":
		return policyExplain(args[1:], stdout, stderr)
	case "suggest":
		return policySuggest(args[1:], stdout, stderr)
	}
	fmt.Fprintf(stderr, "tunwall policy: unknown subcommand %q (check, explain, suggest)\n", args[0])
	return exitUsage
}

func policyCheck(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("policy check", "tunwall policy check FILE", stderr)
	pos, _, err := parseFlagsInterspersed(fs, args)
	if err != nil {
		return exitUsage
	}
	if len(pos) != 1 {
		return usageError(fs, stderr, "want exactly one FILE")
	}
	p, err := policy.ParseFile(pos[0])
	if err != nil {
		fmt.Fprintln(stderr, err)
		return exitFail
	}
	var parts []string
	for _, ph := range p.Phases() {
		parts = append(parts, fmt.Sprintf("%s (%d rules)", ph, len(p.Rules(ph))))
	}
	fmt.Fprintf(stdout, "%s: ok: phases %s\n", pos[0], strings.Join(parts, ", "))
	return exitOK
}

// policyExplain prints the verdict for one destination; exit 0 if allowed, 1
// if denied.
func policyExplain(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("policy explain", "tunwall policy explain FILE HOST[:PORT] [--phase P] [--udp]", stderr)
	phase := fs.String("phase", "", "phase `NAME` (required when the policy has more than one)")
	udp := fs.Bool("udp", false, "ask about UDP instead of TCP")
	pos, _, err := parseFlagsInterspersed(fs, args)
	if err != nil {
		return exitUsage
	}
	if len(pos) != 2 {
		return usageError(fs, stderr, "want FILE and HOST[:PORT]")
	}
	p, err := policy.ParseFile(pos[0])
	if err != nil {
		fmt.Fprintln(stderr, err)
		return exitFail
	}
	rs, err := policy.Select(p, *phase, nil, policy.Guard{})
	if err != nil {
		fmt.Fprintf(stderr, "tunwall: %v\n", err)
		return exitUsage
	}
	host, port, err := splitTarget(pos[1])
	if err != nil {
		return usageError(fs, stderr, "%v", err)
	}
	proto := policy.TCP
	if *udp {
		proto = policy.UDP
	}
	var d policy.Decision
	what := net.JoinHostPort(host, strconv.Itoa(int(port))) + "/" + proto.String()
	if ip, err := netip.ParseAddr(host); err == nil {
		d = rs.DecideIP(ip.Unmap(), port, proto)
		if d.Allowed() {
			if g := rs.CheckDial(ip.Unmap(), port, proto); !g.Allowed() {
				d = g
			}
		}
	} else {
		name, err := policy.NormalizeHost(host)
		if err == nil && strings.HasPrefix(name, "*.") {
			err = fmt.Errorf("ask about a concrete name, not a wildcard")
		}
		if err != nil {
			return usageError(fs, stderr, "%q is not a host name or IP: %v", host, err)
		}
		d = rs.DecideName(name, port, proto)
		dns := rs.NameAllowed(name)
		if dns.Allowed() {
			fmt.Fprintf(stdout, "dns:  %s is answered (fake A/AAAA)\n", name)
		} else {
			fmt.Fprintf(stdout, "dns:  %s gets NXDOMAIN and is never sent upstream\n", name)
		}
	}
	fmt.Fprintf(stdout, "%s %s in phase %q\n  rule:   %s\n  reason: %s\n", d.Verdict, what, rs.Phase(), d.Rule, d.Reason)
	if d.Allowed() {
		return exitOK
	}
	return exitFail
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
// the run used.
func policySuggest(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("policy suggest", "tunwall policy suggest AUDIT.jsonl [--phase NAME]", stderr)
	phase := fs.String("phase", "exec", "name of the phase to write")
	pos, _, err := parseFlagsInterspersed(fs, args)
	if err != nil {
		return exitUsage
	}
	if len(pos) != 1 {
		return usageError(fs, stderr, "want exactly one AUDIT.jsonl")
	}
	f, err := os.Open(pos[0])
	if err != nil {
		fmt.Fprintf(stderr, "tunwall: %v\n", err)
		return exitFail
	}
	defer f.Close()
	var obs []policy.Observation
	for r, err := range audit.Records(f) {
		if err != nil {
			fmt.Fprintf(stderr, "tunwall: %s: %v\n", pos[0], err)
			return exitFail
		}
		o, ok := observation(r)
		if ok {
			obs = append(obs, o)
		}
	}
	if len(obs) == 0 {
		fmt.Fprintf(stderr, "tunwall: %s has no allowed flows to learn from\n", pos[0])
		return exitFail
	}
	gen := fmt.Sprintf("%s from %s", time.Now().UTC().Format(time.RFC3339), pos[0])
	stdout.Write(policy.Suggest(obs, *phase, gen))
	return exitOK
}

// observation is what a flow record teaches: flows the run was allowed to
// make (in learn mode, every flow the guard allowed).
func observation(r audit.Record) (policy.Observation, bool) {
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
