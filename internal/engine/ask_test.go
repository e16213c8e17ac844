package engine

import (
	"context"
	"net/netip"
	"sync"
	"testing"

	"github.com/miekg/dns"

	"github.com/tunwall/tunwall/internal/approve"
	"github.com/tunwall/tunwall/policy"
)

// fakeAsker answers every Ask with pending, and grants what it is told.
type fakeAsker struct {
	mu     sync.Mutex
	asked  []approve.Request
	grants map[string]bool // host
}

func (f *fakeAsker) Granted(phase, host string, port uint16, proto string) (policy.Decision, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.grants[host] && port == 443 && proto == "tcp" {
		return policy.Decision{Verdict: policy.Allow, Rule: "approval:run", Reason: "granted"}, true
	}
	return policy.Decision{}, false
}

func (f *fakeAsker) SetPhase(string) {}

func (f *fakeAsker) Ask(ctx context.Context, r approve.Request) (policy.Decision, bool) {
	f.mu.Lock()
	f.asked = append(f.asked, r)
	f.mu.Unlock()
	return policy.Decision{Rule: "approval", Reason: "awaiting approval"}, true
}

func askQuery(t *testing.T, e *Engine, name string) *dns.Msg {
	t.Helper()
	q := new(dns.Msg)
	q.SetQuestion(dns.Fqdn(name), dns.TypeA)
	return e.dns.Answer(context.Background(), netip.MustParseAddrPort("10.0.0.2:40000"), netip.MustParseAddrPort("10.0.0.1:53"), "udp", q)
}

// TestOnlyWhatTheDefaultRuleDeniesIsAskedAbout: an unknown name is held
// (SERVFAIL, the asker sees it); a name a deny rule denies, a name in learn
// mode and an allowed name are not asked about.
func TestOnlyWhatTheDefaultRuleDeniesIsAskedAbout(t *testing.T) {
	a := &fakeAsker{}
	r := newRig(t, "      - host: ok.test\n    deny:\n      - host: bad.test\n", func(c *Config) { c.Ask = a })
	if m := askQuery(t, r.e, "unknown.test"); m.Rcode != dns.RcodeServerFailure {
		t.Errorf("unknown name: %s, want SERVFAIL while pending", dns.RcodeToString[m.Rcode])
	}
	if m := askQuery(t, r.e, "bad.test"); m.Rcode != dns.RcodeNameError {
		t.Errorf("denied name: %s, want NXDOMAIN", dns.RcodeToString[m.Rcode])
	}
	if m := askQuery(t, r.e, "ok.test"); m.Rcode != dns.RcodeSuccess {
		t.Errorf("allowed name: %s, want NOERROR", dns.RcodeToString[m.Rcode])
	}
	if m := askQuery(t, r.e, "_srv._tcp.unknown.test"); m.Rcode != dns.RcodeNameError {
		t.Errorf("an underscore name: %s, want NXDOMAIN (not held)", dns.RcodeToString[m.Rcode])
	}
	if len(a.asked) != 1 || a.asked[0].Host != "unknown.test" || a.asked[0].Proto != approve.ProtoDNS || a.asked[0].Phase != "test" {
		t.Errorf("asked %+v, want unknown.test alone", a.asked)
	}

	learn := &fakeAsker{}
	rl := newRig(t, "      - host: ok.test\n", func(c *Config) { c.Ask, c.Learn = learn, true })
	if m := askQuery(t, rl.e, "unknown.test"); m.Rcode != dns.RcodeSuccess || len(learn.asked) != 0 {
		t.Errorf("learn mode: %s, asked %v; want an answer, nothing asked", dns.RcodeToString[m.Rcode], learn.asked)
	}
}

// TestAStandingApprovalAllowsTheNamesFlowsOnItsPortOnly: the engine's
// name decisions consult the asker's grants after a default denial, and
// only then.
func TestAStandingApprovalAllowsTheNamesFlowsOnItsPortOnly(t *testing.T) {
	a := &fakeAsker{grants: map[string]bool{"granted.test": true, "bad.test": true}}
	r := newRig(t, "      - host: ok.test\n    deny:\n      - host: bad.test\n", func(c *Config) { c.Ask = a })
	rs := r.e.rules()
	for _, c := range []struct {
		host string
		port uint16
		want bool
	}{
		{"granted.test", 443, true},
		{"granted.test", 80, false},
		{"other.test", 443, false},
		{"bad.test", 443, false}, // a deny rule wins over an approval
		{"GRANTED.test.", 443, true},
		{"*.granted.test", 443, false},
	} {
		if d := r.e.decideName(rs, c.host, c.port, policy.TCP); d.Allowed() != c.want {
			t.Errorf("%s:%d: %+v, want allowed %v", c.host, c.port, d, c.want)
		}
	}
}
