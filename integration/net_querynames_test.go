package integration

import (
	"net/netip"
	"os"
	"strings"
	"testing"

	"github.com/tunwall/tunwall/internal/testworld"
)

// Service-discovery queries (gRPC's _grpc_config TXT, SRV's _http._tcp,
// mongodb+srv's _mongodb._tcp) have underscore labels: they are real DNS
// names, not host names, and the policy decides them as it decides any
// query. A wildcard rule covers them; an exact rule of the host does not
// (the sandbox would choose the label sent to that host's name servers),
// and the denial says no rule allows it, never that the name is invalid.
// Learn mode and enforce agree on each.
func TestUnderscoreQueryNamesReachThePolicy(t *testing.T) {
	requireTools(t, "dig")
	// The world's resolver knows the discovery names under allowed.test.
	w := newWorld(t, testworld.Options{Names: map[string][]netip.Addr{
		"_grpc_config.www.allowed.test": {testworld.Web4},
		"_http._tcp.www.allowed.test":   {testworld.Web4},
		"_mongodb._tcp.db.allowed.test": {testworld.Web4},
		"_grpc_config.exact.test":       {testworld.Web4},
	}})
	script := `d() { dig +tries=1 +time=5 @198.18.0.1 "$@"; }
st() { d "$@" | sed -n 's/.*status: \([A-Z]*\),.*/\1/p'; }
echo "grpc $(d +short -t TXT _grpc_config.www.allowed.test)"
echo "srv $(st -t SRV _http._tcp.www.allowed.test)"
echo "mongo $(st -t SRV _mongodb._tcp.db.allowed.test)"
echo "exact $(st -t TXT _grpc_config.exact.test)"
`
	r := w.mustRun(0, runOpts{flags: []string{"--allow", "*.allowed.test", "--allow", "exact.test"}, script: script})
	got := map[string]string{}
	for l := range strings.SplitSeq(r.stdout, "\n") {
		k, v, _ := strings.Cut(l, " ")
		got[k] = v
	}
	if !strings.Contains(got["grpc"], "world says hello to _grpc_config.www.allowed.test") {
		t.Errorf("TXT _grpc_config.www.allowed.test under *.allowed.test: got %q, want the world's answer\n%s", got["grpc"], r)
	}
	for _, k := range []string{"srv", "mongo"} {
		if got[k] != "NOERROR" {
			t.Errorf("%s under *.allowed.test: status %q, want NOERROR\n%s", k, got[k], r)
		}
	}
	if got["exact"] != "NXDOMAIN" {
		t.Errorf("TXT _grpc_config.exact.test under exact.test only: status %q, want NXDOMAIN\n%s", got["exact"], r)
	}
	if strings.Contains(r.stderr, "invalid host name") {
		t.Errorf("an underscore query name was called invalid instead of reaching the policy:\n%s", r.stderr)
	}
	if !strings.Contains(r.stderr, "tunwall: denied DNS TXT _grpc_config.exact.test: no rule allows it") {
		t.Errorf("want the denial of _grpc_config.exact.test to say no rule allows it:\n%s", r.stderr)
	}
	if strings.Contains(r.stderr, "allowed.test: ") && strings.Contains(r.stderr, "denied DNS") && strings.Contains(r.stderr, "www.allowed.test") {
		t.Errorf("a query under *.allowed.test was denied:\n%s", r.stderr)
	}

	// Learn mode records, for the same queries, what enforce did.
	l := w.mustRun(0, runOpts{flags: []string{"--learn", "--allow", "*.allowed.test", "--allow", "exact.test"}, script: script})
	if strings.Contains(l.stderr, "invalid host name") || strings.Contains(readFile(t, l.audit), "invalid host name") {
		t.Errorf("learn mode called an underscore query name invalid:\n%s", l.stderr)
	}
	if !strings.Contains(readFile(t, l.audit), "enforce would deny: no rule allows it") {
		t.Errorf("learn mode's record of _grpc_config.exact.test does not say enforce would deny it:\n%s", readFile(t, l.audit))
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
