package integration

// Deny rules and the open default (issue 23, item 4), end to end: a deny
// rule wins over the allow rule that covers its name, by name and by raw
// address; default: public reaches any public server of the world, by name,
// on any port and by address, but never loopback, the metadata address or
// an RFC 1918 stand-in, however the sandbox names them.

import (
	"context"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tunwall/tunwall/internal/audit"
	"github.com/tunwall/tunwall/internal/testworld"
)

func TestADenyRuleWinsOverTheAllowRuleThatCoversItsName(t *testing.T) {
	requireTools(t, "curl")
	w := newWorld(t, testworld.Options{Names: map[string][]netip.Addr{
		"gist.allowed.test": {testworld.Evil4, testworld.Evil6},
	}})
	file := polWritePolicy(t, w.dir, "deny.yaml", `version: 1
phases:
  exec:
    allow:
      - host: "*.allowed.test"
        ports: [80, 443]
    deny:
      - host: gist.allowed.test
`)
	denyRule := "deny gist.allowed.test:*/tcp+udp (" + file + ":8)"
	r := w.mustRun(0, runOpts{
		flags: []string{"--policy", file},
		script: `c() { what=$1; shift; out=$(curl -sS --max-time 10 "$@" 2>/dev/null); rc=$?; echo "$what rc=$rc:" $out; }
c sibling https://api.allowed.test/sibling
c by-name https://gist.allowed.test/by-name
c by-ip-tls --resolve gist.allowed.test:443:192.0.2.66 https://gist.allowed.test/by-ip
c by-ip-http --resolve gist.allowed.test:80:192.0.2.66 http://gist.allowed.test/by-ip`,
	})
	out := lines(r.stdout)
	if len(out) != 4 {
		t.Fatalf("want 4 lines of output\n%s", r)
	}
	if out[0] != "sibling rc=0: api api.allowed.test /sibling" {
		t.Errorf("the allowed sibling: %q, want it served\n%s", out[0], r)
	}
	if out[1] != "by-name rc=6:" {
		t.Errorf("the denied name: %q, want curl's resolve failure (6: NXDOMAIN)\n%s", out[1], r)
	}
	if out[2] != "by-ip-tls rc=35:" {
		t.Errorf("the denied name's TLS to a raw address: %q, want it reset in the handshake (35)\n%s", out[2], r)
	}
	if !strings.HasPrefix(out[3], "by-ip-http rc=0: tunwall: denied: ") || !strings.Contains(out[3], "name gist.allowed.test (http): a deny rule matches it (deny rules win over any allow: it wins over rule *.allowed.test:80,443/tcp ("+file+":5))") {
		t.Errorf("the denied name's HTTP to a raw address: %q, want tunwall's 403 naming the deny rule\n%s", out[3], r)
	}
	if !strings.Contains(r.stderr, "gist.allowed.test") || !strings.Contains(r.stderr, "a deny rule matches it") {
		t.Errorf("no denial line on stderr names the deny rule\n%s", r)
	}
	w.noArrivals("evil")
	polNeverAsked(t, w, "gist.allowed.test")

	var dnsDenied, flowsDenied int
	for _, rec := range records(t, r.audit) {
		switch {
		case rec.Kind == audit.KindDNS && rec.Qname == "gist.allowed.test":
			if rec.Verdict != audit.VerdictDeny || rec.Rule != denyRule || rec.Rcode != "NXDOMAIN" || !strings.Contains(rec.Reason, "a deny rule matches it") {
				t.Errorf("DNS record of the denied name: %+v", rec)
			}
			dnsDenied++
		case rec.Kind == audit.KindFlow && (rec.SNI == "gist.allowed.test" || rec.HTTPHost == "gist.allowed.test"):
			if rec.Verdict != audit.VerdictDeny || rec.Rule != denyRule {
				t.Errorf("flow record of the denied name: %+v", rec)
			}
			flowsDenied++
		case rec.Kind == audit.KindFlow && rec.Host == "api.allowed.test":
			if rec.Verdict != audit.VerdictAllow || rec.Rule != "*.allowed.test:80,443/tcp ("+file+":5)" {
				t.Errorf("flow record of the allowed sibling: %+v", rec)
			}
		}
	}
	if dnsDenied == 0 || flowsDenied != 2 {
		t.Errorf("%d DNS and %d flow records deny gist.allowed.test, want some and 2", dnsDenied, flowsDenied)
	}
}

