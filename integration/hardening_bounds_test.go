package integration

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tunwall/tunwall/internal/testworld"
	"github.com/tunwall/tunwall/tun"
)

// The attacks of the hardening issue's item 7 ("bounded resources, whatever
// the sandbox does"), run from inside a real sandbox against a real tunwall:
// floods of held connections, uploads nobody reads, UDP and DNS sessions,
// spoofed sources and handshakes never completed. tunwall's peak RSS
// (VmHWM) must stay under rssLimit whatever the sandbox does.

const (
	// rssLimitMiB is the default --max-memory (256 MiB) and an eighth. The
	// target bounds what tunwall keeps live (flow limits, the buffer
	// budget, what the name checks hold, new flows and growing first
	// messages refused past 5/8 of it); RSS adds the binary's pages (14
	// MiB) and the garbage the collector has not caught up with while a
	// flood allocates faster than it marks (the Go runtime's soft limit is
	// soft). The token flood, the highest, peaked at 201-255 MiB in seven
	// runs; before the pump runner, the 4 KiB first window and the refusal
	// of growing first messages, at 211-271 MiB (271 in a clean CI run).
	// The unbounded code passed 1 GiB.
	rssLimitMiB = 256 + 256/8
	// rssKillMiB stops a run that is clearly unbounded before it hurts the
	// machine (the unfixed code went past 1.8 GB).
	rssKillMiB = 1024
)

// loadPy opens many flows from inside the sandbox and holds them until
// stdin closes. argv: MODE N [ARG]. It prints "ready OK FAILED EXTRA" once
// every flow is set up (or its time bound passed), then waits.
//
//	download N           N connections to echo.test:19, each asking for 1 GiB, never read
//	upload N PORT        N connections to echo.test:PORT, each writing up to 256 KiB, never read by the server
//	tokens N PORT        the same, with bytes that may be an HTTP method, which the name checks hold
//	idle N PORT          N idle connections to echo.test:PORT (a server that holds them)
//	udp N                N UDP sessions to echo.test:7, each echoed once
//	dnstcp N             N DNS-over-TCP connections to the resolver, one query each, held
//	dnsudp N             N UDP sockets, one DNS query each to the resolver, held
const loadPy = `
import errno, os, resource, select, socket, struct, sys, time
mode, n = sys.argv[1], int(sys.argv[2])
arg = sys.argv[3] if len(sys.argv) > 3 else ""
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
deadline = time.time() + 100
socks, ok, failed, extra = [], 0, 0, 0

def dnsq(i, name="allowed.test"):
    q = struct.pack("!HHHHHH", i & 0xffff, 0x0100, 1, 0, 0, 0)
    for label in name.split("."):
        q += bytes([len(label)]) + label.encode()
    return q + b"\x00" + struct.pack("!HH", 1, 1)

def connect_all(addr, first=None):
    global ok, failed
    p = select.poll()
    pending, i = {}, 0
    while (i < n or pending) and time.time() < deadline:
        while i < n and len(pending) < 256:
            i += 1
            try:
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            except OSError:
                failed += 1
                continue
            s.setblocking(False)
            try:
                s.connect(addr)
            except BlockingIOError:
                pass
            except OSError:
                failed += 1
                s.close()
                continue
            pending[s.fileno()] = s
            p.register(s, select.POLLOUT)
        for fd, ev in p.poll(1000):
            s = pending.pop(fd)
            p.unregister(fd)
            if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                failed += 1
                s.close()
                continue
            ok += 1
            socks.append(s)
            if first is not None:
                try:
                    s.send(first(len(socks)))
                except OSError:
                    pass
    failed += len(pending)

def resolve(name):
    return socket.getaddrinfo(name, 0, socket.AF_INET, socket.SOCK_STREAM)[0][4][0]

if mode == "download":
    connect_all((resolve("echo.test"), 19), lambda i: b"1073741824 %d\n" % i)
elif mode == "idle":
    connect_all((resolve("echo.test"), int(arg)))
elif mode in ("upload", "tokens"):
    connect_all((resolve("echo.test"), int(arg)))
    # upload: bytes the name checks pass at once (neither TLS nor HTTP), so
    # they wait in the relay's buffers; tokens: what may be the first word
    # of an HTTP request, held by the name checks until it is too long.
    fill = b"\x00" if mode == "upload" else b"u"
    chunk, quota, sent = fill * 65536, 256 << 10, {}
    end = min(deadline, time.time() + 15)
    p = select.poll()
    for s in socks:
        p.register(s, select.POLLOUT)
        sent[s.fileno()] = 0
    by = {s.fileno(): s for s in socks}
    while sent and time.time() < end:
        for fd, ev in p.poll(500):
            try:
                m = by[fd].send(chunk)
                sent[fd] += m
                extra += m
            except BlockingIOError:
                continue
            except OSError:
                m = quota
            if sent.get(fd, 0) >= quota:
                p.unregister(fd)
                del sent[fd]
elif mode == "dnstcp":
    def q(i):
        m = dnsq(i)
        return struct.pack("!H", len(m)) + m
    connect_all(("198.18.0.1", 53), q)
elif mode in ("udp", "dnsudp"):
    if mode == "udp":
        addr, payload = (resolve("echo.test"), 7), lambda i: b"datagram %d" % i
    else:
        addr, payload = ("198.18.0.1", 53), dnsq
    p = select.poll()
    for i in range(n):
        if time.time() > deadline:
            break
        try:
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.setblocking(False)
            s.connect(addr)
            s.send(payload(i))
        except OSError:
            failed += 1
            continue
        socks.append(s)
        p.register(s, select.POLLIN)
    ok = len(socks)
    by = {s.fileno(): s for s in socks}
    end = min(deadline, time.time() + 10)
    left = ok
    while left and time.time() < end:
        for fd, ev in p.poll(500):
            p.unregister(fd)
            left -= 1
            try:
                by[fd].recv(65536)
                extra += 1
            except OSError:
                pass
else:
    sys.exit("unknown mode " + mode)
print("ready", ok, failed, extra, flush=True)
r, _, _ = select.select([sys.stdin], [], [], max(1, deadline + 60 - time.time()))
`

