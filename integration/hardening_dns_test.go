package integration

// DNS hardening, by attack from inside the sandbox: a client that tries to
// carry chosen bits to the upstream resolver in what tunwall forwards (the
// name's letter case, header flags, EDNS options, odd record types); a flood
// of wildcard names that tries to exhaust the fake-address pool; and floods
// of DNS-over-TCP connections and UDP DNS sessions that try to grow
// tunwall's memory.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/tunwall/tunwall/internal/audit"
)

// hdnsForwardedTypes are the record types tunwall may send upstream: the
// ordinary types it forwards for allowed names (README), and A/AAAA, which it
// asks itself when a flow is dialled.
var hdnsForwardedTypes = map[uint16]bool{
	dns.TypeA: true, dns.TypeAAAA: true,
	dns.TypeNS: true, dns.TypeCNAME: true, dns.TypeSOA: true, dns.TypePTR: true,
	dns.TypeMX: true, dns.TypeTXT: true, dns.TypeSRV: true, dns.TypeNAPTR: true,
	dns.TypeCAA: true, dns.TypeTLSA: true, dns.TypeSSHFP: true,
}

func TestForwardedQueriesAreRebuiltAndCarryNoClientChosenBits(t *testing.T) {
	requireTools(t, "dig")
	w := newWorld(t)
	// Every way dig has to put bits into a query: the name's case (0x20),
	// CD and AD, DO, EDNS options of every kind (a private code, cookies,
	// client subnet, NSID, padding, expire), an EDNS version we do not
	// speak, an odd or meta type, a zone transfer, a non-IN class.
	r := w.mustRun(0, runOpts{
		flags: []string{"--allow", "allowed.test", "--allow", "*.allowed.test"},
		script: `d() { dig +tries=1 +time=5 @198.18.0.1 "$@"; }
st() { d "$@" | sed -n 's/.*status: \([A-Z]*\),.*/\1/p'; }
echo "txt $(d +short -t TXT AlLoWeD.TeSt)"
echo "mx $(d +short +tcp -t MX wWw.ALLOWED.test)"
echo "cd $(st +cd -t TXT ALLOWED.TEST)"
echo "ad $(st +adflag -t TXT allowed.test)"
echo "do $(st +dnssec -t TXT allowed.test)"
echo "opt $(st +ednsopt=65001:deadbeef -t TXT allowed.test)"
echo "cookie $(st +cookie=0102030405060708 -t TXT allowed.test)"
echo "subnet $(st +subnet=198.51.100.77/32 -t TXT allowed.test)"
echo "nsid $(st +nsid +expire -t TXT allowed.test)"
echo "padding $(st +padding=128 -t TXT allowed.test)"
echo "ednsflags $(st +ednsflags=0x7fff -t TXT allowed.test)"
echo "z $(st +zflag -t TXT allowed.test)"
echo "edns1 $(st +edns=1 +noednsnegotiation -t TXT allowed.test)"
echo "private $(st -t TYPE65280 allowed.test)"
echo "null $(st -t NULL api.allowed.test)"
echo "dnskey $(st +dnssec -t DNSKEY allowed.test)"
echo "hinfo $(st -t HINFO allowed.test)"
echo "any $(st -t ANY allowed.test)"
echo "axfr $(d +tcp -t AXFR allowed.test | grep -c 'Transfer failed' )"
echo "chaos $(st -c CH -t TXT allowed.test)"
echo "tcp $(st +tcp +dnssec +cd +subnet=198.51.100.0/24 -t TXT aLLowed.test)"
`,
	})
	got := map[string]string{}
	for _, l := range lines(r.stdout) {
		k, v, _ := strings.Cut(l, " ")
		got[k] = v
	}
	// Forwarding still works for ordinary types and any letter case.
	if !strings.Contains(got["txt"], "world says hello to allowed.test") {
		t.Errorf("TXT AlLoWeD.TeSt: got %q, want the world's TXT record\n%s", got["txt"], r)
	}
	if !strings.Contains(got["mx"], "mail.www.allowed.test") {
		t.Errorf("MX over TCP: got %q, want the world's MX record\n%s", got["mx"], r)
	}
	for _, k := range []string{"cd", "ad", "do", "opt", "cookie", "subnet", "nsid", "padding", "ednsflags", "z", "private", "null", "dnskey", "hinfo", "any", "tcp"} {
		if got[k] != "NOERROR" {
			t.Errorf("%s: status %q, want NOERROR\n%s", k, got[k], r)
		}
	}
	if got["edns1"] != "BADVERS" {
		t.Errorf("EDNS version 1: status %q, want BADVERS", got["edns1"])
	}
	if got["chaos"] != "REFUSED" {
		t.Errorf("class CH: status %q, want REFUSED", got["chaos"])
	}
	if got["axfr"] != "1" {
		t.Errorf("AXFR over TCP: want dig to say the transfer failed, got %q\n%s", got["axfr"], r)
	}

	// What the world's resolver received: only what tunwall built.
	var n int
	for _, q := range w.DNS.Log() {
		m := q.Query
		if m == nil || len(m.Question) != 1 {
			t.Errorf("upstream received a query with %v questions", m)
			continue
		}
		n++
		qq := m.Question[0]
		what := fmt.Sprintf("upstream query %q %s", qq.Name, hdnsType(qq.Qtype))
		if qq.Name != strings.ToLower(qq.Name) {
			t.Errorf("%s: the name's letter case reached the upstream (0x20 bits)", what)
		}
		if !hdnsForwardedTypes[qq.Qtype] {
			t.Errorf("%s: a type outside the forwarded set reached the upstream", what)
		}
		if qq.Qclass != dns.ClassINET {
			t.Errorf("%s: class %d reached the upstream", what, qq.Qclass)
		}
		if m.CheckingDisabled || m.AuthenticatedData || m.Zero || !m.RecursionDesired || m.Opcode != dns.OpcodeQuery || m.Response {
			t.Errorf("%s: header flags CD=%v AD=%v Z=%v RD=%v opcode=%d QR=%v, want only RD", what,
				m.CheckingDisabled, m.AuthenticatedData, m.Zero, m.RecursionDesired, m.Opcode, m.Response)
		}
		if len(m.Answer) != 0 || len(m.Ns) != 0 {
			t.Errorf("%s: carries %d answer and %d authority records", what, len(m.Answer), len(m.Ns))
		}
		for _, rr := range m.Extra {
			opt, ok := rr.(*dns.OPT)
			if !ok {
				t.Errorf("%s: carries an additional record %v", what, rr)
				continue
			}
			if opt.Version() != 0 || opt.Do() || opt.Hdr.Ttl != 0 || len(opt.Option) != 0 || opt.UDPSize() != 1232 || opt.Hdr.Name != "." {
				t.Errorf("%s: OPT record %v (version %d, DO %v, flags %#x, %d options, size %d), want tunwall's own: version 0, no flags, no options, size 1232",
					what, opt, opt.Version(), opt.Do(), opt.Hdr.Ttl, len(opt.Option), opt.UDPSize())
			}
		}
		if len(m.Extra) > 1 {
			t.Errorf("%s: %d additional records", what, len(m.Extra))
		}
	}
	// The TXT, MX and DNSSEC-flagged TXT queries were forwarded: the checks
	// above looked at real queries.
	if n < 13 {
		t.Errorf("the world's resolver saw %d queries, want at least 13 forwarded ones", n)
	}
}

