package integration

// Attacks on the ways out that the red-team issue "Close the ways out" found
// in the guard, the upstream proxy path, attach, the CLI and tunwall socks:
//
//   - an allowed name that resolves to a forbidden address, reached through
//     an --upstream SOCKS5 proxy that resolves names itself;
//   - a namespace with a down link (or one that gains a link while served)
//     handed to tunwall attach;
//   - addresses that embed or name forbidden ones (Teredo, SIIT, local-use
//     NAT64, IETF protocol assignments);
//   - control characters and escapes in names that reach tunwall's stderr;
//   - flags after the command (--learn, --allow, --audit off) and repeated
//     flags;
//   - SIGTERM and SIGHUP while tunwall socks has a flow open.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tunwall/tunwall/internal/audit"
	"github.com/tunwall/tunwall/internal/testworld"
)

// plainSocksPy is a SOCKS5 proxy with no policy at all, like many a
// corporate egress proxy: it resolves names itself (through the world's
// resolver) and connects wherever it is told. It logs every request it gets,
// one JSON object per line, to the file named by argv[2].
const plainSocksPy = `
import json, socket, struct, sys, threading, select

PORT = int(sys.argv[1])
LOG = open(sys.argv[2], "a", buffering=1)
LOCK = threading.Lock()

def log(**kw):
    with LOCK:
        LOG.write(json.dumps(kw) + "\n")

def resolve(name):
    q = struct.pack(">HHHHHH", 0x2a2a, 0x0100, 1, 0, 0, 0)
    for label in name.rstrip(".").split("."):
        q += bytes([len(label)]) + label.encode()
    q += b"\x00" + struct.pack(">HH", 1, 1)
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(3)
    s.sendto(q, ("192.0.2.53", 53))
    r = s.recv(4096)
    s.close()
    an = struct.unpack(">H", r[6:8])[0]
    i = 12
    while r[i] != 0:
        i += 1 + r[i]
    i += 5
    for _ in range(an):
        if r[i] & 0xC0 == 0xC0:
            i += 2
        else:
            while r[i] != 0:
                i += 1 + r[i]
            i += 1
        typ, _, _, rdlen = struct.unpack(">HHIH", r[i:i + 10])
        i += 10
        if typ == 1 and rdlen == 4:
            return socket.inet_ntoa(r[i:i + 4])
        i += rdlen
    raise OSError("no A record for " + name)

def read_addr(buf, i):
    atyp = buf[i]
    if atyp == 1:
        host, kind, i = socket.inet_ntoa(buf[i + 1:i + 5]), "ipv4", i + 5
    elif atyp == 4:
        host, kind, i = socket.inet_ntop(socket.AF_INET6, buf[i + 1:i + 17]), "ipv6", i + 17
    elif atyp == 3:
        n = buf[i + 1]
        host, kind, i = buf[i + 2:i + 2 + n].decode(), "name", i + 2 + n
    else:
        raise OSError("bad atyp")
    port = struct.unpack(">H", buf[i:i + 2])[0]
    return kind, host, port, i + 2

def recvn(c, n):
    b = b""
    while len(b) < n:
        d = c.recv(n - len(b))
        if not d:
            raise OSError("eof")
        b += d
    return b

def target(kind, host):
    if kind == "name":
        return resolve(host)
    return host

def pipe(a, b):
    try:
        while True:
            d = a.recv(65536)
            if not d:
                break
            b.sendall(d)
    except OSError:
        pass
    for s in (a, b):
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

def handle(c):
    try:
        n = recvn(c, 2)[1]
        recvn(c, n)
        c.sendall(b"\x05\x00")
        head = recvn(c, 4)
        cmd, atyp = head[1], head[3]
        if atyp == 1:
            rest = recvn(c, 6)
        elif atyp == 4:
            rest = recvn(c, 18)
        else:
            ln = recvn(c, 1)
            rest = ln + recvn(c, ln[0] + 2)
        kind, host, port, _ = read_addr(head[3:4] + rest, 0)
        if cmd == 1:
            log(cmd="connect", kind=kind, host=host, port=port)
            try:
                ip = target(kind, host)
                fam = socket.AF_INET6 if ":" in ip else socket.AF_INET
                u = socket.create_connection((ip, port), timeout=5)
            except OSError:
                c.sendall(b"\x05\x04\x00\x01" + b"\x00" * 6)
                return
            c.sendall(b"\x05\x00\x00\x01" + b"\x00" * 6)
            threading.Thread(target=pipe, args=(u, c), daemon=True).start()
            pipe(c, u)
        elif cmd == 3:
            relay = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            relay.bind(("127.0.0.1", 0))
            out = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            c.sendall(b"\x05\x00\x00\x01" + socket.inet_aton("127.0.0.1") + struct.pack(">H", relay.getsockname()[1]))
            client, hdr = None, None
            while True:
                r, _, _ = select.select([c, relay, out], [], [], 30)
                if not r or c in r and not c.recv(1):
                    break
                if relay in r:
                    d, client = relay.recvfrom(65536)
                    kind, host, port, i = read_addr(d, 3)
                    log(cmd="udp", kind=kind, host=host, port=port)
                    hdr = d[:i]
                    try:
                        out.sendto(d[i:], (target(kind, host), port))
                    except OSError:
                        pass
                if out in r:
                    d, _ = out.recvfrom(65536)
                    if client:
                        relay.sendto(hdr + d, client)
        else:
            c.sendall(b"\x05\x07\x00\x01" + b"\x00" * 6)
    except OSError:
        pass
    finally:
        c.close()

srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("127.0.0.1", PORT))
srv.listen(64)
print("plain socks ready", flush=True)
while True:
    c, _ = srv.accept()
    threading.Thread(target=handle, args=(c,), daemon=True).start()
`

