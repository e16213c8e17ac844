package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The load tests of issue "Hold under load": one python3 process in the
// sandbox opens N flows to the world's echo server with a bounded ramp and
// holds them, once with --audit off and once audited (the default), and the
// two runs must look alike: no flow stalls, the TUN drops (almost) nothing,
// connect latency stays close, (almost) every flow is attributed to the
// python process, nothing piles up in tunwall after the burst, and tunwall
// exits promptly when the sandbox does.

const (
	// loadDefaultN flows per burst; TUNWALL_LOAD_N=10000 measures the
	// issue's larger load by hand (it needs RLIMIT_NOFILE above 12000).
	loadDefaultN = 5000
	// loadTail flows are opened after the burst and left open when the
	// client exits: tunwall must still exit within loadShutdown.
	loadTail = 1000
	// After the burst, loadChurn flows at loadChurnRate a second each
	// replace the oldest held one (the steady churn of a busy client).
	loadChurn     = 3000
	loadChurnRate = 1000
	// Bounds the audited run is held to, against the unaudited one.
	loadMaxDropRatio   = 0.01 // of the sandbox's packets, at the TUN
	loadMinAttributed  = 0.99 // flow records with a pid
	loadP99Factor      = 2.0  // connect p99, audited <= 2x unaudited ...
	loadP99SlackMS     = 2.0  // ... + 2ms of scheduling noise on a shared machine
	loadSettle         = 5 * time.Second
	loadShutdown       = 2 * time.Second
	loadGoroutineSlack = 64 // goroutines above the pre-burst count that still count as settled
)

