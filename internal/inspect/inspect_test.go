package inspect

import (
	"bytes"
	"crypto/tls"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/tunwall/tunwall/flow"
	"github.com/tunwall/tunwall/internal/engine/enginetest"
)

// outcome is what an inspector made of a stream, as a caller sees it.
type outcome struct {
	passed     []byte
	op         Op // Refuse or Forbid; Wait if the stream ended unrefused
	reason     string
	rule       string
	state      State
	incomplete string
	name       string
	flowRule   string
	sni, host  string
	requests   int
}

// drive feeds chunks to a new inspector the way a caller does: it holds
// what it read, shows it to Next, passes and drops what the step says,
// and answers an Upgrade with switched.
func drive(t testing.TB, cfg Config, chunks [][]byte, canPass, switched bool) outcome {
	t.Helper()
	in := New(cfg)
	var held []byte
	var o outcome
	steps := 0
feed:
	for _, c := range chunks {
		held = append(held, c...)
		for {
			if steps++; steps > 100000 {
				t.Fatalf("more than 100000 steps: the inspector loops in state %d", in.State())
			}
			if in.State() == Switch {
				in.Switched(switched)
				continue
			}
			if in.State() == Passing && len(held) == 0 {
				continue feed
			}
			s := in.Next(held, canPass)
			switch s.Op {
			case Wait:
				o.incomplete = s.Incomplete
				continue feed
			case Again:
				o.incomplete = ""
			case Pass:
				if s.From > s.To || s.To > len(held) || s.Drop > len(held) {
					t.Fatalf("step %+v out of the %d bytes held", s, len(held))
				}
				o.passed = append(o.passed, held[s.From:s.To]...)
				held = held[s.Drop:]
				o.incomplete = ""
			case Refuse, Forbid:
				o.op, o.reason, o.rule = s.Op, s.Verdict.Reason, s.Verdict.Rule
				o.incomplete = ""
				break feed
			}
		}
	}
	o.state, o.name, o.flowRule = in.State(), in.Name(), in.Rule()
	o.sni, o.host, o.requests = in.SNI(), in.HTTPHost(), in.Requests()
	return o
}

// sameVerdict reports how a and b differ in what was decided, or "". A
// reason may quote the offending value as far as it was held when it was
// refused ("a malformed request line (\"  get \")"): the quote is not
// compared, the rest is.
func sameVerdict(a, b outcome) string {
	unquoted := func(r string) string {
		if i := strings.Index(r, ` ("`); i >= 0 {
			return r[:i]
		}
		return r
	}
	switch {
	case a.op != b.op || unquoted(a.reason) != unquoted(b.reason) || a.rule != b.rule:
		return "verdict"
	case a.state != b.state || a.incomplete != b.incomplete:
		return "state"
	case a.name != b.name || a.flowRule != b.flowRule || a.sni != b.sni || a.host != b.host || a.requests != b.requests:
		return "names seen"
	}
	return ""
}

// checkSplits feeds stream whole, split at every byte boundary, and a
// byte at a time, and fails if any verdict differs from the whole one.
// Without early passing the bytes passed must be the same too, unless a
// body was refused part way; they are always a prefix of the stream.
func checkSplits(t testing.TB, cfg func() Config, stream []byte, switched bool) outcome {
	t.Helper()
	whole := drive(t, cfg(), [][]byte{stream}, false, switched)
	check := func(how string, chunks [][]byte) {
		for _, canPass := range []bool{false, true} {
			got := drive(t, cfg(), chunks, canPass, switched)
			if d := sameVerdict(whole, got); d != "" {
				t.Fatalf("fed %s (early pass %v), the %s differs:\n got %+v\nwhole %+v\nstream %q", how, canPass, d, got, whole, stream)
			}
			if !bytes.HasPrefix(stream, got.passed) {
				t.Fatalf("fed %s (early pass %v), passed %q: not a prefix of the stream %q", how, canPass, got.passed, stream)
			}
			// Body bytes pass as they come: before a refusal later in
			// the body, a split stream may have passed more of it.
			if !canPass && (whole.op == Wait && !bytes.Equal(got.passed, whole.passed) || !bytes.HasPrefix(got.passed, whole.passed)) {
				t.Fatalf("fed %s, passed %q; whole passed %q", how, got.passed, whole.passed)
			}
		}
	}
	for k := range len(stream) + 1 {
		check("split at "+itoa(k), [][]byte{stream[:k], stream[k:]})
	}
	bytewise := make([][]byte, len(stream))
	for i := range stream {
		bytewise[i] = stream[i : i+1]
	}
	check("a byte at a time", bytewise)
	return whole
}