// socksRequest is one line of plainSocksPy's log.
type socksRequest struct {
	Cmd  string `json:"cmd"`
	Kind string `json:"kind"`
	Host string `json:"host"`
	Port int    `json:"port"`
}

// startPlainSocks runs plainSocksPy in the agent namespace on port and
// returns the path of its request log.
func (w *world) startPlainSocks(ctx context.Context, port int) string {
	w.t.Helper()
	script := filepath.Join(w.dir, "plain-socks.py")
	if err := os.WriteFile(script, []byte(plainSocksPy), 0o644); err != nil {
		w.t.Fatal(err)
	}
	logPath := filepath.Join(w.dir, fmt.Sprintf("plain-socks-%d.jsonl", port))
	cmd := w.AgentCommand(ctx, "python3", script, fmt.Sprint(port), logPath)
	out, err := cmd.StdoutPipe()
	if err != nil {
		w.t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		w.t.Fatal(err)
	}
	w.t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	ready := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(out)
		ready <- sc.Scan() && strings.Contains(sc.Text(), "ready")
		for sc.Scan() {
		}
	}()
	select {
	case ok := <-ready:
		if !ok {
			w.t.Fatal("the plain SOCKS proxy did not start")
		}
	case <-time.After(20 * time.Second):
		w.t.Fatal("the plain SOCKS proxy did not start within 20s")
	}
	return logPath
}

func readSocksLog(t *testing.T, path string) []socksRequest {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	var out []socksRequest
	for _, l := range lines(string(b)) {
		var r socksRequest
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatalf("%s: %v", l, err)
		}
		out = append(out, r)
	}
	return out
}