// loadClient is the sandboxed client. It talks to the test over a fifo
// (LOAD_CTL) and stdout:
//
//	ready            -> waits for "go"
//	{json}           the figures of the burst (LOAD_N flows held), of the
//	                 same flows used again, and of a churn (LOAD_CHURN new
//	                 flows at LOAD_CHURN_RATE a second, each replacing the
//	                 oldest held one)
//	closed           every flow closed -> waits for "go"
//	tail N S         LOAD_TAIL more flows opened (N held, S stalled) -> waits for "go"
//	bye              exits without closing them
const loadClient = `
import collections, json, os, resource, selectors, socket, subprocess, sys, time

N = int(os.environ["LOAD_N"])
TAIL = int(os.environ["LOAD_TAIL"])
CHURN = int(os.environ["LOAD_CHURN"])
CHURN_RATE = int(os.environ["LOAD_CHURN_RATE"])
MODE = os.environ["LOAD_MODE"]
CTL = os.environ["LOAD_CTL"]
INFLIGHT = 64      # flows being set up at once (the ramp)
TIMEOUT = 10.0     # a flow not echoed within this is stalled

soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
need = N + TAIL + INFLIGHT + 256
if soft < need:
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(need, hard), hard))

def wait_go():
    with open(CTL) as f:
        if f.readline().strip() != "go":
            sys.exit("bad control line")

def tun():
    out = subprocess.run(["ip", "-s", "-j", "link", "show", "tun0"], capture_output=True, check=True).stdout
    s = json.loads(out)[0]["stats64"]
    return {"tx_packets": s["tx"]["packets"], "tx_dropped": s["tx"]["dropped"],
            "rx_packets": s["rx"]["packets"], "rx_dropped": s["rx"]["dropped"]}

kind = socket.SOCK_STREAM if MODE == "tcp" else socket.SOCK_DGRAM
ip = socket.getaddrinfo("echo.test", 7, socket.AF_INET, kind)[0][4][0]
sel = selectors.DefaultSelector()

def burst(n, tag, lat, held, rate=0, rotate=False):
    """Opens n flows, at most INFLIGHT in set-up at once (and, with rate, at
    most rate new flows a second); each sends a line and waits for its echo,
    then joins held. With rotate, each new flow first closes the oldest held
    one. Returns the stalled count."""
    stalled, started, live, t0 = 0, 0, {}, time.monotonic()
    while started < n or live:
        while started < n and len(live) < INFLIGHT and (not rate or started < rate * (time.monotonic() - t0) + 1):
            if rotate and held:
                held.popleft().close()
            s = socket.socket(socket.AF_INET, kind)
            s.setblocking(False)
            st = {"i": started, "t0": time.monotonic(), "want": b"%s %06d\n" % (tag, started), "got": b""}
            if MODE == "tcp":
                s.connect_ex((ip, 7))
                sel.register(s, selectors.EVENT_WRITE, st)
            else:
                s.connect((ip, 7))
                s.send(st["want"])
                sel.register(s, selectors.EVENT_READ, st)
            live[s] = st
            started += 1
        for key, ev in sel.select(timeout=0.005 if rate else 0.05):
            s, st = key.fileobj, key.data
            if ev & selectors.EVENT_WRITE:
                if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) != 0:
                    sel.unregister(s)  # refused or reset
                    del live[s]
                    stalled += 1
                    s.close()
                    continue
                lat.append(time.monotonic() - st["t0"])
                s.send(st["want"])
                sel.modify(s, selectors.EVENT_READ, st)
                continue
            try:
                b = s.recv(4096)
            except OSError:
                b = b""
            st["got"] += b
            if not b or len(st["got"]) >= len(st["want"]):
                if MODE == "udp":
                    lat.append(time.monotonic() - st["t0"])
                sel.unregister(s)
                del live[s]
                if st["got"] == st["want"]:
                    held.append(s)
                else:
                    stalled += 1
                    s.close()
        now = time.monotonic()
        for s, st in list(live.items()):
            if now - st["t0"] > TIMEOUT:
                sel.unregister(s)
                del live[s]
                stalled += 1
                s.close()
    return stalled

def again(held):
    """Every held flow sends once more, at most INFLIGHT at once; returns how
    many got no echo within TIMEOUT."""
    todo, live, lost = list(enumerate(held)), {}, 0
    while todo or live:
        while todo and len(live) < INFLIGHT:
            i, s = todo.pop()
            st = {"t0": time.monotonic(), "want": b"again %06d\n" % i, "got": b""}
            try:
                s.send(st["want"])
            except OSError:
                lost += 1
                continue
            sel.register(s, selectors.EVENT_READ, st)
            live[s] = st
        for key, _ in sel.select(timeout=0.05):
            s, st = key.fileobj, key.data
            try:
                b = s.recv(4096)
            except OSError:
                b = b""
            st["got"] += b
            if not b or len(st["got"]) >= len(st["want"]):
                sel.unregister(s)
                del live[s]
                if st["got"] != st["want"]:
                    lost += 1
        now = time.monotonic()
        for s, st in list(live.items()):
            if now - st["t0"] > TIMEOUT:
                sel.unregister(s)
                del live[s]
                lost += 1
    return lost

print("ready", flush=True)
wait_go()
before = tun()
lat = []
t0 = time.monotonic()
held = collections.deque()
stalled = burst(N, b"burst", lat, held)
seconds = time.monotonic() - t0
stalled_again = again(held)
t1 = time.monotonic()
churn_stalled = burst(CHURN, b"churn", [], held, rate=CHURN_RATE, rotate=True)
churn_seconds = time.monotonic() - t1
after = tun()
lat.sort()
pct = lambda p: 1000 * lat[int(p * (len(lat) - 1))] if lat else -1
res = {"n": N, "held": len(held), "stalled": stalled, "stalled_again": stalled_again,
       "seconds": seconds, "p50_ms": pct(0.50), "p99_ms": pct(0.99), "max_ms": pct(1.0),
       "churn": CHURN, "churn_stalled": churn_stalled, "churn_per_sec": CHURN / churn_seconds}
for k in after:
    res[k] = after[k] - before[k]
print(json.dumps(res), flush=True)
for s in held:
    s.close()
held.clear()
print("closed", flush=True)
wait_go()
tail_stalled = burst(TAIL, b"tail", [], held)
print("tail %d %d" % (len(held), tail_stalled), flush=True)
wait_go()
print("bye", flush=True)
os._exit(0)
`

// loadResult is what the client printed about its burst.
type loadResult struct {
	N            int     `json:"n"`
	Held         int     `json:"held"`
	Stalled      int     `json:"stalled"`
	StalledAgain int     `json:"stalled_again"`
	Seconds      float64 `json:"seconds"`
	P50ms        float64 `json:"p50_ms"`
	P99ms        float64 `json:"p99_ms"`
	MaxMs        float64 `json:"max_ms"`
	Churn        int     `json:"churn"`
	ChurnStalled int     `json:"churn_stalled"`
	ChurnPerSec  float64 `json:"churn_per_sec"`
	TxPackets    uint64  `json:"tx_packets"`
	TxDropped    uint64  `json:"tx_dropped"`
	RxPackets    uint64  `json:"rx_packets"`
	RxDropped    uint64  `json:"rx_dropped"`
}

