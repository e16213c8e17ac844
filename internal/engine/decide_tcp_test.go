package engine

import (
	"bytes"
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/tunwall/tunwall/internal/audit"
	"github.com/tunwall/tunwall/internal/engine/enginetest"
	"github.com/tunwall/tunwall/policy"
)

const allowTLS = `      - host: allowed.test
        ports: [443]
`

func TestAnAllowedNameIsDialledBeforeTheHandshakeAndRelayed(t *testing.T) {
	r := newRig(t, allowTLS, nil)
	r.resolves("allowed.test", "192.0.2.10")
	var startedBeforeDial bool
	r.dial.SetBefore(func() { startedBeforeDial = r.rec.Count(audit.KindStart) == 1 })
	run := r.tcp(t, ap(r.fake(t, "allowed.test").String(), 443))
	srv := r.dial.Server(t)
	run.waitAccepted(t)
	if got := r.dial.Dialled(); len(got) != 1 || got[0] != "tcp 192.0.2.10:443" {
		t.Fatalf("dials = %q, want the resolved address", got)
	}
	if !startedBeforeDial {
		t.Error("the flow was dialled before its start record was committed")
	}
	hello := enginetest.ClientHello(t, "allowed.test")
	run.send(hello)
	if got := enginetest.ReadUpTo(t, srv, len(hello)); !bytes.Equal(got, hello) {
		t.Fatalf("the upstream got %d bytes, want the %d of the hello", len(got), len(hello))
	}
	go srv.Write([]byte("reply"))
	if got := enginetest.ReadUpTo(t, run.client, 5); string(got) != "reply" {
		t.Fatalf("the sandbox got %q", got)
	}
	run.client.Close()
	run.returned(t)

	rec := r.rec.Wait(t, audit.KindFlow)
	want := audit.Record{
		Kind: audit.KindFlow, Phase: "test", Proto: "tcp", Src: sandbox4, Dst: ap(r.fake(t, "allowed.test").String(), 443),
		Host: "allowed.test", HostFrom: audit.HostFromDNS, Port: 443, Verdict: audit.VerdictAllow,
		Rule: r.rules.DecideName("allowed.test", 443, policy.TCP).Rule, Dial: ap("192.0.2.10", 443),
		SNI: "allowed.test", BytesOut: int64(len(hello)), BytesIn: 5, Outcome: audit.OutcomeOK,
		PID: 4242, Comm: "curl", Exe: "/usr/bin/curl",
	}
	got := rec
	got.TS, got.DurationMS, got.Reason = time.Time{}, 0, ""
	if got != want {
		t.Errorf("flow record:\n got %+v\nwant %+v", got, want)
	}
	if rec.Reason == "" || rec.TS.IsZero() || rec.DurationMS < 0 {
		t.Errorf("flow record without reason, time or duration: %+v", rec)
	}
	start := r.rec.Wait(t, audit.KindStart)
	if start.Verdict != audit.VerdictAllow || start.Host != "allowed.test" || start.TS != rec.TS || start.PID != 4242 || start.BytesOut != 0 {
		t.Errorf("start record: %+v", start)
	}
}

func TestAnUpstreamRefusalNeverCompletesTheHandshake(t *testing.T) {
	r := newRig(t, allowTLS, nil)
	r.resolves("allowed.test", "192.0.2.10", "2001:db8::10")
	r.dial.SetRefuse(true)
	run := r.tcp(t, ap(r.fake(t, "allowed.test").String(), 443))
	run.returned(t)
	if run.wasAccepted() {
		t.Fatal("the sandbox's handshake was completed although the upstream refused")
	}
	// The sandbox's family first, then the other.
	if got := r.dial.Dialled(); strings.Join(got, ",") != "tcp 192.0.2.10:443,tcp [2001:db8::10]:443" {
		t.Fatalf("dials = %q", got)
	}
	rec := r.rec.Wait(t, audit.KindFlow)
	if rec.Verdict != audit.VerdictAllow || rec.Outcome != audit.OutcomeRefused || !strings.Contains(rec.Reason, "the server refused the connection") || strings.Contains(rec.Reason, "\n") {
		t.Fatalf("record: %+v", rec)
	}
}

