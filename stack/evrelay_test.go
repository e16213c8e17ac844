package stack

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"runtime"
	"testing"
	"time"
)

// The event relay, end to end: a real TCP client in the sandbox (a second
// gVisor stack over the socketpair), the Stack, StartRelayTCP, and a real
// upstream socket on 127.0.0.1.

func randomBytes(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, seed))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func TestEventRelayMovesBulkBytesBothWaysIntact(t *testing.T) {
	goroutineLeakCheck(t)
	tb := newRelayTestbed(t, nil, 0)
	c, u := tb.connect(t)
	const n = 8 << 20
	up, down := randomBytes(n, 1), randomBytes(n, 2)
	errc := make(chan error, 4)
	go func() { _, err := c.Write(up); c.CloseWrite(); errc <- err }()
	go func() { _, err := u.Write(down); u.(*net.TCPConn).CloseWrite(); errc <- err }()
	gotUp, gotDown := make(chan []byte, 1), make(chan []byte, 1)
	go func() { b, err := io.ReadAll(u); errc <- err; gotUp <- b }()
	go func() { b, err := io.ReadAll(c); errc <- err; gotDown <- b }()
	for range 4 {
		select {
		case err := <-errc:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(8 * waitFor): // 16 MiB under -race and coverage on a loaded machine
			t.Fatal("bulk transfer did not finish")
		}
	}
	if b := <-gotUp; sha256.Sum256(b) != sha256.Sum256(up) {
		t.Errorf("upstream got %d bytes, not the %d the sandbox sent", len(b), n)
	}
	if b := <-gotDown; sha256.Sum256(b) != sha256.Sum256(down) {
		t.Errorf("sandbox got %d bytes, not the %d upstream sent", len(b), n)
	}
	c.Close()
	u.Close()
	r := tb.h.result(t)
	if r.Err != nil || r.Out != n || r.In != n {
		t.Errorf("RelayResult = %+v, want %d each way and no error", r, n)
	}
}

func TestEventRelayHalfCloseFromTheSandbox(t *testing.T) {
	goroutineLeakCheck(t)
	tb := newRelayTestbed(t, nil, 0)
	c, u := tb.connect(t)
	c.Write([]byte("request"))
	c.CloseWrite()
	u.SetReadDeadline(time.Now().Add(waitFor))
	if b, err := io.ReadAll(u); err != nil || string(b) != "request" {
		t.Fatalf("upstream read %q, %v; want the request, then EOF", b, err)
	}
	// The other direction still works after the sandbox's FIN.
	u.Write([]byte("response"))
	u.Close()
	c.SetReadDeadline(time.Now().Add(waitFor))
	if b, err := io.ReadAll(c); err != nil || string(b) != "response" {
		t.Fatalf("sandbox read %q, %v; want the response, then EOF", b, err)
	}
	c.Close()
	if r := tb.h.result(t); r.Err != nil || r.Out != 7 || r.In != 8 {
		t.Errorf("RelayResult = %+v, want 7 out, 8 in, no error", r)
	}
}

func TestEventRelayHalfCloseFromUpstream(t *testing.T) {
	goroutineLeakCheck(t)
	tb := newRelayTestbed(t, nil, 0)
	c, u := tb.connect(t)
	u.Write([]byte("banner"))
	u.(*net.TCPConn).CloseWrite()
	c.SetReadDeadline(time.Now().Add(waitFor))
	if b, err := io.ReadAll(c); err != nil || string(b) != "banner" {
		t.Fatalf("sandbox read %q, %v; want the banner, then EOF", b, err)
	}
	c.Write([]byte("late reply"))
	c.Close()
	u.SetReadDeadline(time.Now().Add(waitFor))
	if b, err := io.ReadAll(u); err != nil || string(b) != "late reply" {
		t.Fatalf("upstream read %q, %v; want the late reply, then EOF", b, err)
	}
	u.Close()
	if r := tb.h.result(t); r.Err != nil || r.Out != 10 || r.In != 6 {
		t.Errorf("RelayResult = %+v, want 10 out, 6 in, no error", r)
	}
}

func TestEventRelayPassesAnUpstreamResetToTheSandbox(t *testing.T) {
	goroutineLeakCheck(t)
	tb := newRelayTestbed(t, nil, 0)
	c, u := tb.connect(t)
	defer c.Close()
	u.(*net.TCPConn).SetLinger(0)
	u.Close() // RST
	c.SetReadDeadline(time.Now().Add(waitFor))
	_, err := c.Read(make([]byte, 1))
	if err == nil || isTimeout(err) || errors.Is(err, io.EOF) {
		t.Errorf("sandbox read after an upstream reset = %v, want a reset", err)
	}
	if r := tb.h.result(t); r.Err == nil {
		t.Errorf("RelayResult after an upstream reset has no error: %+v", r)
	}
}

func TestEventRelayEndsWhenTheStackCloses(t *testing.T) {
	goroutineLeakCheck(t)
	tb := newRelayTestbed(t, nil, 0)
	c, u := tb.connect(t)
	defer c.Close()
	defer u.Close()
	c.Write([]byte("x")) // the relay runs
	readFull(t, u, make([]byte, 1))
	closeWithin(t, tb.st, waitFor)
	r := tb.h.result(t)
	if !errors.Is(r.Err, context.Canceled) {
		t.Errorf("RelayResult after Stack.Close: %+v, want context.Canceled", r)
	}
	u.SetReadDeadline(time.Now().Add(waitFor))
	if _, err := u.Read(make([]byte, 1)); err == nil || isTimeout(err) {
		t.Errorf("upstream read after Stack.Close = %v, want EOF or reset", err)
	}
}