func hdnsType(t uint16) string {
	if s, ok := dns.TypeToString[t]; ok {
		return s
	}
	return "TYPE" + strconv.Itoa(int(t))
}

// hdnsDNSPy is a tiny DNS client for the sandbox's python3: q(name, qtype)
// asks 198.18.0.1 over UDP and returns (rcode, [addresses]).
const hdnsDNSPy = `
import socket, struct, random, time, os, sys
SERVER = '198.18.0.1'
def wire(name, qtype=1, qid=None):
    if qid is None:
        qid = random.randrange(65536)
    b = struct.pack('>HHHHHH', qid, 0x0100, 1, 0, 0, 0)
    for l in name.split('.'):
        b += bytes([len(l)]) + l.encode()
    return b + b'\0' + struct.pack('>HH', qtype, 1)
def parse(r):
    rcode = r[3] & 0xF
    an = struct.unpack('>H', r[6:8])[0]
    i = 12
    while r[i]:
        i += r[i] + 1
    i += 5
    addrs = []
    for _ in range(an):
        if r[i] & 0xC0 == 0xC0:
            i += 2
        else:
            while r[i]:
                i += r[i] + 1
            i += 1
        t, c, ttl, l = struct.unpack('>HHIH', r[i:i+10])
        i += 10
        if t == 1:
            addrs.append(socket.inet_ntoa(r[i:i+l]))
        i += l
    return rcode, addrs
RCODES = {0: 'NOERROR', 2: 'SERVFAIL', 3: 'NXDOMAIN', 5: 'REFUSED'}
def q(name, qtype=1):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(5)
    try:
        s.sendto(wire(name, qtype), (SERVER, 53))
        rcode, addrs = parse(s.recv(4096))
        return RCODES.get(rcode, str(rcode)), addrs
    finally:
        s.close()
`