// holdResult is what one load run saw.
type holdResult struct {
	ok, failed, extra int
	peakMiB           float64 // tunwall's VmHWM
	killed            bool    // tunwall passed rssKillMiB and was killed
	goroutines        int     // tunwall's goroutines while the load held its flows (-1: not sampled)
	stderr            string
}

// peakUnderLoad runs loadPy MODE N ARG in a sandbox, waits until it holds
// every flow and tunwall's RSS has stopped growing, and returns tunwall's
// peak RSS.
func (w *world) peakUnderLoad(flags []string, mode string, n int, arg string) holdResult {
	t := w.t
	t.Helper()
	py := fmt.Sprintf("%s/load.py", w.dir)
	if err := os.WriteFile(py, []byte(loadPy), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	// python3 runs through sh, which finds it on the PATH as a user would.
	cmd, _ := w.tunwallCmd(ctx, runOpts{flags: flags, script: fmt.Sprintf("exec python3 %s %s %d %s", py, mode, n, arg)}, "run")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr lockedBuffer
	cmd.Stderr = &stderr
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid // ip netns exec execs tunwall: same process
	var res holdResult
	readyc := make(chan string, 1)
	ready := (<-chan string)(readyc)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "ready ") {
				readyc <- sc.Text()
			}
		}
		close(readyc)
		io.Copy(io.Discard, stdout)
	}()
	kill := func() {
		res.killed = true
		cmd.Process.Kill()
	}
	// Watch RSS while the sandbox sets up its flows, then until it has not
	// grown for 3s (bounded).
	var (
		line     string
		readyAt  time.Time
		lastGrow = time.Now()
		maxRSS   int64
	)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
