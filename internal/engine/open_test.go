package engine

import (
	"bytes"
	"strings"
	"testing"

	"github.com/tunwall/tunwall/internal/audit"
	"github.com/tunwall/tunwall/internal/engine/enginetest"
	"github.com/tunwall/tunwall/policy"
	"github.com/tunwall/tunwall/stack"
)

// denyYAML is an allow list followed by the phase's deny rules (the rig
// appends it to "allow:").
const denyYAML = `      - host: "*.allowed.test"
        ports: [80, 443]
    deny:
      - host: gist.allowed.test
`

func TestADenyRuleResetsAFlowAnAllowRuleCoversEvenInLearnMode(t *testing.T) {
	for _, learn := range []bool{false, true} {
		t.Run(map[bool]string{false: "enforce", true: "learn"}[learn], func(t *testing.T) { denyRuleResets(t, learn) })
	}
}

func denyRuleResets(t *testing.T, learn bool) {
	r := newRig(t, denyYAML, func(c *Config) { c.Learn = learn })
	r.resolves("gist.allowed.test", "192.0.2.10")
	r.resolves("api.allowed.test", "192.0.2.11")
	run := r.tcp(t, ap(r.fake(t, "gist.allowed.test").String(), 443))
	run.returned(t)
	if run.wasAccepted() || len(r.dial.Dialled()) != 0 || len(r.res.Asked()) != 0 {
		t.Fatalf("learn=%v: a denied name was accepted (%v), resolved (%q) or dialled (%q)", learn, run.wasAccepted(), r.res.Asked(), r.dial.Dialled())
	}
	rec := r.rec.Wait(t, audit.KindFlow)
	if rec.Verdict != audit.VerdictDeny || rec.Rule != "deny gist.allowed.test:*/tcp+udp (test.yaml:8)" || !strings.Contains(rec.Reason, "a deny rule matches it") {
		t.Fatalf("learn=%v: record %+v", learn, rec)
	}
	if !strings.Contains(r.denials.String(), "tunwall: denied gist.allowed.test:443 tcp: a deny rule matches it") {
		t.Errorf("learn=%v: denial lines:\n%s", learn, r.denials.String())
	}
	// The sibling the wildcard allows is dialled.
	run = r.tcp(t, ap(r.fake(t, "api.allowed.test").String(), 443))
	r.dial.Server(t)
	run.waitAccepted(t)
	if d := r.dial.Dialled(); len(d) != 1 || d[0] != "tcp 192.0.2.11:443" {
		t.Fatalf("learn=%v: dials = %q", learn, d)
	}
}

// openYAML is a phase with default: public and one deny rule.
const openYAML = `      - host: placeholder.test
    default: public
    deny:
      - host: evil.test
`

func TestDefaultPublicDialsAPublicRawIPAndJudgesTheNameItSends(t *testing.T) {
	for _, c := range []struct {
		name  string
		port  uint16
		first []byte
		allow bool
		rule  string // of the record
	}{
		{"no name (another protocol)", 22, []byte("SSH-2.0-test\r\n"), true, "default: public"},
		{"an allowed SNI", 443, enginetest.ClientHello(t, "ok.test"), true, "default: public"},
		{"the address as HTTP Host", 80, httpGet("198.51.100.7"), true, "default: public"},
		{"a denied SNI", 443, enginetest.ClientHello(t, "evil.test"), false, "deny evil.test:*/tcp+udp (test.yaml:8)"},
		{"a denied HTTP Host", 80, httpGet("evil.test"), false, "deny evil.test:*/tcp+udp (test.yaml:8)"},
		{"another address as HTTP Host", 80, httpGet("192.0.2.66"), false, "default: public"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := newRig(t, openYAML, nil)
			run := r.tcp(t, ap("198.51.100.7", c.port))
			srv := r.dial.Server(t)
			run.waitAccepted(t) // dialled first: the address is allowed
			if d := r.dial.Dialled(); len(d) != 1 || d[0] != "tcp 198.51.100.7:"+itoa(int(c.port)) {
				t.Fatalf("dials = %q, want the raw IP", d)
			}
			run.send(c.first)
			if c.allow {
				if got := enginetest.ReadUpTo(t, srv, len(c.first)); !bytes.Equal(got, c.first) {
					t.Fatalf("the upstream got %q", got)
				}
				run.client.Close()
			} else if got := enginetest.ReadUpTo(t, srv, 1); len(got) != 0 {
				t.Fatal("the upstream got bytes of a refused name")
			}
			run.returned(t)
			rec := r.rec.Wait(t, audit.KindFlow)
			want := audit.VerdictAllow
			if !c.allow {
				want = audit.VerdictDeny
			}
			if rec.Verdict != want || rec.Rule != c.rule || rec.Host != "" {
				t.Fatalf("record: %+v", rec)
			}
			if !c.allow && !strings.Contains(rec.Reason, "raw IP 198.51.100.7 (allowed by default: public): ") {
				t.Errorf("reason %q does not say why the raw IP's flow was cut", rec.Reason)
			}
		})
	}
}