func TestAWildcardFloodCannotStarveExactNamesAndOnlyIdleSlotsAreReused(t *testing.T) {
	requireTools(t, "python3")
	w := newWorld(t)
	// A pool of 40 slots, reusable after 3s idle. Two exact names are
	// pinned; a flood of wildcard names takes the rest, and must neither
	// take the exact names' slots nor the slot of a name with an open
	// connection.
	r := w.mustRun(0, runOpts{
		flags: []string{
			"--allow", "allowed.test:80", "--allow", "api.allowed.test:80", "--allow", "*.cdn.allowed.test:80",
			"--dns-pool-size", "40", "--dns-pool-idle", "3s",
		},
		timeout: 90 * time.Second,
		script: `python3 - <<'PY'
` + hdnsDNSPy + `
def get(sock, host):
    sock.sendall(('GET / HTTP/1.1\r\nHost: %s\r\n\r\n' % host).encode())
    data = b''
    while b'\r\n\r\n' not in data:
        data += sock.recv(4096)
    head, body = data.split(b'\r\n\r\n', 1)
    n = int([l.split(b':')[1] for l in head.split(b'\r\n') if l.lower().startswith(b'content-length:')][0])
    while len(body) < n:
        body += sock.recv(4096)
    return head.split(b' ')[1].decode() + ' ' + body.decode().strip()

rc, held = q('a.cdn.allowed.test')
hc = socket.create_connection((held[0], 80), timeout=5)
print('held', rc, held[0], get(hc, 'a.cdn.allowed.test'))
sys.stdout.flush()

tag = '%08x' % random.randrange(1 << 32)
flood = {}
counts = {}
for i in range(200):
    n = 'f%d-%s.cdn.allowed.test' % (i, tag)
    rc, a = q(n)
    counts[rc] = counts.get(rc, 0) + 1
    if a:
        flood[n] = a[0]
print('flood1', ' '.join('%s=%d' % kv for kv in sorted(counts.items())))
print('flood1-held-taken', sum(1 for a in flood.values() if a == held[0]))

for name in ('allowed.test', 'api.allowed.test'):
    rc, a = q(name)
    status = 'none'
    if a:
        c = socket.create_connection((a[0], 80), timeout=5)
        status = get(c, name).split(' ')[0]
        c.close()
    print('exact', name, rc, status)
sys.stdout.flush()

# Poll (bounded) until a new wildcard name gets a slot again: an idle one.
got = None
for k in range(150):
    rc, a = q('late%d-%s.cdn.allowed.test' % (k, tag))
    if rc == 'NOERROR':
        got = a[0]
        break
    time.sleep(0.2)
print('reused', got is not None, got in set(flood.values()), got == held[0])

counts = {}
taken = 0
for i in range(200):
    rc, a = q('g%d-%s.cdn.allowed.test' % (i, tag))
    counts[rc] = counts.get(rc, 0) + 1
    if a and a[0] == held[0]:
        taken += 1
print('flood2', ' '.join('%s=%d' % kv for kv in sorted(counts.items())), 'held-taken', taken)

print('held-again', get(hc, 'a.cdn.allowed.test'))
c = socket.create_connection((held[0], 80), timeout=5)
print('held-new', get(c, 'a.cdn.allowed.test'))
c.close()
hc.close()
PY`,
	})
	got := map[string]string{}
	for _, l := range lines(r.stdout) {
		k, v, _ := strings.Cut(l, " ")
		got[k] = v
	}
	t.Logf("sandbox said:\n%s", r.stdout)
	if f := strings.Fields(got["held"]); len(f) < 4 || f[0] != "NOERROR" || f[2] != "200" {
		t.Fatalf("the held connection to a.cdn.allowed.test did not work: %q\n%s", got["held"], r)
	}
	if !strings.Contains(got["flood1"], "REFUSED=") || !strings.Contains(got["flood1"], "NOERROR=") {
		t.Errorf("flood of 200 wildcard names into 40 slots: %q, want some answered and the rest REFUSED", got["flood1"])
	}
	if got["flood1-held-taken"] != "0" {
		t.Errorf("%s flood names got the held connection's address", got["flood1-held-taken"])
	}
	for _, name := range []string{"allowed.test", "api.allowed.test"} {
		if !strings.Contains(r.stdout, "exact "+name+" NOERROR 200") {
			t.Errorf("exact name %s did not resolve and connect after the flood\n%s", name, r)
		}
	}
	if got["reused"] != "True True False" {
		t.Errorf("after the flood: reused = %q, want an idle flood slot handed to a new name (True True False)", got["reused"])
	}
	if !strings.Contains(got["flood2"], "held-taken 0") || !strings.Contains(got["flood2"], "NOERROR=") {
		t.Errorf("second flood: %q, want answers from reused idle slots and never the held slot", got["flood2"])
	}
	if !strings.HasPrefix(got["held-again"], "200 ") || !strings.HasPrefix(got["held-new"], "200 ") {
		t.Errorf("the held slot no longer reaches a.cdn.allowed.test: %q, %q", got["held-again"], got["held-new"])
	}
	if m := regexp.MustCompile(`(\d+) refused with the fake-address pool full`).FindStringSubmatch(r.stderr); m == nil || m[1] == "0" {
		t.Errorf("tunwall did not report refusing names with the pool full\n%s", r)
	}
	// Every flow to the held address was judged as a.cdn.allowed.test.
	held := strings.Fields(got["held"])[1]
	for _, fr := range polFlows(t, r.audit, func(a audit.Record) bool { return a.Dst.Addr().String() == held }) {
		if fr.Host != "a.cdn.allowed.test" || fr.Verdict != "allow" {
			t.Errorf("flow to the held address %s recorded as host %q verdict %q", held, fr.Host, fr.Verdict)
		}
	}
}