watch:
	for {
		select {
		case l, ok := <-ready:
			if !ok {
				break watch
			}
			line, readyAt = l, time.Now()
			lastGrow = readyAt
			ready = nil
		case <-tick.C:
		case <-ctx.Done():
			break watch
		}
		rss := procStatusKB(pid, "VmRSS:")
		if rss > maxRSS+2048 {
			maxRSS, lastGrow = rss, time.Now()
		}
		if rss > rssKillMiB<<10 {
			kill()
			break
		}
		if !readyAt.IsZero() && (time.Since(lastGrow) > 3*time.Second || time.Since(readyAt) > 30*time.Second) {
			break
		}
	}
	res.peakMiB = float64(procStatusKB(pid, "VmHWM:")) / 1024
	res.goroutines = -1
	if !res.killed && line != "" {
		// How many goroutines tunwall runs while the sandbox holds its
		// flows (SIGUSR1 prints them).
		cmd.Process.Signal(syscall.SIGUSR1)
		for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
			if i := strings.Index(stderr.String(), "tunwall: stats goroutines="); i >= 0 {
				fmt.Sscanf(stderr.String()[i:], "tunwall: stats goroutines=%d", &res.goroutines)
				break
			}
		}
	}
	stdin.Close()
	werr := cmd.Wait()
	res.stderr = stderr.String()
	if f := strings.Fields(line); len(f) == 4 {
		res.ok, _ = strconv.Atoi(f[1])
		res.failed, _ = strconv.Atoi(f[2])
		res.extra, _ = strconv.Atoi(f[3])
	}
	t.Logf("%s %d: tunwall peak RSS %.1f MiB, %d goroutines (%s; %d ok, %d failed, extra %d) in %v; exit %v",
		mode, n, res.peakMiB, res.goroutines, map[bool]string{true: "KILLED at the " + strconv.Itoa(rssKillMiB) + " MiB safety limit", false: "completed"}[res.killed],
		res.ok, res.failed, res.extra, time.Since(start).Round(time.Millisecond), werr)
	if res.failed > 0 {
		t.Logf("tunwall's stderr:\n%s", res.stderr)
	}
	if line == "" && !res.killed {
		t.Errorf("the load never reported ready\n%s", res.stderr)
	}
	return res
}

// procStatusKB reads one kB field of /proc/PID/status (0 if gone).
func procStatusKB(pid int, field string) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, field); ok {
			if f := strings.Fields(v); len(f) > 0 {
				kb, _ := strconv.ParseInt(f[0], 10, 64)
				return kb
			}
		}
	}
	return 0
}

// tarpit accepts TCP connections on addr in the world and never reads them:
// a slow sink. It holds every connection until the test ends.
func (w *world) tarpit(addr string) {
	t := w.t
	l, err := w.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		conns []net.Conn
	)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			if tc, ok := c.(*net.TCPConn); ok {
				tc.SetReadBuffer(4096)
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		<-done
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
	})
}

func TestPeakRSSStaysBoundedWhateverTheSandboxHolds(t *testing.T) {
	requireTools(t, "python3")
	raiseFDLimit(t, 1<<16) // the world's servers run in this process
	w := newWorld(t)
	// A tarpit port per load: the agent's side of the last load's
	// connections lingers in TIME_WAIT, holding ports to the old one.
	allow := []string{"--audit", "off", "--allow", "echo.test:7,19,12-14", "--allow", "echo.test:7/udp", "--allow", "allowed.test"}
	for _, c := range []struct {
		mode string
		n    int
		arg  string
		// all: the load must be admitted whole (the budget shrinks
		// buffers, it does not refuse ordinary loads). DNS over TCP is
		// served by a goroutine per connection (dnsintercept), which the
		// memory watch caps by refusing new flows.
		all bool
	}{
		{"idle", 16000, "12", true},
		{"download", 1200, "", true},
		{"upload", 16000, "13", true},
		{"tokens", 16000, "14", true},
		{"udp", 16000, "", true},
		{"dnstcp", 16000, "", false},
		{"dnsudp", 16000, "", true},
	} {
		t.Run(fmt.Sprintf("%s_%d", c.mode, c.n), func(t *testing.T) {
			w.t = t
			if c.arg != "" {
				w.tarpit(net.JoinHostPort(testworld.Echo4.String(), c.arg)) // closed when the subtest ends
			}
			r := w.peakUnderLoad(allow, c.mode, c.n, c.arg)
			if r.killed || r.peakMiB >= rssLimitMiB {
				t.Errorf("%s %d: tunwall peak RSS %.1f MiB, want < %d MiB", c.mode, c.n, r.peakMiB, rssLimitMiB)
			}
			// A TCP flow that waits holds no goroutine, whether or not the
			// name checks read it (before, two each).
			if tcp := c.mode != "udp" && !strings.HasPrefix(c.mode, "dns"); tcp && (r.goroutines < 0 || r.goroutines > max(500, c.n/20)) {
				t.Errorf("%s %d: tunwall runs %d goroutines while the sandbox holds its flows, want none per flow", c.mode, c.n, r.goroutines)
			}
			if c.all && r.ok < c.n*95/100 {
				t.Errorf("%s %d: only %d flows were set up, want (nearly) all", c.mode, c.n, r.ok)
			}
		})
	}
}