func TestDefaultPublicNeverDialsANameWithAGuardedAddress(t *testing.T) {
	r := newRig(t, openYAML, nil)
	r.resolves("mixed.test", "127.0.0.1", "192.0.2.10")
	r.resolves("metadata.test", "169.254.169.254")
	r.resolves("public.test", "192.0.2.10", "2001:db8::10")
	for i, name := range []string{"mixed.test", "metadata.test"} {
		run := r.tcp(t, ap(r.fake(t, name).String(), 443))
		run.returned(t)
		if run.wasAccepted() || len(r.dial.Dialled()) != 0 {
			t.Fatalf("%s: accepted=%v dials=%q", name, run.wasAccepted(), r.dial.Dialled())
		}
		rec := r.rec.WaitN(t, audit.KindFlow, i+1)
		if rec.Verdict != audit.VerdictDeny || rec.Rule != "guard" || !strings.Contains(rec.Reason, "default: public allows only names that resolve only to public addresses") {
			t.Fatalf("%s: record %+v", name, rec)
		}
	}
	run := r.tcp(t, ap(r.fake(t, "public.test").String(), 443))
	r.dial.Server(t)
	run.waitAccepted(t)
	if d := r.dial.Dialled(); len(d) != 1 || d[0] != "tcp 192.0.2.10:443" {
		t.Fatalf("dials = %q", d)
	}
}

// TestTheOpenInspectorJudgesANameAsAFlowToItWouldBe: on a raw IP the open
// default allowed, a name the client sends is refused when a deny rule
// matches it, and when its host's requests are checked (http or inject):
// tunwall checks them only on a connection to the name.
func TestTheOpenInspectorJudgesANameAsAFlowToItWouldBe(t *testing.T) {
	p, err := policy.Parse("p.yaml", []byte(`version: 1
phases:
  b:
    default: public
    allow:
      - host: api.test
        http: [{methods: [GET], paths: ["/**"]}]
    deny:
      - host: evil.test
`))
	if err != nil {
		t.Fatal(err)
	}
	rs, err := policy.Select(p, "", nil, policy.Guard{})
	if err != nil {
		t.Fatal(err)
	}
	e := &Engine{cfg: Config{Rules: rs, Resolver: enginetest.NewResolver()}}
	fr := &flowRecord{f: stack.Flow{Proto: stack.TCP, Src: sandbox4, Dst: ap("198.51.100.7", 443)}, v: verdict{Verdict: policy.Allow, Rule: policy.RuleDefaultPublic}, rs: rs}
	decide := e.openDecide(fr)
	for _, tt := range []struct {
		name   string
		allow  bool
		reason string
	}{
		{"ok.test", true, "default: public"},
		{"evil.test", false, "name evil.test (sni): a deny rule matches it"},
		{"api.test", false, "name api.test (sni): its requests are checked by tunwall, which happens only on a connection to the name"},
	} {
		v, ok := decide(tt.name, audit.HostFromSNI)
		if ok != tt.allow || v.Allowed() != tt.allow || !strings.Contains(v.Reason, tt.reason) {
			t.Errorf("decide(%q) = %+v, %v; want allow=%v reason containing %q", tt.name, v, ok, tt.allow, tt.reason)
		}
	}
}