// Item 5: with --upstream, the rebinding guard still holds. The proxy here
// would connect anywhere, so only tunwall can stop an allowed name that
// resolves to a private, metadata or loopback address.
func TestUpstreamProxyKeepsTheRebindingGuard(t *testing.T) {
	requireTools(t, "curl", "python3")
	w := newWorld(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	proxyLog := w.startPlainSocks(ctx, 1090)
	r := w.mustRun(0, runOpts{
		flags: []string{
			"--upstream", "socks5://127.0.0.1:1090",
			"--allow", "allowed.test:80",
			"--allow", "rebind-private.test:80", "--allow", "rebind-metadata.test:80",
			"--allow", "rebind-lo.test:8081", "--allow", "rebind-mapped.test:8081",
			"--allow", "rebind-private.test:7/udp", "--allow", "echo.test:7/udp",
		},
		script: `curl -sS --max-time 10 http://allowed.test/through-proxy
for n in rebind-private rebind-metadata; do curl -sS --max-time 10 http://$n.test/ 2>/dev/null; echo "$n: $?"; done
for n in rebind-lo rebind-mapped; do curl -sS --max-time 10 http://$n.test:8081/ 2>/dev/null; echo "$n: $?"; done
python3 - <<'PY'
import socket
for name in ("echo.test", "rebind-private.test"):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(3)
    s.connect((name, 7))
    try:
        s.send(b"udp via upstream")
        print(name, s.recv(100).decode())
    except OSError as e:
        print(name, "refused")
PY`,
	})
	wantLines(t, r, "web allowed.test /through-proxy",
		"rebind-private: 7", "rebind-metadata: 7", "rebind-lo: 7", "rebind-mapped: 7",
		"echo.test udp via upstream", "rebind-private.test refused")
	w.noArrivals("private", "metadata", "agent-lo", "agent-veth")

	// The proxy was only ever given checked addresses, never a name it
	// could resolve again.
	reqs := readSocksLog(t, proxyLog)
	if len(reqs) == 0 {
		t.Fatal("the proxy saw no request at all")
	}
	for _, q := range reqs {
		ip, err := netip.ParseAddr(q.Host)
		if q.Kind == "name" || err != nil {
			t.Errorf("the proxy was sent a name, which it resolves itself: %+v", q)
			continue
		}
		if ip != testworld.Web4 && ip != testworld.Web6 && ip != testworld.Echo4 && ip != testworld.Echo6 {
			t.Errorf("the proxy was sent %s, which is neither allowed.test's nor echo.test's address: %+v", ip, q)
		}
	}
	dialled := map[string]netip.AddrPort{}
	for _, f := range polFlows(t, r.audit, func(audit.Record) bool { return true }) {
		if strings.HasPrefix(f.Host, "rebind-") {
			if f.Verdict != audit.VerdictDeny || f.Rule != "guard" || f.Dial.IsValid() {
				t.Errorf("%s through the upstream should be denied by the guard, undialled: %+v", f.Host, f)
			}
			continue
		}
		dialled[f.Host+"/"+f.Proto] = f.Dial
	}
	if d := dialled["allowed.test/tcp"]; d != netip.AddrPortFrom(testworld.Web4, 80) && d != netip.AddrPortFrom(testworld.Web6, 80) {
		t.Errorf("allowed.test's record should name the address sent to the proxy, got dial %v", d)
	}
	if d := dialled["echo.test/udp"]; d != netip.AddrPortFrom(testworld.Echo4, 7) && d != netip.AddrPortFrom(testworld.Echo6, 7) {
		t.Errorf("echo.test's record should name the address sent to the proxy, got dial %v", d)
	}
}

// Item 6: attach serves only a namespace whose only exit is tunwall.
func TestAttachRefusesANamespaceWithADownLink(t *testing.T) {
	w := newWorld(t)
	ns := w.netns("twdown")
	mustCmd(t, "ip", "-n", ns, "link", "add", "down0", "type", "veth", "peer", "name", "down1")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd, _ := w.tunwallCmd(ctx, runOpts{flags: []string{"--netns", "/run/netns/" + ns, "--allow", "allowed.test"}}, "attach")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		cmd.Process.Signal(syscall.SIGTERM)
		<-done
		t.Fatalf("attach served a namespace with a down veth (the job can bring it up later):\n%s", out.String())
	}
	if code := cmd.ProcessState.ExitCode(); code != 125 || !strings.Contains(out.String(), "down0") || !strings.Contains(out.String(), "--force") {
		t.Fatalf("want exit 125 naming down0 and --force, got %d:\n%s", code, out.String())
	}
	if got, _ := exec.Command("ip", "-n", ns, "-o", "link", "show", "tun0").CombinedOutput(); !strings.Contains(string(got), "does not exist") {
		t.Errorf("a TUN was left behind: %s", got)
	}
}