// raiseFDLimit raises this process's descriptor limit if it may, for the
// world's side of many connections. Children inherit it.
func raiseFDLimit(t *testing.T, n uint64) {
	t.Helper()
	var old syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &old); err != nil {
		t.Fatal(err)
	}
	if old.Cur >= n {
		return
	}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &syscall.Rlimit{Cur: n, Max: max(n, old.Max)}); err != nil {
		t.Logf("cannot raise RLIMIT_NOFILE to %d (%v): staying at %d", n, err, old.Cur)
		return
	}
	t.Cleanup(func() { syscall.Setrlimit(syscall.RLIMIT_NOFILE, &old) })
}

// rawPy builds raw TCP SYNs for the attacks below.
const rawPy = `
import os, random, socket, struct, subprocess, sys, time
random.seed(int(sys.argv[2]) if len(sys.argv) > 2 else 7)

def csum(b):
    if len(b) % 2:
        b += b"\0"
    s = sum(struct.unpack("!%dH" % (len(b) // 2), b))
    while s >> 16:
        s = (s & 0xffff) + (s >> 16)
    return ~s & 0xffff

def tcp_syn(ph, sport, dport):
    t = struct.pack("!HHIIBBHHH", sport, dport, random.getrandbits(32), 0, 5 << 4, 0x02, 65535, 0, 0)
    return t[:16] + struct.pack("!H", csum(ph + t)) + t[18:]

def syn4(src, dst, sport, dport):
    ph = socket.inet_aton(src) + socket.inet_aton(dst) + struct.pack("!BBH", 0, 6, 20)
    t = tcp_syn(ph, sport, dport)
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 40, 0, 0, 64, 6, 0, socket.inet_aton(src), socket.inet_aton(dst))
    return ip[:10] + struct.pack("!H", csum(ip)) + ip[12:] + t

def syn6(src, dst, sport, dport):
    s, d = socket.inet_pton(socket.AF_INET6, src), socket.inet_pton(socket.AF_INET6, dst)
    t = tcp_syn(s + d + struct.pack("!I3xB", 20, 6), sport, dport)
    return struct.pack("!IHBB", 6 << 28, 20, 6, 64) + s + d + t

def fake(name, fam=socket.AF_INET):
    return socket.getaddrinfo(name, 0, fam, socket.SOCK_STREAM)[0][4][0]

names = {}

def connect_ms(name, port, timeout=3):
    if name not in names:
        names[name] = fake(name) # not timed: a DNS query may be lost in a flood
    t0 = time.time()
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect((names[name], port))
        r = "ok"
    except socket.timeout:
        r = "hung"
    except ConnectionRefusedError:
        r = "refused"
    except OSError as e:
        r = "error " + str(e.errno)
    finally:
        s.close()
    return r, int((time.time() - t0) * 1000)

def until_connects(name, port, bound):
    t0 = time.time()
    while time.time() - t0 < bound:
        r, ms = connect_ms(name, port, 2)
        if r == "ok":
            return int((time.time() - t0) * 1000)
        if r == "refused":
            time.sleep(0.05)
    return -1

mode = sys.argv[1]
if mode == "spoof":
    dst4, dst6 = fake("echo.test"), fake("echo.test", socket.AF_INET6)
    names["allowed.test"] = fake("allowed.test")
    r4 = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
    r6 = socket.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_RAW)
    sent = 0
    for i in range(5000):
        src = socket.inet_ntoa(struct.pack("!I", random.getrandbits(32)))
        if src == "198.18.0.2":
            continue
        r4.sendto(syn4(src, dst4, random.randint(1024, 65535), 80), (dst4, 0))
        sent += 1
    for i in range(500):
        src = socket.inet_ntop(socket.AF_INET6, bytes([0x20, 0x01, 0x0d, 0xb8]) + random.getrandbits(96).to_bytes(12, "big"))
        r6.sendto(syn6(src, dst6, random.randint(1024, 65535), 80), (dst6, 0))
        sent += 1
    # (The connect's SYN may wait behind the flood in the TUN's queue, or be
    # dropped with it and retransmitted: seconds at most. Before the fix it
    # hung for two minutes.)
    r, ms = connect_ms("allowed.test", 80, 10)
    print("spoofed", sent, "then connect", r)
    print("connect took %d ms" % ms, file=sys.stderr)
elif mode == "handshakes":
    dst, n = fake("echo.test"), int(sys.argv[3])
    names["echo.test"] = dst
    # The sandbox's own kernel would answer the SYN-ACKs of these raw SYNs
    # with RSTs; drop them instead, so the handshakes are never completed.
    # (The local table's rule comes first, so it moves behind ours.)
    for rule in (["pref", "100", "iif", "tun0", "from", dst, "ipproto", "tcp", "sport", "80", "blackhole"],
                 ["pref", "101", "lookup", "local"]):
        subprocess.run(["ip", "rule", "add"] + rule, check=True)
    subprocess.run(["ip", "rule", "del", "pref", "0"], check=True)
    r = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
    for i in range(n):
        r.sendto(syn4("198.18.0.2", dst, 20000 + i, 80), (dst, 0))
        if i % 100 == 99:
            time.sleep(0.002) # (a TUN queue drops what its reader has not read yet)
    first, ms = connect_ms("echo.test", 81)
    print("flood", n, "first connect", first)
    print("first connect took %d ms" % ms, file=sys.stderr)
    ms = until_connects("echo.test", 81, 20)
    print("connects again after", ms, "ms")
`

