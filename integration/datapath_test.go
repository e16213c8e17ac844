package integration

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tunwall/tunwall/internal/testworld"
)

func TestTCPAndUDPOverIPv4AndIPv6(t *testing.T) {
	requireTools(t, "curl", "python3")
	w := newWorld(t)
	r := w.mustRun(0, runOpts{
		flags: []string{"--allow", "allowed.test:80", "--allow", "echo.test:7/udp", "--allow", "192.0.2.20:80", "--allow", "[2001:db8::20]:80"},
		script: `set -e
curl -sS -4 http://allowed.test/v4
curl -sS -6 http://allowed.test/v6
printf 'ping' | curl -sS --max-time 5 telnet://192.0.2.20:80 | head -c3; echo
printf 'ping' | curl -sS --max-time 5 'telnet://[2001:db8::20]:80' | head -c3; echo
python3 - <<'PY'
import socket
for fam, host in ((socket.AF_INET, "echo.test"), (socket.AF_INET6, "echo.test")):
    addr = socket.getaddrinfo(host, 7, fam, socket.SOCK_DGRAM)[0][4]
    s = socket.socket(fam, socket.SOCK_DGRAM)
    s.settimeout(5)
    s.connect(addr)
    s.send(b"datagram over %d" % fam)
    print(s.recv(100).decode())
PY`,
	})
	wantLines(t, r,
		"web allowed.test /v4",
		"web allowed.test /v6",
		"ok",
		"ok",
		fmt.Sprintf("datagram over %d", syscall.AF_INET),
		fmt.Sprintf("datagram over %d", syscall.AF_INET6),
	)
}

// streamHash is the SHA-256 of the first n bytes of testworld.Stream(seed).
func streamHash(seed uint64, n int64) string {
	h := sha256.New()
	io.Copy(h, io.LimitReader(testworld.Stream(seed), n))
	return hex.EncodeToString(h.Sum(nil))
}

func TestTransfer256MiBBothWaysByteForByte(t *testing.T) {
	requireTools(t, "curl", "sha256sum")
	w := newWorld(t)
	const n = 256 << 20
	up := filepath.Join(w.dir, "upload.bin")
	f, err := os.Create(up)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(f, io.LimitReader(testworld.Stream(2), n)); err != nil {
		t.Fatal(err)
	}
	f.Close()
	os.Chmod(up, 0o644)
	r := w.mustRun(0, runOpts{
		flags: []string{"--allow", "allowed.test:80"},
		script: fmt.Sprintf(`set -e
curl -sS --fail http://allowed.test/bytes/%d | sha256sum | cut -d' ' -f1
curl -sS --fail -X POST -T %s http://allowed.test/sha256`, n, up),
	})
	wantLines(t, r, streamHash(1, n), fmt.Sprintf("%d %s", n, streamHash(2, n)))
	var in, out int64
	for _, rec := range records(t, r.audit) {
		if rec.Kind == "flow" {
			in += rec.BytesIn
			out += rec.BytesOut
		}
	}
	if in < n || out < n {
		t.Errorf("audit bytes: in %d, out %d; want both >= %d", in, out, n)
	}
}

func TestThreeHundredConcurrentConnections(t *testing.T) {
	requireTools(t, "python3")
	w := newWorld(t)
	r := w.mustRun(0, runOpts{
		flags: []string{"--allow", "echo.test:7"},
		script: `python3 - <<'PY'
import socket, sys
N = 300
conns = []
for i in range(N):
    s = socket.create_connection(("echo.test", 7), timeout=20)
    conns.append(s)
# every connection is open at once; now use them all
for i, s in enumerate(conns):
    s.sendall(b"connection %05d\n" % i)
bad = 0
for i, s in enumerate(conns):
    want = b"connection %05d\n" % i
    got = b""
    while len(got) < len(want):
        chunk = s.recv(len(want) - len(got))
        if not chunk:
            break
        got += chunk
    if got != want:
        bad += 1
for s in conns:
    s.close()
print("%d open, %d bad" % (len(conns), bad))
PY`,
	})
	wantLines(t, r, "300 open, 0 bad")
}