// dropRatio is the share of the sandbox's packets the TUN dropped.
func (r loadResult) dropRatio() float64 {
	if r.TxPackets+r.TxDropped == 0 {
		return 0
	}
	return float64(r.TxDropped) / float64(r.TxPackets+r.TxDropped)
}

// tunwallStats is one "tunwall: stats" line (SIGUSR1).
type tunwallStats map[string]int64

// loadRun is one tunwall run of the load client.
type loadRun struct {
	res       loadResult
	base      tunwallStats  // before the burst
	peak      tunwallStats  // right after it
	settled   tunwallStats  // once settled after every flow closed
	tail      tunwallStats  // after the tail flows
	settle    time.Duration // from "closed" until settled
	shutdown  time.Duration // from the client's last line until tunwall exited
	rssBase   int64         // VmRSS in KiB, before the burst
	rssPeak   int64
	rssSettle int64
	cpu       float64 // tunwall's CPU seconds from before the burst until settled
	audit     string
	stderr    string
}

func TestHoldUnderLoadTCP(t *testing.T) {
	testLoad(t, "tcp")
}

func TestHoldUnderLoadUDP(t *testing.T) {
	testLoad(t, "udp")
}

func testLoad(t *testing.T, mode string) {
	requireTools(t, "python3", "ip")
	loadN := loadDefaultN
	if n, err := strconv.Atoi(os.Getenv("TUNWALL_LOAD_N")); err == nil && n > 0 {
		loadN = n
	}
	raiseNofile(t, uint64(loadN+loadTail+2048)) // the world's echo server runs in this process
	// Each run gets a world of its own: the first run's connections would
	// otherwise leave thousands of TIME_WAIT sockets in the agent's
	// namespace, and the kernel's search for a free port for each dial of
	// the second run costs more the more there are.
	off := newWorld(t).loadRun(mode, loadN, false)
	t.Logf("%s --audit off: %+v; settle %v, shutdown %v", mode, off.res, off.settle, off.shutdown)
	if off.res.Held != loadN || off.res.Stalled+off.res.StalledAgain+off.res.ChurnStalled != 0 {
		t.Fatalf("the unaudited run already stalls, so the world cannot judge the audited one: %+v\n%s", off.res, off.stderr)
	}
	on := newWorld(t).loadRun(mode, loadN, true)
	t.Logf("%s audited:     %+v; settle %v, shutdown %v", mode, on.res, on.settle, on.shutdown)
	t.Logf("%s audited tunwall: before %v, after the burst %v, settled %v, after the tail %v; VmRSS KiB %d -> %d -> %d",
		mode, on.base, on.peak, on.settled, on.tail, on.rssBase, on.rssPeak, on.rssSettle)
	t.Logf("%s tunwall CPU seconds, burst to settled: unaudited %.2f, audited %.2f (attribution's worker %.2f)",
		mode, off.cpu, on.cpu, float64(on.settled["attr_cpu_us"])/1e6)

	if on.res.Held != loadN || on.res.Stalled != 0 || on.res.StalledAgain != 0 || on.res.ChurnStalled != 0 {
		t.Errorf("audited: %d of %d flows held; stalled: %d in the burst, %d when used again, %d of %d in the churn; want 0",
			on.res.Held, loadN, on.res.Stalled, on.res.StalledAgain, on.res.ChurnStalled, loadChurn)
	}
	// Packets the TUN dropped: under 1% as long as the unaudited run
	// drops under 1% too. On a machine so busy that even the unaudited run
	// loses more (its TUN reader does not get the CPU in time), the audited
	// run may lose no more than it plus one point; CI, where the machine is
	// the test's own, must see a clean unaudited run.
	dOff, dOn := off.res.dropRatio(), on.res.dropRatio()
	switch {
	case dOff < loadMaxDropRatio && dOn >= loadMaxDropRatio:
		t.Errorf("audited: the TUN dropped %d of %d sandbox packets (%.1f%%), want < %.0f%% (unaudited: %.2f%%)",
			on.res.TxDropped, on.res.TxPackets+on.res.TxDropped, 100*dOn, 100*loadMaxDropRatio, 100*dOff)
	case dOff >= loadMaxDropRatio && dOn > dOff+loadMaxDropRatio:
		t.Errorf("audited: the TUN dropped %.1f%% of the sandbox's packets, unaudited %.1f%%: want no more than %.0f point above",
			100*dOn, 100*dOff, 100*loadMaxDropRatio)
	case dOff >= loadMaxDropRatio && os.Getenv("CI") == "true":
		t.Errorf("the unaudited run's TUN dropped %.1f%% of the sandbox's packets: the machine is too busy to judge the audited run's %.1f%%",
			100*dOff, 100*dOn)
	case dOff >= loadMaxDropRatio:
		t.Logf("!!! the unaudited run's TUN dropped %.1f%% of the sandbox's packets (a busy machine); the audited run %.1f%% !!!", 100*dOff, 100*dOn)
	}
	// Latency is timing on a machine that may be shared: when the audited
	// run's p99 is out of bounds, one more pair of runs decides (a real
	// slowdown fails both pairs).
	p99OK := func(off, on loadResult) bool { return on.P99ms <= loadP99Factor*off.P99ms+loadP99SlackMS }
	if !p99OK(off.res, on.res) {
		t.Logf("audited: p99 set-up latency %.2fms, unaudited %.2fms: out of bounds; running the pair again", on.res.P99ms, off.res.P99ms)
		off2, on2 := newWorld(t).loadRun(mode, loadN, false), newWorld(t).loadRun(mode, loadN, true)
		t.Logf("%s again: --audit off %+v; audited %+v", mode, off2.res, on2.res)
		if !p99OK(off2.res, on2.res) {
			t.Errorf("audited: p99 set-up latency %.2fms then %.2fms, want <= %.0f x unaudited (%.2fms then %.2fms) + %.0fms",
				on.res.P99ms, on2.res.P99ms, loadP99Factor, off.res.P99ms, off2.res.P99ms, loadP99SlackMS)
		}
	}
	total, attributed := 0, 0
	notes := map[string]int{} // of the records without the python process
	for _, r := range records(t, on.audit) {
		if r.Kind != "flow" || r.Port != 7 {
			continue
		}
		total++
		if r.PID != 0 && strings.HasPrefix(r.Comm, "python") {
			attributed++
		} else {
			notes[fmt.Sprintf("pid %d comm %q owner %q", r.PID, r.Comm, r.Owner)]++
		}
	}
	if len(notes) > 0 {
		t.Logf("audited: flow records without the python process: %v", notes)
	}
	// Every TCP connection is a flow. A UDP flow is a 5-tuple: a new socket
	// that gets the port of a closed one whose session is still open
	// (tunwall cannot see a UDP socket close) continues that session.
	want := loadN + loadChurn + loadTail
	if mode == "udp" {
		want = loadN
	}
	if total < want {
		t.Errorf("audited: %d flow records for the echo server, want at least %d", total, want)
	}
	if total > 0 && float64(attributed)/float64(total) < loadMinAttributed {
		t.Errorf("audited: %d of %d flow records name the python3 process (%.1f%%), want >= %.0f%%",
			attributed, total, 100*float64(attributed)/float64(total), 100*loadMinAttributed)
	} else {
		t.Logf("audited: %d of %d flow records name the python3 process", attributed, total)
	}
	for _, r := range []struct {
		name string
		run  loadRun
	}{{"unaudited", off}, {"audited", on}} {
		switch {
		case mode == "tcp" && r.run.shutdown > loadShutdown:
			t.Errorf("%s: tunwall exited %v after the client, want < %v", r.name, r.run.shutdown, loadShutdown)
		case mode == "udp" && r.run.shutdown > loadShutdown:
			// Every UDP session of the run (about loadN+loadTail: tunwall
			// cannot see a UDP socket close) is still open at the exit;
			// ending them is the stack's work and writing their records
			// the audit writer's, not attribution's. Reported, not judged
			// here (the hardening issue's stack and audit items).
			t.Logf("!!! %s: tunwall exited %v after the client, over %v: ending about %d UDP sessions !!!",
				r.name, r.run.shutdown, loadShutdown, loadN+loadTail)
		}
		if r.run.settle > loadSettle {
			t.Errorf("%s: tunwall had not settled %v after every flow closed: before the burst %v, last seen %v",
				r.name, loadSettle, r.run.base, r.run.settled)
		}
	}
}