func TestEventRelayIdleTimeoutEndsAQuietFlowButSparesASlowReader(t *testing.T) {
	goroutineLeakCheck(t)
	const idle = 300 * time.Millisecond
	tb := newRelayTestbed(t, func(c *Config) { c.TCPBuffer = 16 << 10 }, idle)

	quietC, quietU := tb.connect(t)
	defer quietC.Close()
	defer quietU.Close()
	start := time.Now()
	r := tb.h.result(t)
	if !errors.Is(r.Err, ErrIdle) {
		t.Fatalf("quiet relay ended with %+v, want ErrIdle", r)
	}
	if d := time.Since(start); d < idle {
		t.Errorf("quiet relay ended after %v, before the %v idle timeout", d, idle)
	}

	// A sandbox that reads 1 KiB every 20ms from a large download keeps
	// the relay blocked on it: that is not idleness.
	slowC, slowU := tb.connect(t)
	defer slowC.Close()
	defer slowU.Close()
	go slowU.Write(make([]byte, 4<<20))
	buf := make([]byte, 1024)
	for start := time.Now(); time.Since(start) < 5*idle; {
		slowC.SetReadDeadline(time.Now().Add(waitFor))
		if _, err := slowC.Read(buf); err != nil {
			t.Fatalf("slow reader: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	select {
	case r := <-tb.h.res:
		t.Fatalf("the relay of a slow reader ended: %+v", r)
	default:
	}
}

// What a sandbox does not read stays in the budgeted gVisor buffer and, past
// it, in the kernel: the relay holds no more, and the upstream is slowed to
// the sandbox's pace.
func TestEventRelayPushesBackOnAnUpstreamWhenTheSandboxDoesNotRead(t *testing.T) {
	goroutineLeakCheck(t)
	tb := newRelayTestbed(t, func(c *Config) { c.TCPBuffer = 64 << 10 }, 0)
	c, u := tb.connect(t)
	defer c.Close()
	defer u.Close()
	written := make(chan int64, 1)
	go func() {
		var n int64
		chunk := make([]byte, 64<<10)
		u.SetWriteDeadline(time.Now().Add(time.Second))
		for {
			m, err := u.Write(chunk)
			n += int64(m)
			if err != nil {
				written <- n
				return
			}
		}
	}()
	n := <-written
	// Kernel socket buffers on both loopback ends, gVisor's 64 KiB send
	// buffer and the sandbox's receive window: a few MiB, not 1 s of
	// loopback bandwidth (gigabytes).
	if n > 32<<20 {
		t.Errorf("upstream wrote %d MiB in 1s to a sandbox that reads nothing", n>>20)
	}
	t.Logf("upstream could write %d KiB before the sandbox's pace held it", n>>10)
}

// The property that bounds tunwall's memory per flow: a flow that waits
// holds no goroutine (and so no stack and no buffer).
func TestEventRelayHoldsNoGoroutinePerWaitingFlow(t *testing.T) {
	goroutineLeakCheck(t)
	tb := newRelayTestbed(t, nil, time.Hour)
	type pair struct{ c, u io.ReadWriteCloser }
	var pairs []pair
	defer func() {
		for _, p := range pairs {
			p.c.Close()
			p.u.Close()
		}
	}()
	// Warm up, then count.
	c, u := tb.connect(t)
	pairs = append(pairs, pair{c, u})
	time.Sleep(50 * time.Millisecond)
	before := runtime.NumGoroutine()
	const flows = 300
	one := make([]byte, 1)
	for range flows {
		c, u := tb.connect(t)
		pairs = append(pairs, pair{c, u})
		c.Write([]byte("x"))
		readFull(t, u, one)
		u.Write([]byte("y"))
		readFull(t, c, one)
	}
	// The test's own side has a goroutine per upstream connection (none)
	// and the client stack none per connection either.
	deadline := time.Now().Add(waitFor)
	for {
		after := runtime.NumGoroutine()
		if after-before < flows/10 {
			t.Logf("%d waiting flows: %d goroutines more", flows, after-before)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d waiting flows hold %d goroutines more: a goroutine per flow", flows, after-before)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestEventRelayUDPMovesDatagramsAndEndsWhenIdle(t *testing.T) {
	goroutineLeakCheck(t)
	const idle = 300 * time.Millisecond
	upApp, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer upApp.Close()
	tb := newRelayTestbed(t, nil, idle, func(h *relayHandler) {
		h.upstream = func(f Flow) (net.Conn, error) { return net.DialUDP("udp4", nil, upApp.LocalAddr().(*net.UDPAddr)) }
	})
	sc, err := tb.sb.dialUDP(netip.AddrPortFrom(remote4, 53))
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	buf := make([]byte, 65536)
	for i, msg := range [][]byte{[]byte("one"), bytes.Repeat([]byte("big"), 20000), []byte("three")} {
		sc.Write(msg)
		upApp.SetReadDeadline(time.Now().Add(waitFor))
		n, from, err := upApp.ReadFrom(buf)
		if err != nil || !bytes.Equal(buf[:n], msg) {
			t.Fatalf("datagram %d: upstream got %d bytes, %v", i, n, err)
		}
		upApp.WriteTo(append([]byte("re:"), msg...), from)
		sc.SetReadDeadline(time.Now().Add(waitFor))
		n, err = sc.Read(buf)
		if err != nil || !bytes.Equal(buf[:n], append([]byte("re:"), msg...)) {
			t.Fatalf("datagram %d: sandbox got %d bytes, %v", i, n, err)
		}
	}
	r := tb.h.result(t)
	if r.Err != nil || r.Out != 3+60000+5 || r.In != 3*3+3+60000+5 {
		t.Errorf("UDP RelayResult = %+v, want the bytes each way and no error (idle is a normal end)", r)
	}
}
