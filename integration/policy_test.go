package integration

// Policy, DNS interception and sniffing, end to end: what the allowlist lets
// through and what it stops, by name, by address, by port, by protocol and by
// phase; what DNS answers (and never forwards); what a TLS SNI or HTTP Host
// that disagrees with the connected name gets; the rebinding guard; and the
// `tunwall policy` subcommands. Every denial is asserted to be immediate
// through the exit code that means RST, NXDOMAIN or ICMP, never through a
// wall-clock threshold.

import (
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/tunwall/tunwall/internal/audit"
	"github.com/tunwall/tunwall/internal/testworld"
)

// polWritePolicy writes a policy file into the world's scratch directory,
// readable by everyone, and returns its path.
func polWritePolicy(t *testing.T, dir, name, body string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// polAskedTypes lists the query types the world's resolver received for
// exactly name (not its subdomains).
func polAskedTypes(w *world, name string) []string {
	var out []string
	for _, q := range w.DNS.Log() {
		if q.Name == name {
			out = append(out, q.Type)
		}
	}
	return out
}

// polNeverAsked fails the test if the world's resolver ever received a
// question for exactly one of names.
func polNeverAsked(t *testing.T, w *world, names ...string) {
	t.Helper()
	for _, n := range names {
		if got := polAskedTypes(w, n); len(got) > 0 {
			t.Errorf("the denied name %s reached the world's resolver (types %v)", n, got)
		}
	}
}

// polDenials returns the "tunwall: denied" lines of stderr.
func polDenials(stderr string) []string {
	var out []string
	for _, l := range strings.Split(stderr, "\n") {
		if strings.HasPrefix(l, "tunwall: denied") {
			out = append(out, l)
		}
	}
	return out
}

// polFlows returns the flow records of an audit log matching keep.
func polFlows(t *testing.T, path string, keep func(audit.Record) bool) []audit.Record {
	t.Helper()
	var out []audit.Record
	for _, r := range records(t, path) {
		if r.Kind == audit.KindFlow && keep(r) {
			out = append(out, r)
		}
	}
	return out
}

// polStatus is a shell function printing the DNS status of a dig query
// (NOERROR, NXDOMAIN, ...), or nothing if dig got no answer.
const polStatus = `st() { dig +tries=1 +time=5 "$@" | sed -n 's/.*status: \([A-Z]*\),.*/\1/p'; }
`

func TestAllowedNamesWorkOverHTTPAndHTTPSOnIPv4AndIPv6(t *testing.T) {
	requireTools(t, "curl")
	w := newWorld(t)
	file := polWritePolicy(t, w.dir, "web.yaml", `version: 1
phases:
  exec:
    allow:
      - host: allowed.test
        ports: [80, 443]
`)
	script := `curl -sS --max-time 10 -4 http://allowed.test/http4
curl -sS --max-time 10 -6 http://allowed.test/http6
curl -sS --max-time 10 -4 https://allowed.test/https4
curl -sS --max-time 10 -6 https://allowed.test/https6`
	top := t
	for _, c := range []struct {
		name  string
		flags []string
		rule  string // what the allowing rule's label names
	}{
		{"from a policy file with one phase", []string{"--policy", file}, file + ":5"},
		{"from --allow flags", []string{"--allow", "allowed.test:80", "--allow", "allowed.test:443"}, "--allow allowed.test:"},
	} {
		t.Run(c.name, func(t *testing.T) {
			w.t = t
			defer func() { w.t = top }()
			w.ResetArrivals()
			r := w.mustRun(0, runOpts{flags: c.flags, script: script})
			wantLines(t, r,
				"web allowed.test /http4",
				"web allowed.test /http6",
				"web allowed.test /https4",
				"web allowed.test /https6",
			)
			// The TLS server saw the sandbox's SNI on both families.
			tls := map[netip.Addr]bool{}
			for _, a := range w.Arrivals("web") {
				if a.Proto == "tls" && a.Host == "allowed.test" {
					tls[a.Local.Addr()] = true
				}
			}
			if !tls[testworld.Web4] || !tls[testworld.Web6] {
				t.Errorf("web saw TLS for allowed.test on %v; want both %v and %v", tls, testworld.Web4, testworld.Web6)
			}
			flows := polFlows(t, r.audit, func(audit.Record) bool { return true })
			if len(flows) != 4 {
				t.Fatalf("want 4 flow records, got %d: %+v", len(flows), flows)
			}
			for _, f := range flows {
				if f.Verdict != audit.VerdictAllow || f.Host != "allowed.test" || f.HostFrom != audit.HostFromDNS ||
					!strings.Contains(f.Rule, c.rule) || !f.Dial.IsValid() {
					t.Errorf("flow record is not an allow of allowed.test by %q with a real dial address: %+v", c.rule, f)
				}
				if f.Dial.Addr() != testworld.Web4 && f.Dial.Addr() != testworld.Web6 {
					t.Errorf("allowed.test was dialled at %v, not at its real address", f.Dial)
				}
			}
		})
	}
}

func TestNodeFetchIgnoresProxyVariablesAndObeysThePolicy(t *testing.T) {
	requireTools(t, "node")
	w := newWorld(t)
	const proxy = "http://192.0.2.66:3128"
	r := w.mustRun(0, runOpts{
		flags: []string{"--allow", "allowed.test"},
		env:   []string{"HTTPS_PROXY=" + proxy, "https_proxy=" + proxy, "HTTP_PROXY=" + proxy, "http_proxy=" + proxy},
		script: `echo "proxy $HTTPS_PROXY"
node -e '
const go = async (u) => {
  try {
    const r = await fetch(u);
    console.log(r.status, (await r.text()).trim());
  } catch (e) {
    console.log("rejected", e.cause && e.cause.code);
  }
};
(async () => {
  await go("https://allowed.test/node");
  await go("https://denied.test/node");
  await go("http://192.0.2.66/node");
})();
'`,
	})
	wantLines(t, r,
		"proxy "+proxy,
		"200 web allowed.test /node",
		"rejected ENOTFOUND",
		"rejected ECONNREFUSED",
	)
	w.noArrivals("evil")
	polNeverAsked(t, w, "denied.test")
	for _, f := range polFlows(t, r.audit, func(audit.Record) bool { return true }) {
		if f.Dst.Port() == 3128 {
			t.Errorf("node went to the proxy it was told about: %+v", f)
		}
	}
}

func TestDeniedNamesGetNXDOMAINForEveryTypeAndNeverReachTheResolver(t *testing.T) {
	requireTools(t, "curl", "dig")
	w := newWorld(t)
	r := w.mustRun(0, runOpts{
		flags: []string{"--allow", "allowed.test"},
		script: polStatus + `curl -sS --max-time 10 https://denied.test/ 2>/dev/null; echo "curl: $?"
for t in A AAAA TXT MX ANY; do echo "$t $(st -t $t denied.test)"; done
echo "control TXT $(dig +tries=1 +time=5 +short -t TXT allowed.test)"`,
	})
	wantLines(t, r,
		"curl: 6",
		"A NXDOMAIN",
		"AAAA NXDOMAIN",
		"TXT NXDOMAIN",
		"MX NXDOMAIN",
		"ANY NXDOMAIN",
		`control TXT "world says hello to allowed.test"`,
	)
	polNeverAsked(t, w, "denied.test")
	// The control proves the log works: an allowed name's TXT is forwarded.
	if !slices.Contains(polAskedTypes(w, "allowed.test"), "TXT") {
		t.Errorf("the allowed TXT query never reached the world's resolver: %v", w.DNS.Log())
	}
	denied := map[string]bool{}
	for _, rec := range records(t, r.audit) {
		if rec.Kind == audit.KindDNS && rec.Qname == "denied.test" {
			if rec.Verdict != audit.VerdictDeny || rec.Rcode != "NXDOMAIN" {
				t.Errorf("DNS record for denied.test is not a deny with NXDOMAIN: %+v", rec)
			}
			denied[rec.Qtype] = true
		}
	}
	for _, qt := range []string{"A", "AAAA", "TXT", "MX", "ANY"} {
		if !denied[qt] {
			t.Errorf("no audit record of the denied %s query for denied.test (have %v)", qt, denied)
		}
	}
}

func TestRawAddressesNeedACIDRRuleUnlessTheySendAnAllowedName(t *testing.T) {
	requireTools(t, "curl")
	w := newWorld(t)
	top := t

	t.Run("without a cidr rule raw addresses are refused at once", func(t *testing.T) {
		w.t = t
		defer func() { w.t = top }()
		w.ResetArrivals()
		r := w.mustRun(0, runOpts{
			flags: []string{"--allow", "allowed.test:80,443"},
			script: `curl -sS --max-time 10 https://192.0.2.10/ 2>/dev/null; echo "https ipv4: $?"
curl -sS --max-time 10 'https://[2001:db8::10]/' 2>/dev/null; echo "https ipv6: $?"
curl -sS --max-time 10 http://192.0.2.10:8443/ 2>/dev/null; echo "no host rule for the port: $?"
curl -sS --max-time 10 -o body -w '%{http_code}\n' 'http://[2001:db8::10]/'; cat body`,
		})
		out := lines(r.stdout)
		if len(out) < 5 {
			t.Fatalf("short output\n%s", r)
		}
		// A raw-IP TLS connection with no SNI is reset after its
		// ClientHello (curl 35: the handshake failed), not timed out (28).
		want := []string{"https ipv4: 35", "https ipv6: 35", "no host rule for the port: 7", "403"}
		if !slices.Equal(out[:4], want) {
			t.Fatalf("got %q, want %q\n%s", out[:4], want, r)
		}
		body := strings.Join(out[4:], "\n")
		if !strings.Contains(body, "tunwall: denied") || !strings.Contains(body, "raw IP 2001:db8::10") {
			t.Errorf("the 403 body does not say why: %q", body)
		}
		w.noArrivals("web", "evil")
		for _, f := range polFlows(t, r.audit, func(audit.Record) bool { return true }) {
			if f.Verdict != audit.VerdictDeny || f.HostFrom != audit.HostFromNone || f.Dial.IsValid() {
				t.Errorf("raw-IP flow was not denied without a name and without a dial: %+v", f)
			}
		}
	})

	t.Run("a cidr rule allows a raw address", func(t *testing.T) {
		w.t = t
		defer func() { w.t = top }()
		w.ResetArrivals()
		file := polWritePolicy(t, w.dir, "cidr.yaml", `version: 1
phases:
  exec:
    allow:
      - cidr: 192.0.2.10/32
        ports: [443]
      - cidr: 2001:db8::10/128
        ports: [80]
`)
		// The world's certificate for a client without SNI names no IP,
		// hence -k; what matters is that the flow reaches web.
		r := w.mustRun(0, runOpts{
			flags: []string{"--policy", file},
			script: `curl -sS -k --max-time 10 https://192.0.2.10/cidr4
curl -sS --max-time 10 'http://[2001:db8::10]/cidr6'
curl -sS --max-time 10 http://192.0.2.10/ 2>/dev/null; echo "port not in the cidr rule: $?"`,
		})
		wantLines(t, r, "web 192.0.2.10 /cidr4", "web [2001:db8::10] /cidr6", "port not in the cidr rule: 7")
		for _, a := range w.Arrivals("web") {
			if a.Local.Port() == 80 && a.Local.Addr() == testworld.Web4 {
				t.Errorf("web was reached on a port the cidr rule does not allow: %+v", a)
			}
		}
		var allowed int
		for _, f := range polFlows(t, r.audit, func(f audit.Record) bool { return f.Verdict == audit.VerdictAllow }) {
			allowed++
			if f.HostFrom != audit.HostFromNone || f.Dial != f.Dst || !strings.Contains(f.Rule, "cidr.yaml") {
				t.Errorf("cidr-allowed flow should be dialled as asked, by the file's rule: %+v", f)
			}
		}
		if allowed != 2 {
			t.Errorf("want 2 allowed flows, got %d", allowed)
		}
	})

	t.Run("a raw address carrying an allowed SNI is dialled by name", func(t *testing.T) {
		w.t = t
		defer func() { w.t = top }()
		w.ResetArrivals()
		r := w.mustRun(0, runOpts{
			flags: []string{"--allow", "allowed.test"},
			script: `curl -sS --max-time 10 --resolve allowed.test:443:192.0.2.66 https://allowed.test/sni4
curl -sS --max-time 10 --resolve 'allowed.test:443:[2001:db8::66]' https://allowed.test/sni6`,
		})
		wantLines(t, r, "web allowed.test /sni4", "web allowed.test /sni6")
		w.noArrivals("evil")
		sni := map[netip.Addr]bool{}
		for _, a := range w.Arrivals("web") {
			if a.Proto == "tls" && a.Host == "allowed.test" {
				sni[a.Local.Addr()] = true
			}
		}
		if !sni[testworld.Web4] || !sni[testworld.Web6] {
			t.Errorf("web's TLS servers saw SNI allowed.test on %v; want both %v and %v", sni, testworld.Web4, testworld.Web6)
		}
		flows := polFlows(t, r.audit, func(audit.Record) bool { return true })
		if len(flows) != 2 {
			t.Fatalf("want 2 flow records, got %+v", flows)
		}
		for _, f := range flows {
			wantDial := testworld.Web4
			if f.Dst.Addr().Is6() {
				wantDial = testworld.Web6
			}
			if f.Verdict != audit.VerdictAllow || f.Host != "allowed.test" || f.HostFrom != audit.HostFromSNI ||
				f.Dial.Addr() != wantDial || !strings.Contains(f.Reason, "dialled by name") {
				t.Errorf("want an allow by SNI dialled to %v, got %+v", wantDial, f)
			}
			if a := f.Dst.Addr(); a != testworld.Evil4 && a != testworld.Evil6 {
				t.Errorf("the record's dst should be the raw address the client chose, got %v", f.Dst)
			}
		}
	})
}

func TestDigToAnyServerAddressIsAnsweredByTunwall(t *testing.T) {
	requireTools(t, "dig")
	w := newWorld(t)
	r := w.mustRun(0, runOpts{
		flags: []string{"--allow", "allowed.test"},
		script: `q() { dig +tries=1 +time=5 "$@"; }
for s in 192.0.2.66 192.0.2.53 198.18.0.1 2001:db8::66; do
  for m in +notcp +tcp; do
    a=$(q @$s $m +short -t A allowed.test | tr -d '\n')
    aaaa=$(q @$s $m +short -t AAAA allowed.test | tr -d '\n')
    da=$(q @$s $m -t A denied.test | sed -n 's/.*status: \([A-Z]*\),.*/\1/p')
    dt=$(q @$s $m -t TXT denied.test | sed -n 's/.*status: \([A-Z]*\),.*/\1/p')
    echo "$s $m $a $aaaa $da $dt"
  done
done`,
	})
	out := lines(r.stdout)
	if len(out) != 8 {
		t.Fatalf("want 8 result lines\n%s", r)
	}
	fake4 := netip.MustParsePrefix("198.18.0.0/15")
	var first4, first6 netip.Addr
	for _, l := range out {
		f := strings.Fields(l)
		if len(f) != 6 {
			t.Errorf("%q: want server, mode, A, AAAA and two statuses", l)
			continue
		}
		a, err4 := netip.ParseAddr(f[2])
		aaaa, err6 := netip.ParseAddr(f[3])
		if err4 != nil || !fake4.Contains(a) {
			t.Errorf("%s %s: A allowed.test = %q, want a fake address in %v", f[0], f[1], f[2], fake4)
		}
		if err6 != nil || !aaaa.Is6() || !strings.HasPrefix(aaaa.String(), "fd74:") {
			t.Errorf("%s %s: AAAA allowed.test = %q, want a fake fd74: address", f[0], f[1], f[3])
		}
		// One stable slot per name, whichever server was asked.
		if !first4.IsValid() {
			first4, first6 = a, aaaa
		} else if a != first4 || aaaa != first6 {
			t.Errorf("%s %s: allowed.test answered %v %v, earlier %v %v: not a stable slot", f[0], f[1], a, aaaa, first4, first6)
		}
		if f[4] != "NXDOMAIN" || f[5] != "NXDOMAIN" {
			t.Errorf("%s %s: denied.test A/TXT got %s/%s, want NXDOMAIN", f[0], f[1], f[4], f[5])
		}
	}
	w.noArrivals("evil")
	polNeverAsked(t, w, "denied.test")
	// Fake answers need no upstream: the real address is resolved only
	// when a flow is dialled, and nothing was.
	if got := polAskedTypes(w, "allowed.test"); len(got) > 0 {
		t.Errorf("answering allowed.test with fake addresses asked the world's resolver %v", got)
	}
}

func TestUDPGoesOnlyWhereAUDPRuleAllows(t *testing.T) {
	requireTools(t, "python3")
	w := newWorld(t)
	r := w.mustRun(0, runOpts{
		flags: []string{"--allow", "echo.test:7/udp", "--allow", "allowed.test"},
		script: `python3 - <<'PY'
import socket
def probe(label, fam, addr):
    s = socket.socket(fam, socket.SOCK_DGRAM)
    s.settimeout(10)
    try:
        s.connect(addr)
        s.send(b"probe " + label.encode())
        print(label, "answered", s.recv(100).decode())
    except ConnectionRefusedError:
        print(label, "refused")
    except socket.timeout:
        print(label, "timed out")
    finally:
        s.close()
def name(host, port, fam):
    return socket.getaddrinfo(host, port, fam, socket.SOCK_DGRAM)[0][4]
probe("echo.test v4", socket.AF_INET, name("echo.test", 7, socket.AF_INET))
probe("echo.test v6", socket.AF_INET6, name("echo.test", 7, socket.AF_INET6))
probe("evil v4", socket.AF_INET, ("192.0.2.66", 7))
probe("evil v6", socket.AF_INET6, ("2001:db8::66", 7))
probe("echo raw v4", socket.AF_INET, ("192.0.2.20", 7))
probe("allowed.test tcp-only", socket.AF_INET, name("allowed.test", 7, socket.AF_INET))
try:
    name("evil.test", 7, socket.AF_INET)
    print("evil.test resolved")
except socket.gaierror:
    print("evil.test unresolvable")
PY`,
	})
	wantLines(t, r,
		"echo.test v4 answered probe echo.test v4",
		"echo.test v6 answered probe echo.test v6",
		"evil v4 refused",
		"evil v6 refused",
		"echo raw v4 refused",
		"allowed.test tcp-only refused",
		"evil.test unresolvable",
	)
	w.noArrivals("evil")
	deny := polFlows(t, r.audit, func(f audit.Record) bool { return f.Verdict == audit.VerdictDeny })
	if len(deny) != 4 {
		t.Errorf("want 4 denied UDP flows, got %+v", deny)
	}
	for _, f := range deny {
		if f.Proto != "udp" || f.Dial.IsValid() {
			t.Errorf("denied UDP flow was dialled or has the wrong protocol: %+v", f)
		}
	}
	allow := polFlows(t, r.audit, func(f audit.Record) bool { return f.Verdict == audit.VerdictAllow })
	if len(allow) != 2 {
		t.Errorf("want 2 allowed UDP flows, got %+v", allow)
	}
	for _, f := range allow {
		if f.Host != "echo.test" || !strings.Contains(f.Rule, "echo.test:7/udp") || f.BytesIn == 0 {
			t.Errorf("allowed UDP flow is not echo.test by its /udp rule with bytes back: %+v", f)
		}
	}
}

func TestPingIsRefusedWithAnICMPError(t *testing.T) {
	requireTools(t, "ping")
	w := newWorld(t)
	r := w.mustRun(0, runOpts{
		flags: []string{"--allow", "allowed.test"},
		script: `for target in "-4 allowed.test" "-4 192.0.2.66" "-6 allowed.test"; do
  echo "== $target"
  ping -c1 -W2 $target 2>&1
  echo "exit $?"
done`,
	})
	blocks := strings.Split(r.stdout, "== ")[1:]
	if len(blocks) != 3 {
		t.Fatalf("want 3 ping results\n%s", r)
	}
	for i, want := range []string{"Packet filtered", "Packet filtered", "Administratively prohibited"} {
		b := blocks[i]
		target := strings.SplitN(b, "\n", 2)[0]
		// The ICMP error is the answer; without it ping would just time
		// out after -W2, also with exit 1.
		if !strings.Contains(b, want) || !strings.Contains(b, "+1 error") {
			t.Errorf("ping %s: want an ICMP error %q\n%s", target, want, b)
		}
		if !strings.Contains(b, "exit 1\n") {
			t.Errorf("ping %s: want exit 1\n%s", target, b)
		}
	}
}

func TestAPortNotInTheRuleIsRefused(t *testing.T) {
	requireTools(t, "curl")
	w := newWorld(t)
	r := w.mustRun(0, runOpts{
		flags: []string{"--allow", "allowed.test:443"},
		script: `curl -sS --max-time 10 https://allowed.test/tls
curl -sS --max-time 10 http://allowed.test:8443/ 2>/dev/null; echo "8443: $?"
curl -sS --max-time 10 http://allowed.test/ 2>/dev/null; echo "80: $?"`,
	})
	wantLines(t, r, "web allowed.test /tls", "8443: 7", "80: 7")
	for _, a := range w.Arrivals("web") {
		if a.Local.Port() != 443 {
			t.Errorf("web was reached on a port the rule does not allow: %+v", a)
		}
	}
	d := strings.Join(polDenials(r.stderr), "\n")
	for _, port := range []string{"8443", "80"} {
		if !strings.Contains(d, "tunwall: denied allowed.test:"+port+" tcp: port "+port+" not in rule") {
			t.Errorf("no denial line for allowed.test:%s naming the port:\n%s", port, r.stderr)
		}
	}
	deny := polFlows(t, r.audit, func(f audit.Record) bool { return f.Verdict == audit.VerdictDeny })
	if len(deny) == 0 {
		t.Fatal("no denied flow records")
	}
	for _, f := range deny {
		if f.Host != "allowed.test" || (f.Port != 80 && f.Port != 8443) || f.Dial.IsValid() {
			t.Errorf("unexpected denied flow: %+v", f)
		}
	}
}

func TestAWildcardAllowsSubdomainsButNotTheApexOrALookAlike(t *testing.T) {
	requireTools(t, "curl", "dig")
	w := newWorld(t)
	file := polWritePolicy(t, w.dir, "wild.yaml", `version: 1
phases:
  exec:
    allow:
      - host: "*.cdn.allowed.test"
        ports: [80]
`)
	r := w.mustRun(0, runOpts{
		flags: []string{"--policy", file},
		script: polStatus + `curl -sS --max-time 10 http://a.cdn.allowed.test/w
curl -sS --max-time 10 http://deep.a.cdn.allowed.test/w
curl -sS --max-time 10 http://cdn.allowed.test/w 2>/dev/null; echo "apex: $?"
curl -sS --max-time 10 http://evilallowed.test/w 2>/dev/null; echo "look-alike: $?"
echo "apex $(st cdn.allowed.test)"
echo "look-alike $(st evilallowed.test)"
echo "sibling $(st allowed.test)"`,
	})
	wantLines(t, r,
		"web a.cdn.allowed.test /w",
		"web deep.a.cdn.allowed.test /w",
		"apex: 6",
		"look-alike: 6",
		"apex NXDOMAIN",
		"look-alike NXDOMAIN",
		"sibling NXDOMAIN",
	)
	w.noArrivals("evil")
	polNeverAsked(t, w, "cdn.allowed.test", "evilallowed.test", "allowed.test")
	for _, f := range polFlows(t, r.audit, func(audit.Record) bool { return true }) {
		if f.Verdict != audit.VerdictAllow || !strings.Contains(f.Rule, "*.cdn.allowed.test") {
			t.Errorf("flow not allowed by the wildcard rule: %+v", f)
		}
	}
}

func TestDNSRebindingToForbiddenAddressesIsNeverDialled(t *testing.T) {
	requireTools(t, "curl")
	w := newWorld(t)
	forbidden := []string{"agent-lo", "private", "metadata", "agent-veth"}
	top := t

	t.Run("allowed names that resolve to forbidden addresses are reset", func(t *testing.T) {
		w.t = t
		defer func() { w.t = top }()
		w.ResetArrivals()
		names := []string{"rebind-lo.test", "rebind-private.test", "rebind-metadata.test", "rebind-self.test", "rebind-mapped.test", "rebind-mixed.test"}
		var flags []string
		for _, n := range names {
			flags = append(flags, "--allow", n)
		}
		r := w.mustRun(0, runOpts{
			flags: flags,
			script: `for n in rebind-lo rebind-private rebind-metadata rebind-self rebind-mapped; do
  curl -sS --max-time 10 https://$n.test/ 2>/dev/null; echo "$n: $?"
done
curl -sS --max-time 10 https://rebind-mixed.test/mixed`,
		})
		wantLines(t, r,
			"rebind-lo: 7",
			"rebind-private: 7",
			"rebind-metadata: 7",
			"rebind-self: 7",
			"rebind-mapped: 7",
			"web rebind-mixed.test /mixed",
		)
		w.noArrivals(forbidden...)
		guarded := map[string]bool{}
		for _, f := range polFlows(t, r.audit, func(f audit.Record) bool { return f.Verdict == audit.VerdictDeny }) {
			if f.Rule != "guard" || !strings.Contains(f.Reason, "never dialled") || f.Dial.IsValid() {
				t.Errorf("rebinding denial should be the guard's, undialled: %+v", f)
			}
			guarded[f.Host] = true
		}
		for _, n := range names[:5] {
			if !guarded[n] {
				t.Errorf("no guard denial recorded for %s", n)
			}
		}
		for _, f := range polFlows(t, r.audit, func(f audit.Record) bool { return f.Host == "rebind-mixed.test" }) {
			if f.Verdict != audit.VerdictAllow || f.Dial != netip.AddrPortFrom(testworld.Web4, 443) {
				t.Errorf("rebind-mixed.test should be dialled at its public address only: %+v", f)
			}
		}
	})

	t.Run("an explicit cidr rule unlocks a private address", func(t *testing.T) {
		w.t = t
		defer func() { w.t = top }()
		w.ResetArrivals()
		file := polWritePolicy(t, w.dir, "private.yaml", `version: 1
phases:
  exec:
    allow:
      - host: rebind-private.test
      - cidr: 10.0.0.5/32
        ports: [443]
`)
		r := w.mustRun(0, runOpts{
			flags:  []string{"--policy", file},
			script: `curl -sS --max-time 10 https://rebind-private.test/unlocked`,
		})
		wantLines(t, r, "private rebind-private.test /unlocked")
		if len(w.Arrivals("private")) == 0 {
			t.Error("the private server saw nothing")
		}
		w.noArrivals("agent-lo", "metadata", "agent-veth")
	})

	t.Run("cidr 0.0.0.0/0 does not unlock loopback, private or metadata", func(t *testing.T) {
		w.t = t
		defer func() { w.t = top }()
		w.ResetArrivals()
		file := polWritePolicy(t, w.dir, "everything.yaml", `version: 1
phases:
  exec:
    allow:
      - host: rebind-lo.test
      - host: rebind-private.test
      - host: rebind-metadata.test
      - cidr: 0.0.0.0/0
        ports: [443]
      - cidr: ::/0
        ports: [443]
`)
		r := w.mustRun(0, runOpts{
			flags: []string{"--policy", file},
			script: `for n in rebind-lo rebind-private rebind-metadata; do
  curl -sS --max-time 10 https://$n.test/ 2>/dev/null; echo "$n: $?"
done
curl -sS --max-time 10 https://127.0.0.1/ 2>/dev/null; echo "raw loopback: $?"`,
		})
		wantLines(t, r, "rebind-lo: 7", "rebind-private: 7", "rebind-metadata: 7", "raw loopback: 7")
		w.noArrivals(forbidden...)
		for _, f := range polFlows(t, r.audit, func(audit.Record) bool { return true }) {
			if f.Verdict != audit.VerdictDeny || !strings.Contains(f.Reason, "broader than") {
				t.Errorf("want a guard denial saying the cidr rule is too broad: %+v", f)
			}
		}
	})
}

func TestANameThatDisagreesWithTheConnectedNameIsDenied(t *testing.T) {
	requireTools(t, "curl", "python3")
	w := newWorld(t)
	top := t
	front := `curl -sS --max-time 10 --connect-to other.test:443:allowed.test:443 https://other.test/front 2>/dev/null; echo "sni: $?"`

	for _, c := range []struct {
		name  string
		flags []string
	}{
		{"a TLS SNI for a name that is not allowed", []string{"--allow", "allowed.test"}},
		{"a TLS SNI for another allowed name (fronting)", []string{"--allow", "allowed.test", "--allow", "other.test"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			w.t = t
			defer func() { w.t = top }()
			w.ResetArrivals()
			r := w.mustRun(0, runOpts{flags: c.flags, script: front})
			// Reset after the ClientHello: the TLS handshake fails (35).
			wantLines(t, r, "sni: 35")
			for _, a := range w.Arrivals("") {
				if a.Host == "other.test" {
					t.Errorf("the fronted ClientHello reached a server: %+v", a)
				}
			}
			d := polDenials(r.stderr)
			if len(d) != 1 || !strings.Contains(d[0], "disagrees") || !strings.Contains(d[0], "other.test") {
				t.Errorf("want one denial line saying other.test disagrees, got %q", d)
			}
			deny := polFlows(t, r.audit, func(f audit.Record) bool { return f.Verdict == audit.VerdictDeny })
			if len(deny) != 1 || deny[0].Host != "allowed.test" || !strings.Contains(deny[0].Reason, "disagrees") {
				t.Errorf("want one denied flow for allowed.test saying why: %+v", deny)
			}
		})
	}

	t.Run("an HTTP Host that disagrees gets a 403 naming the reason", func(t *testing.T) {
		w.t = t
		defer func() { w.t = top }()
		r := w.mustRun(0, runOpts{
			flags:  []string{"--allow", "allowed.test:80", "--allow", "other.test:80"},
			script: `curl -sS --max-time 10 -o body -w '%{http_code}\n' -H 'Host: other.test' http://allowed.test/host; cat body`,
		})
		out := lines(r.stdout)
		if len(out) < 2 || out[0] != "403" {
			t.Fatalf("want 403 and a body\n%s", r)
		}
		body := strings.Join(out[1:], "\n")
		if !strings.Contains(body, "disagrees") || !strings.Contains(body, "other.test") || strings.Contains(body, "web ") {
			t.Errorf("the 403 body does not name the reason (or came from web): %q", body)
		}
		if d := polDenials(r.stderr); len(d) != 1 || !strings.Contains(d[0], "disagrees") {
			t.Errorf("want one denial line, got %q", d)
		}
	})

	t.Run("a client that sends nothing at first is judged on the name alone", func(t *testing.T) {
		w.t = t
		defer func() { w.t = top }()
		r := w.mustRun(0, runOpts{
			flags: []string{"--allow", "echo.test:7"},
			script: `python3 - <<'PY'
import socket, time
s = socket.create_connection(("echo.test", 7), timeout=10)
time.sleep(1)
s.sendall(b"late hello\n")
got = b""
while not got.endswith(b"\n"):
    chunk = s.recv(100)
    if not chunk:
        break
    got += chunk
print(got.decode().strip())
PY`,
		})
		wantLines(t, r, "late hello")
		flows := polFlows(t, r.audit, func(audit.Record) bool { return true })
		if len(flows) != 1 || flows[0].Verdict != audit.VerdictAllow || flows[0].HostFrom != audit.HostFromDNS {
			t.Errorf("want one allowed flow judged by its DNS name: %+v", flows)
		}
	})
}

func TestSetupAndExecPhasesAllowDifferentNames(t *testing.T) {
	requireTools(t, "curl")
	w := newWorld(t)
	file := polWritePolicy(t, w.dir, "phases.yaml", `version: 1
phases:
  setup:
    allow:
      - host: allowed.test
        ports: [80]
  exec:
    allow:
      - host: api.allowed.test
        ports: [80]
`)
	script := `curl -sS --max-time 10 http://allowed.test/p 2>/dev/null; echo "allowed.test: $?"
curl -sS --max-time 10 http://api.allowed.test/p 2>/dev/null; echo "api.allowed.test: $?"`
	top := t
	for _, c := range []struct {
		phase string
		want  []string
	}{
		{"setup", []string{"web allowed.test /p", "allowed.test: 0", "api.allowed.test: 6"}},
		{"exec", []string{"allowed.test: 6", "api api.allowed.test /p", "api.allowed.test: 0"}},
	} {
		t.Run("phase "+c.phase, func(t *testing.T) {
			w.t = t
			defer func() { w.t = top }()
			r := w.mustRun(0, runOpts{flags: []string{"--policy", file, "--phase", c.phase}, script: script})
			wantLines(t, r, c.want...)
			recs := records(t, r.audit)
			if len(recs) == 0 {
				t.Fatal("empty audit log")
			}
			for _, rec := range recs {
				if rec.Phase != c.phase {
					t.Errorf("record in phase %q, want %q: %+v", rec.Phase, c.phase, rec)
				}
			}
		})
	}

	t.Run("no phase with a two-phase file is a usage error naming the phases", func(t *testing.T) {
		w.t = t
		defer func() { w.t = top }()
		r := w.run(runOpts{flags: []string{"--policy", file}, script: "echo the command ran"})
		if r.code != polExitUsage {
			t.Errorf("want exit %d (usage)\n%s", polExitUsage, r)
		}
		if strings.Contains(r.stdout, "the command ran") {
			t.Errorf("the command ran without a phase\n%s", r)
		}
		if !strings.Contains(r.stderr, "setup") || !strings.Contains(r.stderr, "exec") || !strings.Contains(r.stderr, "--phase") {
			t.Errorf("the error does not name the phases and --phase:\n%s", r.stderr)
		}
	})
}

// polExitUsage is tunwall's exit status for usage errors (README).
const polExitUsage = 2

// polCLI runs the tunwall binary directly (no world needed).
func polCLI(t *testing.T, args ...string) result {
	t.Helper()
	cmd := exec.Command(tunwallBin, args...)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	r := result{stdout: stdout.String(), stderr: stderr.String()}
	if ee, ok := err.(*exec.ExitError); ok {
		r.code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("tunwall %s: %v", strings.Join(args, " "), err)
	}
	return r
}

func TestPolicyCheckAndExplainOnTheCommandLine(t *testing.T) {
	dir := t.TempDir()
	good := polWritePolicy(t, dir, "good.yaml", `version: 1
phases:
  setup:
    allow:
      - host: allowed.test
  exec:
    allow:
      - host: "*.allowed.test"
        ports: [443, 8443]
      - cidr: 192.0.2.0/24
        ports: [5432]
`)
	bad := polWritePolicy(t, dir, "bad.yaml", `version: 1
phases:
  exec:
    allow:
      - host: allowed.test
        portz: [443]
`)

	t.Run("a good file passes", func(t *testing.T) {
		r := polCLI(t, "policy", "check", good)
		if r.code != 0 || !strings.Contains(r.stdout, good) || !strings.Contains(r.stdout, "ok") ||
			!strings.Contains(r.stdout, "setup") || !strings.Contains(r.stdout, "exec") {
			t.Errorf("want exit 0 and an ok naming both phases\n%s", r)
		}
	})

	t.Run("an unknown key fails with file and line", func(t *testing.T) {
		r := polCLI(t, "policy", "check", bad)
		if r.code != 1 {
			t.Errorf("want exit 1\n%s", r)
		}
		if !strings.Contains(r.stdout+r.stderr, bad+":6:") || !strings.Contains(r.stdout+r.stderr, "portz") {
			t.Errorf("the error does not name %s:6 and the key\n%s", bad, r)
		}
	})

	for _, c := range []struct {
		name     string
		args     []string
		code     int
		patterns []string
	}{
		{"explain an allowed destination", []string{good, "api.allowed.test:8443", "--phase", "exec"}, 0,
			[]string{`^allow api\.allowed\.test:8443/tcp in phase "exec"`, `rule: +\*\.allowed\.test.*good\.yaml:8`}},
		{"explain a name allowed only in the other phase", []string{good, "allowed.test:443", "--phase", "exec"}, 1,
			[]string{`^deny allowed\.test:443/tcp in phase "exec"`, `NXDOMAIN`, `rule: +default-deny`}},
		{"explain a port not in the rule", []string{good, "allowed.test:80", "--phase", "setup"}, 1,
			[]string{`^deny allowed\.test:80/tcp in phase "setup"`, `port 80 not in rule`}},
		{"explain an address allowed by a cidr rule", []string{good, "192.0.2.7:5432", "--phase", "exec"}, 0,
			[]string{`^allow 192\.0\.2\.7:5432/tcp in phase "exec"`, `192\.0\.2\.0/24`}},
		{"explain a guarded address", []string{good, "169.254.169.254:5432", "--phase", "exec"}, 1,
			[]string{`^deny 169\.254\.169\.254:5432/tcp`, `cloud metadata`}},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := polCLI(t, append([]string{"policy", "explain"}, c.args...)...)
			if r.code != c.code {
				t.Errorf("want exit %d\n%s", c.code, r)
			}
			for _, p := range c.patterns {
				if !regexp.MustCompile(`(?m)` + p).MatchString(r.stdout) {
					t.Errorf("stdout does not match %q\n%s", p, r)
				}
			}
		})
	}

	t.Run("explain without a phase on a two-phase file names the phases", func(t *testing.T) {
		r := polCLI(t, "policy", "explain", good, "allowed.test")
		if r.code != polExitUsage || !strings.Contains(r.stderr, "setup, exec") {
			t.Errorf("want a usage error naming the phases\n%s", r)
		}
	})
}