// hdnsRunMeasured runs tunwall like w.run, and reads its peak RSS (VmHWM)
// when the sandbox writes $HDNS_DIR/measure, then writes $HDNS_DIR/measured
// for the sandbox to go on.
func hdnsRunMeasured(w *world, o runOpts) (result, int64) {
	t := w.t
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), o.timeout)
	defer cancel()
	dir, err := os.MkdirTemp(w.dir, "hdns-")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(dir, 0o777)
	o.env = append(o.env, "HDNS_DIR="+dir)
	cmd, auditPath := w.tunwallCmd(ctx, o, "run")
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// `ip netns exec` execs tunwall: the pid is tunwall's.
	pid := cmd.Process.Pid
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()

	var hwm int64 = -1
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var werr error
wait:
	for {
		select {
		case werr = <-waited:
			break wait
		case <-tick.C:
			if hwm < 0 {
				if _, err := os.Stat(filepath.Join(dir, "measure")); err == nil {
					hwm = hdnsVmHWM(t, pid)
					os.WriteFile(filepath.Join(dir, "measured"), nil, 0o644)
				}
			}
		}
	}
	res := result{stdout: stdout.String(), stderr: stderr.String(), audit: auditPath, elapsed: time.Since(start)}
	var ee *exec.ExitError
	switch {
	case werr == nil:
	case errors.As(werr, &ee):
		res.code = ee.ExitCode()
		if ctx.Err() != nil {
			t.Fatalf("tunwall run timed out after %v\n%s", o.timeout, res)
		}
	default:
		t.Fatalf("tunwall run: %v\n%s", werr, res)
	}
	t.Logf("tunwall run: exit %d in %v", res.code, res.elapsed.Round(time.Millisecond))
	return res, hwm
}

// hdnsVmHWM returns the peak resident set of pid in bytes.
func hdnsVmHWM(t *testing.T, pid int) int64 {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatalf("tunwall's status: %v", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				t.Fatalf("VmHWM %q: %v", v, err)
			}
			return kb << 10
		}
	}
	t.Fatalf("no VmHWM in /proc/%d/status", pid)
	return 0
}

