package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
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
		// 1024 handshake slots, fewer than the connects: without a
		// per-destination limit the blackholed host takes them all.
		flags: append([]string{"--allow", "blackhole.test:80", "--allow", "echo.test:7", "--max-tcp-handshakes", "1024"},
			strings.Fields(os.Getenv("DIALTEST_FLAGS"))...),
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
	// A flood of refusals at the stack's limits is recorded one by one up
	// to a queue of records waiting to be written, and counted beyond it
	// (engine.refusedQueue); tunwall says how many at exit.
	unrecorded := 0
	for _, l := range lines(r.stderr) {
		if strings.Contains(l, "limits reached") || strings.Contains(l, "stack stats") || strings.Contains(l, "reset ") || strings.Contains(l, "not recorded one by one") {
			t.Logf("tunwall: %s", l)
		}
		if i := strings.Index(l, " refused flows were counted but not recorded one by one"); i > 0 {
			f := strings.Fields(l[:i])
			unrecorded, _ = strconv.Atoi(f[len(f)-1])
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
	var limitRecs, limitCount, stackCount int
	for _, rec := range records(t, r.audit) {
		if rec.Kind == audit.KindFlow && rec.Rule == "limit" {
			// (The stack's own handshake limit, which a burst of SYNs
			// may touch before the engine has refused the ones before.)
			stackCount += max(rec.Count, 1)
		}
		if rec.Kind != audit.KindFlow || rec.Rule != "dial-limit" {
			continue
		}
		limitRecs++
		limitCount += max(rec.Count, 1)
		if !strings.Contains(rec.Host, "blackhole.test") {
			t.Errorf("dial-limit record for %q, want only blackhole.test: %+v", rec.Host, rec)
		}
	}
	t.Logf("dial-limit records: %d, standing for %d refused SYNs; %d refused at the stack's handshake limit; %d counted, not recorded one by one", limitRecs, limitCount, stackCount, unrecorded)
	if limitCount+stackCount+unrecorded < fig.Refused {
		t.Errorf("dial-limit records stand for %d refusals (and the stack's limit records %d, %d more counted), the client saw %d", limitCount, stackCount, unrecorded, fig.Refused)
	}
	// (How many of the burst's SYNs the stack's own handshake limit
	// resets before the engine refuses them depends on how fast they
	// arrive; the per-destination limit must have refused some.)
	if limitCount == 0 {
		t.Errorf("none of %d refusals was the per-destination limit's", fig.Refused)
	}
	if limitRecs > 20 {
		t.Errorf("%d dial-limit records for %d refusals: want a summary per window, not one per SYN", limitRecs, limitCount)
	}
}

// synBurstPy sends raw TCP SYNs from the sandbox's own address, which
// its kernel answers with RSTs when tunwall's SYN-ACKs come (no socket
// has them): every SYN tunwall turns into a dial makes one real
// connection to the server and nothing else.
//
//	burst DST_NAME PORT N        N SYNs, distinct source ports
//	nohandshake DST_NAME PORT SPORT  one SYN whose SYN-ACK the sandbox drops
const synBurstPy = `
import random, socket, struct, subprocess, sys, time

def csum(b):
    if len(b) % 2:
        b += b"\0"
    s = sum(struct.unpack("!%dH" % (len(b) // 2), b))
    while s >> 16:
        s = (s & 0xffff) + (s >> 16)
    return ~s & 0xffff

def syn4(src, dst, sport, dport, seq):
    ph = socket.inet_aton(src) + socket.inet_aton(dst) + struct.pack("!BBH", 0, 6, 20)
    t = struct.pack("!HHIIBBHHH", sport, dport, seq, 0, 5 << 4, 0x02, 65535, 0, 0)
    t = t[:16] + struct.pack("!H", csum(ph + t)) + t[18:]
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 40, 0, 0, 64, 6, 0, socket.inet_aton(src), socket.inet_aton(dst))
    return ip[:10] + struct.pack("!H", csum(ip)) + ip[12:] + t

mode, name, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
dst = socket.getaddrinfo(name, 0, socket.AF_INET, socket.SOCK_STREAM)[0][4][0]
r = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
t0 = time.monotonic()
if mode == "burst":
    n = int(sys.argv[4])
    for i in range(n):
        r.sendto(syn4("198.18.0.2", dst, 10000 + i, port, random.getrandbits(32)), (dst, 0))
        if i % 100 == 99:
            time.sleep(0.002) # (a TUN queue drops what its reader has not read yet)
elif mode == "nohandshake":
    # The sandbox's kernel would answer tunwall's SYN-ACK with an RST (no
    # socket has it); drop it instead, as a sandbox that is gone would.
    # (The local table's rule comes first, so it moves behind ours.)
    for rule in (["pref", "100", "iif", "tun0", "from", dst, "ipproto", "tcp", "sport", str(port), "blackhole"],
                 ["pref", "101", "lookup", "local"]):
        subprocess.run(["ip", "rule", "add"] + rule, check=True)
    subprocess.run(["ip", "rule", "del", "pref", "0"], check=True)
    r.sendto(syn4("198.18.0.2", dst, int(sys.argv[4]), port, random.getrandbits(32)), (dst, 0))
print("sent in %.3f s" % (time.monotonic() - t0))
`

// countAccepts serves TCP on addr in the world and counts the connections
// it accepts (closing each at once).
func countAccepts(t *testing.T, w *world, addr string) *atomic.Int64 {
	t.Helper()
	l, err := w.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	var n atomic.Int64
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			n.Add(1)
			c.Close()
		}
	}()
	return &n
}

