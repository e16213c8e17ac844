package integration

import (
	"encoding/json"
	"net/netip"
	"os/exec"
	"strings"
	"testing"

	"github.com/tunwall/tunwall/internal/audit"
	"github.com/tunwall/tunwall/internal/testenv"
	"github.com/tunwall/tunwall/internal/testworld"
)

// TestAnAllowedFlowThatFailsSaysWhyOnStderr: an allowed flow that does not
// open is no silent failure. Whether its name did not resolve (the DNS
// upstream has no answer for it, or does not answer at all), its server
// refused it, or nothing answered in time, tunwall says so in one line
// naming the host, and the record says how it ended (dns-failed, refused,
// timeout) with a one-line reason.
func TestAnAllowedFlowThatFailsSaysWhyOnStderr(t *testing.T) {
	requireTools(t, "curl")
	w := newWorld(t, testworld.Options{Names: map[string][]netip.Addr{
		"refused.test":   {testworld.Refuse4},
		"blackhole.test": {testworld.Blackhole4},
	}})
	script := `curl -sS --max-time 20 http://refused.test/ 2>/dev/null; echo "refused: $?"
curl -sS --max-time 20 http://blackhole.test/ 2>/dev/null; echo "blackhole: $?"
curl -sS --max-time 20 http://unknown.test/ 2>/dev/null; echo "unknown: $?"
`
	r := w.mustRun(0, runOpts{flags: []string{"--allow", "refused.test:80", "--allow", "blackhole.test:80", "--allow", "unknown.test:80", "--dial-timeout", "2s"}, script: script})
	for host, want := range map[string]string{"refused.test": "refused", "blackhole.test": "timed out", "unknown.test": "did not resolve"} {
		var line string
		for l := range strings.SplitSeq(r.stderr, "\n") {
			if strings.HasPrefix(l, "tunwall: ") && strings.Contains(l, host) && !strings.Contains(l, "  ") {
				line = l
			}
		}
		if !strings.Contains(line, want) {
			t.Errorf("%s: no stderr line naming it that says %q (last line naming it: %q)\n%s", host, want, line, r)
		}
	}
	got := map[string]audit.Record{}
	for _, rec := range records(t, r.audit) {
		if rec.Kind == audit.KindFlow {
			got[rec.Host] = rec
		}
	}
	for host, want := range map[string]string{"refused.test": audit.OutcomeRefused, "blackhole.test": audit.OutcomeTimeout, "unknown.test": audit.OutcomeDNSFailed} {
		if rec := got[host]; rec.Outcome != want || !strings.Contains(rec.Reason, ";") {
			t.Errorf("%s: record outcome %q reason %q, want %s with its reason", host, rec.Outcome, rec.Reason, want)
		}
	}

	// A DNS upstream that does not answer at all: the flow's record says
	// dns-failed (not timeout), and the line says the upstream did not
	// answer.
	r = w.mustRun(0, runOpts{flags: []string{"--allow", "allowed.test:80", "--dns-upstream", testworld.Blackhole4.String() + ":53", "--json-log"},
		script: `curl -sS --max-time 30 http://allowed.test/ 2>/dev/null; echo "silent upstream: $?"`, timeout: 90e9})
	found := false
	for l := range strings.SplitSeq(r.stderr, "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(l), &m) == nil && strings.Contains(l, "allowed.test") && strings.Contains(l, "did not resolve") {
			found = true
		}
	}
	if !found {
		t.Errorf("no JSON line under --json-log saying allowed.test did not resolve\n%s", r)
	}
	for _, rec := range records(t, r.audit) {
		if rec.Kind == audit.KindFlow && rec.Host == "allowed.test" && rec.Outcome != audit.OutcomeDNSFailed {
			t.Errorf("a flow whose DNS upstream did not answer: outcome %q, want dns-failed (%s)", rec.Outcome, rec.Reason)
		}
	}
}

// TestAClientThatRejectsTheRunsCertificateIsSaidAndRecorded: a client
// told to trust another CA (curl --cacert, python's verify= in urllib and
// requests) refuses the run's certificate of a terminated host. Whatever
// way its TLS says so (an alert, a record tunwall cannot read, a hang-up),
// tunwall says so on stderr naming the host and the variable that names
// the run's bundle (a cert-rejected event under --json-log), and the
// record's outcome is cert-rejected, not ok.
func TestAClientThatRejectsTheRunsCertificateIsSaidAndRecorded(t *testing.T) {
	requireTools(t, "curl", "python3")
	if exec.Command("python3", "-c", "import requests").Run() != nil {
		testenv.Skip(t, "python3 has no requests module (.ci/run installs python3-requests)")
	}
	cw := newCredsWorld(t, 0)
	other := cw.world.caPEM // the world's CA: not the run's
	script := `curl -sS --max-time 10 --cacert ` + other + ` https://api.creds.test/curl -o /dev/null 2>/dev/null; echo "curl: $?"
python3 -c 'import ssl,urllib.request,sys
try:
    urllib.request.urlopen("https://api.creds.test/python", context=ssl.create_default_context(cafile=sys.argv[1]), timeout=10)
    print("python: ok")
except Exception as e:
    print("python: failed")' ` + other + `
python3 -c 'import requests,sys
try:
    requests.get("https://api.creds.test/requests", verify=sys.argv[1], timeout=10)
    print("requests: ok")
except Exception as e:
    print("requests: failed")' ` + other + `
`
	r := cw.run(runOpts{script: script, flags: []string{"--json-log"}})
	if !strings.Contains(r.stdout, "curl: 60") && !strings.Contains(r.stdout, "curl: 35") ||
		!strings.Contains(r.stdout, "python: failed") || !strings.Contains(r.stdout, "requests: failed") {
		t.Errorf("a client trusting another CA did not fail on the certificate\n%s", r)
	}
	lines := 0
	for l := range strings.SplitSeq(r.stderr, "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(l), &m) != nil || m["event"] != "cert-rejected" {
			continue
		}
		msg, _ := m["msg"].(string)
		if m["what"] == "api.creds.test:443 tcp" && strings.Contains(msg, "run's CA") && strings.Contains(msg, "SSL_CERT_FILE") {
			lines++
		}
	}
	if lines < 1 {
		t.Errorf("no cert-rejected line says a client did not trust the run's CA for api.creds.test (and names SSL_CERT_FILE)\n%s", r)
	}
	n := 0
	for _, rec := range records(t, r.audit) {
		if rec.Kind == audit.KindFlow && rec.Host == "api.creds.test" {
			n++
			if rec.Outcome != audit.OutcomeCertRejected {
				t.Errorf("a flow whose client rejected the run's certificate: outcome %q, want %q (%s)", rec.Outcome, audit.OutcomeCertRejected, rec.Reason)
			}
		}
	}
	if n != 3 {
		t.Errorf("%d flow records for api.creds.test, want 3", n)
	}
}