func TestFiveThousandConnectionsWhereTheServerClosesFirst(t *testing.T) {
	requireTools(t, "python3")
	w := newWorld(t)
	// The server answers and closes first, so tunwall's side of each
	// connection ends in TIME_WAIT; a new SYN that reuses a 4-tuple still in
	// TIME_WAIT must not hang.
	r := w.mustRun(0, runOpts{
		flags:   []string{"--allow", "echo.test:81", "--quiet"},
		timeout: 5 * time.Minute,
		script: `python3 - <<'PY'
import socket
ip = socket.getaddrinfo("echo.test", 81, socket.AF_INET)[0][4][0]
ok = hung = bad = 0
for i in range(5000):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(5)
    try:
        s.connect((ip, 81))
        s.sendall(b"x")
        data = b""
        while True:
            chunk = s.recv(16)
            if not chunk:
                break
            data += chunk
        if data == b"ok\n":
            ok += 1
        else:
            bad += 1
    except socket.timeout:
        hung += 1
    except OSError:
        bad += 1
    finally:
        s.close()
print("%d ok, %d hung, %d failed" % (ok, hung, bad))
PY`,
	})
	wantLines(t, r, "5000 ok, 0 hung, 0 failed")
}

func TestRefusedUpstreamIsRefusedInTheSandbox(t *testing.T) {
	requireTools(t, "curl")
	w := newWorld(t)
	// Dial first: the sandbox's handshake completes only if the upstream's
	// does, so a refusal is an RST at once (curl exit 7), not a timeout (28).
	r := w.mustRun(0, runOpts{
		flags: []string{"--allow", "refused.test:80", "--allow", "192.0.2.30:80"},
		script: `curl -sS --max-time 20 http://refused.test/ 2>/dev/null; echo "by name: $?"
curl -sS --max-time 20 http://192.0.2.30/ 2>/dev/null; echo "by ip: $?"`,
	})
	wantLines(t, r, "by name: 7", "by ip: 7")
	var n int
	for _, rec := range records(t, r.audit) {
		if rec.Kind != "flow" {
			continue
		}
		n++
		if rec.Verdict != "allow" || !strings.Contains(rec.Reason, "upstream unreachable") || !strings.Contains(rec.Reason, "refused") {
			t.Errorf("flow record does not say the allowed upstream refused: %+v", rec)
		}
	}
	if n < 2 {
		t.Errorf("want a flow record per attempt (at least 2), got %d", n)
	}
}

func TestDeniedDestinationsFailFastAndNeverArrive(t *testing.T) {
	requireTools(t, "curl", "python3")
	w := newWorld(t)
	r := w.mustRun(0, runOpts{
		flags: []string{"--allow", "allowed.test:443"},
		script: `curl -sS --max-time 20 http://192.0.2.66/ 2>/dev/null; echo "raw ipv4: $?"
curl -sS --max-time 20 'http://[2001:db8::66]/' 2>/dev/null; echo "raw ipv6: $?"
curl -sS --max-time 20 http://evil.test/ 2>/dev/null; echo "name: $?"
python3 - <<'PY'
import socket
for fam, ip in ((socket.AF_INET, "192.0.2.66"), (socket.AF_INET6, "2001:db8::66")):
    s = socket.socket(fam, socket.SOCK_DGRAM)
    s.settimeout(10)
    s.connect((ip, 7))
    s.send(b"exfil")
    try:
        s.recv(100)
        print("udp answered")
    except ConnectionRefusedError:
        print("udp refused")
    except socket.timeout:
        print("udp timed out")
PY`,
	})
	wantLines(t, r, "raw ipv4: 7", "raw ipv6: 7", "name: 6", "udp refused", "udp refused")
	w.noArrivals("evil")
	if w.DNS.Asked("evil.test") {
		t.Error("the denied name evil.test reached the world's resolver")
	}
}

