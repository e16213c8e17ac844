package engine

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tunwall/tunwall/internal/audit"
	"github.com/tunwall/tunwall/internal/engine/enginetest"
	"github.com/tunwall/tunwall/internal/inspect"
	"github.com/tunwall/tunwall/stack"
)

// The inspectConn's unit tests run a real stack.RelayTCP between two loopback TCP
// pairs: the test is the sandboxed client on one end and the server on the
// other. (Integration tests do the same through the TUN and gVisor.)

// resetConn is a TCP conn whose Abort sends RST, as the stack's does.
type resetConn struct{ *net.TCPConn }

func (c resetConn) Abort() {
	c.SetLinger(0)
	c.Close()
}

// tcpPair returns two ends of a loopback TCP connection.
func tcpPair(t testing.TB) (*net.TCPConn, *net.TCPConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	done := make(chan *net.TCPConn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			done <- nil
			return
		}
		done <- c.(*net.TCPConn)
	}()
	a, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	b := <-done
	if b == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return a.(*net.TCPConn), b
}

// relayRun is one relayed flow through an inspectConn.
type relayRun struct {
	client, server *net.TCPConn
	g              *inspectConn
	done           chan stack.RelayResult
}

// startInspect relays a flow for name through an inspectConn with the given sniff
// timeout.
func startInspect(t *testing.T, name string, limit time.Duration) *relayRun {
	t.Helper()
	return startInspectHeld(t, name, limit, &heldBytes{max: 16 << 20})
}

// startInspectHeld is startInspect with the held-bytes count of all inspected conns.
func startInspectHeld(t *testing.T, name string, limit time.Duration, held *heldBytes) *relayRun {
	t.Helper()
	client, sandbox := tcpPair(t)
	upstream, server := tcpPair(t)
	g := newInspectConn(resetConn{sandbox}, inspect.Config{Name: name, Rule: "test rule"}, limit, held)
	g.up = &upConn{Conn: upstream}
	r := &relayRun{client: client, server: server, g: g, done: make(chan stack.RelayResult, 1)}
	go func() { r.done <- stack.RelayTCP(context.Background(), g, g.up, time.Minute) }()
	t.Cleanup(func() {
		client.Close()
		server.Close()
		select {
		case <-r.done:
		case <-time.After(10 * time.Second):
			t.Error("the relay did not end")
		}
	})
	return r
}

// readAll reads from c until EOF, an error or 5s, and says how it ended.
func readAll(c net.Conn) ([]byte, error) {
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	var out []byte
	buf := make([]byte, 4096)
	for {
		n, err := c.Read(buf)
		out = append(out, buf[:n]...)
		if err != nil {
			if err == io.EOF {
				return out, nil
			}
			return out, err
		}
	}
}

// readN reads exactly n bytes from c within 5s.
func readN(t *testing.T, c net.Conn, n int) []byte {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	b := make([]byte, n)
	if _, err := io.ReadFull(c, b); err != nil {
		t.Fatalf("reading %d bytes: %v (got %q)", n, err, b)
	}
	return b
}

// wantReset checks that c was reset (the inspectConn refused the flow).
func wantReset(t *testing.T, c net.Conn) {
	t.Helper()
	got, err := readAll(c)
	if !errors.Is(err, syscall.ECONNRESET) || len(got) != 0 {
		t.Fatalf("want a reset and nothing else, got %q, %v", got, err)
	}
}

func (r *relayRun) result(t *testing.T) (*verdict, stack.RelayResult) {
	t.Helper()
	select {
	case res := <-r.done:
		r.done <- res
		d, _ := r.g.result()
		return d, res
	case <-time.After(10 * time.Second):
		t.Fatal("the relay did not end")
	}
	return nil, stack.RelayResult{}
}

func TestInspectionPassesAHelloSentSlowlyAfterItIsComplete(t *testing.T) {
	r := startInspect(t, "allowed.test", 5*time.Second)
	hello := enginetest.ClientHello(t, "allowed.test")
	for _, part := range [][]byte{hello[:1], hello[1:7], hello[7:200]} {
		r.client.Write(part)
	}
	// The server sees nothing of an incomplete hello (absence, so a bound).
	r.server.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	if n, _ := r.server.Read(make([]byte, 1)); n != 0 {
		t.Fatal("the server got bytes of an incomplete hello")
	}
	r.client.Write(hello[200:])
	if got := readN(t, r.server, len(hello)); !bytes.Equal(got, hello) {
		t.Fatal("the server got other bytes than the hello")
	}
	r.client.Write([]byte("after the hello, opaque"))
	if got := readN(t, r.server, 23); string(got) != "after the hello, opaque" {
		t.Fatalf("got %q", got)
	}
	if r.g.in.SNI() != "allowed.test" {
		t.Errorf("sni = %q", r.g.in.SNI())
	}
}