func itoa(n int) string {
	if n == 0 {
		return "0"
	}
	var b []byte
	for ; n > 0; n /= 10 {
		b = append([]byte{byte('0' + n%10)}, b...)
	}
	return string(b)
}

// named is the config of a flow to allowed.test, with a search domain and
// a foreign-placeholder finder.
func named() Config {
	return Config{
		Name: "allowed.test", Rule: "allow allowed.test", Search: []string{"corp.test"},
		Foreign: func(name string, head []byte) (flow.Decision, bool) {
			if bytes.Contains(head, []byte("TW_PLACEHOLDER")) {
				return flow.Decision{Rule: "credential-placeholder", Reason: "placeholder for " + name}, true
			}
			return flow.Decision{}, false
		},
	}
}

// rawIP is the config of a flow to a raw IP: the first name read is
// judged by Decide, which allows allowed.test only.
func rawIP() Config {
	return Config{
		Rule: "default-deny",
		Decide: func(name, from string) (flow.Decision, bool) {
			if name == "allowed.test" {
				return flow.Decision{Verdict: flow.Allow, Rule: "allow allowed.test"}, true
			}
			return flow.Decision{Verdict: flow.Deny, Rule: "default-deny", Reason: "name " + name + " (" + from + ") is not allowed"}, false
		},
	}
}

// openIP is rawIP on a raw IP (192.0.2.7) the open default allowed.
func openIP() Config {
	c := rawIP()
	c.Open, c.Addr = true, "192.0.2.7"
	return c
}