func TestAttachForceServesANamespaceWithADownLink(t *testing.T) {
	requireTools(t, "curl")
	w := newWorld(t)
	ns := w.netns("twforce")
	mustCmd(t, "ip", "-n", ns, "link", "add", "down0", "type", "veth", "peer", "name", "down1")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd, _, log := w.startBackground(ctx, "attach", runOpts{
		flags: []string{"--netns", "/run/netns/" + ns, "--force", "--allow", "allowed.test:80"},
	}, "serving the namespace")
	out, _ := exec.CommandContext(ctx, "ip", "netns", "exec", ns, "curl", "-sS", "--max-time", "10", "http://allowed.test/forced").CombinedOutput()
	if string(out) != "web allowed.test /forced\n" {
		t.Errorf("with --force the namespace should be served, curl said %q\n%s", out, log)
	}
	cmd.Process.Signal(syscall.SIGTERM)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("attach --force after SIGTERM: %v\n%s", err, log)
	}
}

func TestAttachStopsWhenTheNamespaceGainsAWayOut(t *testing.T) {
	requireTools(t, "curl")
	for _, c := range []struct {
		name  string
		force bool
		setup func(t *testing.T, w *world, ns string)
		link  string
	}{
		{"a veth made inside", false, func(t *testing.T, w *world, ns string) {
			mustCmd(t, "ip", "-n", ns, "link", "add", "sneak0", "type", "veth", "peer", "name", "sneak1")
		}, "interface sneak"},
		{"a veth moved in from outside", false, func(t *testing.T, w *world, ns string) {
			mustCmd(t, "ip", "-n", w.AgentNS, "link", "add", "moved0", "type", "veth", "peer", "name", "moved1")
			mustCmd(t, "ip", "-n", w.AgentNS, "link", "set", "moved0", "netns", ns)
		}, "interface moved0"},
		{"a bridge, with --force", true, func(t *testing.T, w *world, ns string) {
			mustCmd(t, "ip", "-n", ns, "link", "add", "br9", "type", "bridge")
		}, "interface br9 (bridge)"},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := newWorld(t)
			ns := w.netns("twgain")
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			flags := []string{"--netns", "/run/netns/" + ns, "--allow", "allowed.test:80"}
			if c.force {
				flags = append(flags, "--force")
			}
			cmd, auditPath, log := w.startBackground(ctx, "attach", runOpts{flags: flags}, "serving the namespace")
			if out, _ := exec.CommandContext(ctx, "ip", "netns", "exec", ns, "curl", "-sS", "--max-time", "10", "http://allowed.test/before").CombinedOutput(); string(out) != "web allowed.test /before\n" {
				t.Fatalf("not served before the link appeared: %q\n%s", out, log)
			}
			start := time.Now()
			c.setup(t, w, ns)
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			select {
			case <-done:
			case <-time.After(15 * time.Second):
				cmd.Process.Signal(syscall.SIGTERM)
				<-done
				t.Fatalf("attach kept serving after %s appeared in the namespace:\n%s", c.link, log)
			}
			t.Logf("attach stopped %v after the link was made", time.Since(start).Round(time.Millisecond))
			if code := cmd.ProcessState.ExitCode(); code != 3 {
				t.Errorf("exit %d, want 3 (the namespace gained a way out)\n%s", code, log)
			}
			if !strings.Contains(log.String(), c.link) || !strings.Contains(log.String(), "stopped serving") {
				t.Errorf("attach did not say it stopped, and why (%s):\n%s", c.link, log)
			}
			if got, _ := exec.Command("ip", "-n", ns, "-o", "link", "show", "tun0").CombinedOutput(); !strings.Contains(string(got), "does not exist") {
				t.Errorf("the TUN is still there: %s", got)
			}
			if out, code, _ := auditVerify(t, auditPath); code != 0 {
				t.Errorf("the audit log does not verify after the stop: %s", out)
			}
		})
	}
}