func TestSpoofedSourcesAreDroppedBeforeTheStack(t *testing.T) {
	requireTools(t, "python3")
	w := newWorld(t)
	py := w.dir + "/raw.py"
	if err := os.WriteFile(py, []byte(rawPy), 0o644); err != nil {
		t.Fatal(err)
	}
	// 5,000 IPv4 and 500 IPv6 SYNs from random sources to an allowed name:
	// before the fix each took a handshake slot for two minutes, and the
	// next ordinary connect hung.
	r := w.mustRun(0, runOpts{
		flags:   []string{"--allow", "echo.test:80", "--allow", "allowed.test:80"},
		script:  "exec python3 " + py + " spoof",
		timeout: time.Minute,
	})
	wantLines(t, r, "spoofed 5500 then connect ok")
	// (A TUN whose queue is full drops packets before tunwall sees them,
	// so under load a few may never arrive to be counted.)
	var dropped int
	if i := strings.Index(r.stderr, "tunwall: dropped "); i < 0 {
		t.Errorf("the end-of-run summary does not count the spoofed packets:\n%s", r.stderr)
	} else if fmt.Sscanf(r.stderr[i:], "tunwall: dropped %d packets whose source address is not the sandbox's", &dropped); dropped < 4000 || dropped > 5500 {
		t.Errorf("dropped %d spoofed packets, want (nearly) the 5500 sent:\n%s", dropped, r.stderr)
	} else {
		t.Logf("dropped and counted %d of the 5500 spoofed packets", dropped)
	}
	for _, rec := range records(t, r.audit) {
		if rec.Kind == "flow" && !tun.DefaultAddr4.Contains(rec.Src.Addr()) && !tun.DefaultAddr6.Contains(rec.Src.Addr()) {
			t.Fatalf("a flow from a spoofed source reached the engine: %+v", rec)
		}
	}
}