func TestExitCodeIsTheCommands(t *testing.T) {
	w := newWorld(t)
	opts := runOpts{flags: []string{"--allow", "allowed.test", "--quiet"}}
	for _, c := range []struct {
		name string
		argv []string
		want int
	}{
		{"a plain exit status", []string{"sh", "-c", "exit 7"}, 7},
		{"success", []string{"true"}, 0},
		{"killed by SIGKILL is 128+9", []string{"sh", "-c", "kill -9 $$"}, 137},
		{"killed by SIGTERM is 128+15", []string{"sh", "-c", "kill -TERM $$"}, 143},
		{"a missing command is 127", []string{"no-such-command-tunwall"}, 127},
	} {
		t.Run(c.name, func(t *testing.T) {
			o := opts
			o.argv = c.argv
			w.t = t
			w.mustRun(c.want, o)
		})
	}
}

func TestSandboxHasOnlyLoopbackAndOneTUN(t *testing.T) {
	w := newWorld(t)
	r := w.mustRun(0, runOpts{
		flags:  []string{"--allow", "allowed.test"},
		script: `ip -o link show | awk -F': ' '{print $2}'; ip -4 route show; ip -6 route show default | cut -d' ' -f1-3; id -u`,
	})
	wantLines(t, r, "lo", "tun0", "default dev tun0 src 198.18.0.2 mtu 65520", "default dev tun0", "0")
}