func TestDefaultPublicReachesPublicServersButNeverLoopbackMetadataOrPrivateOnes(t *testing.T) {
	requireTools(t, "curl")
	w := newWorld(t)
	file := polWritePolicy(t, w.dir, "browse.yaml", `version: 1
phases:
  browse:
    default: public
    deny:
      - host: denied.test
`)
	// Each line: what, then curl's exit status (0 only when served).
	r := w.mustRun(0, runOpts{
		flags: []string{"--policy", file},
		script: `c() { what=$1; shift; out=$(curl -fsS --max-time 10 "$@" 2>/dev/null); rc=$?; echo "$what rc=$rc" $out; }
c name https://allowed.test/open
c port https://other.test:8443/port
c ipv6 -6 https://api.other.test/v6
c address http://192.0.2.11/address
c denied https://denied.test/
c denied-ip-tls --resolve denied.test:443:192.0.2.66 https://denied.test/
c denied-ip-http --resolve denied.test:80:192.0.2.66 http://denied.test/
c loopback https://rebind-lo.test/
c metadata http://rebind-metadata.test/
c private http://rebind-private.test/
c mixed http://rebind-mixed.test/
c self http://rebind-self.test:8081/
c metadata-ip http://169.254.169.254/latest/meta-data/
c private-ip http://10.0.0.5/
c self-ip http://10.77.0.1:8081/`,
	})
	got := map[string]string{}
	for _, l := range lines(r.stdout) {
		what, _, _ := strings.Cut(l, " ")
		got[what] = l
	}
	for what, want := range map[string]string{
		"name":    "name rc=0 web allowed.test /open",
		"port":    "port rc=0 web other.test:8443 /port",
		"ipv6":    "ipv6 rc=0 api api.other.test /v6",
		"address": "address rc=0 api 192.0.2.11 /address",
	} {
		if got[what] != want {
			t.Errorf("%s: %q, want %q\n%s", what, got[what], want, r)
		}
	}
	for _, what := range []string{"denied", "denied-ip-tls", "loopback", "metadata", "private", "mixed", "self", "metadata-ip", "private-ip", "self-ip"} {
		l, ok := got[what]
		if !ok || strings.HasPrefix(l, what+" rc=0") || !strings.HasPrefix(l, what+" rc=") || l != strings.TrimSpace(l) || strings.Count(l, " ") != 1 {
			t.Errorf("%s: %q, want refused with nothing served\n%s", what, l, r)
		}
	}
	w.noArrivals("metadata", "private", "agent-lo", "agent-veth")
	// The denied name's server address is public, so the open default
	// dials it (a bare connection); the name the client then sends is
	// refused before a byte of it goes on.
	for _, a := range w.Arrivals("evil") {
		if a.Proto != "tcp" {
			t.Errorf("the denied name's server saw %+v", a)
		}
	}
	if l := got["denied-ip-http"]; !strings.HasPrefix(l, "denied-ip-http rc=22") {
		t.Errorf("denied-ip-http: %q, want tunwall's 403", l)
	}

	var public, byAddr int
	guarded := map[string]bool{}
	for _, rec := range polFlows(t, r.audit, func(audit.Record) bool { return true }) {
		switch {
		case rec.Host == "allowed.test" || rec.Host == "other.test" || rec.Host == "api.other.test" ||
			rec.Host == "" && rec.Dst.Addr() == testworld.API4:
			if rec.Verdict != audit.VerdictAllow || rec.Rule != "default: public" || !strings.Contains(rec.Reason, "default: public") {
				t.Errorf("flow to a public server: %+v, want allowed by the open default", rec)
			}
			public++
		case rec.SNI == "denied.test" || rec.HTTPHost == "denied.test":
			if rec.Verdict != audit.VerdictDeny || rec.Rule != "deny denied.test:*/tcp+udp ("+file+":6)" || !strings.Contains(rec.Reason, "raw IP 192.0.2.66 (allowed by default: public): name denied.test") {
				t.Errorf("flow to the denied name by address: %+v", rec)
			}
			byAddr++
		case strings.HasPrefix(rec.Host, "rebind-"):
			if rec.Verdict != audit.VerdictDeny || rec.Rule != "guard" || !strings.Contains(rec.Reason, "default: public allows only names that resolve only to public addresses") {
				t.Errorf("flow to a name with a guarded address: %+v", rec)
			}
			guarded[rec.Host] = true
		}
	}
	if byAddr != 2 {
		t.Errorf("%d flows to the denied name by address refused, want 2", byAddr)
	}
	if public != 4 || len(guarded) != 5 {
		t.Errorf("%d flows allowed by the open default (want 4); names refused for their addresses: %v (want the 5 rebind- names)", public, guarded)
	}
}