func TestInspectionResetsAForeignSNIAndForwardsNothing(t *testing.T) {
	r := startInspect(t, "allowed.test", 5*time.Second)
	r.client.Write(enginetest.ClientHello(t, "other.test"))
	wantReset(t, r.client)
	if got, _ := readAll(r.server); len(got) != 0 {
		t.Fatalf("the server got %d bytes", len(got))
	}
	d, _ := r.result(t)
	if d == nil || !strings.Contains(d.Reason, "sni name other.test disagrees with allowed.test") || d.Rule != "test rule" {
		t.Fatalf("denial = %+v", d)
	}
	if r.g.in.SNI() != "other.test" {
		t.Errorf("sni = %q", r.g.in.SNI())
	}
}

func TestInspectionResetsAHelloNotCompleteWithinTheSniffTimeout(t *testing.T) {
	r := startInspect(t, "allowed.test", 300*time.Millisecond)
	hello := enginetest.ClientHello(t, "other.test")
	start := time.Now()
	r.client.Write(hello[:10])
	wantReset(t, r.client)
	if el := time.Since(start); el < 250*time.Millisecond || el > 4*time.Second {
		t.Errorf("reset after %v, want about 300ms", el)
	}
	d, _ := r.result(t)
	if d == nil || !strings.Contains(d.Reason, "ClientHello was not complete 300ms after it began") {
		t.Fatalf("denial = %+v", d)
	}
}

func TestInspectionWaitsAsLongAsItTakesForTheFirstByte(t *testing.T) {
	r := startInspect(t, "allowed.test", 200*time.Millisecond)
	// Silence longer than the sniff timeout is not a reason to stop
	// checking: the late hello is still read and refused.
	time.Sleep(500 * time.Millisecond) // the attacker's delay, not synchronisation
	r.client.Write(enginetest.ClientHello(t, "other.test"))
	wantReset(t, r.client)
}

func TestInspectionChecksEveryRequestAndAnswersA403AfterTheOnesBefore(t *testing.T) {
	r := startInspect(t, "allowed.test", 5*time.Second)
	body := "GET / HTTP/1.1\r\nHost: other.test\r\n\r\n" // a request inside a body is data
	reqs := "POST /1 HTTP/1.1\r\nHost: allowed.test\r\nContent-Length: 36\r\n\r\n" + body +
		"POST /2 HTTP/1.1\r\nHost: Allowed.Test.\r\nTransfer-Encoding: chunked\r\n\r\n24\r\n" + body + "\r\n0\r\n\r\n"
	bad := "GET /3 HTTP/1.1\r\nHost: other.test\r\n\r\n"
	r.client.Write([]byte(reqs + bad))
	if got := readN(t, r.server, len(reqs)); string(got) != reqs {
		t.Fatalf("the server got %q", got)
	}
	// The server answers what it got; then it sees EOF, not request 3.
	r.server.Write([]byte("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"))
	if rest, err := readAll(r.server); len(rest) != 0 || err != nil {
		t.Fatalf("after the checked requests the server got %q, %v; want EOF", rest, err)
	}
	r.server.Close()
	got, err := readAll(r.client)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(got, []byte("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokHTTP/1.1 403 Forbidden\r\n")) ||
		!bytes.Contains(got, []byte("http name other.test disagrees with allowed.test")) {
		t.Fatalf("the client got %q", got)
	}
	d, res := r.result(t)
	if d == nil || r.g.in.HTTPHost() != "other.test" {
		t.Fatalf("denial = %+v, httpHost %q", d, r.g.in.HTTPHost())
	}
	if res.Out != int64(len(reqs)) {
		t.Errorf("bytes out = %d, want %d", res.Out, len(reqs))
	}
}