// hdnsFloodPy holds many DNS-over-TCP connections and then many UDP DNS
// sessions open at once, keeping each alive with a query every 2s, and
// asks dig for an answer while they are held and after.
const hdnsFloodPy = hdnsDNSPy + `
import resource, select, subprocess, threading
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
NTCP, NUDP = int(sys.argv[1]), int(sys.argv[2])
def frame(name):
    m = wire(name)
    return struct.pack('>H', len(m)) + m
def dig(*args):
    # An ordinary dig: its default 3 tries of 5s over UDP.
    try:
        out = subprocess.run(['dig', '+short', '@' + SERVER] + list(args) + ['allowed.test'],
                             capture_output=True, text=True, timeout=30).stdout.split()
    except subprocess.TimeoutExpired:
        return 'timeout'
    # The answer, or what dig said instead (after a timed-out try, dig
    # prints a warning before the answer of the next).
    for w in reversed(out):
        try:
            socket.inet_aton(w)
            return w
        except OSError:
            pass
    return '_'.join(out) or 'none'
dropped = [0]
def keepalive(socks, send, pace=False):
    # One query on every held socket; paced, 1000 every 0.1s, so that the
    # hold is not also a packet burst that overflows the TUN's queue.
    alive = []
    for i, s in enumerate(socks):
        try:
            send(s)
            alive.append(s)
        except OSError:
            s.close()
            dropped[0] += 1
        if pace and i % 1000 == 999:
            time.sleep(0.1)
    return alive

def tcp_flood(n):
    # Up to 1000 connects in flight; each that completes sends a query and
    # is held. Every 2s each held connection sends another query.
    socks, refused, opened, last = [], 0, 0, time.time()
    p = select.poll()
    pending = {}
    t_end = time.time() + 120
    while (opened < n or pending) and time.time() < t_end:
        while opened < n and len(pending) < 1000:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setblocking(False)
            s.connect_ex((SERVER, 53))
            p.register(s, select.POLLOUT)
            pending[s.fileno()] = (s, time.time())
            opened += 1
        for fd, ev in p.poll(100):
            s, _ = pending.pop(fd, (None, 0))
            if s is None:
                continue
            p.unregister(fd)
            if ev & (select.POLLERR | select.POLLHUP) or s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                s.close()
                refused += 1
                continue
            try:
                s.send(frame('allowed.test'))
                socks.append(s)
            except OSError:
                s.close()
                refused += 1
        now = time.time()
        for fd, (s, t0) in list(pending.items()):
            if now - t0 > 10:
                del pending[fd]
                p.unregister(fd)
                s.close()
                refused += 1
        if now - last > 2:
            socks = keepalive(socks, lambda s: s.send(frame('allowed.test')))
            last = now
    for s, _ in pending.values():
        s.close()
        refused += 1
    return socks, refused, opened

def txdrop():
    for l in open('/proc/net/dev'):
        if l.strip().startswith('tun0:'):
            return l.split(':', 1)[1].split()[11]
def dig_held(*args):
    # An ordinary dig, again (at most 4 times, 60s in all) while it gets no
    # answer: on this small machine the flood can fill the TUN's queue, and
    # a datagram that never reached tunwall proves nothing about its
    # limits; a limit that starved the client would starve every try.
    tries = []
    for _ in range(4):
        a = dig(*args)
        tries.append(a)
        try:
            socket.inet_aton(a)
            break
        except OSError:
            pass
    return tries[-1], len(tries)

def during(socks, send, what):
    # dig while another thread keeps holding every socket, sending on each
    # every 2s or so (bounded: until the digs are done, at most 150s).
    stop = threading.Event()
    held = [socks]
    def loop():
        t_end = time.time() + 150
        while not stop.is_set() and time.time() < t_end:
            held[0] = keepalive(held[0], send, pace=True)
            stop.wait(1)
    th = threading.Thread(target=loop)
    th.start()
    d0 = txdrop()
    (a, na), (b, nb) = dig_held(), dig_held('+tcp')
    print(what, a, b)
    print(what + '-tries', na, nb, 'txdrop', d0, txdrop())
    sys.stdout.flush()
    stop.set()
    th.join()
    return held[0]

socks, refused, opened = tcp_flood(NTCP)
print('tcp-opened', opened, 'refused', refused, 'closed-by-tunwall', dropped[0], 'alive', len(socks))
sys.stdout.flush()
socks = during(socks, lambda s: s.send(frame('allowed.test')), 'dig-during-tcp')
for s in socks:
    s.close()

usocks, last = [], time.time()
for i in range(NUDP):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setblocking(False)
    try:
        s.connect((SERVER, 53))
        s.send(wire('allowed.test'))
        usocks.append(s)
    except OSError:
        s.close()
    if time.time() - last > 2:
        usocks = keepalive(usocks, lambda s: s.send(wire('allowed.test')))
        last = time.time()
usocks = keepalive(usocks, lambda s: s.send(wire('allowed.test')))
print('udp-opened', NUDP, 'alive', len(usocks))
usocks = during(usocks, lambda s: s.send(wire('allowed.test')), 'dig-during-udp')
for s in usocks:
    s.close()
print('dig-after', dig(), dig('+tcp'))
sys.stdout.flush()
d = os.environ['HDNS_DIR']
open(os.path.join(d, 'measure'), 'w').close()
for _ in range(300):
    if os.path.exists(os.path.join(d, 'measured')):
        break
    time.sleep(0.1)
`

