package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// hdnsChurnPy opens N DNS-over-TCP connections in about SECS seconds and
// holds each, silent, until the end; tunwall keeps at most --dns-max-tcp
// of them, closing the idle longest to make room. Then it asks for the
// measurement of tunwall's peak memory, and waits for it.
const hdnsChurnPy = `
import errno, os, select, socket, sys, time, resource
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
n, secs = int(sys.argv[1]), float(sys.argv[2])
socks, t0 = [], time.time()
for i in range(n):
    d = t0 + i * secs / n - time.time()
    if d > 0:
        time.sleep(d)
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setblocking(False)
    s.connect_ex(('198.18.0.1', 53))
    socks.append(s)
print("churn: %d connects in %.2fs" % (n, time.time() - t0), flush=True)
time.sleep(1)
# How each connection tunwall ended was ended: reset, or closed (FIN).
reset = fin = alive = 0
for s in socks:
    try:
        b = s.recv(1)
        if b == b"":
            fin += 1
        else:
            alive += 1
    except ConnectionResetError:
        reset += 1
    except (BlockingIOError, ConnectionRefusedError, OSError) as e:
        if getattr(e, "errno", 0) in (errno.EAGAIN, errno.EWOULDBLOCK):
            alive += 1
        else:
            reset += 1
print("ended: reset %d fin %d alive %d" % (reset, fin, alive), flush=True)
d = os.environ['HDNS_DIR']
open(os.path.join(d, 'measure'), 'w').close()
for _ in range(100):
    if os.path.exists(os.path.join(d, 'measured')):
        break
    time.sleep(0.1)
`

// TestARefusedOrEvictedDNSConnectCostsAlmostNothing: a sandbox opening
// DNS-over-TCP connections far faster than the cap lets live (3,000 in
// 1.5 s, 128 may live) makes tunwall close the idle longest for each new
// one. A connection tunwall ends to make room is reset, not closed: it
// leaves no endpoint lingering in the stack (FIN-WAIT, TIME-WAIT), so the
// flood costs a few KiB a connect at most. TUNWALL_DNSCHURN_N sets the
// count (default 3000).
func TestARefusedOrEvictedDNSConnectCostsAlmostNothing(t *testing.T) {
	requireTools(t, "python3")
	w := newWorld(t)
	py := filepath.Join(w.dir, "hdns_churn.py")
	if err := os.WriteFile(py, []byte(hdnsChurnPy), 0o644); err != nil {
		t.Fatal(err)
	}
	n := "3000"
	if v := os.Getenv("TUNWALL_DNSCHURN_N"); v != "" {
		n = v
	}
	r, hwm := hdnsRunMeasured(w, runOpts{flags: []string{"--allow", "allowed.test", "--dns-max-tcp", "128"},
		script: "python3 " + py + " " + n + " 1.5", timeout: 120 * time.Second})
	if !strings.Contains(r.stdout, "churn: "+n+" connects") || !strings.Contains(r.stdout, "ended:") || hwm < 0 {
		t.Fatalf("the churn did not run\n%s", r)
	}
	_, idle := hdnsRunMeasured(w, runOpts{flags: []string{"--allow", "allowed.test", "--dns-max-tcp", "128"},
		script: "python3 " + py + " 1 1.5", timeout: 120 * time.Second})
	count, _ := strconv.Atoi(n)
	perConnect := float64(hwm-idle) / float64(count) / 1024
	t.Logf("tunwall's peak RSS: %.1f MiB after %s DNS-over-TCP connects (one connect: %.1f MiB): %.1f KiB a connect", float64(hwm)/(1<<20), n, float64(idle)/(1<<20), perConnect)
	// Closed, not reset: 7.8-7.9 KiB a connect (41.3-41.6 MiB peak);
	// reset: 3.5 (28.6-28.8 MiB), on this project's 2-core VM, quiet. The
	// peak depends on when the GC runs (11 KiB under a loaded CI run), so
	// the test asserts what makes it cheap: every connection tunwall ended
	// to make room was reset, none closed, and none lingers.
	var reset, fin, alive int
	if _, err := fmt.Sscanf(r.stdout[strings.Index(r.stdout, "ended:"):], "ended: reset %d fin %d alive %d", &reset, &fin, &alive); err != nil {
		t.Fatalf("no result: %v\n%s", err, r)
	}
	t.Logf("the connections tunwall ended: %d reset, %d closed; %d still open", reset, fin, alive)
	if fin > 0 || reset < count-2*128 {
		t.Errorf("of %d DNS-over-TCP connects past --dns-max-tcp 128, %d were reset and %d closed (FIN): want every one ended to make room reset", count, reset, fin)
	}
	if perConnect > 16 {
		t.Errorf("%.1f KiB of peak RSS a refused or evicted DNS-over-TCP connect, want at most 16", perConnect)
	}
}