func mustCmd(t *testing.T, name string, args ...string) {
	t.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
	}
}

func auditVerify(t *testing.T, path string) (string, int, error) {
	t.Helper()
	out, err := exec.Command(tunwallBin, "audit", "verify", path).CombinedOutput()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return string(out), ee.ExitCode(), nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return string(out), 0, nil
}

// Item 8: names that resolve to addresses embedding or naming forbidden
// ones are never dialled. None of these has a route in the test world, so a
// dial would fail anyway; what matters is that the guard refuses it first.
func TestGuardRefusesEveryEmbedding(t *testing.T) {
	requireTools(t, "curl")
	names := map[string][]netip.Addr{
		"teredo-server-lo.test":   {netip.MustParseAddr("2001:0:7f00:1::1")},                    // Teredo, server 127.0.0.1
		"teredo-client-meta.test": {netip.MustParseAddr("2001:0:c000:20a::5601:5601")},          // Teredo, client 169.254.169.254 obfuscated (XOR 0xff)
		"teredo-public.test":      {netip.MustParseAddr("2001:0:c000:20a:8000:f227:3fff:fdf5")}, // Teredo, public server and client: the /32 is guarded whole
		"siit-lo.test":            {netip.MustParseAddr("::ffff:0:7f00:1")},                     // SIIT ::ffff:0:0:0/96, 127.0.0.1
		"nat64-local.test":        {netip.MustParseAddr("64:ff9b:1::c000:20a")},                 // RFC 8215 local-use NAT64
		"ietf-proto.test":         {netip.MustParseAddr("192.0.0.8")},                           // 192.0.0.0/24
		"reserved.test":           {netip.MustParseAddr("240.0.0.9")},                           // 240.0.0.0/4
		"this-net.test":           {netip.MustParseAddr("0.1.2.3")},                             // 0.0.0.0/8
		"benchmark6.test":         {netip.MustParseAddr("2001:2::5")},                           // 2001:2::/48
		"discard6.test":           {netip.MustParseAddr("100::1")},                              // 100::/64
		"srv6.test":               {netip.MustParseAddr("5f00::1")},                             // 5f00::/16
	}
	w := newWorld(t, testworld.Options{Names: names})
	var flags []string
	var script strings.Builder
	for n := range names {
		flags = append(flags, "--allow", n+":80")
		fmt.Fprintf(&script, "curl -sS --max-time 10 http://%s/ 2>/dev/null; echo \"%s: $?\"\n", n, n)
	}
	r := w.mustRun(0, runOpts{flags: flags, script: script.String()})
	denied := map[string]audit.Record{}
	for _, f := range polFlows(t, r.audit, func(audit.Record) bool { return true }) {
		denied[f.Host] = f
	}
	for n := range names {
		f, ok := denied[n]
		switch {
		case !ok:
			t.Errorf("%s: no flow recorded\n%s", n, r)
		case f.Verdict != audit.VerdictDeny || f.Rule != "guard" || f.Dial.IsValid():
			t.Errorf("%s (%v) should be refused by the guard before any dial: %+v", n, names[n], f)
		}
	}
	if !strings.Contains(denied["teredo-client-meta.test"].Reason, "169.254.169.254") {
		t.Errorf("the Teredo client address should be judged by its embedded address: %+v", denied["teredo-client-meta.test"])
	}
}