// TestAnAllowedNameWhoseDNSUpstreamFailsIsDNSFailedAndSaid: a query for an
// allowed name that tunwall forwards (TXT, MX, ...) and a flow to an
// allowed name, when the DNS upstream does not answer or answers SERVFAIL,
// are no silent failure: one line on stderr naming the name (JSON under
// --json-log), and the record's outcome is dns-failed with a one-line
// reason.
func TestAnAllowedNameWhoseDNSUpstreamFailsIsDNSFailedAndSaid(t *testing.T) {
	requireTools(t, "curl", "dig")
	w := newWorld(t, testworld.Options{})
	check := func(r result, host, qtype, why string) {
		t.Helper()
		dnsLine, flowLine := false, false
		for l := range strings.SplitSeq(r.stderr, "\n") {
			var m map[string]any
			if json.Unmarshal([]byte(l), &m) != nil || m["event"] != "failed" || !strings.Contains(l, host) || !strings.Contains(l, why) {
				continue
			}
			if strings.Contains(l, "DNS "+qtype+" "+host) {
				dnsLine = true
			} else if strings.Contains(l, host+":80 tcp") {
				flowLine = true
			}
		}
		if !dnsLine || !flowLine {
			t.Errorf("%s: JSON failed line for the %s query %v, for the flow %v; want both saying %q\n%s", host, qtype, dnsLine, flowLine, why, r)
		}
		var dnsRec, flowRec audit.Record
		for _, rec := range records(t, r.audit) {
			switch {
			case rec.Kind == audit.KindDNS && rec.Qname == host && rec.Qtype == qtype:
				dnsRec = rec
			case rec.Kind == audit.KindFlow && rec.Host == host:
				flowRec = rec
			}
		}
		for _, rec := range []audit.Record{dnsRec, flowRec} {
			if rec.Outcome != audit.OutcomeDNSFailed || !strings.Contains(rec.Reason, why) || strings.Contains(rec.Reason, "\n") {
				t.Errorf("%s: %s record outcome %q reason %q, want dns-failed saying %q", host, rec.Kind, rec.Outcome, rec.Reason, why)
			}
		}
	}
	script := func(host string) string {
		return `dig +tries=1 +time=20 TXT ` + host + ` | grep -o 'status: [A-Z]*'
curl -sS --max-time 30 http://` + host + `/ 2>/dev/null; echo "curl: $?"`
	}

	// The upstream does not answer at all.
	r := w.mustRun(0, runOpts{flags: []string{"--allow", "allowed.test:80", "--dns-upstream", testworld.Blackhole4.String() + ":53", "--json-log"},
		script: script("allowed.test"), timeout: 90e9})
	check(r, "allowed.test", "TXT", "did not answer")

	// The upstream answers SERVFAIL.
	r = w.mustRun(0, runOpts{flags: []string{"--allow", testworld.ServFailName + ":80", "--json-log"}, script: script(testworld.ServFailName)})
	check(r, testworld.ServFailName, "TXT", "SERVFAIL")
}

// TestARequestTunwallCouldNotSendUpstreamIsSaidOnStderr: on a terminated
// host (inject, http), a request whose upstream connection fails (here the
// server's certificate is one tunwall does not trust) gets a 502 from
// tunwall; that is no silent failure either: one line naming the request
// and why (an event failed under --json-log).
func TestARequestTunwallCouldNotSendUpstreamIsSaidOnStderr(t *testing.T) {
	requireTools(t, "curl")
	cw := newCredsWorld(t, 0)
	r := cw.run(runOpts{flags: []string{"--json-log"}, script: `curl -sS --max-time 10 https://untrusted.creds.test/x -o /dev/null -w 'status %{http_code}\n'`})
	if !strings.Contains(r.stdout, "status 502") {
		t.Fatalf("the request did not get tunwall's 502\n%s", r)
	}
	found := false
	for l := range strings.SplitSeq(r.stderr, "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(l), &m) == nil && m["event"] == "failed" && m["what"] == "GET https://untrusted.creds.test/x" &&
			strings.Contains(l, "certificate tunwall does not trust") {
			found = true
		}
	}
	if !found {
		t.Errorf("no failed line names the request and says why\n%s", r)
	}
}