func TestInspectorVerdicts(t *testing.T) {
	hello := enginetest.ClientHello(t, "allowed.test")
	evilHello := enginetest.ClientHello(t, "evil.test")
	get := func(host string) string { return "GET / HTTP/1.1\r\nHost: " + host + "\r\n\r\n" }
	tests := []struct {
		name     string
		cfg      func() Config
		stream   string
		switched bool
		// want
		op         Op
		reason     string // a part of the reason
		rule       string
		state      State
		passed     string // "" for the whole stream when not refused
		incomplete string
		flowName   string
	}{
		{name: "a ClientHello for the flow's name passes and TLS passes after it", cfg: named, stream: string(hello) + "\x17\x03\x03\x00\x01x", state: Passing, flowName: "allowed.test"},
		{name: "a ClientHello for another name is refused as fronting", cfg: named, stream: string(evilHello), op: Refuse, reason: "sni name evil.test disagrees with allowed.test, the name this connection is for (domain fronting)", state: Denied, passed: "-"},
		{name: "a ClientHello cut short waits for the rest", cfg: named, stream: string(hello[:40]), state: Hello, incomplete: "ClientHello", passed: "-"},
		{name: "a request head for the flow's name passes", cfg: named, stream: get("allowed.test"), state: Head},
		{name: "a Host written short with the search domain passes", cfg: func() Config { c := named(); c.Name = "intra.corp.test"; return c }, stream: get("intra"), state: Head},
		{name: "a Host for another name gets a 403 for fronting", cfg: named, stream: get("evil.test"), op: Forbid, reason: "http name evil.test disagrees", state: Denied, passed: "-"},
		{name: "a second request on the connection for another name gets a 403 after the first passed", cfg: named, stream: get("allowed.test") + get("evil.test"), op: Forbid, reason: "http name evil.test disagrees", state: Denied, passed: get("allowed.test")},
		{name: "a request body is followed to the next head", cfg: named, stream: "POST / HTTP/1.1\r\nHost: allowed.test\r\nContent-Length: 5\r\n\r\nhello" + get("allowed.test"), state: Head},
		{name: "a chunked body hiding a request is followed, and the next head checked", cfg: named, stream: "POST / HTTP/1.1\r\nHost: allowed.test\r\nTransfer-Encoding: chunked\r\n\r\n1b\r\nGET / HTTP/1.1\r\nHost: e\r\n\r\n\r\n0\r\n\r\n" + get("evil.test"), op: Forbid, reason: "http name evil.test", state: Denied, passed: "POST / HTTP/1.1\r\nHost: allowed.test\r\nTransfer-Encoding: chunked\r\n\r\n1b\r\nGET / HTTP/1.1\r\nHost: e\r\n\r\n\r\n0\r\n\r\n"},
		{name: "CONNECT gets a 403", cfg: named, stream: "CONNECT allowed.test:443 HTTP/1.1\r\nHost: allowed.test:443\r\n\r\n", op: Forbid, reason: "CONNECT is not relayed", state: Denied, passed: "-"},
		{name: "an h2c upgrade gets a 403", cfg: named, stream: "GET / HTTP/1.1\r\nHost: allowed.test\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAA\r\n\r\n", op: Forbid, reason: "Upgrade: h2c is not relayed", state: Denied, passed: "-"},
		{name: "an upgrade to another protocol gets a 403", cfg: named, stream: "GET / HTTP/1.1\r\nHost: allowed.test\r\nConnection: Upgrade\r\nUpgrade: foo/2\r\n\r\n", op: Forbid, reason: `Upgrade: "foo" is not relayed`, state: Denied, passed: "-"},
		{name: "after a websocket switch the server accepted bytes pass as they are", cfg: named, switched: true, stream: "GET /ws HTTP/1.1\r\nHost: allowed.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n\x81\x05GET /", state: Passing},
		{name: "after a websocket switch the server refused HTTP goes on being checked", cfg: named, stream: "GET /ws HTTP/1.1\r\nHost: allowed.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n" + get("evil.test"), op: Forbid, reason: "http name evil.test", state: Denied, passed: "GET /ws HTTP/1.1\r\nHost: allowed.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"},
		{name: "an upgrade on a second request gets a 403", cfg: named, stream: get("allowed.test") + "GET /ws HTTP/1.1\r\nHost: allowed.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n", op: Forbid, reason: "must be the first on its connection", state: Denied, passed: get("allowed.test")},
		{name: "a head with a foreign placeholder gets the finder's 403", cfg: named, stream: "GET / HTTP/1.1\r\nHost: allowed.test\r\nAuthorization: Bearer TW_PLACEHOLDER\r\n\r\n", op: Forbid, reason: "placeholder for allowed.test", rule: "credential-placeholder", state: Denied, passed: "-"},
		{name: "a Host that is not a hostname gets a 403", cfg: named, stream: get("a_b!"), op: Forbid, reason: `HTTP Host "a_b!" is not a hostname`, state: Denied, passed: "-"},
		{name: "two Host headers are refused", cfg: named, stream: "GET / HTTP/1.1\r\nHost: allowed.test\r\nHost: evil.test\r\n\r\n", op: Refuse, reason: "HTTP request refused: ", state: Denied, passed: "-"},
		{name: "neither TLS nor HTTP passes on a flow to a name", cfg: named, stream: "\x00\x01 ssh-ish\n", state: Passing},
		{name: "neither TLS nor HTTP is refused on a raw IP", cfg: rawIP, stream: "\x00\x01 ssh-ish\n", op: Refuse, reason: "sent no name", state: Denied, passed: "-"},
		{name: "on a raw IP an allowed SNI names the flow", cfg: rawIP, stream: string(hello), state: Passing, flowName: "allowed.test"},
		{name: "on a raw IP a denied SNI is refused with the decider's verdict", cfg: rawIP, stream: string(evilHello), op: Refuse, reason: "name evil.test (sni) is not allowed", rule: "default-deny", state: Denied, passed: "-"},
		{name: "on a raw IP a denied Host gets a 403 with the decider's verdict", cfg: rawIP, stream: get("evil.test"), op: Forbid, reason: "name evil.test (http) is not allowed", rule: "default-deny", state: Denied, passed: "-"},
		{name: "on a raw IP a request with no Host is refused", cfg: rawIP, stream: "GET / HTTP/1.0\r\n\r\n", op: Forbid, reason: "sent no name", state: Denied, passed: "-"},
		{name: "on a raw IP a later request must have the name the first one set", cfg: rawIP, stream: get("allowed.test") + get("other.test"), op: Forbid, reason: "http name other.test disagrees with allowed.test", state: Denied, passed: get("allowed.test")},
		{name: "a request head cut short waits for the rest", cfg: named, stream: "GET / HTTP/1.1\r\nHost: allo", state: Head, incomplete: "request head", passed: "-"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := checkSplits(t, tt.cfg, []byte(tt.stream), tt.switched)
			if got.op != tt.op || !strings.Contains(got.reason, tt.reason) || got.rule != tt.rule || got.state != tt.state || got.incomplete != tt.incomplete {
				t.Errorf("got op %d %q (rule %q) in state %d, incomplete %q; want op %d %q (rule %q) in state %d, incomplete %q",
					got.op, got.reason, got.rule, got.state, got.incomplete, tt.op, tt.reason, tt.rule, tt.state, tt.incomplete)
			}
			want := tt.stream
			switch tt.passed {
			case "-":
				want = ""
			case "":
			default:
				want = tt.passed
			}
			if string(got.passed) != want {
				t.Errorf("passed %q, want %q", got.passed, want)
			}
			if tt.flowName != "" && got.name != tt.flowName {
				t.Errorf("flow name %q, want %q", got.name, tt.flowName)
			}
		})
	}
}

