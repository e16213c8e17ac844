package integration

// The sandbox's network resolves names as the host's does (issue 10, items
// 2 and 3): the host's search list and options carry over, every
// nameserver is used with failover, the hosts file is read first, and a
// client's pinned address (curl --resolve, or an address from the hosts
// file) is dialled when it is one of the name's real addresses.
//
// The host's /etc/resolv.conf and /etc/hosts are given to tunwall the way
// iproute2 does for a named network namespace: `ip netns exec NS` (which
// starts tunwall in the agent namespace) binds /etc/netns/NS/FILE over
// /etc/FILE. So tunwall reads its real default paths and the machine's own
// files are never touched.

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tunwall/tunwall/internal/audit"
	"github.com/tunwall/tunwall/internal/testworld"
)

// agentEtc makes name (resolv.conf, hosts) read as content by every command
// started in the agent namespace, tunwall and its sandbox included.
func (w *world) agentEtc(name, content string) {
	w.t.Helper()
	dir := filepath.Join("/etc/netns", w.AgentNS)
	if _, err := os.Stat("/etc/netns"); errors.Is(err, os.ErrNotExist) {
		// Made here: removed again when empty (after dir, cleanups run
		// last-in first-out).
		w.t.Cleanup(func() { os.Remove("/etc/netns") })
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		w.t.Fatal(err)
	}
	w.t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
		w.t.Fatal(err)
	}
}

// hostResolv lets tunwall read the host's resolv.conf, its default (the
// harness gives it /dev/null and --dns-upstream otherwise).
var hostResolv = "--resolv-conf=/etc/resolv.conf"

// `curl http://intra/` with `search corp.test` on the host: the client
// applies the search list and asks for intra.corp.test, which the policy
// allows; curl, getent and Python's getaddrinfo all reach it, and the
// request (Host: intra) is not taken for domain fronting.
func TestResolverSearchDomainCarriesOver(t *testing.T) {
	requireTools(t, "curl", "getent", "python3", "bwrap")
	w := newWorld(t, testworld.Options{Names: map[string][]netip.Addr{
		"intra.corp.test": {testworld.Web4},
	}})
	w.agentEtc("resolv.conf", "# the host's\nsearch corp.test\noptions ndots:1 attempts:3 timeout:2 rotate\nnameserver 192.0.2.53\n")
	script := `grep -E '^(search|options)' /etc/resolv.conf
curl -sS --max-time 10 http://intra/
getent hosts intra | awk '{print $2}'
python3 -c "import urllib.request; print(urllib.request.urlopen('http://intra/py', timeout=10).read().decode().strip())"
`
	for _, c := range []struct {
		name   string
		asUser int
		bwrap  []string
	}{
		{"run", 0, nil},
		{"run/rootless", 65534, nil},
		{"bwrap", 0, bwrapBase},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := w.run(runOpts{
				flags:  []string{hostResolv, "--allow", "intra.corp.test:80"},
				script: script, asUser: c.asUser, bwrap: c.bwrap,
			})
			wantLines(t, r,
				"search corp.test",
				"options ndots:1 attempts:3 timeout:2 edns0 trust-ad",
				"web intra /",
				"intra.corp.test",
				"web intra /py",
			)
			if r.code != 0 {
				t.Fatalf("exit %d\n%s", r.code, r)
			}
		})
	}
	if !w.DNS.Asked("intra.corp.test") {
		t.Errorf("tunwall never resolved intra.corp.test upstream")
	}
	for _, q := range w.DNS.Log() {
		if q.Name == "intra" {
			t.Errorf("the bare name %q was sent upstream: the policy decides on the fully qualified name", q.Name)
		}
	}
}

// A dead first nameserver (blackholed: no reply, no ICMP) does not break
// resolution: the next one answers, within a short per-server timeout.
func TestResolverDeadFirstNameserver(t *testing.T) {
	requireTools(t, "curl")
	w := newWorld(t)
	w.agentEtc("resolv.conf", "nameserver 192.0.2.99\nnameserver 192.0.2.53\n")
	r := w.run(runOpts{
		flags: []string{hostResolv, "--allow", "allowed.test:80", "--allow", "www.allowed.test:80"},
		script: `s=$(date +%s%N); curl -sS --max-time 20 -w "%{stderr}lookup %{time_namelookup}s connect %{time_connect}s total %{time_total}s\n" http://allowed.test/; e=$(date +%s%N); echo "first $(( (e-s)/1000000 ))ms" >&2
s=$(date +%s%N); curl -sS --max-time 20 -w "%{stderr}lookup %{time_namelookup}s connect %{time_connect}s total %{time_total}s\n" http://www.allowed.test/; e=$(date +%s%N); echo "second $(( (e-s)/1000000 ))ms" >&2
`,
	})
	wantLines(t, r, "web allowed.test /", "web www.allowed.test /")
	t.Logf("times: %s", strings.Join(lines(r.stderr), "; "))
	if r.elapsed > 15*time.Second {
		t.Errorf("took %v with a dead first nameserver", r.elapsed)
	}
}