func TestDNSFloodsOverTCPAndUDPStayBoundedAndDigStillAnswers(t *testing.T) {
	requireTools(t, "python3", "dig")
	w := newWorld(t)
	pyPath := filepath.Join(w.dir, "hdns_flood.py")
	if err := os.WriteFile(pyPath, []byte(hdnsFloodPy), 0o644); err != nil {
		t.Fatal(err)
	}
	// The figures of the red-team report: 17,000 held DNS-over-TCP
	// connections, 19,000 UDP DNS sessions, with the documented defaults.
	r, hwm := hdnsRunMeasured(w, runOpts{
		flags:   []string{"--allow", "allowed.test"},
		script:  "python3 " + pyPath + " 17000 19000",
		timeout: 400 * time.Second,
	})
	t.Logf("sandbox said:\n%s\ntunwall said:\n%s", r.stdout, r.stderr)
	if r.code != 0 {
		t.Fatalf("flood script failed\n%s", r)
	}
	if hwm < 0 {
		t.Fatalf("the sandbox never asked for the measurement\n%s", r)
	}
	t.Logf("tunwall's peak RSS (VmHWM): %.1f MiB", float64(hwm)/(1<<20))
	// 192 MiB: the unbounded code peaked at 325 MiB (718 MiB before the
	// DNS caps) under this flood; the bounded one peaks at about 85 or
	// about 145 MiB depending on when the GC runs (runs in a row on an
	// idle machine: 85.8, 144.9, 144.9, 85.0), and reached 161.2 MiB in
	// one clean CI run, so 128 and then 160 MiB failed now and then while
	// nothing was unbounded. --max-memory is 256 MiB.
	if limit := int64(192 << 20); hwm > limit {
		t.Errorf("tunwall's peak RSS %.1f MiB under the DNS floods, want at most %d MiB (well under 256 MiB)", float64(hwm)/(1<<20), limit>>20)
	}
	fake := netip.MustParsePrefix("198.18.0.0/15")
	for _, k := range []string{"dig-during-tcp", "dig-during-udp", "dig-after"} {
		var line string
		for _, l := range lines(r.stdout) {
			if strings.HasPrefix(l, k+" ") {
				line = l
			}
		}
		f := strings.Fields(line)
		if len(f) != 3 {
			t.Errorf("%s: no result\n%s", k, r)
			continue
		}
		for i, mode := range []string{"udp", "tcp"} {
			if a, err := netip.ParseAddr(f[1+i]); err != nil || !fake.Contains(a) {
				t.Errorf("%s: dig over %s got %q, want allowed.test's fake address", k, mode, f[1+i])
			}
		}
	}
	if !strings.Contains(r.stdout, "tcp-opened 17000 ") || !strings.Contains(r.stdout, "udp-opened 19000 ") {
		t.Errorf("the flood did not try 17000 connections and 19000 sessions\n%s", r)
	}
	// The limits, not luck, kept it bounded: tunwall says it closed idle
	// sessions to make room.
	m := regexp.MustCompile(`DNS limits reached: (\d+) idle sessions closed`).FindStringSubmatch(r.stderr)
	if m == nil || m[1] == "0" {
		t.Errorf("tunwall did not report closing idle DNS sessions at its limits\n%s", r)
	}
}