// raiseNofile lifts this process's descriptor limit (inherited by tunwall
// and the sandbox) to at least n.
func raiseNofile(t *testing.T, n uint64) {
	t.Helper()
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		t.Fatal(err)
	}
	if rl.Cur >= n {
		return
	}
	old := rl
	rl.Cur, rl.Max = n, max(rl.Max, n)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		t.Fatalf("raise RLIMIT_NOFILE from %d/%d to %d: %v", old.Cur, old.Max, n, err)
	}
	t.Logf("RLIMIT_NOFILE %d/%d -> %d/%d", old.Cur, old.Max, rl.Cur, rl.Max)
}

// loadRun runs the load client once in `tunwall run` and drives its phases.
func (w *world) loadRun(mode string, loadN int, audited bool) loadRun {
	t := w.t
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	ctl := filepath.Join(w.dir, fmt.Sprintf("load-ctl-%d", w.runs.Load()+1))
	if err := unix.Mkfifo(ctl, 0o666); err != nil {
		t.Fatal(err)
	}
	os.Chmod(ctl, 0o666)
	allow := "echo.test:7"
	if mode == "udp" {
		allow += "/udp"
	}
	o := runOpts{
		flags:  []string{"--allow", allow},
		script: "exec python3 -c \"$LOAD_CLIENT\"",
		env: []string{"LOAD_CLIENT=" + loadClient, "LOAD_MODE=" + mode, "LOAD_CTL=" + ctl,
			"LOAD_N=" + strconv.Itoa(loadN), "LOAD_TAIL=" + strconv.Itoa(loadTail),
			"LOAD_CHURN=" + strconv.Itoa(loadChurn), "LOAD_CHURN_RATE=" + strconv.Itoa(loadChurnRate)},
	}
	if !audited {
		o.flags = append(o.flags, "--audit", "off")
	}
	cmd, auditPath := w.tunwallCmd(ctx, o, "run")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderrR, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	var stderr strings.Builder
	stats := make(chan tunwallStats, 16)
	lines := make(chan string, 16)
	readersDone := make(chan struct{}, 2)
	go func() {
		defer func() { readersDone <- struct{}{} }()
		sc := bufio.NewScanner(stdout)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	go func() {
		defer func() { readersDone <- struct{}{} }()
		sc := bufio.NewScanner(stderrR)
		for sc.Scan() {
			l := sc.Text()
			if s, ok := parseStats(l); ok {
				select {
				case stats <- s:
				default:
				}
				continue
			}
			stderr.WriteString(l + "\n")
		}
	}()
	var run loadRun
	run.audit = auditPath
	fail := func(format string, args ...any) {
		t.Helper()
		cmd.Process.Kill()
		<-readersDone
		<-readersDone
		cmd.Wait()
		t.Fatalf(format+"\n--- tunwall stderr\n%s", append(args, stderr.String())...)
	}
	next := func(what string, d time.Duration) string {
		t.Helper()
		select {
		case l, ok := <-lines:
			if !ok {
				fail("the client ended before %q", what)
			}
			return l
		case <-time.After(d):
			fail("no %q from the client within %v", what, d)
		}
		return ""
	}
	sample := func() (tunwallStats, int64) {
		t.Helper()
		if err := cmd.Process.Signal(syscall.SIGUSR1); err != nil {
			fail("SIGUSR1: %v", err)
		}
		select {
		case s := <-stats:
			return s, vmRSS(cmd.Process.Pid)
		case <-time.After(10 * time.Second):
			fail("tunwall printed no stats line within 10s of SIGUSR1")
		}
		return nil, 0
	}
	goAhead := func() {
		t.Helper()
		if err := writeFifo(ctl, "go\n", 10*time.Second); err != nil {
			fail("control fifo: %v", err)
		}
	}

	if l := next("ready", 60*time.Second); l != "ready" {
		fail("want ready, got %q", l)
	}
	run.base, run.rssBase = sample()
	cpu0 := cpuSeconds(cmd.Process.Pid)
	goAhead()
	l := next("burst figures", 4*time.Minute)
	if err := json.Unmarshal([]byte(l), &run.res); err != nil {
		fail("client output %q: %v", l, err)
	}
	if l := next("closed", time.Minute); l != "closed" {
		fail("want closed, got %q", l)
	}
	run.peak, run.rssPeak = sample()
	start := time.Now()
	for {
		run.settled, run.rssSettle = sample()
		run.settle = time.Since(start)
		if settled(mode, run.base, run.settled) || run.settle > loadSettle {
			break
		}
		time.Sleep(200 * time.Millisecond) // poll with a bound (loadSettle)
	}
	run.cpu = cpuSeconds(cmd.Process.Pid) - cpu0
	goAhead()
	l = next("tail", 2*time.Minute)
	if f := strings.Fields(l); len(f) != 3 || f[0] != "tail" || f[1] != strconv.Itoa(loadTail) || f[2] != "0" {
		t.Errorf("tail: %q, want %d flows held and 0 stalled", l, loadTail)
	}
	run.tail, _ = sample()
	goAhead()
	if l := next("bye", 30*time.Second); l != "bye" {
		fail("want bye, got %q", l)
	}
	bye := time.Now()
	go func() {
		<-readersDone
		<-readersDone
		cmd.Wait()
		close(exited)
	}()
	select {
	case <-exited:
		run.shutdown = time.Since(bye)
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		<-exited
		t.Fatalf("tunwall did not exit within 30s of its sandbox\n%s", stderr.String())
	}
	run.stderr = stderr.String()
	if code := cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("tunwall exit %d\n%s", code, run.stderr)
	}
	return run
}

