package integration

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tunwall/tunwall/internal/testworld"
)

// lrStarveScript sends N raw SYNs in SECS seconds to DST:80, whose
// SYN-ACKs it drops (so tunwall holds each handshake until its timeout),
// while another thread connects to OTHER:80 every 100 ms; it prints how
// those connects went.
const lrStarveScript = `
import os, random, socket, struct, subprocess, sys, threading, time
n, secs, dst, other = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3], sys.argv[4]
random.seed(11)
` + lrRawSYNPy + `stop = threading.Event()
res = {"n": 0, "fail": 0, "max": 0.0}
def prober():
    while not stop.is_set():
        t0 = time.time()
        try:
            s = socket.create_connection((other, 80), timeout=5)
            s.sendall(b"GET / HTTP/1.0\r\n\r\n")
            s.recv(10)
            s.close()
        except OSError:
            res["fail"] += 1
        res["max"] = max(res["max"], time.time() - t0)
        res["n"] += 1
        time.sleep(0.1)
th = threading.Thread(target=prober)
time.sleep(0.5)
th.start()
r = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
t0 = time.time()
for i in range(n):
    r.sendto(syn4(src, dst, 1024 + i % 60000, 80), (dst, 0))
    if i % 100 == 99:
        d = t0 + (i + 1) * secs / n - time.time()
        if d > 0:
            time.sleep(d)
print("starve: %d SYNs in %.1fs" % (n, time.time() - t0), flush=True)
time.sleep(1)
stop.set()
th.join()
print("starve: other host connects %d failed %d max_ms %.0f" % (res["n"], res["fail"], res["max"] * 1000), flush=True)
`

// TestASYNBurstToOneHostDoesNotStarveTheOthers: 50,000 SYNs in 5 s to one
// allowed host, whose handshakes are never completed, must not take every
// handshake slot: a connection to another allowed host during the burst
// succeeds, every time, within a second. (The SYNs come from raw sockets
// in a namespace tunwall attach serves, where the test drops the
// SYN-ACKs.) TUNWALL_STARVE_SYNS sets the count.
func TestASYNBurstToOneHostDoesNotStarveTheOthers(t *testing.T) {
	requireTools(t, "python3", "ip")
	syns := "50000"
	if v := os.Getenv("TUNWALL_STARVE_SYNS"); v != "" {
		syns = v
	}
	w := newWorld(t)
	ns := w.netns("twstarve")
	py := filepath.Join(w.dir, "starve.py")
	if err := os.WriteFile(py, []byte(lrStarveScript), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd, _ := w.tunwallCmd(ctx, runOpts{
		flags: []string{"--netns", "/run/netns/" + ns, "--allow", testworld.Echo4.String() + ":80", "--allow", testworld.Web4.String() + ":80", "--audit-max-rate", "20000"},
	}, "attach")
	var stderr lrBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	defer func() {
		cmd.Process.Kill()
		<-exited
	}()
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(stderr.String(), "serving the namespace"); {
		select {
		case <-exited:
			t.Fatalf("tunwall attach exited:\n%s", stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("tunwall attach is not serving after 30s:\n%s", stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	pid := cmd.Process.Pid // ip netns exec execs tunwall in place
	rss0 := lrRSSKiB(t, pid)
	out, err := exec.CommandContext(ctx, "ip", "netns", "exec", ns, "python3", py, syns, "5", testworld.Echo4.String(), testworld.Web4.String()).CombinedOutput()
	if err != nil {
		t.Fatalf("the burst: %v\n%s", err, out)
	}
	t.Logf("%s", out)
	m := regexp.MustCompile(`other host connects (\d+) failed (\d+) max_ms (\d+)`).FindStringSubmatch(string(out))
	if m == nil {
		t.Fatalf("no result\n%s", out)
	}
	n, _ := strconv.Atoi(m[1])
	failed, _ := strconv.Atoi(m[2])
	maxMS, _ := strconv.Atoi(m[3])
	if n < 10 || failed > 0 || maxMS > 1000 {
		t.Errorf("during the burst to one host, %d connects to another: %d failed, the slowest took %d ms (want none failed, all within 1000 ms)", n, failed, maxMS)
	}
	// Within 10 s of the burst, tunwall's RSS is back within 32 MiB of
	// what it was before.
	rss, start := lrRSSKiB(t, pid), time.Now()
	for rss > rss0+32<<10 && time.Since(start) < 10*time.Second {
		time.Sleep(500 * time.Millisecond)
		rss = lrRSSKiB(t, pid)
	}
	t.Logf("RSS: %d KiB before the burst, %d KiB %v after it", rss0, rss, time.Since(start).Round(100*time.Millisecond))
	if rss > rss0+32<<10 {
		t.Errorf("10 s after the burst tunwall's RSS is %d KiB, want within 32 MiB of the %d KiB before it", rss, rss0)
	}
	sc := bufio.NewScanner(strings.NewReader(stderr.String()))
	for sc.Scan() {
		if strings.Contains(sc.Text(), "handshake") || strings.Contains(sc.Text(), "reset") {
			t.Log(sc.Text())
		}
	}
}

// lrRSSKiB is pid's resident set now, in KiB.
func lrRSSKiB(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^VmRSS:\s+(\d+) kB`).FindSubmatch(b)
	if m == nil {
		t.Fatalf("no VmRSS in /proc/%d/status", pid)
	}
	n, _ := strconv.Atoi(string(m[1]))
	return n
}