// Item 11b: names the sandbox chooses cannot forge lines or escape sequences
// on tunwall's stderr.
func TestSandboxNamesCannotForgeTunwallsOutput(t *testing.T) {
	requireTools(t, "dig", "python3")
	w := newWorld(t)
	r := w.mustRun(0, runOpts{
		flags: []string{"--allow", "allowed.test:80"},
		script: `dig +short +tries=1 +time=3 'evil\010tunwall:\032allowed\032everything\027[2J.test' >/dev/null
python3 - <<'PY'
import socket, struct
# a raw query whose name holds a newline, a carriage return, an ESC and a byte that is not UTF-8
name = b"\x0ex\ntunwall: ok\r\x04\x1b[2J\x02\xff\xfe\x00"
q = struct.pack(">HHHHHH", 7, 0x0100, 1, 0, 0, 0) + name + struct.pack(">HH", 1, 1)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(3)
s.sendto(q, ("198.18.0.1", 53))
try:
    s.recv(512)
except OSError:
    pass
PY`,
	})
	t.Logf("tunwall's stderr:\n%s", r.stderr)
	for i, l := range strings.Split(r.stderr, "\n") {
		if l == "" {
			continue
		}
		if !strings.HasPrefix(l, "tunwall: ") && !strings.HasPrefix(l, "tunwall:   ") {
			t.Errorf("stderr line %d does not come from tunwall: %q", i+1, l)
		}
		if strings.HasPrefix(l, "tunwall: ok") || strings.HasPrefix(l, "tunwall: allowed") {
			t.Errorf("stderr line %d was forged by the sandbox: %q", i+1, l)
		}
	}
	for _, c := range []string{"\x1b", "\r", "\xff"} {
		if strings.Contains(r.stderr, c) {
			t.Errorf("stderr holds %q from the sandbox:\n%q", c, r.stderr)
		}
	}
	if !strings.Contains(r.stderr, "denied DNS") {
		t.Errorf("the queries were not reported as denied:\n%s", r.stderr)
	}
}

// rawTunwall runs tunwall with exactly args in the agent namespace.
func (w *world) rawTunwall(args ...string) result {
	w.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := w.AgentCommand(ctx, tunwallBin, args...)
	cmd.Dir = w.dir
	cmd.Env = append(os.Environ(), "HOME="+w.dir)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	r := result{stdout: o.String(), stderr: e.String()}
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee) && ctx.Err() == nil:
		r.code = ee.ExitCode()
	default:
		w.t.Fatalf("tunwall %v: %v\n%s", args, err, r)
	}
	return r
}

// auditHeaderConfig returns the config map of the first header in path.
func auditHeaderConfig(t *testing.T, path string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	first, _, _ := bytes.Cut(b, []byte("\n"))
	var h struct {
		Kind   string            `json:"kind"`
		Config map[string]string `json:"config"`
	}
	if err := json.Unmarshal(first, &h); err != nil || h.Kind != "header" {
		t.Fatalf("%s: first line is not a header: %v %s", path, err, first)
	}
	return h.Config
}