// settled reports whether tunwall is back where it was before the burst: no
// attribution work pending and, for TCP, about as many goroutines. (A UDP
// session lasts until it has been idle for a minute: tunwall cannot see the
// client close its socket.)
func settled(mode string, base, now tunwallStats) bool {
	if mode == "tcp" && now["goroutines"] > base["goroutines"]+loadGoroutineSlack {
		return false
	}
	return now["attr_pending"] == 0
}

// parseStats parses "tunwall: stats k=v k=v ...".
func parseStats(l string) (tunwallStats, bool) {
	rest, ok := strings.CutPrefix(l, "tunwall: stats ")
	if !ok {
		return nil, false
	}
	s := tunwallStats{}
	for _, f := range strings.Fields(rest) {
		k, v, ok := strings.Cut(f, "=")
		if !ok {
			continue
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err == nil {
			s[k] = n
		}
	}
	return s, true
}

// vmRSS returns a process's resident set in KiB, or -1.
func vmRSS(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return -1
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return n
		}
	}
	return -1
}

// cpuSeconds returns the user and system CPU time a process has used.
func cpuSeconds(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return -1
	}
	// Fields after the command name in parentheses; utime and stime are
	// the 14th and 15th fields of the whole line, in clock ticks.
	i := strings.LastIndexByte(string(b), ')')
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return -1
	}
	ut, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	return (ut + st) / 100 // USER_HZ is 100 on Linux
}