// TestLoadDialSYNBurstIsNotAnAmplifier: 50,000 raw SYNs with distinct
// source ports to one allowed destination make at most --dial-rate real
// connections a second (after a burst of as many), not one each; the
// refusals are recorded in a few summary records.
func TestLoadDialSYNBurstIsNotAnAmplifier(t *testing.T) {
	requireTools(t, "python3")
	w := newWorld(t)
	accepts := countAccepts(t, w, "192.0.2.20:8080")
	py := w.dir + "/syn.py"
	if err := os.WriteFile(py, []byte(synBurstPy), 0o644); err != nil {
		t.Fatal(err)
	}
	const n, rate = 50000, 100
	start := time.Now()
	r := w.run(runOpts{
		flags:   []string{"--allow", "echo.test:8080", "--dial-rate", fmt.Sprint(rate)},
		script:  "exec python3 " + py + " burst echo.test 8080 " + fmt.Sprint(n),
		timeout: 3 * time.Minute,
	})
	elapsed := time.Since(start)
	if r.code != 0 {
		t.Fatalf("client failed\n%s", r)
	}
	got := accepts.Load()
	// Dials admitted while tunwall ran: the burst, then the rate.
	bound := int64(rate + rate*elapsed.Seconds() + 10)
	t.Logf("%d raw SYNs (%s) in a run of %v: the server saw %d connections (bound %d = %d/s after a burst of %d)",
		n, strings.Join(lines(r.stdout), " "), elapsed.Round(time.Millisecond), got, bound, rate, rate)
	for _, l := range lines(r.stderr) {
		if strings.Contains(l, "limits reached") {
			t.Logf("tunwall: %s", l)
		}
	}
	if got == 0 {
		t.Fatalf("the server saw no connection at all: the burst did not reach tunwall\n%s", r)
	}
	if got > bound {
		t.Errorf("%d raw SYNs made %d real connections in %v, want at most %d (--dial-rate %d)", n, got, elapsed, bound, rate)
	}
	var limitRecs, limitCount int
	for _, rec := range records(t, r.audit) {
		if rec.Kind == audit.KindFlow && rec.Rule == "dial-limit" {
			limitRecs++
			limitCount += max(rec.Count, 1)
		}
	}
	t.Logf("dial-limit records: %d, standing for %d refused SYNs", limitRecs, limitCount)
	if limitCount == 0 {
		t.Errorf("no refusal recorded")
	}
	if maxRecs := int(elapsed/RefusalWindowForTest) + 2; limitRecs > maxRecs*2 {
		t.Errorf("%d dial-limit records in %v: want one per destination and window (%v), not one per SYN", limitRecs, elapsed, RefusalWindowForTest)
	}
}

// RefusalWindowForTest is engine.RefusalWindow (the integration tests
// build the binary, not the package).
const RefusalWindowForTest = 5 * time.Second