// Flags after the command belong to the command: an agent that can shape
// its own command line cannot switch enforcement off.
func TestFlagsAfterTheCommandBelongToTheCommand(t *testing.T) {
	requireTools(t, "curl")
	w := newWorld(t)
	pol := polWritePolicy(t, w.dir, "p.yaml", "version: 1\nphases:\n  exec:\n    allow:\n      - host: allowed.test\n        ports: [80]\n")
	agent := filepath.Join(w.dir, "agent.sh")
	if err := os.WriteFile(agent, []byte("#!/bin/sh\necho \"args: $*\"\ncurl -sS --max-time 10 http://evil.test/ >/dev/null 2>&1; echo \"evil: $?\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for i, c := range []struct {
		name string
		tail []string // after tunwall's own flags
		args string   // what the command must see
	}{
		{"--learn after the command", []string{agent, "--learn"}, "--learn"},
		{"--allow after the command", []string{agent, "--allow", "evil.test:80"}, "--allow evil.test:80"},
		{"--audit off after the command", []string{agent, "--audit", "off"}, "--audit off"},
		{"--learn after -- and the command", []string{"--", agent, "--learn"}, "--learn"},
		{"-- after the command is the command's", []string{agent, "--", "--learn"}, "-- --learn"},
	} {
		t.Run(c.name, func(t *testing.T) {
			w.ResetArrivals()
			auditPath := filepath.Join(w.dir, fmt.Sprintf("flags-%d.jsonl", i))
			args := append([]string{"run", "--dns-upstream", "192.0.2.53:53", "--audit", auditPath, "--policy", pol}, c.tail...)
			r := w.rawTunwall(args...)
			if r.code != 0 {
				t.Fatalf("tunwall %v:\n%s", args, r)
			}
			wantLines(t, r, "args: "+c.args, "evil: 6")
			w.noArrivals("evil")
			cfg := auditHeaderConfig(t, auditPath)
			if cfg["learn"] != "false" || cfg["allow"] != "" {
				t.Errorf("the command's arguments changed tunwall's settings: %v", cfg)
			}
			if out, code, _ := auditVerify(t, auditPath); code != 0 {
				t.Errorf("audit log: %s", out)
			}
		})
	}
}

func TestRepeatedSingleValuedFlagsAreUsageErrors(t *testing.T) {
	w := newWorld(t)
	pol := polWritePolicy(t, w.dir, "p.yaml", "version: 1\nphases:\n  exec:\n    allow:\n      - host: allowed.test\n")
	evil := polWritePolicy(t, w.dir, "evil.yaml", "version: 1\nphases:\n  exec:\n    allow:\n      - host: evil.test\n")
	for _, args := range [][]string{
		{"run", "--policy", pol, "--policy", evil, "--", "true"},
		{"run", "--policy", pol, "--phase", "exec", "--phase", "exec", "--", "true"},
		{"run", "--policy", pol, "--audit", filepath.Join(w.dir, "a.jsonl"), "--audit", "off", "--", "true"},
		{"run", "--policy", pol, "--dns-upstream", "192.0.2.53:53", "--dns-upstream", "192.0.2.66:53", "--", "true"},
		{"run", "--policy", pol, "--upstream", "socks5://127.0.0.1:1", "--upstream", "socks5://127.0.0.1:2", "--", "true"},
		{"run", "--policy", pol, "--learn", "--learn=false", "--", "true"},
		{"socks", "--policy", pol, "--listen", "127.0.0.1:0", "--listen", "bad:address"},
		{"attach", "--policy", pol, "--netns", "/run/netns/x", "--netns", "/run/netns/y"},
	} {
		r := w.rawTunwall(args...)
		l := lines(r.stderr)
		// One line saying so, and one with a hint (README: a usage error).
		if r.code != 2 || len(l) != 2 || !strings.Contains(l[0], "more than once") || !strings.Contains(l[1], "--help") {
			t.Errorf("tunwall %v: want exit 2, one line saying the flag was given more than once and a hint\n%s", args, r)
		}
	}
	// Repeatable flags stay repeatable.
	r := w.rawTunwall("run", "--dns-upstream", "192.0.2.53:53", "--audit", "off", "--allow", "allowed.test:80", "--allow", "echo.test:80", "--", "true")
	if r.code != 0 {
		t.Errorf("a repeated --allow was refused:\n%s", r)
	}
}

// tunwall socks records every flow, even one still open at SIGTERM or
// SIGHUP, and closes its log with a trailer.
func TestSocksSignalsKeepOpenFlowsAndTheChain(t *testing.T) {
	requireTools(t, "python3")
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGHUP} {
		t.Run(sig.String(), func(t *testing.T) {
			w := newWorld(t)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			proxy, auditPath, log := w.startBackground(ctx, "socks", runOpts{
				flags: []string{"--listen", "127.0.0.1:1082", "--allow", "echo.test:7", "--allow", "echo.test:7/udp"},
			}, "SOCKS5 proxy on")
			// A client that holds a CONNECT and a UDP ASSOCIATE open, both
			// echoing, until it is told to stop.
			client := w.AgentCommand(ctx, "python3", "-c", socksHoldPy)
			stdin, _ := client.StdinPipe()
			out, _ := client.StdoutPipe()
			client.Stderr = os.Stderr
			if err := client.Start(); err != nil {
				t.Fatal(err)
			}
			defer func() { stdin.Close(); client.Wait() }()
			sc := bufio.NewScanner(out)
			for _, want := range []string{"tcp long-lived", "udp long-lived"} {
				if !sc.Scan() || sc.Text() != want {
					t.Fatalf("the flows did not start: got %q, want %q\n%s", sc.Text(), want, log)
				}
			}
			start := time.Now()
			proxy.Process.Signal(sig)
			done := make(chan error, 1)
			go func() { done <- proxy.Wait() }()
			select {
			case <-done:
			case <-time.After(30 * time.Second):
				proxy.Process.Kill()
				<-done
				t.Fatalf("tunwall socks did not stop within 30s of %v\n%s", sig, log)
			}
			t.Logf("tunwall socks stopped %v after %v (exit %d)", sig, time.Since(start).Round(time.Millisecond), proxy.ProcessState.ExitCode())
			if code := proxy.ProcessState.ExitCode(); code != 0 {
				t.Errorf("exit %d after %v, want 0\n%s", code, sig, log)
			}
			if out, code, _ := auditVerify(t, auditPath); code != 0 {
				t.Errorf("after %v the audit log does not verify: %s", sig, out)
			}
			found := map[string]bool{}
			for _, f := range polFlows(t, auditPath, func(f audit.Record) bool { return f.Host == "echo.test" }) {
				found[f.Proto] = true
				if f.Verdict != audit.VerdictAllow || f.BytesOut != 10 || f.BytesIn != 10 {
					t.Errorf("the open flow's record is wrong: %+v", f)
				}
			}
			for _, p := range []string{"tcp", "udp"} {
				if !found[p] {
					t.Errorf("the %s flow open at %v was not recorded\n%s", p, sig, log)
				}
			}
		})
	}
}