func TestANameThatDoesNotResolveIsNeverAccepted(t *testing.T) {
	r := newRig(t, allowTLS, nil)
	run := r.tcp(t, ap(r.fake(t, "allowed.test").String(), 443))
	run.returned(t)
	if run.wasAccepted() || len(r.dial.Dialled()) != 0 {
		t.Fatal("a name with no address was accepted or dialled")
	}
	if rec := r.rec.Wait(t, audit.KindFlow); rec.Outcome != audit.OutcomeDNSFailed {
		t.Fatalf("record: %+v", rec)
	}
}

func TestADeniedNameIsResetWithoutADial(t *testing.T) {
	r := newRig(t, allowTLS, nil)
	r.resolves("denied.test", "192.0.2.11")
	for _, dst := range []struct {
		name string
		port uint16
	}{{"denied.test", 443}, {"allowed.test", 80}} {
		run := r.tcp(t, ap(r.fake(t, dst.name).String(), dst.port))
		run.returned(t)
		if run.wasAccepted() {
			t.Errorf("%s:%d: accepted", dst.name, dst.port)
		}
	}
	if d, asked := r.dial.Dialled(), r.res.Asked(); len(d) != 0 || len(asked) != 0 {
		t.Fatalf("denied flows were resolved (%q) or dialled (%q)", asked, d)
	}
	recs := r.rec.All()
	if len(recs) != 2 || recs[0].Verdict != audit.VerdictDeny || recs[0].Rule != "default-deny" || recs[1].Verdict != audit.VerdictDeny {
		t.Fatalf("records: %+v", recs)
	}
	if n := strings.Count(r.denials.String(), "tunwall: denied denied.test:443 tcp"); n != 1 {
		t.Fatalf("denial lines:\n%s", r.denials.String())
	}
}

func TestAStaleOrGuessedFakeAddressIsDenied(t *testing.T) {
	r := newRig(t, allowTLS, nil)
	run := r.tcp(t, ap("198.18.0.200", 443)) // in the pool, never handed out
	run.returned(t)
	rec := r.rec.Wait(t, audit.KindFlow)
	if run.wasAccepted() || rec.Verdict != audit.VerdictDeny || !strings.Contains(rec.Reason, "no name was handed out") {
		t.Fatalf("accepted=%v record: %+v", run.wasAccepted(), rec)
	}
}

// Fronting: the client connects to one allowed name and names another.
func TestANameTheClientSendsMustBeTheConnectedName(t *testing.T) {
	for _, c := range []struct {
		name  string
		port  uint16
		first []byte
		sni   bool
	}{
		{"a TLS SNI of another name", 443, enginetest.ClientHello(t, "other.test"), true},
		{"an HTTP Host of another name", 80, httpGet("other.test"), false},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := newRig(t, `      - host: allowed.test
        ports: [80, 443]
      - host: other.test
        ports: [80, 443]
`, nil)
			r.resolves("allowed.test", "192.0.2.10")
			run := r.tcp(t, ap(r.fake(t, "allowed.test").String(), c.port))
			srv := r.dial.Server(t)
			run.waitAccepted(t)
			run.send(c.first)
			run.returned(t)
			if got := enginetest.ReadUpTo(t, srv, 1); len(got) != 0 {
				t.Fatal("the upstream got bytes of a fronted request")
			}
			rec := r.rec.Wait(t, audit.KindFlow)
			if rec.Verdict != audit.VerdictDeny || !strings.Contains(rec.Reason, "other.test disagrees with allowed.test") {
				t.Fatalf("record: %+v", rec)
			}
			if c.sni && rec.SNI != "other.test" || !c.sni && rec.HTTPHost != "other.test" {
				t.Fatalf("the record does not say what was sent: %+v", rec)
			}
		})
	}
}

