package integration

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tunwall/tunwall/internal/audit"
	"github.com/tunwall/tunwall/internal/testworld"
)

// Every address of a name gets a fair try (issue "Behave like the network
// users already have", item 1). The sandbox sees one fake address per
// family, so tunwall must do what the client would have done with the
// real ones: Happy Eyeballs (RFC 8305). In the test world:
//   - first-dead.test has two A records, the first blackholed;
//   - v6-dead.test has an AAAA that blackholes and an A that answers,
//     and the client connects over IPv6.
//
// curl and node each time one request; each prints "CLIENT CODE SECONDS".
const eyeballsScript = `
set -u
for name in first-dead.test v6-dead.test; do
  fam=-4; nfam=4
  [ "$name" = v6-dead.test ] && { fam=-6; nfam=6; }
  curl -s $fam -o /dev/null --max-time 15 -w "curl $name %{http_code} %{time_total}\n" http://$name/ || true
  node -e '
const http = require("http"), t0 = Date.now();
const req = http.get({host: process.argv[1], port: 80, path: "/", family: +process.argv[2], timeout: 15000}, r => {
  r.resume(); r.on("end", () => console.log("node " + process.argv[1] + " " + r.statusCode + " " + ((Date.now() - t0) / 1000)));
});
req.on("timeout", () => { console.log("node " + process.argv[1] + " timeout"); req.destroy(); });
req.on("error", e => console.log("node " + process.argv[1] + " failed " + e.code));
' $name $nfam
done
`

func TestDialEveryAddressGetsAFairTry(t *testing.T) {
	requireTools(t, "curl", "node")
	w := newWorld(t)
	r := w.run(runOpts{
		flags:   []string{"--allow", "first-dead.test:80", "--allow", "v6-dead.test:80"},
		script:  eyeballsScript,
		timeout: 2 * time.Minute,
	})
	if r.code != 0 {
		t.Fatalf("client script failed\n%s", r)
	}
	got := map[string]float64{}
	for _, l := range lines(r.stdout) {
		f := strings.Fields(l)
		if len(f) != 4 || f[2] != "200" {
			t.Errorf("%s: want status 200 within the client's timeout", l)
			continue
		}
		secs, err := strconv.ParseFloat(f[3], 64)
		if err != nil {
			t.Errorf("%s: %v", l, err)
			continue
		}
		got[f[0]+" "+f[1]] = secs
		t.Logf("%s: %.3f s", f[0]+" "+f[1], secs)
		if secs >= 2 {
			t.Errorf("%s took %.3f s, want well under 2 s (a blackholed address must not hold up the next)", f[0]+" "+f[1], secs)
		}
	}
	if len(got) != 4 {
		t.Fatalf("want 4 answers (curl and node, two names), got %d\n%s", len(got), r)
	}
	// The records name the address dialled and the attempts that failed.
	want := map[string]string{
		"first-dead.test": testworld.Blackhole4.String() + ":80",
		"v6-dead.test":    "[" + testworld.Blackhole6.String() + "]:80",
	}
	n := 0
	for _, rec := range records(t, r.audit) {
		if rec.Kind != audit.KindFlow || want[rec.Host] == "" {
			continue
		}
		n++
		if rec.Dial.String() != testworld.Web4.String()+":80" {
			t.Errorf("%s: dial %v, want %v:80", rec.Host, rec.Dial, testworld.Web4)
		}
		if s := rec.DialFailed; !strings.Contains(s, want[rec.Host]) {
			t.Errorf("%s: dial_failed %q does not name the blackholed %s", rec.Host, s, want[rec.Host])
		}
	}
	if n != 4 {
		t.Errorf("%d flow records for the two names, want 4", n)
	}
}