// writeFifo writes s to a fifo once a reader has it open, waiting at most d
// for the reader.
func writeFifo(path, s string, d time.Duration) error {
	deadline := time.Now().Add(d)
	for {
		fd, err := unix.Open(path, unix.O_WRONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		if errors.Is(err, unix.ENXIO) && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond) // no reader yet: poll with a bound
			continue
		}
		if err != nil {
			return err
		}
		f := os.NewFile(uintptr(fd), path)
		_, err = io.WriteString(f, s)
		f.Close()
		return err
	}
}

// churnClient connects to echo.test at CHURN_RATE new connections a second
// for CHURN_SECONDS, alternating the close order: to port 80 (the sandbox
// closes first, after the reply: its kernel keeps the TIME_WAIT) and to port
// 81 (the server closes first: tunwall's side of the sandbox's connection
// ends in TIME_WAIT). Ports come from the sandbox's ephemeral range, so over
// a minute they come back. Each connection sends a line and reads the
// reply (and for 81 the server's FIN). One process, non-blocking sockets,
// at most INFLIGHT at once; it prints one JSON line.
const churnClient = `
import json, os, selectors, socket, time
RATE = int(os.environ["CHURN_RATE"])
SECS = float(os.environ["CHURN_SECONDS"])
INFLIGHT = 512
TIMEOUT = 10.0
ip = socket.getaddrinfo("echo.test", 80, socket.AF_INET, socket.SOCK_STREAM)[0][4][0]
sel = selectors.DefaultSelector()
total = int(RATE * SECS)
n = 0
res = {"total": total, "ok": 0, "refused": 0, "reset": 0, "stalled": 0, "delayed": 0, "by_port": {"80": 0, "81": 0}}
lat, live = [], {}
def tun():
    for l in open("/proc/net/dev"):
        name, _, rest = l.partition(":")
        if name.strip() == "tun0":
            f = rest.split()
            return int(f[9]), int(f[11])
    return 0, 0
tx0, drop0 = tun()
def done(s):
    sel.unregister(s)
    del live[s]
    s.close()
t0 = time.monotonic()
while n < total or live:
    now = time.monotonic()
    while n < total and len(live) < INFLIGHT and n < RATE * (now - t0) + 1:
        port = 80 if n % 2 == 0 else 81
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        s.connect_ex((ip, port))
        st = {"t0": time.monotonic(), "port": port, "phase": 0, "got": b""}
        sel.register(s, selectors.EVENT_WRITE, st)
        live[s] = st
        n += 1
    if n == total and "connect_seconds" not in res:
        res["connect_seconds"] = time.monotonic() - t0
    for key, ev in sel.select(timeout=0.002):
        s, st = key.fileobj, key.data
        if st["phase"] == 0:
            if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) != 0:
                res["refused"] += 1
                done(s)
                continue
            d = time.monotonic() - st["t0"]
            lat.append(d)
            if d > 0.9:
                res["delayed"] += 1  # a SYN went unanswered: its retransmit got through
            s.send(b"ping\n")
            st["phase"] = 1
            sel.modify(s, selectors.EVENT_READ, st)
            continue
        try:
            b = s.recv(4096)
        except OSError:
            res["reset"] += 1
            done(s)
            continue
        if st["phase"] == 1:
            st["got"] += b
            if st["got"] == b"ok\n":
                if st["port"] == 80:
                    res["ok"] += 1
                    res["by_port"]["80"] += 1
                    done(s)  # the sandbox closes first
                else:
                    st["phase"] = 2  # wait for the server's FIN
            elif not b or len(st["got"]) >= 3:
                res["stalled"] += 1
                done(s)
            continue
        if not b:  # phase 2: the server's FIN
            res["ok"] += 1
            res["by_port"]["81"] += 1
            done(s)
        elif True:
            res["stalled"] += 1
            done(s)
    now = time.monotonic()
    for s, st in list(live.items()):
        if now - st["t0"] > TIMEOUT:
            res["stalled"] += 1
            done(s)
lat.sort()
pct = lambda p: 1000 * lat[int(p * (len(lat) - 1))] if lat else -1
tx1, drop1 = tun()
res.update({"tun_tx": tx1 - tx0, "tun_dropped": drop1 - drop0})
res.update({"rate": total / res.get("connect_seconds", 1), "p50_ms": pct(0.5), "p99_ms": pct(0.99), "max_ms": pct(1.0)})
print(json.dumps(res), flush=True)
`

