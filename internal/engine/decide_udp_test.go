package engine

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/tunwall/tunwall/internal/audit"
	"github.com/tunwall/tunwall/internal/engine/enginetest"
	"github.com/tunwall/tunwall/stack"
)

// serveUDP runs the serve func Engine.UDP returned on one end of a
// net.Pipe and returns the other (the sandbox's socket).
func serveUDP(t *testing.T, serve func(context.Context, stack.UDPSession)) net.Conn {
	t.Helper()
	client, sess := net.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	us := &fakeUDPSession{c: sess}
	go func() {
		defer close(done)
		serve(ctx, us)
		us.relay.Wait() // a relay goes on after serve returns
	}()
	t.Cleanup(func() {
		cancel()
		client.Close()
		select {
		case <-done:
		case <-time.After(waitFor):
			t.Error("the UDP session did not end")
		}
	})
	return client
}

func TestUDPGoesOnlyWhereAUDPRuleAllows(t *testing.T) {
	r := newRig(t, `      - host: allowed.test
        ports: [443, 5000]
        proto: tcp
      - host: game.test
        ports: [5000]
        proto: udp
`, nil)
	r.resolves("game.test", "192.0.2.30")
	r.resolves("allowed.test", "192.0.2.10")

	// A tcp rule does not allow udp; port 443 says why QUIC is off.
	f := stack.Flow{Proto: stack.UDP, Src: sandbox4, Dst: ap(r.fake(t, "allowed.test").String(), 443)}
	if _, ok := r.e.UDP(f); ok {
		t.Fatal("udp to a name with only a tcp rule was allowed")
	}
	rec := r.rec.Wait(t, audit.KindFlow)
	if rec.Verdict != audit.VerdictDeny || rec.Proto != "udp" || !strings.Contains(rec.Reason, "QUIC is off") {
		t.Fatalf("record: %+v", rec)
	}

	f.Dst = ap(r.fake(t, "game.test").String(), 5000)
	serve, ok := r.e.UDP(f)
	if !ok {
		t.Fatal("udp under a udp rule was denied")
	}
	if len(r.dial.Dialled()) != 0 {
		t.Fatal("Engine.UDP dialled on the packet path")
	}
	client := serveUDP(t, serve)
	srv := r.dial.Server(t)
	go client.Write([]byte("ping"))
	if got := enginetest.ReadUpTo(t, srv, 4); string(got) != "ping" {
		t.Fatalf("upstream got %q", got)
	}
	if d := r.dial.Dialled(); len(d) != 1 || d[0] != "udp 192.0.2.30:5000" {
		t.Fatalf("dials = %q", d)
	}
	go srv.Write([]byte("pong"))
	if got := enginetest.ReadUpTo(t, client, 4); string(got) != "pong" {
		t.Fatalf("sandbox got %q", got)
	}
	srv.Close()
	deadline := time.After(waitFor)
	for r.rec.Count(audit.KindFlow) < 2 {
		select {
		case <-deadline:
			t.Fatal("no record of the udp session")
		case <-time.After(time.Millisecond):
		}
	}
	recs := r.rec.All()
	last := recs[len(recs)-1]
	if last.Verdict != audit.VerdictAllow || last.Host != "game.test" || last.BytesOut != 4 || last.BytesIn != 4 || last.Dial != ap("192.0.2.30", 5000) {
		t.Fatalf("record: %+v", last)
	}

	// A raw address without a cidr rule: denied, never dialled.
	if _, ok := r.e.UDP(stack.Flow{Proto: stack.UDP, Src: sandbox4, Dst: ap("192.0.2.30", 5000)}); ok {
		t.Fatal("udp to a raw address was allowed")
	}
}

func TestAFailingAuditLogDeniesUDPAndDNS(t *testing.T) {
	r := newRig(t, `      - host: game.test
        ports: [5000]
        proto: udp
`, nil)
	r.rec.SetAdmit(errors.New("the audit log cannot be written"))
	f := stack.Flow{Proto: stack.UDP, Src: sandbox4, Dst: ap(r.fake(t, "game.test").String(), 5000)}
	if _, ok := r.e.UDP(f); ok {
		t.Fatal("udp allowed with a failing audit log")
	}
	if rec := r.rec.Wait(t, audit.KindFlow); rec.Verdict != audit.VerdictDeny || rec.Rule != "audit" {
		t.Fatalf("record: %+v", rec)
	}
	if v := r.e.dnsFilter("game.test"); v.Allowed() {
		t.Fatalf("a DNS name was allowed with a failing audit log: %+v", v)
	}
}

// query asks q over conn (DNS over TCP when stream, else over UDP).
func query(t *testing.T, c net.Conn, name string, qtype uint16) *dns.Msg {
	t.Helper()
	dc := &dns.Conn{Conn: c}
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), qtype)
	c.SetDeadline(time.Now().Add(waitFor))
	if err := dc.WriteMsg(m); err != nil {
		t.Fatal(err)
	}
	resp, err := dc.ReadMsg()
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

