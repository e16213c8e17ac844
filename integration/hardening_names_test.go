package integration

// The name checks never fail open (hardening issue, item 4): a flow whose
// first bytes are TLS or HTTP is relayed only after its name was read and
// checked, and every request on a plain-HTTP connection is checked. Each
// test attacks the way a sandboxed program would: a foreign SNI or Host sent
// to an allowed name whose address it shares (allowed.test and other.test
// are served by the same world address, like two sites on one CDN), with the
// ClientHello or request head bent so that a lenient parser gives up and
// relays it. The proof is the world servers' own logs: the Go HTTP/TLS
// servers log every SNI and every request's Host, and an openssl s_server
// (whose record layer accepts what Go's does not, e.g. an empty record) logs
// every SNI it reads. Every forbidden name is "<variant>.other.test", so a
// log line names the variant that got through.

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tunwall/tunwall/internal/testworld"
)

// hnPyLib is the attacker's toolkit, a python3 prelude: raw sockets for
// byte-exact control, ssl.MemoryBIO for real ClientHellos and for a real TLS
// client whose records and timing the script chooses.
const hnPyLib = `
import os, re, socket, ssl, struct, sys, time

def conn(host, port, fam=socket.AF_INET, timeout=8):
    addr = socket.getaddrinfo(host, port, fam, socket.SOCK_STREAM)[0][4]
    s = socket.socket(fam, socket.SOCK_STREAM)
    s.settimeout(timeout)
    s.connect(addr)
    return s

def rec(typ, ver, payload):
    return bytes([typ]) + struct.pack(">HH", ver, len(payload)) + payload

def unrecord(w):
    out = b""
    while w:
        n = struct.unpack(">H", w[3:5])[0]
        out += w[5:5+n]
        w = w[5+n:]
    return out

def records(msg, sizes, ver=0x0301):
    out = b""
    for n in sizes:
        if not msg:
            break
        out += rec(0x16, ver, msg[:n])
        msg = msg[n:]
    if msg:
        out += rec(0x16, ver, msg)
    return out

def hello(sni):
    """The ClientHello handshake message OpenSSL (python's ssl) sends for sni."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    i, o = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ctx.wrap_bio(i, o, server_hostname=sni)
    try:
        obj.do_handshake()
    except ssl.SSLWantReadError:
        pass
    return unrecord(o.read())

def with_exts(msg, extra):
    """msg with the raw extension bytes extra appended to its extensions."""
    body = msg[4:]
    p = 2 + 32
    p += 1 + body[p]
    p += 2 + struct.unpack(">H", body[p:p+2])[0]
    p += 1 + body[p]
    exts = body[p+2:] + extra
    body = body[:p] + struct.pack(">H", len(exts)) + exts
    return bytes([1]) + struct.pack(">I", len(body))[1:] + body

def sni_ext(*names):
    lst = b"".join(b"\x00" + struct.pack(">H", len(n)) + n.encode() for n in names)
    body = struct.pack(">H", len(lst)) + lst
    return struct.pack(">HH", 0, len(body)) + body

def padded(msg, size):
    """msg grown to size bytes with an unknown extension (a GREASE type)."""
    grow = size - len(msg) - 4
    return with_exts(msg, struct.pack(">HH", 0x3a3a, grow) + b"\x00" * grow)

def read_end(s, want_any=False):
    """Reads until the peer closes or resets; with want_any, returns at the
    first bytes. Returns (how, data): how is closed, reset or timeout."""
    data = b""
    try:
        while True:
            b = s.recv(65536)
            if not b:
                return "closed", data
            data += b
            if want_any:
                return "answered", data
    except ConnectionResetError:
        return "reset", data
    except socket.timeout:
        return "timeout", data

def tls_probe(label, host, port, chunks, pause=0.0, prewait=0.0):
    """Sends chunks (pausing between them), then reports what came back:
    reset (tunwall refused), or answered (a server read the hello)."""
    try:
        s = conn(host, port)
        time.sleep(prewait)
        for k, c in enumerate(chunks):
            if k:
                time.sleep(pause)
            s.sendall(c)
        how, data = read_end(s, want_any=True)
        if how == "answered":
            how += " " + data[:3].hex()
        print(label + ": " + how, flush=True)
        s.close()
    except Exception as e:
        print(label + ": error " + type(e).__name__ + " " + str(e), flush=True)

def summarize(how, data):
    statuses = re.findall(rb"HTTP/1\.[01] (\d{3})", data)
    bodies = re.findall(rb"^(?:web|api) \S+ \S+", data, re.M)
    out = "statuses=" + ",".join(x.decode() for x in statuses)
    out += " bodies=" + ",".join(x.decode() for x in bodies)
    if b"tunwall: denied" in data:
        out += " tunwall-403"
    return out + " end=" + how

BODY = rb"^(?:web|api) \S+ \S+\n"

def http_probe(label, host, port, parts, pause=0.0, fam=socket.AF_INET):
    """Sends parts, pausing between them (or, when pause < 0, waiting for a
    response body first), then reads until the connection ends."""
    try:
        s = conn(host, port, fam)
        got = b""
        for k, p in enumerate(parts):
            if k and pause < 0:
                want = len(re.findall(BODY, got, re.M)) + 1
                while len(re.findall(BODY, got, re.M)) < want:
                    b = s.recv(65536)
                    if not b:
                        break
                    got += b
            elif k:
                time.sleep(pause)
            s.sendall(p)
        how, data = read_end(s)
        print(label + ": " + summarize(how, got + data), flush=True)
        s.close()
    except Exception as e:
        print(label + ": error " + type(e).__name__ + " " + str(e), flush=True)

def tls_get(label, host, port, sni, path, sizes=None, pause=0.0, prewait=0.0, fam=socket.AF_INET, first=None):
    """A real TLS client (verifying the world's CA) whose first flight is
    cut into records of sizes and sent with pauses; prints the response
    body line. first, when given, replaces the ClientHello message."""
    try:
        s = conn(host, port, fam, timeout=15)
        ctx = ssl.create_default_context(cafile=os.environ["SSL_CERT_FILE"])
        i, o = ssl.MemoryBIO(), ssl.MemoryBIO()
        obj = ctx.wrap_bio(i, o, server_hostname=sni)
        time.sleep(prewait)
        flight = 0
        while True:
            try:
                obj.do_handshake()
                done = True
            except ssl.SSLWantReadError:
                done = False
            out = o.read()
            if out:
                if flight == 0 and sizes:
                    msg = unrecord(out)
                    for k, n in enumerate(sizes + [len(msg)]):
                        if not msg:
                            break
                        piece = rec(0x16, 0x0301, msg[:n])
                        msg = msg[n:]
                        # every record in two writes: the header, then the payload
                        s.sendall(piece[:3])
                        time.sleep(pause)
                        s.sendall(piece[3:])
                        time.sleep(pause)
                else:
                    s.sendall(out)
                flight += 1
            if done:
                break
            b = s.recv(65536)
            if not b:
                raise EOFError("server closed during the handshake")
            i.write(b)
        obj.write(("GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n" % (path, sni)).encode())
        s.sendall(o.read())
        resp = b""
        while True:
            b = s.recv(65536)
            if not b:
                break
            i.write(b)
            try:
                while True:
                    chunk = obj.read(65536)
                    if not chunk:
                        break
                    resp += chunk
            except (ssl.SSLWantReadError, ssl.SSLZeroReturnError):
                pass
        m = re.search(rb"^(?:web|api) \S+ \S+", resp, re.M)
        print(label + ": " + (m.group(0).decode() if m else "no body " + repr(resp[:80])), flush=True)
    except Exception as e:
        print(label + ": error " + type(e).__name__ + " " + str(e), flush=True)
`