// A name only the host's /etc/hosts knows: glibc in the sandbox reads it
// from the same file and connects to its address with the name in the SNI
// or Host; tunwall resolves allowed names through the hosts file first, as
// glibc does, so the connection is not reset. A client that asks tunwall's
// DNS instead gets a fake address, which tunwall dials via the hosts file
// too. The world's DNS is never asked.
func TestResolverHostsFileName(t *testing.T) {
	requireTools(t, "curl", "python3", "dig")
	w := newWorld(t)
	w.agentEtc("hosts", "127.0.0.1 localhost\n::1 localhost\n192.0.2.11 hostsonly.test hostsalias\n")
	r := w.run(runOpts{
		flags: []string{"--allow", "hostsonly.test:80", "--allow", "hostsonly.test:443"},
		script: `curl -sS --max-time 10 http://hostsonly.test/
curl -sS --max-time 10 https://hostsonly.test/tls
python3 -c "import urllib.request; print(urllib.request.urlopen('http://hostsonly.test/py', timeout=10).read().decode().strip())"
fake=$(dig +short +time=5 hostsonly.test A)
case "$fake" in 198.18.*) ;; *) echo "dig gave $fake, not a fake address" ;; esac
curl -sS --max-time 10 --resolve hostsonly.test:80:$fake http://hostsonly.test/dns
`,
	})
	wantLines(t, r, "api hostsonly.test /", "api hostsonly.test /tls", "api hostsonly.test /py", "api hostsonly.test /dns")
	if w.DNS.Asked("hostsonly.test") {
		t.Errorf("the world's DNS was asked about a name the hosts file has")
	}
}

// curl --resolve NAME:PORT:IP pins the address: when IP is one of NAME's
// real addresses, tunwall dials it, not the first address DNS gives. An IP
// that is not one of NAME's addresses is never dialled (the name is).
func TestResolverClientPin(t *testing.T) {
	requireTools(t, "curl", "python3")
	w := newWorld(t, testworld.Options{Names: map[string][]netip.Addr{
		"pin.test": {testworld.Web4, testworld.API4},
	}})
	r := w.run(runOpts{
		flags: []string{"--allow", "pin.test:80", "--allow", "pin.test:443"},
		script: `curl -sS --max-time 10 --resolve pin.test:443:192.0.2.11 https://pin.test/https
curl -sS --max-time 10 --resolve pin.test:80:192.0.2.11 http://pin.test/http
curl -sS --max-time 10 --resolve pin.test:443:192.0.2.10 https://pin.test/web
python3 - <<'EOF'
import socket
s = socket.create_connection(("192.0.2.11", 80), timeout=10)
s.sendall(b"GET /py HTTP/1.0\r\nHost: pin.test\r\n\r\n")
data = b""
while True:
    b = s.recv(4096)
    if not b:
        break
    data += b
print(data.decode().splitlines()[-1])
EOF
curl -sS --max-time 10 --resolve pin.test:80:192.0.2.66 http://pin.test/notmine
`,
	})
	wantLines(t, r, "api pin.test /https", "api pin.test /http", "web pin.test /web", "api pin.test /py", "web pin.test /notmine")
	w.noArrivals("evil")
	// The record names the pinned address as the one dialled.
	pinned := 0
	for _, rec := range records(t, r.audit) {
		if rec.Kind != audit.KindFlow || rec.Dst != netip.MustParseAddrPort("192.0.2.11:443") {
			continue
		}
		pinned++
		if rec.Dial != rec.Dst || !strings.Contains(rec.Reason, "pinned") {
			t.Errorf("flow to %v: dial %v, reason %q; want the pinned address dialled and said so", rec.Dst, rec.Dial, rec.Reason)
		}
	}
	if pinned != 1 {
		t.Errorf("%d flow records to 192.0.2.11:443, want 1", pinned)
	}
}

// The hosts file and a client's pin are only ways to name a name's
// addresses: the rebinding guard still decides whether one is dialled. An
// allowed name the hosts file maps to the metadata service, a private
// address or the agent's loopback is never reached, whether the client
// connects to that address itself (its own hosts file, --resolve) or to
// the fake address tunwall handed out.
func TestResolverHostsFileAndPinsStillPassTheGuard(t *testing.T) {
	requireTools(t, "curl", "dig")
	w := newWorld(t)
	w.agentEtc("hosts", "169.254.169.254 meta.test\n10.0.0.5 priv.test\n127.0.0.1 lo.test\n")
	r := w.run(runOpts{
		flags: []string{"--allow", "meta.test:80", "--allow", "priv.test:80", "--allow", "lo.test:8081"},
		script: `for u in http://meta.test/ http://priv.test/ http://lo.test:8081/; do
  curl -sS --max-time 10 "$u" >/dev/null 2>&1 && echo "reached $u" || echo "blocked $u"
done
for n in meta.test priv.test; do
  fake=$(dig +short +time=5 $n A)
  curl -sS --max-time 10 --resolve $n:80:$fake http://$n/ >/dev/null 2>&1 && echo "reached $n via $fake" || echo "blocked $n via fake"
done
fake=$(dig +short +time=5 lo.test A)
curl -sS --max-time 10 --resolve lo.test:8081:$fake http://lo.test:8081/ >/dev/null 2>&1 && echo "reached lo.test via $fake" || echo "blocked lo.test via fake"
curl -sS --max-time 10 --resolve meta.test:80:169.254.169.254 http://meta.test/ >/dev/null 2>&1 && echo "reached pin" || echo "blocked pin"
`,
	})
	wantLines(t, r, "blocked http://meta.test/", "blocked http://priv.test/", "blocked http://lo.test:8081/",
		"blocked meta.test via fake", "blocked priv.test via fake", "blocked lo.test via fake", "blocked pin")
	w.noArrivals("metadata", "private", "agent-lo")
}