func TestUnfinishedHandshakesFreeTheirSlotsWithinSeconds(t *testing.T) {
	requireTools(t, "python3", "ip")
	w := newWorld(t)
	py := w.dir + "/raw.py"
	if err := os.WriteFile(py, []byte(rawPy), 0o644); err != nil {
		t.Fatal(err)
	}
	// Holding handshakes open from its own address takes a sandbox that may
	// drop its own kernel's RSTs (CAP_NET_ADMIN in its namespace): not a
	// tunwall run command, but a namespace served by tunwall attach, such
	// as a container's, where root has it.
	ns := w.netns("twsyn")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd, _ := w.tunwallCmd(ctx, runOpts{
		flags: []string{"--netns", "/run/netns/" + ns, "--allow", "echo.test:80,81", "--max-tcp-handshakes", "1000",
			"--max-dials-per-dest", "100000", "--dial-rate", "0"}, // (this test is about the stack's limit, not the per-destination one)
	}, "attach")
	var log lrBuffer
	cmd.Stderr = &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer cmd.Process.Kill()
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(log.String(), "serving the namespace"); {
		select {
		case err := <-exited:
			t.Fatalf("tunwall attach exited (%v):\n%s", err, log.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("tunwall attach is not serving after 30s:\n%s", log.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	// 5,000 SYNs from the namespace's own address whose handshakes it never
	// completes: they may hold slots for a few seconds at most, SYNs
	// beyond the handshake limit are reset at once, and ordinary connects
	// work again within seconds.
	b, err := exec.CommandContext(ctx, "ip", "netns", "exec", ns, "python3", py, "handshakes", "7", "5000").CombinedOutput()
	floodEnd := time.Now()
	// Every slot the flood took is free again within the handshake timeout
	// (5s) and a margin: tunwall's own counters (SIGUSR1) say no handshake
	// is in flight and the unfinished ones timed out.
	freed := false
	for deadline := floodEnd.Add(15 * time.Second); err == nil && time.Now().Before(deadline); {
		if st := lrLastStats(t, cmd.Process.Pid, &log); st["tcp_inflight"] == 0 && st["handshake_timeouts"] > 0 {
			freed = true
			t.Logf("every handshake slot free %v after the flood: %v timed out", time.Since(floodEnd).Round(time.Millisecond), st["handshake_timeouts"])
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	cmd.Process.Signal(syscall.SIGTERM)
	werr := <-exited
	r := result{stdout: string(b), stderr: log.String()}
	if err != nil || werr != nil {
		t.Fatalf("flood: %v; attach: %v\n%s", err, werr, r)
	}
	if !freed {
		t.Errorf("the flood's handshake slots were not all free (and timed out) within 15s of it:\n%s", r)
	}
	out := lines(r.stdout)
	// Fail fast, not hang: the first connect during the flood is refused
	// (RST), or gets a freed slot; before the fix it hung.
	if len(out) < 2 || out[0] != "flood 5000 first connect refused" && out[0] != "flood 5000 first connect ok" {
		t.Fatalf("the first connect during the flood must be refused or succeed, not hang\n%s", r)
	}
	var ms int
	if _, err := fmt.Sscanf(out[len(out)-1], "connects again after %d ms", &ms); err != nil || ms < 0 || ms > 9000 {
		t.Fatalf("ordinary connects must work again within the handshake timeout (5s) and a margin\n%s", r)
	}
	t.Logf("ordinary connects worked again %d ms after the flood", ms)
	for _, want := range []string{"TCP handshakes already in progress", "TCP handshakes were not completed by the sandbox within"} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("the end-of-run summary does not say %q:\n%s", want, r.stderr)
		}
	}
}