// hnScript is a python3 script: the toolkit, then body.
func hnScript(body string) string {
	return "python3 - <<'PY'\n" + hnPyLib + "\n" + body + "\nPY\n"
}

// hnResults maps each "label: result" line of stdout to its result.
func hnResults(t *testing.T, r result) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, l := range lines(r.stdout) {
		k, v, ok := strings.Cut(l, ": ")
		if ok {
			out[k] = v
		}
	}
	return out
}

// hnAudit reads an audit log's flow records as generic JSON objects, so the
// test reads keys (sni, http_host) that a tunwall without them lacks.
func hnAudit(t *testing.T, path string) []map[string]any {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []map[string]any
	for _, l := range bytes.Split(b, []byte("\n")) {
		if len(bytes.TrimSpace(l)) == 0 {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal(l, &m); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if m["kind"] == "flow" {
			out = append(out, m)
		}
	}
	return out
}

func hnStr(m map[string]any, k string) string {
	s, _ := m[k].(string)
	return s
}

// hnDenied finds the denied flow record that names variant (a forbidden
// name "<variant>.other.test", or a label) in its sni, http_host or reason.
func hnDenied(recs []map[string]any, needle string) map[string]any {
	for _, m := range recs {
		if hnStr(m, "verdict") != "deny" {
			continue
		}
		if strings.Contains(hnStr(m, "sni"), needle) || strings.Contains(hnStr(m, "http_host"), needle) ||
			strings.Contains(hnStr(m, "reason"), needle) {
			return m
		}
	}
	return nil
}

// hnNoForbiddenArrivals fails if a world server saw a request or SNI for
// any name under other.test.
func hnNoForbiddenArrivals(t *testing.T, w *world) {
	t.Helper()
	for _, a := range w.Arrivals("") {
		if strings.Contains(strings.ToLower(a.Host), "other.test") {
			t.Errorf("%s (%s on %v) saw the forbidden name %q", a.Server, a.Proto, a.Local, a.Host)
		}
	}
}

// hnOpenSSLServer runs openssl s_server in the world on Web4:4433 and
// returns a function that stops it and returns every SNI it read.
func hnOpenSSLServer(t *testing.T, w *world) func() []string {
	t.Helper()
	requireTools(t, "openssl", "stdbuf")
	key, crt := filepath.Join(w.dir, "ossl.key"), filepath.Join(w.dir, "ossl.crt")
	gen := exec.Command("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
		"-keyout", key, "-out", crt, "-subj", "/CN=allowed.test", "-days", "2")
	if out, err := gen.CombinedOutput(); err != nil {
		t.Fatalf("openssl req: %v\n%s", err, out)
	}
	ctx, cancel := context.WithCancel(context.Background())
	// -servername installs the SNI callback, which with -tlsextdebug logs
	// every server name it reads; the name itself is never sent.
	cmd := w.WorldCommand(ctx, "stdbuf", "-o0", "-e0", "openssl", "s_server", "-accept", netip.AddrPortFrom(testworld.Web4, 4433).String(),
		"-cert", crt, "-key", key, "-servername", "never-sent.invalid", "-cert2", crt, "-key2", key, "-tlsextdebug")
	var mu sync.Mutex
	var log bytes.Buffer
	cmd.Stdout = &lockedWriter{mu: &mu, w: &log}
	cmd.Stderr = cmd.Stdout
	stdin, err := cmd.StdinPipe() // s_server exits when its stdin ends
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	stopped := false
	stop := func() []string {
		if !stopped {
			stopped = true
			cancel()
			cmd.Wait()
			stdin.Close()
		}
		mu.Lock()
		defer mu.Unlock()
		var names []string
		for _, m := range regexp.MustCompile(`Hostname in TLS extension: "([^"]*)"`).FindAllStringSubmatch(log.String(), -1) {
			names = append(names, m[1])
		}
		return names
	}
	t.Cleanup(func() { stop() })
	// Wait (bounded) until it accepts connections.
	deadline := time.Now().Add(10 * time.Second)
	for {
		var c net.Conn
		err := w.InWorld(func() (err error) {
			c, err = net.DialTimeout("tcp", netip.AddrPortFrom(testworld.Web4, 4433).String(), time.Second)
			return err
		})
		if err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("openssl s_server did not start: %v\n%s", err, log.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	return stop
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// hnGoHello returns the TLS records crypto/tls sends as a client's first
// flight for serverName: with Go's defaults, a post-quantum
// (X25519MLKEM768) key share, over a kilobyte larger than a classic hello.
func hnGoHello(t *testing.T, serverName string) []byte {
	t.Helper()
	c := &hnCapture{}
	tls.Client(c, &tls.Config{ServerName: serverName}).Handshake()
	if c.out.Len() == 0 {
		t.Fatal("crypto/tls wrote no ClientHello")
	}
	return c.out.Bytes()
}

// hnCapture is a net.Conn that records writes and reads EOF.
type hnCapture struct{ out bytes.Buffer }

func (c *hnCapture) Read([]byte) (int, error)         { return 0, net.ErrClosed }
func (c *hnCapture) Write(p []byte) (int, error)      { return c.out.Write(p) }
func (c *hnCapture) Close() error                     { return nil }
func (c *hnCapture) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (c *hnCapture) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (c *hnCapture) SetDeadline(time.Time) error      { return nil }
func (c *hnCapture) SetReadDeadline(time.Time) error  { return nil }
func (c *hnCapture) SetWriteDeadline(time.Time) error { return nil }

func TestNameChecksResetEveryMalformedOrForeignClientHello(t *testing.T) {
	requireTools(t, "python3", "curl", "openssl", "node")
	w := newWorld(t)
	stopOpenSSL := hnOpenSSLServer(t, w)
	pq := hnGoHello(t, "allowed.test")
	if len(pq) < 1200 {
		t.Fatalf("Go's ClientHello is %d bytes: no post-quantum key share?", len(pq))
	}
	if err := os.WriteFile(filepath.Join(w.dir, "pq-hello.bin"), pq, 0o644); err != nil {
		t.Fatal(err)
	}
	script := hnScript(`
H = "allowed.test"
def m(v): return hello(v + ".other.test")
# Attacks: each names <variant>.other.test, a name the policy does not
# allow, on a connection to allowed.test, whose address it shares.
tls_probe("plain", H, 443, [rec(0x16, 0x0301, m("plain"))])
msg = m("slow")
wire = rec(0x16, 0x0301, msg)
tls_probe("slow", H, 443, [wire[:20], wire[20:200], wire[200:]], pause=0.6)
tls_probe("late", H, 443, [rec(0x16, 0x0301, m("late"))], prewait=1.0)
tls_probe("recver0300", H, 443, [rec(0x16, 0x0300, m("recver0300"))])
tls_probe("recver0305", H, 443, [rec(0x16, 0x0305, m("recver0305"))])
tls_probe("recver0000", H, 443, [rec(0x16, 0x0000, m("recver0000"))])
tls_probe("emptyrec", H, 4433, [rec(0x16, 0x0301, b"") + rec(0x16, 0x0301, m("emptyrec"))])
tls_probe("alertfirst", H, 443, [rec(0x15, 0x0301, b"\x01\x5a") + rec(0x16, 0x0301, m("alertfirst"))])
msg = m("split")
tls_probe("split", H, 443, [records(msg, [60, 40])])
tls_probe("big", H, 443, [records(padded(m("big"), 17000), [16384])])
tls_probe("twonames", H, 4433, [rec(0x16, 0x0301, with_exts(hello(None), sni_ext("allowed.test", "twonames.other.test")))])
msg = m("badXname").replace(b"badXname", b"bad_name")
tls_probe("underscore", H, 443, [rec(0x16, 0x0301, msg)])
tls_probe("ossl-recver0300", H, 4433, [rec(0x16, 0x0300, m("osslrecver"))])
# Legitimate clients still work: slow, late, split into records, and a
# post-quantum hello (Go's, X25519MLKEM768) cut into three records.
tls_get("legit-slow", H, 443, H, "/slow", sizes=[7, 100], pause=0.4)
tls_get("legit-late", H, 443, H, "/late", prewait=1.0)
pq = open("pq-hello.bin", "rb").read()
pqmsg = unrecord(pq)
tls_probe("legit-pq", H, 443, [records(pqmsg, [500, 700])[:900], records(pqmsg, [500, 700])[900:]], pause=0.5)
`) + `curl -sS --max-time 10 https://allowed.test/curl; echo "curl: $?"
curl -sS --max-time 10 --connect-to curl.other.test:443:allowed.test:443 https://curl.other.test/ 2>/dev/null; echo "curl-front: $?"
node -e 'fetch("https://allowed.test/node").then(r => r.text()).then(t => console.log("node: " + t.trim()), e => console.log("node: " + e))'
echo | openssl s_client -connect allowed.test:4433 -servername allowed.test 2>&1 | grep -q "^New, TLS" && echo "s_client-allowed: handshake" || echo "s_client-allowed: failed"
echo | openssl s_client -connect allowed.test:4433 -servername sclient.other.test 2>&1 | grep -q "^New, TLS" && echo "s_client-front: handshake" || echo "s_client-front: failed"
`
	r := w.mustRun(0, runOpts{
		flags:  []string{"--allow", "allowed.test:443,4433"},
		script: script,
	})
	got := hnResults(t, r)
	attacks := []string{"plain", "slow", "late", "recver0300", "recver0305", "recver0000", "emptyrec", "alertfirst",
		"split", "big", "twonames", "underscore", "ossl-recver0300"}
	for _, v := range attacks {
		if got[v] != "reset" {
			t.Errorf("%s: got %q, want reset", v, got[v])
		}
	}
	want := map[string]string{
		"legit-slow":       "web allowed.test /slow",
		"legit-late":       "web allowed.test /late",
		"curl":             "0",
		"node":             "web allowed.test /node",
		"curl-front":       "35",
		"s_client-allowed": "handshake",
		"s_client-front":   "failed",
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: got %q, want %q", k, got[k], v)
		}
	}
	if !strings.HasPrefix(got["legit-pq"], "answered 16") {
		t.Errorf("legit-pq: got %q, want the server's answer to a post-quantum hello", got["legit-pq"])
	}
	if !strings.Contains(r.stdout, "web allowed.test /curl") {
		t.Errorf("curl got no answer from web\n%s", r)
	}
	hnNoForbiddenArrivals(t, w)
	osslNames := stopOpenSSL()
	for _, n := range osslNames {
		if strings.Contains(n, "other.test") {
			t.Errorf("openssl s_server read the forbidden server name %q", n)
		}
	}
	if !containsStr(osslNames, "allowed.test") {
		t.Errorf("openssl s_server never read allowed.test (the control): %q", osslNames)
	}
	recs := hnAudit(t, r.audit)
	// Each denial says why: the SNI it read, or what it could not parse.
	needles := map[string]string{
		"recver0000": "a TLS record version that is not 3.x", "emptyrec": "an empty TLS record",
		"alertfirst": "not a handshake record", "big": "a ClientHello over 16 KiB",
		"twonames": "two host names", "underscore": `"bad_name.other.test" is not a hostname`,
		"ossl-recver0300": "osslrecver.other.test", "curl": "curl.other.test", "sclient": "sclient.other.test",
	}
	for _, v := range append(attacks, "curl", "sclient") {
		needle := needles[v]
		if needle == "" {
			needle = v + ".other.test"
		}
		d := hnDenied(recs, needle)
		if d == nil {
			t.Errorf("%s: no denied flow record naming %q (in sni, http_host or reason)", v, needle)
			continue
		}
		if hnStr(d, "host") != "allowed.test" || hnStr(d, "reason") == "" {
			t.Errorf("%s: denial should be about allowed.test, with a reason: %v", v, d)
		}
	}
	// A hello that parsed names its SNI in the record.
	for _, v := range []string{"plain", "slow", "late", "recver0300", "split", "curl"} {
		if d := hnDenied(recs, v+".other.test"); d == nil || hnStr(d, "sni") != v+".other.test" {
			t.Errorf("%s: want sni %q in the denial, got %v", v, v+".other.test", d)
		}
	}
	var allowedSNI int
	for _, m := range recs {
		if hnStr(m, "verdict") == "allow" && hnStr(m, "sni") == "allowed.test" {
			allowedSNI++
		}
	}
	if allowedSNI < 6 {
		t.Errorf("want allowed flows recording sni allowed.test (slow, late, pq, curl, node, s_client), got %d", allowedSNI)
	}
}

func containsStr(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func TestNameChecksCheckEveryHTTPRequest(t *testing.T) {
	requireTools(t, "python3", "curl")
	w := newWorld(t)
	script := hnScript(`
H = "allowed.test"
def req(host, path="/", method="GET", extra="", ver="HTTP/1.1", close=True):
    h = "%s %s %s\r\nHost: %s\r\n%s" % (method, path, ver, host, extra)
    if close:
        h += "Connection: close\r\n"
    return (h + "\r\n").encode()
# Attacks.
http_probe("dup-host", H, 80, [b"GET /dup HTTP/1.1\r\nHost: allowed.test\r\nHost: dup.other.test\r\nConnection: close\r\n\r\n"])
http_probe("absolute", H, 80, [b"GET http://absolute.other.test/x HTTP/1.1\r\nHost: allowed.test\r\nConnection: close\r\n\r\n"])
http_probe("absolute-both", H, 80, [b"GET http://absboth.other.test/x HTTP/1.1\r\nHost: absboth.other.test\r\nConnection: close\r\n\r\n"])
http_probe("pipelined", H, 80, [req(H, "/p1", close=False) + req("pipelined.other.test", "/p2")])
http_probe("keepalive", H, 80, [req(H, "/k1", close=False), req("keepalive.other.test", "/k2")], pause=-1)
http_probe("lowercase", H, 80, [req("lowercase.other.test", "/lc", method="get")])
http_probe("custom-method", H, 80, [req("custom.other.test", "/cm", method="FROB")])
http_probe("oddspace", H, 80, [b"GET  /os  HTTP/1.1\r\nHost: oddspace.other.test\r\nConnection: close\r\n\r\n"])
http_probe("h2c-preface", H, 80, [b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"])
http_probe("oversized", H, 80, [req("oversized.other.test", "/big", extra="X-Pad: " + "p" * 20000 + "\r\n")])
http_probe("fold-host", H, 80, [b"GET / HTTP/1.1\r\nHost: allowed.test\r\n foldhost.other.test\r\nConnection: close\r\n\r\n"])
http_probe("fold-other", H, 80, [b"GET / HTTP/1.1\r\nX-A: 1\r\n Host: foldother.other.test\r\nHost: allowed.test\r\nConnection: close\r\n\r\n"])
http_probe("userinfo", H, 80, [req("allowed.test@userinfo.other.test")])
http_probe("nul", H, 80, [b"GET / HTTP/1.1\r\nHost: nul.other.test\x00allowed.test\r\nConnection: close\r\n\r\n"])
http_probe("bare-cr", H, 80, [b"GET / HTTP/1.1\r\nX-A: 1\rHost: barecr.other.test\r\nHost: allowed.test\r\nConnection: close\r\n\r\n"])
http_probe("smuggle-cl-te", H, 80, [b"POST /s HTTP/1.1\r\nHost: allowed.test\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + req("smuggle.other.test", "/s2")])
http_probe("smuggle-te", H, 80, [b"POST /s HTTP/1.1\r\nHost: allowed.test\r\nTransfer-Encoding: identity, chunked\r\n\r\n0\r\n\r\n" + req("smugglete.other.test", "/s2")])
http_probe("connect", H, 80, [b"CONNECT allowed.test:443 HTTP/1.1\r\nHost: allowed.test:443\r\n\r\n"])
http_probe("upgrade-h2c", H, 80, [b"GET / HTTP/1.1\r\nHost: allowed.test\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAoAAAAAIAAAAA\r\n\r\n"])
http_probe("upgrade-refused", H, 80, [req(H, "/", extra="Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n", close=False), req("noupgrade.other.test", "/nu")], pause=-1)
http_probe("slow-head", H, 80, [b"GET /sl HTTP/1.1\r\nHo", b"st: slowhead.other.test\r\nConnection: close\r\n\r\n"], pause=1.0)
# Legitimate clients: keep-alive requests with bodies that look like
# requests, a lower-case method and a late first byte to the right host.
body = req("inbody.other.test", "/inbody")
chunked = b"%x\r\n" % len(body) + body + b"\r\n0\r\n\r\n"
http_probe("legit-bodies", H, 80, [
    req(H, "/b1", method="POST", extra="Content-Length: %d\r\n" % len(body), close=False) + body +
    req(H, "/b2", method="POST", extra="Transfer-Encoding: chunked\r\n", close=False) + chunked +
    b"\r\n" + req(H, "/b3")])
http_probe("legit-lowercase", H, 80, [req(H, "/lower", method="get")])
http_probe("legit-slow", H, 80, [b"GET /slow HTTP/1.1\r\nHo", b"st: allowed.test\r\nConnection: close\r\n\r\n"], pause=1.0)
# A WebSocket: after the server's 101 the bytes are no longer HTTP.
s = conn(H, 80)
s.sendall(req(H, "/ws", extra="Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n", close=False))
head = b""
while b"\r\n\r\n" not in head:
    head += s.recv(4096)
frame = b"\x81\x05hello" + req("inframe.other.test", "/notarequest")
s.sendall(frame)
echo = head.split(b"\r\n\r\n", 1)[1]
while len(echo) < len(frame):
    b = s.recv(65536)
    if not b:
        break
    echo += b
print("websocket: " + head.split(b"\r\n")[0].decode() + (" echoed" if echo == frame else " not echoed %r" % echo[:40]), flush=True)
s.close()
`) + `curl -sS --max-time 10 --http2-prior-knowledge -H 'Host: h2c.other.test' http://allowed.test/h2c 2>/dev/null; echo "curl-h2c: $?"
curl -sS --max-time 10 -w '%{num_connects}\n' http://allowed.test/c1 http://allowed.test/c2 http://allowed.test/c3 | tr '\n' ' '; echo
`
	r := w.mustRun(0, runOpts{flags: []string{"--allow", "allowed.test:80"}, script: script})
	got := hnResults(t, r)
	const reset, denied = "statuses= bodies= end=reset", "statuses=403 bodies= tunwall-403 end=closed"
	want := map[string]string{
		"dup-host":        reset,
		"absolute":        reset,
		"absolute-both":   denied,
		"pipelined":       "statuses=200,403 bodies=web allowed.test /p1 tunwall-403 end=closed",
		"keepalive":       "statuses=200,403 bodies=web allowed.test /k1 tunwall-403 end=closed",
		"lowercase":       denied,
		"custom-method":   denied,
		"oddspace":        reset,
		"h2c-preface":     reset,
		"oversized":       reset,
		"fold-host":       reset,
		"fold-other":      reset,
		"userinfo":        reset,
		"nul":             reset,
		"bare-cr":         reset,
		"smuggle-cl-te":   reset,
		"smuggle-te":      reset,
		"connect":         denied,
		"upgrade-h2c":     denied,
		"upgrade-refused": "statuses=200,403 bodies=web allowed.test / tunwall-403 end=closed",
		"slow-head":       denied,
		"legit-bodies":    "statuses=200,200,200 bodies=web allowed.test /b1,web allowed.test /b2,web allowed.test /b3 end=closed",
		"legit-lowercase": "statuses=200 bodies=web allowed.test /lower end=closed",
		"legit-slow":      "statuses=200 bodies=web allowed.test /slow end=closed",
		"websocket":       "HTTP/1.1 101 Switching Protocols echoed",
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s:\n got %q\nwant %q", k, got[k], v)
		}
	}
	// A reset is a send (55) or receive (56) failure, or an HTTP/2 error
	// (16), depending on where curl is when it comes.
	if c := got["curl-h2c"]; c != "55" && c != "56" && c != "16" {
		t.Errorf("curl-h2c: got exit %q, want the failure a reset causes", c)
	}
	// curl reused one connection for three requests, each checked.
	if !strings.Contains(r.stdout, "web allowed.test /c1 1 web allowed.test /c2 0 web allowed.test /c3 0") {
		t.Errorf("curl's three requests on one keep-alive connection did not all pass\n%s", r)
	}
	hnNoForbiddenArrivals(t, w)
	recs := hnAudit(t, r.audit)
	for v, needle := range map[string]string{
		"dup-host": "dup.other.test", "absolute": "absolute.other.test", "absolute-both": "absboth.other.test",
		"pipelined": "pipelined.other.test", "keepalive": "keepalive.other.test", "lowercase": "lowercase.other.test",
		"custom-method": "custom.other.test", "oddspace": "GET  /os", "h2c-preface": "HTTP/2", "oversized": "16 KiB",
		"fold-host": "fold", "fold-other": "fold", "userinfo": "userinfo.other.test", "nul": "control",
		"bare-cr": "CR", "smuggle-cl-te": "Content-Length", "smuggle-te": "Transfer-Encoding", "connect": "CONNECT",
		"upgrade-h2c": "h2c", "upgrade-refused": "noupgrade.other.test", "slow-head": "slowhead.other.test",
		"curl-h2c": "HTTP/2",
	} {
		if hnDenied(recs, needle) == nil {
			t.Errorf("%s: no denied flow record naming %q", v, needle)
		}
	}
	for _, v := range []string{"pipelined", "keepalive", "lowercase", "absolute-both", "slow-head"} {
		host := map[string]string{"absolute-both": "absboth", "slow-head": "slowhead"}[v]
		if host == "" {
			host = v
		}
		if d := hnDenied(recs, host+".other.test"); d == nil || hnStr(d, "http_host") != host+".other.test" {
			t.Errorf("%s: want http_host %s.other.test in the denial, got %v", v, host, d)
		}
	}
	var allowedHost int
	for _, m := range recs {
		if hnStr(m, "verdict") == "allow" && hnStr(m, "http_host") == "allowed.test" {
			allowedHost++
		}
	}
	if allowedHost < 5 {
		t.Errorf("want allowed flows recording http_host allowed.test, got %d", allowedHost)
	}
}

func TestNameChecksOnARawAddressCheckEveryRequestToo(t *testing.T) {
	requireTools(t, "python3")
	w := newWorld(t)
	script := hnScript(`
E = "192.0.2.66"   # evil's address: a raw IP no cidr rule allows
def req(host, path, close=True):
    return ("GET %s HTTP/1.1\r\nHost: %s\r\n%s\r\n" % (path, host, "Connection: close\r\n" if close else "")).encode()
http_probe("raw-pipelined", E, 80, [req("allowed.test", "/r1", close=False) + req("rawpipe.other.test", "/r2")])
http_probe("raw-dup-host", E, 80, [b"GET / HTTP/1.1\r\nHost: allowed.test\r\nHost: rawdup.other.test\r\n\r\n"])
tls_probe("raw-recver0300", E, 443, [rec(0x16, 0x0300, hello("rawrec.other.test"))])
tls_probe("raw-alertfirst", E, 443, [rec(0x15, 0x0301, b"\x01\x5a") + rec(0x16, 0x0301, hello("allowed.test"))])
tls_get("raw-slow", E, 443, "allowed.test", "/rawslow", sizes=[7, 100], pause=0.4)
tls_get("raw-late", E, 443, "allowed.test", "/rawlate", prewait=1.0)
http_probe("raw-ok", E, 80, [req("allowed.test", "/rawok")])
`)
	r := w.mustRun(0, runOpts{flags: []string{"--allow", "allowed.test:80,443"}, script: script})
	got := hnResults(t, r)
	for k, v := range map[string]string{
		"raw-pipelined":  "statuses=200,403 bodies=web allowed.test /r1 tunwall-403 end=closed",
		"raw-dup-host":   "statuses= bodies= end=reset",
		"raw-recver0300": "reset",
		"raw-alertfirst": "reset",
		"raw-slow":       "web allowed.test /rawslow",
		"raw-late":       "web allowed.test /rawlate",
		"raw-ok":         "statuses=200 bodies=web allowed.test /rawok end=closed",
	} {
		if got[k] != v {
			t.Errorf("%s:\n got %q\nwant %q", k, got[k], v)
		}
	}
	hnNoForbiddenArrivals(t, w)
	w.noArrivals("evil")
	recs := hnAudit(t, r.audit)
	for v, needle := range map[string]string{"raw-pipelined": "rawpipe.other.test", "raw-dup-host": "rawdup.other.test",
		"raw-recver0300": "rawrec.other.test", "raw-alertfirst": "TLS"} {
		if hnDenied(recs, needle) == nil {
			t.Errorf("%s: no denied flow record naming %q", v, needle)
		}
	}
}

func TestNameChecksLeaveOtherProtocolsAlone(t *testing.T) {
	requireTools(t, "python3")
	w := newWorld(t)
	// A server that speaks first, as SSH and SMTP do, then echoes.
	ln, err := w.Listen("tcp", netip.AddrPortFrom(testworld.Echo4, 2222).String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				c.Write([]byte("SSH-2.0-world\r\n"))
				buf := make([]byte, 4096)
				for {
					n, err := c.Read(buf)
					if n > 0 {
						c.Write(buf[:n])
					}
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	script := hnScript(`
def echo(label, port, data, banner=False, prewait=0.0, parts=1):
    try:
        s = conn("echo.test", port)
        got = b""
        if banner:
            while not got.endswith(b"\n"):
                got += s.recv(100)
        time.sleep(prewait)
        want = b""
        for k in range(parts):
            s.sendall(data)
            want += data
            back = b""
            while len(back) < len(data):
                b = s.recv(65536)
                if not b:
                    break
                back += b
            got += back
        print(label + ": " + repr(got), flush=True)
        s.close()
    except Exception as e:
        print(label + ": error " + type(e).__name__ + " " + str(e), flush=True)
echo("server-first", 2222, b"SSH-2.0-client\r\n", banner=True)
echo("server-first-late", 2222, b"GET / HTTP/1.1\r\nHost: late.other.test\r\n\r\n", banner=True, prewait=1.0)
echo("client-first", 7, b"SSH-2.0-client\r\n")
echo("silent-then-binary", 7, b"\x00\x01binary", prewait=1.0)
# one byte at a time, waiting for each answer: the request/response
# benchmark's pattern (each chunk answered with "ok")
s = conn("echo.test", 80)
ok = 0
for i in range(50):
    s.sendall(b"x")
    if s.recv(10) == b"ok\n":
        ok += 1
print("token-stream: %d" % ok, flush=True)
`)
	r := w.mustRun(0, runOpts{flags: []string{"--allow", "echo.test:7,80,2222"}, script: script})
	got := hnResults(t, r)
	for k, v := range map[string]string{
		"server-first":       `b'SSH-2.0-world\r\nSSH-2.0-client\r\n'`,
		"client-first":       `b'SSH-2.0-client\r\n'`,
		"silent-then-binary": `b'\x00\x01binary'`,
		"token-stream":       "50",
	} {
		if got[k] != v {
			t.Errorf("%s:\n got %q\nwant %q", k, got[k], v)
		}
	}
	// Whoever speaks first, the client's first bytes are judged: after a
	// banner, an HTTP request naming another host is still refused.
	if late := got["server-first-late"]; !strings.HasPrefix(late, `b'SSH-2.0-world\r\nHTTP/1.1 403 Forbidden`) || strings.Contains(late, "late.other.test\\r\\n\\r\\n") {
		t.Errorf("server-first-late: got %q, want the banner and then tunwall's 403", late)
	}
	hnNoForbiddenArrivals(t, w)
	for _, m := range hnAudit(t, r.audit) {
		if hnStr(m, "verdict") != "allow" && !strings.Contains(hnStr(m, "http_host"), "late.other.test") {
			t.Errorf("a flow of a protocol that is neither TLS nor HTTP was denied: %v", m)
		}
	}
}

func TestNameChecksApplyToSOCKSClients(t *testing.T) {
	requireTools(t, "curl")
	w := newWorld(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	proxy, proxyAudit, _ := w.startBackground(ctx, "socks", runOpts{
		flags: []string{"--listen", "127.0.0.1:1080", "--allow", "allowed.test:80,443"},
	}, "SOCKS5 proxy on")
	script := `curl -sS --socks5-hostname 127.0.0.1:1080 http://allowed.test/socks
curl -sS --max-time 10 -o /dev/null -w '%{http_code}\n' --socks5-hostname 127.0.0.1:1080 -H 'Host: socks.other.test' http://allowed.test/front
curl -sS --max-time 10 --cacert ` + w.caPEM + ` --socks5-hostname 127.0.0.1:1080 --connect-to sockstls.other.test:443:allowed.test:443 https://sockstls.other.test/ 2>/dev/null; echo "tls: $?"`
	out, err := w.AgentCommand(ctx, "sh", "-c", script).Output()
	if err != nil {
		t.Fatal(err)
	}
	if want := "web allowed.test /socks\n403\ntls: 35\n"; string(out) != want {
		t.Errorf("through tunwall socks:\n got %q\nwant %q", out, want)
	}
	proxy.Process.Signal(syscall.SIGTERM)
	proxy.Wait()
	hnNoForbiddenArrivals(t, w)
	recs := hnAudit(t, proxyAudit)
	for _, needle := range []string{"socks.other.test", "sockstls.other.test"} {
		if hnDenied(recs, needle) == nil {
			t.Errorf("no denied SOCKS flow naming %s: %v", needle, recs)
		}
	}
}