func TestSignalsAreForwardedToTheCommand(t *testing.T) {
	w := newWorld(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd, _ := w.tunwallCmd(ctx, runOpts{
		flags:  []string{"--allow", "allowed.test", "--quiet"},
		script: `trap 'echo got TERM; exit 42' TERM; echo ready; while :; do sleep 0.05; done`,
	}, "run")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(out)
	if line, _ := br.ReadString('\n'); line != "ready\n" {
		t.Fatalf("want ready, got %q", line)
	}
	cmd.Process.Signal(syscall.SIGTERM)
	rest, _ := io.ReadAll(br)
	err = cmd.Wait()
	if cmd.ProcessState.ExitCode() != 42 || string(rest) != "got TERM\n" {
		t.Fatalf("want exit 42 and 'got TERM', got %v %q", err, rest)
	}
}

// descendants lists the pids below pid (host pids), by /proc children.
func descendants(pid int) []int {
	var out []int
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	for _, f := range tasks {
		b, _ := os.ReadFile(f)
		for _, s := range strings.Fields(string(b)) {
			if c, err := strconv.Atoi(s); err == nil {
				out = append(out, c)
				out = append(out, descendants(c)...)
			}
		}
	}
	return out
}

func TestSIGKILLOfTunwallLeavesNoNetworkAndNoProcess(t *testing.T) {
	requireTools(t, "curl")
	w := newWorld(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	probe := filepath.Join(w.dir, "probe.log")
	cmd, _ := w.tunwallCmd(ctx, runOpts{
		flags: []string{"--allow", "allowed.test:80", "--quiet"},
		// A loop that keeps using the network and logs each result.
		script: fmt.Sprintf(`echo ready; while :; do curl -s -o /dev/null -w '%%{http_code}\n' --max-time 1 http://allowed.test/ >> %s; sleep 0.05; done`, probe),
	}, "run")
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if line, _ := bufio.NewReader(out).ReadString('\n'); line != "ready\n" {
		t.Fatalf("want ready, got %q", line)
	}
	// Wait (bounded) until the probe has been through at least once.
	for i := 0; i < 100; i++ {
		if b, _ := os.ReadFile(probe); strings.Contains(string(b), "200") {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if b, _ := os.ReadFile(probe); !strings.Contains(string(b), "200") {
		t.Fatalf("the sandbox never reached allowed.test: %q", b)
	}
	pids := descendants(cmd.Process.Pid)
	if len(pids) < 2 {
		t.Fatalf("expected sandbox processes under tunwall, found %v", pids)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(fmt.Sprintf("/proc/%d/ns/net", pids[0]), &st); err != nil {
		t.Fatal(err)
	}
	netns := st.Ino
	cmd.Process.Kill()
	cmd.Wait()
	deadline := time.Now().Add(5 * time.Second)
	for {
		var alive []int
		for _, p := range pids {
			if _, err := os.Stat(fmt.Sprintf("/proc/%d", p)); err == nil {
				alive = append(alive, p)
			}
		}
		if len(alive) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox processes %v outlived tunwall's SIGKILL", alive)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Nothing is left in the sandbox's network namespace.
	all, _ := filepath.Glob("/proc/[0-9]*/ns/net")
	for _, p := range all {
		if err := syscall.Stat(p, &st); err == nil && st.Ino == netns {
			t.Errorf("%s is still in the sandbox's network namespace", p)
		}
	}
}

func TestRootlessRunAsAnUnprivilegedUser(t *testing.T) {
	requireTools(t, "curl", "setpriv")
	w := newWorld(t)
	// /dev/net/tun is 0666 on most distributions; this machine ships 0600.
	if err := os.Chmod("/dev/net/tun", 0o666); err != nil {
		t.Fatal(err)
	}
	r := w.mustRun(0, runOpts{
		asUser: 65534,
		flags:  []string{"--allow", "allowed.test:80"},
		script: `id -u; curl -sS http://allowed.test/rootless; curl -sS --max-time 10 http://evil.test/ 2>/dev/null; echo "denied: $?"`,
	})
	wantLines(t, r, "0", "web allowed.test /rootless", "denied: 6")
	fi, err := os.Stat(r.audit)
	if err != nil {
		t.Fatal(err)
	}
	if uid := fi.Sys().(*syscall.Stat_t).Uid; uid != 65534 {
		t.Errorf("audit log owned by uid %d, want 65534", uid)
	}
	w.noArrivals("evil")
}

func TestMalformedPacketsAreDroppedAndCounted(t *testing.T) {
	requireTools(t, "curl", "python3")
	w := newWorld(t)
	r := w.mustRun(0, runOpts{
		flags: []string{"--allow", "allowed.test:80"},
		script: `python3 - <<'PY'
import socket, struct, random
random.seed(7)
s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
def ip4(proto, payload, ihl=5, total=None, dst="192.0.2.10"):
    total = total if total is not None else 20 + len(payload)
    h = struct.pack("!BBHHHBBH4s4s", (4 << 4) | ihl, 0, total, 1, 0, 64, proto, 0,
                    socket.inet_aton("198.18.0.2"), socket.inet_aton(dst))
    return h + payload
bad = [
    ip4(6, b"\x00" * 3),                      # TCP header cut short
    ip4(17, b"\x00\x35\x00\x35\x00\x04\x00\x00"),   # UDP length smaller than its header
    ip4(6, bytes(random.getrandbits(8) for _ in range(40))),  # garbage TCP, bad checksum
    ip4(1, b"\x08"),                          # ICMP echo cut short
    ip4(6, b"\x00" * 20, total=9000),         # total length beyond the packet
]
n = 0
for p in bad:
    try:
        s.sendto(p, ("192.0.2.10", 0)); n += 1
    except OSError as e:
        pass
print("sent", n >= 3)
PY
curl -sS http://allowed.test/still-fine`,
	})
	wantLines(t, r, "sent True", "web allowed.test /still-fine")
	if !strings.Contains(r.stderr, "malformed") {
		t.Errorf("the end-of-run summary does not count malformed packets:\n%s", r.stderr)
	}
}

// TestVirtioNetHeadersCraftedInTheSandboxAreNeverTrusted writes packets
// with virtio-net headers of the sandbox's own making into its TUN (an
// AF_PACKET socket with PACKET_VNET_HDR on tun0, as root in the sandbox can):
// segment sizes of 1 and beyond the packet, TCP segmentation of UDP and of
// the other IP version, checksum positions past the end and inside the IP
// header. The sandbox's kernel refuses some and rewrites the header of the
// others from what it kept; tunwall must drop what does not fit, keep
// serving, and never segment or checksum by a header it was handed (the
// header checks themselves: stack/internal/tunlink, fuzzed).
func TestVirtioNetHeadersCraftedInTheSandboxAreNeverTrusted(t *testing.T) {
	requireTools(t, "curl", "python3")
	w := newWorld(t)
	r := w.mustRun(0, runOpts{
		flags: []string{"--allow", "allowed.test:80"},
		script: `python3 - <<'PY'
import socket, struct
SOL_PACKET, PACKET_VNET_HDR = 263, 15
def vnet(flags=0, gso=0, hdr_len=0, gso_size=0, start=0, off=0):
    return struct.pack("<BBHHHH", flags, gso, hdr_len, gso_size, start, off)
def ip4(proto, payload, dst="192.0.2.10"):
    h = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(payload), 1, 0, 64, proto, 0,
                    socket.inet_aton("198.18.0.2"), socket.inet_aton(dst))
    return h + payload
def ip6(nh, payload):
    return struct.pack("!IHBB16s16s", 6 << 28, len(payload), nh, 64,
                       socket.inet_pton(socket.AF_INET6, "fd74:756e:7761:6c6c::2"),
                       socket.inet_pton(socket.AF_INET6, "2001:db8::10")) + payload
tcp = struct.pack("!HHIIBBHHH", 40000, 80, 1, 0, 5 << 4, 0x10, 65535, 0, 0) + b"x" * 3000
udp = struct.pack("!HHHH", 40000, 53, 8 + 3000, 0) + b"y" * 3000
crafted = [
    vnet(1, 1, 40, 1, 20, 16) + ip4(6, tcp),          # TSO by 1-byte segments
    vnet(1, 1, 40, 9000, 20, 16) + ip4(6, tcp),       # segment size beyond the packet
    vnet(0, 1, 28, 1000) + ip4(17, udp),              # TCP segmentation of UDP
    vnet(1, 4, 40, 1000, 20, 16) + ip4(6, tcp),       # TCPv6 segmentation of IPv4
    vnet(1, 1, 60, 1000, 40, 16) + ip6(6, tcp),       # TCPv4 segmentation of IPv6
    vnet(1, 5, 28, 1000, 20, 6) + ip4(17, udp),       # UDP segmentation (not offered)
    vnet(1, 0, 0, 0, 3015, 16) + ip4(6, tcp),         # checksum past the end
    vnet(1, 0, 0, 0, 2, 0) + ip4(6, tcp),             # checksum inside the IP header
    vnet(0xfe, 0, 0, 0) + ip4(6, tcp),                # unknown flags
    vnet(0, 0x80, 0, 0) + ip4(6, tcp),                # ECN without segmentation
]
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
s.setsockopt(SOL_PACKET, PACKET_VNET_HDR, 1)
sent = 0
for i in range(20):
    for p in crafted:
        proto = 0x86DD if p[10] >> 4 == 6 else 0x0800
        try:
            s.sendto(p, ("tun0", proto)); sent += 1
        except OSError:
            pass
import sys
print("crafted", len(crafted) * 20, "accepted by the kernel", sent, file=sys.stderr)
print("crafted done")
PY
curl -sS http://allowed.test/after-crafted-headers`,
	})
	wantLines(t, r, "crafted done", "web allowed.test /after-crafted-headers")
	// What the kernel let through and what tunwall dropped, for the log:
	// the kernel refuses some of these and rewrites the header of the rest
	// from the packet it kept (6.18: none of them reaches tunwall with a
	// header its checks refuse; the checks are for a kernel that would).
	for _, l := range strings.Split(r.stderr, "\n") {
		if strings.HasPrefix(l, "crafted") || strings.Contains(l, "malformed") {
			t.Log(l)
		}
	}
}

func TestRootlessWithoutTUNAccessSaysHowToFixIt(t *testing.T) {
	requireTools(t, "setpriv")
	w := newWorld(t)
	if err := os.Chmod("/dev/net/tun", 0o600); err != nil {
		t.Fatal(err)
	}
	defer os.Chmod("/dev/net/tun", 0o666)
	r := w.mustRun(125, runOpts{asUser: 65534, flags: []string{"--allow", "allowed.test"}, script: "echo the command ran"})
	if strings.Contains(r.stdout, "the command ran") || !strings.Contains(r.stderr, "chmod 0666 /dev/net/tun") {
		t.Fatalf("want a refusal that says how to fix it\n%s", r)
	}
}