func TestEachDenialIsOneImmediateLineOnStderr(t *testing.T) {
	requireTools(t, "curl", "dig", "python3")
	w := newWorld(t)
	r := w.mustRun(0, runOpts{
		flags: []string{"--allow", "allowed.test:443"},
		script: polStatus + `curl -sS --max-time 10 http://192.0.2.66/ 2>/dev/null; echo "raw ip: $?"
curl -sS -4 --max-time 10 http://allowed.test:8443/ 2>/dev/null; echo "port: $?"
echo "dns: $(st -t A denied.test)"
python3 - <<'PY'
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(10)
s.connect(("192.0.2.66", 7))
s.send(b"once")
try:
    s.recv(100)
    print("udp: answered")
except ConnectionRefusedError:
    print("udp: refused")
except socket.timeout:
    print("udp: timed out")
PY`,
	})
	// RST (curl 7), NXDOMAIN and ICMP unreachable: each answer is the
	// denial itself, so none of these waited for a timeout.
	wantLines(t, r, "raw ip: 7", "port: 7", "dns: NXDOMAIN", "udp: refused")
	d := polDenials(r.stderr)
	want := []string{
		"tunwall: denied 192.0.2.66:80 tcp: ",
		"tunwall: denied allowed.test:8443 tcp: ",
		"tunwall: denied DNS A denied.test: ",
		"tunwall: denied 192.0.2.66:7 udp: ",
	}
	if len(d) != len(want) {
		t.Errorf("want %d denial lines, got %d:\n%s", len(want), len(d), strings.Join(d, "\n"))
	}
	for _, prefix := range want {
		n := 0
		for _, l := range d {
			if strings.HasPrefix(l, prefix) {
				n++
				if len(l) <= len(prefix) {
					t.Errorf("denial line gives no reason: %q", l)
				}
			}
		}
		if n != 1 {
			t.Errorf("denial %q printed %d times, want once:\n%s", prefix, n, r.stderr)
		}
	}
	var flows, dns int
	for _, rec := range records(t, r.audit) {
		if rec.Verdict != audit.VerdictDeny {
			continue
		}
		if rec.Kind == audit.KindFlow {
			flows++
		} else {
			dns++
		}
	}
	if flows != 3 || dns != 1 {
		t.Errorf("audit has %d denied flows and %d denied queries, want 3 and 1", flows, dns)
	}
	w.noArrivals("evil")
	polNeverAsked(t, w, "denied.test")

	top := t
	t.Run("--quiet prints none", func(t *testing.T) {
		w.t = t
		defer func() { w.t = top }()
		r := w.mustRun(0, runOpts{
			flags:  []string{"--allow", "allowed.test:443", "--quiet"},
			script: `curl -sS --max-time 10 http://192.0.2.66/ 2>/dev/null; echo "raw ip: $?"`,
		})
		wantLines(t, r, "raw ip: 7")
		if d := polDenials(r.stderr); len(d) != 0 {
			t.Errorf("--quiet printed denials: %q", d)
		}
	})
}