func TestARawIPIsDialledOnlyUnderACIDRRule(t *testing.T) {
	r := newRig(t, allowTLS+`      - cidr: 192.0.2.0/28
        ports: [22]
`, nil)
	// No rule at all for the port: reset at once.
	run := r.tcp(t, ap("203.0.113.5", 22))
	run.returned(t)
	if run.wasAccepted() {
		t.Fatal("a raw IP with no rule for its port was accepted")
	}
	// A cidr rule: dialled first, as a name would be.
	run = r.tcp(t, ap("192.0.2.3", 22))
	srv := r.dial.Server(t)
	run.waitAccepted(t)
	run.send([]byte("SSH-2.0-test\r\n"))
	if got := enginetest.ReadUpTo(t, srv, 14); string(got) != "SSH-2.0-test\r\n" {
		t.Fatalf("upstream got %q", got)
	}
	run.client.Close()
	run.returned(t)
	if d := r.dial.Dialled(); len(d) != 1 || d[0] != "tcp 192.0.2.3:22" {
		t.Fatalf("dials = %q", d)
	}
	recs := r.rec.All()
	flow := recs[len(recs)-1]
	if flow.Kind != audit.KindFlow || flow.Verdict != audit.VerdictAllow || flow.Host != "" || flow.HostFrom != audit.HostFromNone || flow.Dial != ap("192.0.2.3", 22) {
		t.Fatalf("record: %+v", flow)
	}
}

func TestARawIPWithoutACIDRRuleIsDialledOnlyByTheAllowedNameItSends(t *testing.T) {
	for _, c := range []struct {
		name   string
		port   uint16
		first  []byte
		allow  bool
		sniffd string
	}{
		{"an allowed SNI", 443, enginetest.ClientHello(t, "allowed.test"), true, audit.HostFromSNI},
		{"an allowed HTTP Host", 80, httpGet("allowed.test"), true, audit.HostFromHTTP},
		{"a denied SNI", 443, enginetest.ClientHello(t, "evil.test"), false, audit.HostFromSNI},
		{"a denied HTTP Host", 80, httpGet("evil.test"), false, audit.HostFromHTTP},
		{"no name at all", 443, []byte("\x00\x01not TLS, not HTTP\r\n\r\n"), false, audit.HostFromNone},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := newRig(t, `      - host: allowed.test
        ports: [80, 443]
`, func(cfg *Config) {
				if c.sniffd == audit.HostFromNone {
					cfg.SniffTimeout = 50 * time.Millisecond // it waits for a name that never comes
				}
			})
			r.resolves("allowed.test", "192.0.2.10")
			r.resolves("evil.test", "192.0.2.66")
			before := 0
			run := r.tcp(t, ap("203.0.113.7", c.port))
			run.waitAccepted(t) // accepted only to read the name
			run.send(c.first)
			if !c.allow {
				reply, _ := readAll(run.client)
				if http := c.sniffd == audit.HostFromHTTP; http != strings.HasPrefix(string(reply), "HTTP/1.1 403") || !http && len(reply) != 0 {
					t.Errorf("the sandbox got %q", reply)
				}
				run.returned(t)
				rec := r.rec.Wait(t, audit.KindFlow)
				if d := r.dial.Dialled(); len(d) != before {
					t.Fatalf("dialled %q", d[before:])
				}
				if rec.Verdict != audit.VerdictDeny || rec.HostFrom != c.sniffd {
					t.Fatalf("record: %+v", rec)
				}
				return
			}
			srv := r.dial.Server(t)
			if got := enginetest.ReadUpTo(t, srv, len(c.first)); !bytes.Equal(got, c.first) {
				t.Fatalf("the upstream got %q", got)
			}
			run.client.Close()
			run.returned(t)
			d := r.dial.Dialled()
			if len(d) != before+1 || d[before] != "tcp 192.0.2.10:"+itoa(int(c.port)) {
				t.Fatalf("dials = %q, want allowed.test's address, never the raw IP", d[before:])
			}
			rec := r.rec.Wait(t, audit.KindFlow)
			if rec.Verdict != audit.VerdictAllow || rec.Host != "allowed.test" || rec.HostFrom != c.sniffd || !strings.Contains(rec.Reason, "raw IP 203.0.113.7 ignored, dialled by name") {
				t.Fatalf("record: %+v", rec)
			}
		})
	}
}

func TestARawIPThatSendsNothingIsResetAfterTheSniffTimeout(t *testing.T) {
	r := newRig(t, allowTLS, func(c *Config) { c.SniffTimeout = 50 * time.Millisecond })
	run := r.tcp(t, ap("203.0.113.7", 443))
	run.waitAccepted(t)
	run.send([]byte{0x16, 0x03}) // the beginning of a ClientHello, then nothing
	run.returned(t)
	rec := r.rec.Wait(t, audit.KindFlow)
	if rec.Verdict != audit.VerdictDeny || len(r.dial.Dialled()) != 0 {
		t.Fatalf("record: %+v, dials %q", rec, r.dial.Dialled())
	}
}