func TestInspectionAnswersAFirstRefusedRequestAtOnce(t *testing.T) {
	r := startInspect(t, "allowed.test", 5*time.Second)
	r.client.Write([]byte("get / HTTP/1.1\r\nHost: other.test\r\n\r\n"))
	got, err := readAll(r.client)
	if err != nil || !bytes.HasPrefix(got, []byte("HTTP/1.1 403 Forbidden")) {
		t.Fatalf("the client got %q, %v", got, err)
	}
	if got, _ := readAll(r.server); len(got) != 0 {
		t.Fatalf("the server got %q", got)
	}
}

func TestInspectionResetsWhenTheServerDoesNotFinishWithinTheTimeout(t *testing.T) {
	r := startInspect(t, "allowed.test", 300*time.Millisecond)
	r.client.Write([]byte("GET /1 HTTP/1.1\r\nHost: allowed.test\r\n\r\nGET /2 HTTP/1.1\r\nHost: other.test\r\n\r\n"))
	readN(t, r.server, 37)
	// The server never answers nor closes: after the timeout the client
	// is reset rather than kept waiting for a 403.
	got, err := readAll(r.client)
	if !errors.Is(err, syscall.ECONNRESET) || len(got) != 0 {
		t.Fatalf("the client got %q, %v", got, err)
	}
}

func TestInspectionLetsAWebSocketThroughOnlyAfterA101(t *testing.T) {
	up := "GET /ws HTTP/1.1\r\nHost: allowed.test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"
	frame := "\x81\x05hello GET / HTTP/1.1\r\nHost: other.test\r\n\r\n"
	t.Run("switched", func(t *testing.T) {
		r := startInspect(t, "allowed.test", 5*time.Second)
		r.client.Write([]byte(up + frame))
		readN(t, r.server, len(up))
		// Nothing after the upgrade request passes before the answer.
		r.server.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		if n, _ := r.server.Read(make([]byte, 1)); n != 0 {
			t.Fatal("bytes after the upgrade request passed before the server answered")
		}
		r.server.Write([]byte("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n"))
		if got := readN(t, r.server, len(frame)); string(got) != frame {
			t.Fatalf("the server got %q", got)
		}
	})
	t.Run("not switched", func(t *testing.T) {
		r := startInspect(t, "allowed.test", 5*time.Second)
		r.client.Write([]byte(up + "GET / HTTP/1.1\r\nHost: other.test\r\n\r\n"))
		readN(t, r.server, len(up))
		r.server.Write([]byte("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n"))
		if rest, _ := readAll(r.server); len(rest) != 0 {
			t.Fatalf("the server got %q", rest)
		}
		r.server.Close()
		if got, _ := readAll(r.client); !bytes.Contains(got, []byte("403 Forbidden")) {
			t.Fatalf("the client got %q", got)
		}
	})
}

func TestInspectionPassesTokensAtOnceAndOtherProtocolsAsTheyAre(t *testing.T) {
	r := startInspect(t, "allowed.test", 5*time.Second)
	// A short token and a wait for the answer: the token passes at once.
	r.client.Write([]byte("x"))
	if got := readN(t, r.server, 1); string(got) != "x" {
		t.Fatalf("got %q", got)
	}
	r.server.Write([]byte("ok\n"))
	readN(t, r.client, 3)
	r.client.Write([]byte("x\r\nthen anything: GET / HTTP/1.1\r\nHost: other.test\r\n\r\n"))
	want := "x\r\nthen anything: GET / HTTP/1.1\r\nHost: other.test\r\n\r\n"
	if got := readN(t, r.server, len(want)); string(got) != want {
		t.Fatalf("got %q", got)
	}
}

func TestInspectionChecksTheClientAfterTheServerSpokeFirst(t *testing.T) {
	r := startInspect(t, "allowed.test", 5*time.Second)
	r.server.Write([]byte("SSH-2.0-server\r\n"))
	if got := readN(t, r.client, 16); string(got) != "SSH-2.0-server\r\n" {
		t.Fatalf("got %q", got)
	}
	r.client.Write([]byte("GET / HTTP/1.1\r\nHost: other.test\r\n\r\n"))
	r.server.SetReadDeadline(time.Now().Add(5 * time.Second))
	if got, err := readAll(r.server); len(got) != 0 || err != nil {
		t.Fatalf("the server got %q, %v", got, err)
	}
	r.server.Close()
	if got, _ := readAll(r.client); !bytes.Contains(got, []byte("403 Forbidden")) {
		t.Fatalf("the client got %q", got)
	}
}

