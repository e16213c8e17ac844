package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tunwall/tunwall/dnsintercept"
	"github.com/tunwall/tunwall/internal/audit"
	"github.com/tunwall/tunwall/internal/engine"
	"github.com/tunwall/tunwall/internal/engine/enginetest"
	"github.com/tunwall/tunwall/internal/netplan"
	"github.com/tunwall/tunwall/policy"
	"github.com/tunwall/tunwall/stack"
)

const agreePolicy = `version: 1
phases:
  exec:
    allow:
      - host: pypi.org
      - host: "*.pythonhosted.org"
        ports: [443, 80]
      - host: ntp.example
        ports: [123]
        proto: udp
      - cidr: 192.0.2.0/24
        ports: [5432]
      - cidr: 198.51.100.0/24
        ports: [5000]
        proto: udp
      - cidr: 10.0.0.0/8
        ports: [5000]
        proto: udp
      - cidr: 0.0.0.0/0
        ports: [6000]
        proto: udp
    deny:
      - host: files.pythonhosted.org
      - cidr: 198.51.100.66
        proto: udp
`

// TestExplainSaysWhatTheEngineDoes runs one table of destinations through
// `tunwall policy explain` and through a real Engine (its UDP path, and its
// TCP path to a name for denials), with the same rule set, and wants the
// same verdict, rule and reason from both: explain cannot drift from what a
// sandbox gets.
func TestExplainSaysWhatTheEngineDoes(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "p.yaml")
	if err := os.WriteFile(file, []byte(agreePolicy), 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := policy.Parse(file, []byte(agreePolicy))
	if err != nil {
		t.Fatal(err)
	}
	// explain's rule set: no host guard (it runs nowhere).
	rs, err := policy.Select(p, "exec", nil, policy.Guard{})
	if err != nil {
		t.Fatal(err)
	}
	pool, err := dnsintercept.NewPool(netplan.Default.Fake4, netplan.Default.Fake6)
	if err != nil {
		t.Fatal(err)
	}
	res, err := dnsintercept.NewResolver(dnsintercept.ResolverConfig{Servers: []netip.AddrPort{netip.MustParseAddrPort("192.0.2.53:53")}})
	if err != nil {
		t.Fatal(err)
	}
	rec := enginetest.NewRecorder()
	e, err := engine.New(engine.Config{
		Rules: rs, Pool: pool, Resolver: res, Audit: rec,
		Dial: func(context.Context, string, string) (net.Conn, error) {
			t.Error("the engine dialled; this test only asks it to decide")
			return nil, net.ErrClosed
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	src := netip.AddrPortFrom(netplan.Default.Addr4.Addr(), 40000)
	for _, c := range []struct {
		target string
		udp    bool
		allow  bool
	}{
		{"ntp.example:123", true, true},
		{"ntp.example:124", true, false},
		{"pypi.org:123", true, false},
		{"evil.example:123", true, false},
		{"files.pythonhosted.org:80", true, false},
		{"198.51.100.7:5000", true, true},
		{"198.51.100.7:5001", true, false},
		{"10.1.2.3:5000", true, true},
		{"127.0.0.1:5000", true, false},
		{"169.254.169.254:6000", true, false},
		{"203.0.113.9:6000", true, true},
		{"192.0.2.7:5432", true, false},
		{"[2001:db8::1]:5000", true, false},
		{"[fd00::1]:6000", true, false},
		{"evil.example:443", false, false},
		{"pypi.org:22", false, false},
		{"pythonhosted.org:443", false, false},
		{"x.evilpythonhosted.org:443", false, false},
		{"files.pythonhosted.org:443", false, false},
		{"198.51.100.66:5000", true, false},
	} {
		t.Run(c.target, func(t *testing.T) {
			args := []string{file, c.target}
			if c.udp {
				args = append(args, "--udp")
			}
			var out, errb bytes.Buffer
			code := policyExplain(args, &out, &errb)
			verdict, rule, reason := parseExplain(t, out.String())
			if (code == exitOK) != c.allow || (verdict == "allow") != c.allow {
				t.Fatalf("explain exit %d, verdict %q; want allow=%v\n%s%s", code, verdict, c.allow, out.String(), errb.String())
			}

			host, port, err := splitTarget(c.target)
			if err != nil {
				t.Fatal(err)
			}
			dst := netip.AddrPort{}
			if ip, err := netip.ParseAddr(host); err == nil {
				dst = netip.AddrPortFrom(ip, port)
			} else {
				v4, _, err := pool.Assign(host)
				if err != nil {
					t.Fatal(err)
				}
				dst = netip.AddrPortFrom(v4, port)
			}
			f := stack.Flow{Proto: stack.UDP, Src: src, Dst: dst}
			if !c.udp {
				f.Proto = stack.TCP
				if c.allow {
					t.Fatal("allowed TCP cases would dial; ask them over UDP")
				}
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				e.TCP(ctx, deniedRequest{t: t, f: f})
			} else if _, ok := e.UDP(f); ok != c.allow {
				t.Fatalf("engine: UDP to %v admitted=%v, explain says allow=%v", dst, ok, c.allow)
			}
			if c.allow {
				return // the record comes when the session ends; the verdict agreed
			}
			r := rec.WaitMatch(t, fmt.Sprintf("flow record to %v", dst), func(r audit.Record) bool {
				return r.Kind == audit.KindFlow && r.Dst == dst
			})
			if r.Verdict != verdict || r.Rule != rule || r.Reason != reason {
				t.Errorf("explain and the engine disagree on %s:\n explain: %s, rule %q, reason %q\n  engine: %s, rule %q, reason %q",
					c.target, verdict, rule, reason, r.Verdict, r.Rule, r.Reason)
			}
		})
	}
}

// parseExplain reads the verdict, rule and reason explain printed.
func parseExplain(t *testing.T, out string) (verdict, rule, reason string) {
	t.Helper()
	for _, l := range strings.Split(out, "\n") {
		switch {
		case strings.HasPrefix(l, "allow ") || strings.HasPrefix(l, "deny "):
			verdict, _, _ = strings.Cut(l, " ")
		case strings.HasPrefix(l, "  rule:   "):
			rule = strings.TrimPrefix(l, "  rule:   ")
		case strings.HasPrefix(l, "  reason: "):
			reason = strings.TrimPrefix(l, "  reason: ")
		}
	}
	if verdict == "" || rule == "" || reason == "" {
		t.Fatalf("explain printed no verdict, rule and reason:\n%s", out)
	}
	return verdict, rule, reason
}

// deniedRequest is the stack's request of a flow the engine must deny: it
// fails the test if the engine dials, accepts or relays it.
type deniedRequest struct {
	t *testing.T
	f stack.Flow
}

func (q deniedRequest) Flow() stack.Flow { return q.f }
func (q deniedRequest) Dial(context.Context, netip.AddrPort) (net.Conn, error) {
	q.t.Error("the engine dialled a denied flow")
	return nil, net.ErrClosed
}
func (q deniedRequest) Accept() (net.Conn, error) {
	q.t.Error("the engine completed the handshake of a denied flow")
	return nil, net.ErrClosed
}
func (q deniedRequest) Relay(_ context.Context, up net.Conn, _ stack.RelayOptions, done func(stack.RelayResult)) {
	q.t.Error("the engine relayed a denied flow")
	up.Close()
	done(stack.RelayResult{Err: stack.ErrNotAccepted})
}
func (q deniedRequest) Reset() {}