func TestDNSAnswersAllowedNamesWithFakeAddressesAndRecordsEachQuery(t *testing.T) {
	r := newRig(t, allowTLS, nil)
	// Over TCP, to any address on port 53.
	run := r.tcp(t, ap("192.0.2.53", 53))
	run.waitAccepted(t)
	resp := query(t, run.client, "allowed.test", dns.TypeA)
	if resp.Rcode != dns.RcodeSuccess || len(resp.Answer) != 1 {
		t.Fatalf("answer: %v", resp)
	}
	a := resp.Answer[0].(*dns.A).A
	fake, _ := netip.AddrFromSlice(a.To4())
	if name, ok := r.pool.Name(fake); !ok || name != "allowed.test" {
		t.Fatalf("answered %v, not allowed.test's fake address", a)
	}
	if resp := query(t, run.client, "denied.test", dns.TypeA); resp.Rcode != dns.RcodeNameError {
		t.Fatalf("a denied name got %s", dns.RcodeToString[resp.Rcode])
	}
	run.client.Close()
	run.returned(t)
	// A query's record is written after its answer is sent: in any order.
	recs := r.rec.All()
	byName := map[string]audit.Record{}
	for _, rec := range recs {
		if rec.Kind == audit.KindDNS {
			byName[rec.Qname] = rec
		}
	}
	if len(byName) != 2 {
		t.Fatalf("records: %+v", recs)
	}
	ok, no := byName["allowed.test"], byName["denied.test"]
	if ok.Verdict != audit.VerdictAllow || ok.Qname != "allowed.test" || ok.Qtype != "A" || ok.Rcode != "NOERROR" || ok.Proto != "tcp" || ok.Dst != ap("192.0.2.53", 53) || ok.Src != sandbox4 || ok.PID != 4242 {
		t.Errorf("allowed query record: %+v", ok)
	}
	if no.Verdict != audit.VerdictDeny || no.Qname != "denied.test" || no.Rcode != "NXDOMAIN" || no.Rule != "default-deny" {
		t.Errorf("denied query record: %+v", no)
	}
	if !strings.Contains(r.denials.String(), "tunwall: denied DNS A denied.test") {
		t.Errorf("denial lines:\n%s", r.denials.String())
	}

	// Over UDP.
	serve, ok2 := r.e.UDP(stack.Flow{Proto: stack.UDP, Src: sandbox4, Dst: ap("192.0.2.53", 53)})
	if !ok2 {
		t.Fatal("a DNS session over UDP was refused")
	}
	c := serveUDP(t, serve)
	m := new(dns.Msg)
	m.SetQuestion("allowed.test.", dns.TypeA)
	wire, _ := m.Pack()
	go c.Write(wire)
	buf := make([]byte, 512)
	c.SetReadDeadline(time.Now().Add(waitFor))
	n, err := c.Read(buf)
	if err != nil {
		t.Fatal(err)
	}
	var resp2 dns.Msg
	if err := resp2.Unpack(buf[:n]); err != nil || resp2.Rcode != dns.RcodeSuccess || len(resp2.Answer) != 1 {
		t.Fatalf("answer over udp: %v %v", &resp2, err)
	}
}

func TestLearnModeAnswersEveryNameAndRecordsWhatEnforceWouldSay(t *testing.T) {
	r := newRig(t, allowTLS, func(c *Config) { c.Learn = true })
	v := r.e.dnsFilter("unlisted.test")
	if !v.Allowed() || v.Rule != "learn" || !strings.Contains(v.Reason, "enforce would deny") {
		t.Fatalf("learn-mode DNS verdict: %+v", v)
	}
	if v := r.e.dnsFilter("allowed.test"); !v.Allowed() || v.Rule == "learn" {
		t.Fatalf("allowed name in learn mode: %+v", v)
	}
}

// A Resolver is required: names are resolved and checked by tunwall, even
// with an upstream proxy. (Config's interface fields take plain nil for
// none: the session passes nil, never a nil pointer, which would be
// called.)
func TestNewRefusesAConfigWithoutAResolver(t *testing.T) {
	r := newRig(t, allowTLS, nil)
	if _, err := New(Config{Rules: r.rules, Pool: r.pool}); err == nil {
		t.Fatal("New took a config without a Resolver")
	}
}

// fakeUDPSession is a stack.UDPSession over a net.Pipe; its relay is
// package stack's goroutine relay.
type fakeUDPSession struct {
	c     net.Conn
	relay sync.WaitGroup
}

func (u *fakeUDPSession) Flow() stack.Flow { return stack.Flow{Proto: stack.UDP} }
func (u *fakeUDPSession) Conn() net.Conn   { return u.c }
func (u *fakeUDPSession) Relay(ctx context.Context, up net.Conn, o stack.RelayOptions, done func(stack.RelayResult)) {
	u.relay.Add(1)
	go stack.StartRelayUDP(ctx, u.c, up, o.Idle, func(res stack.RelayResult) {
		defer u.relay.Done()
		done(res)
	})
}