// giveUpClient connects to blackhole4.test:80 (one address) and gives up after 4 s (its
// kernel retransmits the SYN meanwhile), then stays 6 s more so that
// tunwall does not end the dial by shutting down.
const giveUpClient = `
import socket, time
t0 = time.monotonic()
addr = socket.getaddrinfo('blackhole4.test', 80, socket.AF_INET, socket.SOCK_STREAM)[0][4]
s = socket.socket()
s.settimeout(4)
try:
    s.connect(addr)
    print('connected?!')
except OSError as e:
    print('gave up after %.1f s: %s' % (time.monotonic() - t0, e))
s.close()
time.sleep(6)
`

// TestLoadDialPendingDialEndsWhenTheClientGivesUp: a client whose connect
// hangs (a blackholed allowed host) retransmits its SYN, which is folded
// into the one dial in progress, and gives up; the dial (the upstream
// socket) ends within about a second of that, not at the dial timeout.
func TestLoadDialPendingDialEndsWhenTheClientGivesUp(t *testing.T) {
	requireTools(t, "python3")
	w := newWorld(t)
	r := w.run(runOpts{
		flags:   []string{"--allow", "blackhole4.test:80"},
		script:  `exec python3 -c "$CLIENT"`,
		env:     []string{"CLIENT=" + giveUpClient},
		timeout: time.Minute,
	})
	if r.code != 0 || !strings.HasPrefix(r.stdout, "gave up after 4") {
		t.Fatalf("client\n%s", r)
	}
	var flows []audit.Record
	for _, rec := range records(t, r.audit) {
		if rec.Kind == audit.KindFlow && rec.Host == "blackhole4.test" {
			flows = append(flows, rec)
		}
	}
	if len(flows) != 1 {
		t.Fatalf("%d flow records for one connect and its retransmitted SYNs, want 1 (folded into one dial): %+v", len(flows), flows)
	}
	f := flows[0]
	t.Logf("the dial ended after %.0f ms: %s (dial_failed %s)", f.DurationMS, f.Reason, f.DialFailed)
	// 4 s of the client, a check a second, and a margin; the dial timeout
	// is 10 s, and tunwall shuts down after 10 s.
	if f.DurationMS > 6500 {
		t.Errorf("the dial lasted %.0f ms, want it ended within about a second of the client giving up at 4 s", f.DurationMS)
	}
	if !strings.Contains(f.Reason, "gave up") {
		t.Errorf("reason %q does not say the client gave up", f.Reason)
	}
}

// TestLoadDialUpstreamClosedWhenTheHandshakeNeverCompletes: tunwall dials
// first, then answers the sandbox's SYN; when the sandbox never completes
// that handshake (its side is gone), the upstream connection must be
// closed within seconds, not held for the two minutes gVisor retransmits
// its SYN-ACK.
func TestLoadDialUpstreamClosedWhenTheHandshakeNeverCompletes(t *testing.T) {
	requireTools(t, "python3", "ip")
	w := newWorld(t)
	l, err := w.Listen("tcp", "192.0.2.20:8082")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	type conn struct{ opened, closed time.Time }
	conns := make(chan conn, 4)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				cn := conn{opened: time.Now()}
				c.SetReadDeadline(time.Now().Add(3 * time.Minute))
				c.Read(make([]byte, 1)) // EOF or RST when tunwall closes it
				cn.closed = time.Now()
				c.Close()
				conns <- cn
			}()
		}
	}()
	py := w.dir + "/syn.py"
	if err := os.WriteFile(py, []byte(synBurstPy), 0o644); err != nil {
		t.Fatal(err)
	}
	// A namespace served by tunwall attach, where the test is root and
	// can make the sandbox's kernel drop tunwall's SYN-ACK.
	ns := w.netns("twhs")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, _, log := w.startBackground(ctx, "attach", runOpts{
		flags: []string{"--netns", "/run/netns/" + ns, "--allow", "echo.test:8082"},
	}, "serving the namespace")
	if out, err := exec.CommandContext(ctx, "ip", "netns", "exec", ns, "python3", py, "nohandshake", "echo.test", "8082", "40000").CombinedOutput(); err != nil {
		t.Fatalf("raw SYN: %v: %s", err, out)
	}
	const bound = 8 * time.Second // handshakeWait (5s) and a margin
	select {
	case cn := <-conns:
		held := cn.closed.Sub(cn.opened)
		t.Logf("the upstream connection was held %v while the sandbox never completed its handshake", held.Round(time.Millisecond))
		if held > bound {
			t.Errorf("held %v, want at most %v", held, bound)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("the upstream connection was still open 20 s after the sandbox's side was gone (want closed within %v)\n%s", bound, log)
	}
}
