package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/tunwall/tunwall/internal/audit"
)

// The upstream dial under load (issue "Hold under load", items 3 and 4):
// one dead destination must not stall the others, and the sandbox's SYNs
// must not become an unbounded number of real connections.

// dialStallClient opens BH_N non-blocking connects to a blackholed
// allowed host and, while they hang, times OK_N sequential connects (each
// with a byte echoed) to a healthy one. It prints one JSON object.
const dialStallClient = `
import errno, json, os, resource, select, socket, time
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 20000), hard))
bh = socket.getaddrinfo('blackhole.test', 80, socket.AF_INET, socket.SOCK_STREAM)[0][4]
ok = socket.getaddrinfo('echo.test', 7, socket.AF_INET, socket.SOCK_STREAM)[0][4]
n, m = int(os.environ['BH_N']), int(os.environ['OK_N'])
held = []
for i in range(n):
    s = socket.socket()
    s.setblocking(False)
    try:
        s.connect(bh)
    except BlockingIOError:
        pass
    held.append(s)
# Let the burst settle (bounded): the connects tunwall refuses fail at
# once, the rest hang. The healthy connects are timed after that.
p = select.poll()
fds = {}
for s in held:
    p.register(s, select.POLLOUT)
    fds[s.fileno()] = s
settled, t0 = 0, time.monotonic()
while settled < n - int(os.environ['BH_HOLD']) and time.monotonic() - t0 < float(os.environ['SETTLE_S']):
    for fd, ev in p.poll(100):
        p.unregister(fd)
        settled += 1
settle_ms = (time.monotonic() - t0) * 1000
lat, failed = [], 0
for i in range(m):
    t = time.monotonic()
    try:
        c = socket.create_connection(ok, timeout=20)
        c.sendall(b'x')
        if c.recv(1) != b'x':
            failed += 1
        c.close()
    except OSError:
        failed += 1
    lat.append((time.monotonic() - t) * 1000)
refused = pending = 0
for s in held:
    e = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
    if e == errno.ECONNREFUSED:
        refused += 1
    elif e == 0:
        pending += 1
    s.close()
first = [round(x, 1) for x in lat[:5]]
lat.sort()
print(json.dumps({'first': first, 'settled': settled, 'settle_ms': settle_ms, 'p50': lat[len(lat)//2], 'p99': lat[min(len(lat)-1, (len(lat)*99)//100)], 'max': lat[-1],
                  'failed': failed, 'refused': refused, 'pending': pending}))
`

type dialStallFigures struct {
	First                    []float64
	Settled                  int
	SettleMS                 float64 `json:"settle_ms"`
	P50, P99, Max            float64
	Failed, Refused, Pending int
}

// TestLoadDialBlackholeDoesNotStallOthers: 3,000 connects to one
// blackholed allowed host, then connects to a healthy one must still take
// milliseconds. The connects beyond the per-destination limit are refused
// at once (RST) and recorded in a few summary records, not one each.
func TestLoadDialBlackholeDoesNotStallOthers(t *testing.T) {
	requireTools(t, "python3")
	w := newWorld(t)
	const bhN, okN = 3000, 50
	r := w.run(runOpts{
		flags:  append([]string{"--allow", "blackhole.test:80", "--allow", "echo.test:7"}, strings.Fields(os.Getenv("DIALTEST_FLAGS"))...),
		script: `exec python3 -c "$CLIENT"`,
		env: []string{"CLIENT=" + dialStallClient, fmt.Sprintf("BH_N=%d", bhN), fmt.Sprintf("OK_N=%d", okN),
			"BH_HOLD=256", "SETTLE_S=5"},
		timeout: 180 * time.Second,
	})
	if r.code != 0 {
		t.Fatalf("client failed\n%s", r)
	}
	var fig dialStallFigures
	out := lines(r.stdout)
	if len(out) == 0 || json.Unmarshal([]byte(out[len(out)-1]), &fig) != nil {
		t.Fatalf("no figures\n%s", r)
	}
	for _, l := range lines(r.stderr) {
		if strings.Contains(l, "limits reached") || strings.Contains(l, "stack stats") {
			t.Logf("tunwall: %s", l)
		}
	}
	t.Logf("blackhole connects settled (refused at once) before timing: %d in %.0f ms", fig.Settled, fig.SettleMS)
	t.Logf("first healthy connects (ms): %v", fig.First)
	t.Logf("healthy connects while %d hang on a blackhole: p50 %.1f ms, p99 %.1f ms, max %.1f ms, failed %d; blackhole connects refused %d, still pending %d",
		bhN, fig.P50, fig.P99, fig.Max, fig.Failed, fig.Refused, fig.Pending)
	if fig.Failed > 0 {
		t.Errorf("%d of %d connects to the healthy host failed", fig.Failed, okN)
	}
	if fig.P99 > 250 {
		t.Errorf("connect p99 to the healthy host = %.1f ms while one destination is blackholed, want milliseconds (< 250 ms)", fig.P99)
	}
	if fig.Refused == 0 {
		t.Errorf("no connect to the blackholed host was refused: the per-destination pending-dial limit did not apply")
	}
	// The refusals are summarised: a record with a count per window, not
	// one record per SYN.
	var limitRecs, limitCount int
	for _, rec := range records(t, r.audit) {
		if rec.Kind != audit.KindFlow || rec.Rule != "dial-limit" {
			continue
		}
		limitRecs++
		limitCount += max(rec.Count, 1)
		if !strings.Contains(rec.Host, "blackhole.test") {
			t.Errorf("dial-limit record for %q, want only blackhole.test: %+v", rec.Host, rec)
		}
	}
	t.Logf("dial-limit records: %d, standing for %d refused SYNs", limitRecs, limitCount)
	if limitCount < fig.Refused {
		t.Errorf("dial-limit records stand for %d refusals, the client saw %d", limitCount, fig.Refused)
	}
	if limitRecs > 20 {
		t.Errorf("%d dial-limit records for %d refusals: want a summary per window, not one per SYN", limitRecs, limitCount)
	}
}