// socksHoldPy opens a CONNECT and a UDP ASSOCIATE to echo.test:7 through
// the SOCKS5 proxy on 127.0.0.1:1082, echoes once on each, and holds both
// open until stdin closes.
const socksHoldPy = `
import socket, struct, sys

def recvn(c, n):
    b = b""
    while len(b) < n:
        d = c.recv(n - len(b))
        assert d, "eof"
        b += d
    return b

def request(cmd, addr):
    c = socket.create_connection(("127.0.0.1", 1082))
    c.sendall(b"\x05\x01\x00")
    assert recvn(c, 2) == b"\x05\x00"
    c.sendall(b"\x05" + bytes([cmd]) + b"\x00" + addr)
    rep = recvn(c, 4)
    assert rep[1] == 0, rep
    bnd = recvn(c, {1: 6, 4: 18}[rep[3]])
    return c, bnd

echo = b"\x03" + bytes([9]) + b"echo.test" + struct.pack(">H", 7)
t, _ = request(1, echo)
t.sendall(b"long-lived")
print("tcp", recvn(t, 10).decode(), flush=True)

ctl, bnd = request(3, b"\x01" + b"\x00" * 6)
relay = (socket.inet_ntoa(bnd[:4]), struct.unpack(">H", bnd[4:6])[0])
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.settimeout(5)
hdr = b"\x00\x00\x00" + echo
u.sendto(hdr + b"long-lived", relay)
d, _ = u.recvfrom(1000)
print("udp", d[len(hdr):].decode(), flush=True)
sys.stdin.readline()
`