func TestInspectorPassesOnlyTheFirstWordBeforeAHeadIsComplete(t *testing.T) {
	in := New(named())
	held := []byte("FOO /secret")
	if s := in.Next(held, false); s.Op != Wait {
		t.Fatalf("with no upstream: %+v, want Wait", s)
	}
	s := in.Next(held, true)
	if s.Op != Pass || s.Drop != 0 || string(held[s.From:s.To]) != "FOO" {
		t.Fatalf("with an upstream: %+v (%q), want the first word passed and kept", s, held[s.From:s.To])
	}
	if s := in.Next(held, true); s.Op != Wait {
		t.Fatalf("again with no more bytes: %+v, want Wait", s)
	}
	held = append(held, " HTTP/1.1\r\nHost: allowed.test\r\n\r\n"...)
	for range 3 {
		if s = in.Next(held, true); s.Op != Again {
			break
		}
	}
	if s.Op != Pass || string(held[s.From:s.To]) != " /secret HTTP/1.1\r\nHost: allowed.test\r\n\r\n" || s.Drop != len(held) {
		t.Fatalf("once complete: %+v, want the rest of the head passed and all dropped", s)
	}
}

func TestInspectorHoldingCountsOnlyBytesNotYetPassed(t *testing.T) {
	in := New(named())
	if in.Holding(0) {
		t.Error("holding with nothing read on a flow to a name")
	}
	if raw := New(rawIP()); !raw.Holding(0) {
		t.Error("not holding with nothing read on a raw IP: the sniff timeout must count from the start")
	}
	in.Next([]byte("FOO"), true)
	if in.Holding(3) || !in.Holding(4) {
		t.Error("the first word passed early counts as held")
	}
}

// smallHello is a real ClientHello (crypto/tls's) for serverName offering
// X25519 only: a fifth of the size of one with a post-quantum key share,
// so that fuzzing every split of it stays quick.
func smallHello(t testing.TB, serverName string) []byte {
	t.Helper()
	c, s := net.Pipe()
	defer c.Close()
	defer s.Close()
	go tls.Client(c, &tls.Config{ServerName: serverName, CurvePreferences: []tls.CurveID{tls.X25519}}).Handshake()
	s.SetReadDeadline(time.Now().Add(5 * time.Second))
	hdr := make([]byte, 5)
	if _, err := io.ReadFull(s, hdr); err != nil {
		t.Fatal(err)
	}
	body := make([]byte, int(hdr[3])<<8|int(hdr[4]))
	if _, err := io.ReadFull(s, body); err != nil {
		t.Fatal(err)
	}
	return append(hdr, body...)
}

func FuzzInspectorSplits(f *testing.F) {
	hello := smallHello(f, "allowed.test")
	if len(hello) > 1<<10 {
		f.Fatalf("the seed ClientHello is %d bytes: longer than the fuzz target takes", len(hello))
	}
	f.Add(hello, uint8(0))
	f.Add(hello, uint8(1))
	f.Add(append(append([]byte{}, hello...), "\x17\x03\x03\x00\x02hi"...), uint8(0))
	f.Add([]byte("GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\nGET / HTTP/1.1\r\nHost: evil.test\r\n\r\n"), uint8(0))
	f.Add([]byte("POST / HTTP/1.1\r\nHost: allowed.test\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\nGET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n"), uint8(1))
	f.Add([]byte("GET /ws HTTP/1.1\r\nHost: allowed.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n\x81\x05hello"), uint8(2))
	f.Add([]byte("PUT / HTTP/1.1\r\nHost: intra\r\nContent-Length: 3\r\n\r\nabc"), uint8(3))
	f.Add([]byte("\r\n  get http://allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n"), uint8(0))
	f.Add([]byte("GET / HTTP/1.1\r\nHost: 192.0.2.7\r\n\r\nGET / HTTP/1.1\r\nHost: evil.test\r\n\r\n"), uint8(4))
	f.Add([]byte("SSH-2.0-x\r\n"), uint8(4))
	f.Fuzz(func(t *testing.T, stream []byte, mode uint8) {
		if len(stream) > 1<<10 {
			return // every split re-parses: keep a run quick
		}
		cfg := named
		if mode&1 != 0 {
			cfg = rawIP
		}
		if mode&4 != 0 {
			cfg = openIP
		}
		checkSplits(t, cfg, stream, mode&2 != 0)
	})
}