func TestInspectionHoldsPipelinedBytesAfterABodyRead(t *testing.T) {
	r := startInspect(t, "allowed.test", 5*time.Second)
	// A large body read straight through, then many small requests in the
	// same write: every head is still checked.
	big := strings.Repeat("b", 200<<10)
	var reqs strings.Builder
	reqs.WriteString("POST / HTTP/1.1\r\nHost: allowed.test\r\nContent-Length: " + itoa(len(big)) + "\r\n\r\n" + big)
	for range 2000 {
		reqs.WriteString("GET /p HTTP/1.1\r\nHost: allowed.test\r\n\r\n")
	}
	good := reqs.String()
	go r.client.Write([]byte(good + "GET /x HTTP/1.1\r\nHost: other.test\r\n\r\n"))
	if got := readN(t, r.server, len(good)); string(got) != good {
		t.Fatal("the server got other bytes than the allowed requests")
	}
	if rest, _ := readAll(r.server); len(rest) != 0 {
		t.Fatalf("the server got %q after them", rest)
	}
}

func itoa(n int) string {
	var b [20]byte
	i := len(b)
	for {
		i--
		b[i] = byte('0' + n%10)
		n /= 10
		if n == 0 {
			return string(b[i:])
		}
	}
}

// BenchmarkRelayThroughInspection measures what the inspectConn costs a relayed upload:
// plain (no inspection), TLS after its ClientHello (the inspectConn steps aside), and a
// plain-HTTP request body (the inspectConn follows its framing).
func BenchmarkRelayThroughInspection(b *testing.B) {
	const size = 64 << 20
	chunk := bytes.Repeat([]byte("z"), 256<<10)
	hello := enginetest.ClientHello(b, "allowed.test")
	for _, mode := range []string{"plain", "tls", "http-body"} {
		b.Run(mode, func(b *testing.B) {
			b.SetBytes(size)
			for b.Loop() {
				client, sandbox := tcpPair(b)
				upstream, server := tcpPair(b)
				var side net.Conn = sandbox
				var up net.Conn = upstream
				var prefix []byte
				switch mode {
				case "tls":
					prefix = hello
				case "http-body":
					prefix = []byte("POST / HTTP/1.1\r\nHost: allowed.test\r\nContent-Length: " + itoa(size) + "\r\n\r\n")
				}
				if mode != "plain" {
					g := newInspectConn(resetConn{sandbox}, inspect.Config{Name: "allowed.test"}, 5*time.Second, nil)
					g.up = &upConn{Conn: upstream}
					side, up = g, g.up
				}
				done := make(chan struct{})
				go func() {
					stack.RelayTCP(context.Background(), side, up, 0)
					close(done)
				}()
				go func() {
					client.Write(prefix)
					for sent := 0; sent < size; sent += len(chunk) {
						client.Write(chunk)
					}
					client.CloseWrite()
				}()
				n, _ := io.Copy(io.Discard, server)
				if n != int64(size+len(prefix)) {
					b.Fatalf("server got %d bytes, want %d", n, size+len(prefix))
				}
				server.Close()
				<-done
				client.Close()
			}
		})
	}
}

func TestInspectionKeepsRelayingLongAfterTheSniffTimeoutOnceAHelloPassed(t *testing.T) {
	r := startInspect(t, "allowed.test", 200*time.Millisecond)
	hello := enginetest.ClientHello(t, "allowed.test")
	r.client.Write(hello)
	if got := readN(t, r.server, len(hello)); !bytes.Equal(got, hello) {
		t.Fatal("the server got other bytes than the hello")
	}
	// The client says nothing for longer than the sniff timeout: what it
	// sends after that must still pass (the checks are over), and the
	// buffer the checks used is given back.
	time.Sleep(600 * time.Millisecond) // time passing is what is tested
	r.client.Write([]byte("late application data"))
	if got := readN(t, r.server, 21); string(got) != "late application data" {
		t.Fatalf("got %q", got)
	}
	if n := r.g.held.n.Load(); n != 0 {
		t.Errorf("the inspectConn still counts %d held bytes after its checks", n)
	}
}