func TestANameResolvingToAForbiddenAddressIsNeverDialled(t *testing.T) {
	r := newRig(t, allowTLS, nil)
	r.resolves("allowed.test", "127.0.0.1", "169.254.169.254", "10.1.2.3", "198.18.0.9", "::1")
	run := r.tcp(t, ap(r.fake(t, "allowed.test").String(), 443))
	run.returned(t)
	if run.wasAccepted() || len(r.dial.Dialled()) != 0 {
		t.Fatalf("accepted=%v dials=%q", run.wasAccepted(), r.dial.Dialled())
	}
	rec := r.rec.Wait(t, audit.KindFlow)
	if rec.Verdict != audit.VerdictDeny || !strings.Contains(rec.Reason, "resolves only to addresses that are never dialled") || rec.Rule == "default-deny" {
		t.Fatalf("record: %+v", rec)
	}

	// With one ordinary address among them, only that one is dialled.
	r.resolves("allowed.test", "192.0.2.10")
	run = r.tcp(t, ap(r.fake(t, "allowed.test").String(), 443))
	r.dial.Server(t)
	run.waitAccepted(t)
	if d := r.dial.Dialled(); len(d) != 1 || d[0] != "tcp 192.0.2.10:443" {
		t.Fatalf("dials = %q", d)
	}
}

func TestLearnModeAllowsWhatEnforceWouldDenyButNotTheGuard(t *testing.T) {
	r := newRig(t, allowTLS, func(c *Config) { c.Learn = true })
	r.resolves("unlisted.test", "192.0.2.20")
	r.resolves("rebound.test", "127.0.0.1")
	run := r.tcp(t, ap(r.fake(t, "unlisted.test").String(), 443))
	r.dial.Server(t)
	run.waitAccepted(t)
	run.client.Close()
	run.returned(t)
	rec := r.rec.Wait(t, audit.KindFlow)
	if rec.Verdict != audit.VerdictAllow || rec.Rule != "learn" || !strings.Contains(rec.Reason, "enforce would deny") {
		t.Fatalf("learn-mode record: %+v", rec)
	}

	// A raw address the guard forbids is accepted only to read a name, as
	// in enforce mode, and never dialled as such.
	for _, dst := range []string{"127.0.0.1", "169.254.169.254"} {
		run = r.tcp(t, ap(dst, 80))
		run.waitAccepted(t)
		run.client.Close()
		run.returned(t)
	}
	run = r.tcp(t, ap(r.fake(t, "rebound.test").String(), 443))
	run.returned(t)
	if run.wasAccepted() {
		t.Error("learn mode accepted a name resolving to loopback")
	}
	if d := r.dial.Dialled(); len(d) != 1 {
		t.Fatalf("dials = %q, want only unlisted.test's", d)
	}
}

func TestAFailingAuditLogDeniesEveryNewFlow(t *testing.T) {
	for _, c := range []struct {
		name          string
		admit, commit error
		rule          string
	}{
		{"the log cannot be written", errors.New("write audit.jsonl: no space left on device"), nil, "audit"},
		{"the start record is refused", nil, audit.ErrSizeCap, audit.RuleMaxSize},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := newRig(t, allowTLS+`      - cidr: 192.0.2.0/24
        ports: [22]
`, nil)
			r.resolves("allowed.test", "192.0.2.10")
			r.rec.SetAdmit(c.admit)
			r.rec.SetCommit(c.commit)
			for _, dst := range []string{r.fake(t, "allowed.test").String() + ":443", "192.0.2.3:22"} {
				run := r.tcp(t, netip.MustParseAddrPort(dst))
				run.returned(t)
				if run.wasAccepted() {
					t.Errorf("%s: accepted with a failing audit log", dst)
				}
			}
			if d := r.dial.Dialled(); len(d) != 0 {
				t.Fatalf("dialled %q with a failing audit log", d)
			}
			recs := r.rec.All()
			if len(recs) != 2 {
				t.Fatalf("records: %+v", recs)
			}
			for _, rec := range recs {
				if rec.Kind != audit.KindFlow || rec.Verdict != audit.VerdictDeny || rec.Rule != c.rule {
					t.Errorf("record: %+v", rec)
				}
			}
		})
	}
}