// churnResult is what churnClient printed.
type churnResult struct {
	Total   int            `json:"total"`
	OK      int            `json:"ok"`
	Refused int            `json:"refused"`
	Reset   int            `json:"reset"`
	Stalled int            `json:"stalled"`
	Delayed int            `json:"delayed"`
	ByPort  map[string]int `json:"by_port"`
	Seconds float64        `json:"connect_seconds"`
	Rate    float64        `json:"rate"`
	P50ms   float64        `json:"p50_ms"`
	P99ms   float64        `json:"p99_ms"`
	MaxMs   float64        `json:"max_ms"`
	TUNTx   int64          `json:"tun_tx"`
	TUNDrop int64          `json:"tun_dropped"`
}

// Issue "Hold under load": a minute of churn at 600 new connections a
// second, audited as users run it, with both close orders.
const (
	churnRate    = 600
	churnSeconds = 60 // TUNWALL_CHURN_SECONDS overrides, for a quick look
	// churnMaxDelayed bounds the connects that needed a SYN retransmit
	// (over 900ms), per connect: a SYN on a tuple tunwall still holds in
	// TIME_WAIT costs one, however idle the machine; one in a thousand is
	// left for a shared machine's scheduling.
	churnMaxDelayed = 0.001
)

func TestChurnWithBothCloseOrdersIsRecordedAndAttributed(t *testing.T) {
	requireTools(t, "python3")
	secs := churnSeconds
	if n, err := strconv.Atoi(os.Getenv("TUNWALL_CHURN_SECONDS")); err == nil && n > 0 {
		secs = n
	}
	w := newWorld(t)
	// When the sandbox closes first, tunwall's upstream socket does too and
	// holds the host's TIME_WAIT (60 s), as any proxy's would: let the
	// host reuse those ports for new dials, as the README advises for
	// churn like this ("Connection churn").
	if out, err := exec.Command("ip", "netns", "exec", w.AgentNS, "sysctl", "-w", "net.ipv4.tcp_tw_reuse=1").CombinedOutput(); err != nil {
		t.Fatalf("sysctl: %v: %s", err, out)
	}
	r := w.run(runOpts{
		flags:   []string{"--allow", "echo.test:80,81", "--quiet"},
		script:  "exec python3 -c \"$CHURN_CLIENT\"",
		env:     []string{"CHURN_CLIENT=" + churnClient, "CHURN_RATE=" + strconv.Itoa(churnRate), "CHURN_SECONDS=" + strconv.Itoa(secs)},
		timeout: time.Duration(secs)*time.Second + 2*time.Minute,
	})
	if r.code != 0 {
		t.Fatalf("tunwall exit %d\n%s", r.code, r)
	}
	var res churnResult
	if err := json.Unmarshal([]byte(strings.TrimSpace(r.stdout)), &res); err != nil {
		t.Fatalf("client output: %v\n%s", err, r)
	}
	t.Logf("churn: %+v", res)
	if res.OK != res.Total || res.Refused+res.Reset+res.Stalled != 0 {
		t.Errorf("%d of %d connections worked: %d refused, %d reset, %d stalled (by close order: %v)",
			res.OK, res.Total, res.Refused, res.Reset, res.Stalled, res.ByPort)
	}
	if float64(res.Delayed) > churnMaxDelayed*float64(res.Total) {
		t.Errorf("%d of %d connects waited for a SYN retransmit (slowest %.0fms), want at most %.1f%%",
			res.Delayed, res.Total, res.MaxMs, 100*churnMaxDelayed)
	}
	// The client issues its connects on one Python thread, which shares
	// the 2 CPUs with tunwall and the kernel: on this project's VM it
	// reaches 555-590 a second, the code before this series too (572), so
	// the guard that the test churned as meant is 90% of the rate.
	if res.Rate < 0.9*churnRate {
		t.Errorf("the client made %.0f connections a second, want about %d: the test did not churn as meant", res.Rate, churnRate)
	}
	recorded, attributed := map[uint16]int{}, 0
	notes, denied := map[string]int{}, map[string]int{}
	for _, rec := range records(t, r.audit) {
		switch {
		case rec.Verdict == "deny":
			denied[rec.Kind+" "+rec.Rule+": "+rec.Reason]++
		case rec.Kind == "flow" && (rec.Port == 80 || rec.Port == 81):
			recorded[rec.Port]++
			if rec.PID != 0 && strings.HasPrefix(rec.Comm, "python") {
				attributed++
			} else {
				notes[fmt.Sprintf("pid %d comm %q owner %q", rec.PID, rec.Comm, rec.Owner)]++
			}
		}
	}
	if len(denied) > 0 {
		t.Errorf("denied records in a run that only made allowed connections: %v", denied)
	}
	if recorded[80] < res.ByPort["80"] || recorded[81] < res.ByPort["81"] {
		t.Errorf("flow records %v, want one for each connection that worked %v (and for those that did not)", recorded, res.ByPort)
	}
	all := recorded[80] + recorded[81]
	if len(notes) > 0 {
		t.Logf("flow records without the python process: %v", notes)
	}
	if all == 0 || float64(attributed)/float64(all) < loadMinAttributed {
		t.Errorf("%d of %d flow records name the python3 process, want >= %.0f%%", attributed, all, 100*loadMinAttributed)
	} else {
		t.Logf("%d of %d flow records name the python3 process (%.2f%%)", attributed, all, 100*float64(attributed)/float64(all))
	}
}