// What all inspected conns hold at once is bounded: a flow whose unfinished first
// message would take more is refused, and what the others held is counted
// back when they end.
func TestInspectionRefusesAFirstMessageBeyondWhatAllInspectionsMayHold(t *testing.T) {
	held := &heldBytes{max: 4 << 10}
	r := startInspectHeld(t, "allowed.test", 5*time.Second, held)
	// A request head that does not end (it may take up to 64 KiB).
	r.client.Write([]byte("GET / HTTP/1.1\r\nHost: allowed.test\r\nX-Pad: " + strings.Repeat("a", 6000)))
	wantReset(t, r.client)
	d, _ := r.result(t)
	if d == nil || !strings.Contains(d.Reason, "unfinished first messages and request heads already") {
		t.Fatalf("denial = %+v", d)
	}
	r.g.releaseHeld()
	if n := held.n.Load(); n != 0 {
		t.Errorf("%d bytes still counted after the flow ended", n)
	}
}

// waitConn is a sandbox connection read without blocking: Read returns
// what was queued, or errNothingYet. scribble makes a Read with nothing to
// return write over its buffer first, as io.Reader allows.
type waitConn struct {
	net.Conn
	queued   [][]byte
	scribble bool
}

var errNothingYet = errors.New("nothing yet")

func (c *waitConn) Read(p []byte) (int, error) {
	if len(c.queued) == 0 {
		if c.scribble {
			for i := range p {
				p[i] = 'X'
			}
		}
		return 0, errNothingYet
	}
	n := copy(p, c.queued[0])
	c.queued = c.queued[1:]
	return n, nil
}

func (c *waitConn) SetReadDeadline(time.Time) error { return nil }

func TestInspectionWaitingForFirstBytesHoldsNoBuffer(t *testing.T) {
	held := &heldBytes{max: 16 << 20}
	c := &waitConn{scribble: true}
	g := newInspectConn(c, inspect.Config{Name: "allowed.test", Rule: "test rule"}, time.Minute, held)
	buf := make([]byte, 4096)
	for range 3 {
		if n, err := g.Read(buf); n != 0 || err != errNothingYet {
			t.Fatalf("Read with nothing sent = %d, %v", n, err)
		}
		if g.mem != nil || held.n.Load() != 0 {
			t.Fatalf("a flow with nothing sent holds a %d-byte buffer (%d counted)", len(g.mem), held.n.Load())
		}
		// The buffer went back empty, whatever Read scribbled on it.
		b := firstBufs.Get().(*[firstBufSize]byte)
		if i := bytes.IndexByte(b[:], 'X'); i >= 0 {
			t.Fatalf("a first buffer given back holds a byte read into it at %d", i)
		}
		firstBufs.Put(b)
	}
	c.queued = [][]byte{[]byte("\x00\x01 not TLS, not HTTP")}
	n, err := g.Read(buf)
	if err != nil || string(buf[:n]) != "\x00\x01 not TLS, not HTTP" {
		t.Fatalf("Read once bytes came = %q, %v", buf[:n], err)
	}
}

func TestInspectionUnderMemoryPressureRefusesAFirstMessageThatNeedsMoreBuffer(t *testing.T) {
	high := func() bool { return true }
	r := startInspectHeld(t, "allowed.test", 5*time.Second, &heldBytes{max: 16 << 20, high: high})
	r.client.Write([]byte("GET / HTTP/1.1\r\nHost: allowed.test\r\nX-Pad: " + strings.Repeat("a", 3000)))
	wantReset(t, r.client)
	if d, _ := r.result(t); d == nil || !strings.Contains(d.Reason, "near --max-memory") {
		t.Fatalf("denial = %+v", d)
	}
	// A first message that fits the first buffer still passes.
	r = startInspectHeld(t, "allowed.test", 5*time.Second, &heldBytes{max: 16 << 20, high: high})
	req := "GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n"
	r.client.Write([]byte(req))
	if got := readN(t, r.server, len(req)); string(got) != req {
		t.Fatalf("server got %q", got)
	}
}

// The inspector names where a name came from in the audit record's words:
// the raw-IP decider stores them as host_from as they are.
func TestInspectorSourcesAreTheAuditRecordsHostFrom(t *testing.T) {
	if inspect.FromSNI != audit.HostFromSNI || inspect.FromHTTP != audit.HostFromHTTP {
		t.Fatalf("inspect says %q and %q; the audit record %q and %q", inspect.FromSNI, inspect.FromHTTP, audit.HostFromSNI, audit.HostFromHTTP)
	}
}