// Following a body and passing after the checks allocate nothing (STYLE
// 2.7): a long upload costs the inspector no garbage.
func TestInspectorBodyAndPassingAllocateNothing(t *testing.T) {
	in := New(named())
	head := []byte("POST / HTTP/1.1\r\nHost: allowed.test\r\nContent-Length: 1000000000\r\n\r\n")
	for s := in.Next(head, true); s.Op != Pass; s = in.Next(head, true) {
		if s.Op != Again {
			t.Fatalf("head: %+v", s)
		}
	}
	chunk := bytes.Repeat([]byte("z"), 32<<10)
	if n := testing.AllocsPerRun(100, func() {
		if s := in.Next(chunk, true); s.Op != Pass || s.Drop != len(chunk) {
			t.Fatalf("body: %+v", s)
		}
	}); n != 0 {
		t.Errorf("Next on body bytes allocs = %v, want 0", n)
	}
	tl := New(named())
	hello := smallHello(t, "allowed.test")
	for s := tl.Next(hello, true); s.Op != Pass; s = tl.Next(hello, true) {
		if s.Op != Again {
			t.Fatalf("hello: %+v", s)
		}
	}
	if n := testing.AllocsPerRun(100, func() {
		if s := tl.Next(chunk, true); s.Op != Pass || s.Drop != len(chunk) {
			t.Fatalf("passing: %+v", s)
		}
	}); n != 0 {
		t.Errorf("Next after the checks allocs = %v, want 0", n)
	}
}

// BenchmarkInspectorKeepAlive measures the checks of one request head on
// a kept-alive connection: parse, name check, pass.
func BenchmarkInspectorKeepAlive(b *testing.B) {
	head := []byte("GET /index.html HTTP/1.1\r\nHost: allowed.test\r\nUser-Agent: bench/1\r\nAccept: */*\r\n\r\n")
	in := New(named())
	b.SetBytes(int64(len(head)))
	b.ReportAllocs()
	for b.Loop() {
		for s := in.Next(head, true); s.Op != Pass; s = in.Next(head, true) {
			if s.Op != Again {
				b.Fatalf("head: %+v", s)
			}
		}
	}
}

// TestAnOpenInspectorJudgesANameButLetsANamelessClientPass: on a raw IP
// the open default allowed, a name the client sends is decided (a denied
// one refused), and a client that sends none (another protocol, a hello
// without SNI, the address itself as Host) is judged by the address,
// without the sniff deadline a client must send a name within.
func TestAnOpenInspectorJudgesANameButLetsANamelessClientPass(t *testing.T) {
	decide := func(name, from string) (flow.Decision, bool) {
		if name == "denied.test" {
			return flow.Decision{Rule: "deny denied.test", Reason: "a deny rule matches it"}, false
		}
		return flow.Decision{Verdict: flow.Allow, Rule: "default: public"}, true
	}
	cfg := Config{Rule: "default: public", Decide: decide, Open: true, Addr: "2001:db8::7"}
	get := func(host string) []byte { return []byte("GET / HTTP/1.1\r\nHost: " + host + "\r\n\r\n") }
	for _, tt := range []struct {
		name   string
		stream []byte
		op     Op
		reason string
	}{
		{"another protocol passes", []byte("SSH-2.0-x\r\n"), Wait, ""},
		{"the address as Host passes", get("[2001:DB8::7]"), Wait, ""},
		{"an allowed name passes", enginetest.ClientHello(t, "ok.test"), Wait, ""},
		{"a denied SNI is reset", enginetest.ClientHello(t, "denied.test"), Refuse, "a deny rule matches it"},
		{"a denied Host is forbidden", get("denied.test"), Forbid, "a deny rule matches it"},
		{"another address as Host is forbidden", get("[2001:db8::8]"), Forbid, "is not a hostname"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			o := drive(t, cfg, [][]byte{tt.stream}, true, false)
			if o.op != tt.op || !strings.Contains(o.reason, tt.reason) {
				t.Fatalf("op %d reason %q, want op %d reason containing %q", o.op, o.reason, tt.op, tt.reason)
			}
			if tt.op == Wait && !bytes.Equal(o.passed, tt.stream) {
				t.Fatalf("passed %q, want the whole stream", o.passed)
			}
		})
	}
	in := New(cfg)
	if in.Holding(0) {
		t.Error("an open inspector holding nothing counts the sniff deadline: a client that waits for the server would be reset")
	}
	closed := New(Config{Decide: decide})
	if !closed.Holding(0) {
		t.Error("a raw-IP inspector that is not open must wait for a name within the deadline")
	}
}