// The SOCKS front end decides through the same engine: a deny rule refuses
// a name sent to it, and an address its client sent is dialled under the
// open default, the name then sent over it judged like any other.
func TestSocksAppliesDenyRulesAndTheOpenDefault(t *testing.T) {
	requireTools(t, "curl")
	w := newWorld(t)
	file := polWritePolicy(t, w.dir, "browse.yaml", `version: 1
phases:
  browse:
    default: public
    deny:
      - host: denied.test
`)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	proxy, proxyAudit, log := w.startBackground(ctx, "socks", runOpts{
		flags: []string{"--listen", "127.0.0.1:1080", "--policy", file},
	}, "SOCKS5 proxy on")
	script := `c() { what=$1; shift; out=$(curl -sS --max-time 10 "$@" 2>/dev/null); rc=$?; echo "$what rc=$rc:" $out; }
c name --socks5-hostname 127.0.0.1:1080 http://allowed.test/name
c address --socks5 127.0.0.1:1080 http://192.0.2.11/address
c denied --socks5-hostname 127.0.0.1:1080 http://denied.test/
c denied-by-address --socks5 127.0.0.1:1080 --resolve denied.test:80:192.0.2.66 http://denied.test/
c private --socks5-hostname 127.0.0.1:1080 http://rebind-private.test/`
	out, err := w.AgentCommand(ctx, "sh", "-c", script).Output()
	if err != nil {
		t.Fatal(err)
	}
	proxy.Process.Signal(syscall.SIGTERM)
	proxy.Wait()
	got := lines(string(out))
	want := []string{
		"name rc=0: web allowed.test /name",
		"address rc=0: api 192.0.2.11 /address",
		"denied rc=97:",
		"private rc=97:",
	}
	if len(got) != 5 || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] || got[4] != want[3] ||
		!strings.HasPrefix(got[3], "denied-by-address rc=0: tunwall: denied: raw IP 192.0.2.66 (allowed by default: public): name denied.test (http): a deny rule matches it") {
		t.Fatalf("through tunwall socks:\n got %q\nwant %q and denied-by-address refused with a 403 naming the deny rule\n%s", got, want, log.String())
	}
	w.noArrivals("private")
	for _, a := range w.Arrivals("evil") {
		if a.Proto != "tcp" {
			t.Errorf("the denied name's server saw %+v", a)
		}
	}
	var rules []string
	for _, r := range records(t, proxyAudit) {
		if r.Kind == audit.KindFlow {
			rules = append(rules, r.Verdict+" "+r.Rule)
		}
	}
	denyRule := "deny deny denied.test:*/tcp+udp (" + file + ":6)"
	if len(rules) != 5 || rules[0] != "allow default: public" || rules[1] != "allow default: public" || rules[2] != denyRule || rules[3] != denyRule || rules[4] != "deny guard" {
		t.Errorf("flow records' verdicts and rules: %q", rules)
	}
}
