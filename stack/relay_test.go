package stack

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// tcpPair returns the two ends of a real TCP connection on 127.0.0.1 (net.Pipe
// has no CloseWrite, so it cannot show half-closes).
func tcpPair(t *testing.T) (a, b *net.TCPConn) {
	t.Helper()
	ln, err := net.ListenTCP("tcp4", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	defer ln.Close()
	type res struct {
		c   *net.TCPConn
		err error
	}
	ch := make(chan res, 1)
	go func() {
		c, err := ln.AcceptTCP()
		ch <- res{c, err}
	}()
	a, err = net.DialTCP("tcp4", nil, ln.Addr().(*net.TCPAddr))
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	r := <-ch
	if r.err != nil {
		t.Fatalf("accept: %v", r.err)
	}
	t.Cleanup(func() { a.Close(); r.c.Close() })
	return a, r.c
}

// relayWorld is sandboxApp <-> [sandbox | RelayTCP | upstream] <-> upstreamApp.
type relayWorld struct {
	sbApp, upApp *net.TCPConn
	sb, up       *net.TCPConn
	res          chan RelayResult
}

func startTCPRelay(t *testing.T, ctx context.Context, idle time.Duration) *relayWorld {
	t.Helper()
	w := &relayWorld{res: make(chan RelayResult, 1)}
	w.sbApp, w.sb = tcpPair(t)
	w.up, w.upApp = tcpPair(t)
	go func() { w.res <- RelayTCP(ctx, w.sb, w.up, idle) }()
	t.Cleanup(func() {
		// Whatever the test did, the relay must end once both apps are gone.
		w.sbApp.Close()
		w.upApp.Close()
		select {
		case <-w.res:
		case <-time.After(waitFor):
			t.Errorf("relay did not return after both ends closed")
		}
	})
	return w
}

func (w *relayWorld) wait(t *testing.T) RelayResult {
	t.Helper()
	select {
	case r := <-w.res:
		w.res <- r // for the cleanup
		return r
	case <-time.After(waitFor):
		t.Fatal("relay did not return")
		return RelayResult{}
	}
}

func readAllTimeout(t *testing.T, c net.Conn) []byte {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(waitFor))
	b, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("read until EOF: %v", err)
	}
	return b
}

func TestRelayTCPHalfCloseFromSandbox(t *testing.T) {
	goroutineLeakCheck(t)
	w := startTCPRelay(t, context.Background(), 0)
	// Request, then "no more from me"; the response still flows back.
	w.sbApp.Write([]byte("request"))
	w.sbApp.CloseWrite()
	if got := readAllTimeout(t, w.upApp); string(got) != "request" {
		t.Fatalf("upstream got %q, want %q then EOF", got, "request")
	}
	w.upApp.Write([]byte("the response"))
	w.upApp.CloseWrite()
	if got := readAllTimeout(t, w.sbApp); string(got) != "the response" {
		t.Fatalf("sandbox got %q, want %q then EOF", got, "the response")
	}
	r := w.wait(t)
	if r.Out != 7 || r.In != 12 || r.Err != nil {
		t.Errorf("RelayTCP = %+v, want Out 7, In 12, Err nil", r)
	}
}

func TestRelayTCPHalfCloseFromUpstream(t *testing.T) {
	goroutineLeakCheck(t)
	w := startTCPRelay(t, context.Background(), 0)
	// The server speaks first and closes its side; the client keeps sending.
	w.upApp.Write([]byte("banner"))
	w.upApp.CloseWrite()
	if got := readAllTimeout(t, w.sbApp); string(got) != "banner" {
		t.Fatalf("sandbox got %q, want %q then EOF", got, "banner")
	}
	if _, err := w.sbApp.Write([]byte("still talking")); err != nil {
		t.Fatalf("sandbox write after upstream's half-close: %v", err)
	}
	buf := make([]byte, 13)
	w.upApp.SetReadDeadline(time.Now().Add(waitFor))
	if _, err := io.ReadFull(w.upApp, buf); err != nil || string(buf) != "still talking" {
		t.Fatalf("upstream got %q, %v after its own half-close; want %q", buf, err, "still talking")
	}
	select {
	case r := <-w.res:
		t.Fatalf("relay ended while the sandbox direction was open: %+v", r)
	default:
	}
	w.sbApp.CloseWrite()
	if got := readAllTimeout(t, w.upApp); len(got) != 0 {
		t.Errorf("upstream got %q after the data, want EOF", got)
	}
	r := w.wait(t)
	if r.Out != 13 || r.In != 6 || r.Err != nil {
		t.Errorf("RelayTCP = %+v, want Out 13, In 6, Err nil", r)
	}
}

func TestRelayTCPCountsBulkBytesBothWays(t *testing.T) {
	goroutineLeakCheck(t)
	w := startTCPRelay(t, context.Background(), time.Minute)
	out := bytes.Repeat([]byte("sandbox->upstream "), 100_000) // 1.8 MB
	in := bytes.Repeat([]byte("upstream->sandbox!!"), 70_000)  // 1.33 MB
	var wg sync.WaitGroup
	var gotOut, gotIn []byte
	wg.Add(4)
	go func() { defer wg.Done(); w.sbApp.Write(out); w.sbApp.CloseWrite() }()
	go func() { defer wg.Done(); w.upApp.Write(in); w.upApp.CloseWrite() }()
	go func() { defer wg.Done(); gotOut, _ = io.ReadAll(w.upApp) }()
	go func() { defer wg.Done(); gotIn, _ = io.ReadAll(w.sbApp) }()
	wg.Wait()
	if !bytes.Equal(gotOut, out) || !bytes.Equal(gotIn, in) {
		t.Fatalf("relayed %d/%d bytes out, %d/%d in, or corrupted", len(gotOut), len(out), len(gotIn), len(in))
	}
	r := w.wait(t)
	if r.Out != int64(len(out)) || r.In != int64(len(in)) || r.Err != nil {
		t.Errorf("RelayTCP = %+v, want Out %d, In %d, Err nil", r, len(out), len(in))
	}
}

func TestRelayTCPContextCancelClosesBoth(t *testing.T) {
	goroutineLeakCheck(t)
	ctx, cancel := context.WithCancel(context.Background())
	w := startTCPRelay(t, ctx, 0)
	w.sbApp.Write([]byte("hi"))
	buf := make([]byte, 2)
	w.upApp.SetReadDeadline(time.Now().Add(waitFor))
	io.ReadFull(w.upApp, buf)
	cancel()
	r := w.wait(t)
	if !errors.Is(r.Err, context.Canceled) {
		t.Errorf("RelayTCP err = %v, want context.Canceled", r.Err)
	}
	if r.Out != 2 {
		t.Errorf("RelayTCP Out = %d, want 2", r.Out)
	}
	for name, c := range map[string]net.Conn{"sandbox": w.sbApp, "upstream": w.upApp} {
		c.SetReadDeadline(time.Now().Add(waitFor))
		if _, err := c.Read(buf); err == nil || errors.Is(err, io.ErrNoProgress) || isTimeout(err) {
			t.Errorf("%s app read after cancel = %v, want EOF or reset", name, err)
		}
	}
	if _, err := w.sb.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
		t.Errorf("relay's sandbox conn write = %v, want net.ErrClosed", err)
	}
	if _, err := w.up.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
		t.Errorf("relay's upstream conn write = %v, want net.ErrClosed", err)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func TestRelayTCPIdleTimeoutEndsQuietRelay(t *testing.T) {
	goroutineLeakCheck(t)
	const idle = 200 * time.Millisecond
	start := time.Now()
	w := startTCPRelay(t, context.Background(), idle)
	r := w.wait(t)
	d := time.Since(start)
	if !errors.Is(r.Err, ErrIdle) {
		t.Errorf("RelayTCP err = %v, want ErrIdle", r.Err)
	}
	if d < idle || d > idle+2*time.Second {
		t.Errorf("idle relay ended after %v, want about %v", d, idle)
	}
	w.sbApp.SetReadDeadline(time.Now().Add(waitFor))
	if _, err := w.sbApp.Read(make([]byte, 1)); err == nil || isTimeout(err) {
		t.Errorf("sandbox app read after idle close = %v, want EOF", err)
	}
}

// Traffic in one direction keeps the relay alive, although the other
// direction's reads keep timing out.
func TestRelayTCPIdleTimeoutSparesOneWayTraffic(t *testing.T) {
	tests := []struct {
		name     string
		upstream bool // true: upstream streams to the sandbox
	}{
		{"the sandbox uploads, upstream is silent", false},
		{"upstream streams, the sandbox is silent", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			goroutineLeakCheck(t)
			const idle = 200 * time.Millisecond
			w := startTCPRelay(t, context.Background(), idle)
			src, dst := w.sbApp, w.upApp
			if tc.upstream {
				src, dst = w.upApp, w.sbApp
			}
			drained := make(chan int64, 1)
			go func() {
				n, _ := io.Copy(io.Discard, dst)
				drained <- n
			}()
			const ticks = 16 // 16 x 50ms = 4 idle periods
			for range ticks {
				if _, err := src.Write([]byte("x")); err != nil {
					t.Fatalf("write during one-way traffic: %v", err)
				}
				time.Sleep(50 * time.Millisecond)
				select {
				case r := <-w.res:
					t.Fatalf("relay ended during one-way traffic: %+v", r)
				default:
				}
			}
			// Now both directions are quiet: it ends with ErrIdle.
			r := w.wait(t)
			if !errors.Is(r.Err, ErrIdle) {
				t.Errorf("RelayTCP err = %v, want ErrIdle", r.Err)
			}
			got, other := r.Out, r.In
			if tc.upstream {
				got, other = r.In, r.Out
			}
			if got != ticks || other != 0 {
				t.Errorf("RelayTCP = %+v, want %d bytes one way and 0 the other", r, ticks)
			}
			select {
			case n := <-drained:
				if n != ticks {
					t.Errorf("receiver got %d bytes, want %d", n, ticks)
				}
			case <-time.After(waitFor):
				t.Errorf("receiver not closed after the idle timeout")
			}
		})
	}
}

func TestRelayTCPUpstreamResetEndsRelay(t *testing.T) {
	goroutineLeakCheck(t)
	w := startTCPRelay(t, context.Background(), 0)
	w.upApp.SetLinger(0)
	w.upApp.Close() // RST
	r := w.wait(t)
	if r.Err == nil {
		t.Errorf("RelayTCP after an upstream reset: Err nil, want the reset")
	}
	w.sbApp.SetReadDeadline(time.Now().Add(waitFor))
	if _, err := w.sbApp.Read(make([]byte, 1)); err == nil || isTimeout(err) {
		t.Errorf("sandbox app read after upstream reset = %v, want EOF or reset", err)
	}
}

// udpPair returns an unconnected app socket and a relay-side socket
// connected to it, on 127.0.0.1.
func udpPair(t *testing.T) (app, relay *net.UDPConn) {
	t.Helper()
	app, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatalf("listen udp: %v", err)
	}
	relay, err = net.DialUDP("udp4", nil, app.LocalAddr().(*net.UDPAddr))
	if err != nil {
		app.Close()
		t.Fatalf("dial udp: %v", err)
	}
	t.Cleanup(func() { app.Close(); relay.Close() })
	return app, relay
}

func TestRelayUDPCountsDatagramsAndEndsWhenIdle(t *testing.T) {
	goroutineLeakCheck(t)
	const idle = 200 * time.Millisecond
	sbApp, sb := udpPair(t)
	upApp, up := udpPair(t)
	res := make(chan RelayResult, 1)
	go func() { res <- RelayUDP(context.Background(), sb, up, idle) }()

	recv := func(c *net.UDPConn) (string, *net.UDPAddr) {
		t.Helper()
		buf := make([]byte, 1500)
		c.SetReadDeadline(time.Now().Add(waitFor))
		n, from, err := c.ReadFromUDP(buf)
		if err != nil {
			t.Fatalf("read datagram: %v", err)
		}
		return string(buf[:n]), from
	}
	sizes := []string{"one", "twenty bytes exactly", "and a third, longer datagram"}
	var out int64
	var upPeer *net.UDPAddr
	for _, s := range sizes {
		sbApp.WriteToUDP([]byte(s), sb.LocalAddr().(*net.UDPAddr))
		got, from := recv(upApp)
		if got != s {
			t.Fatalf("upstream got %q, want %q (datagram boundaries kept)", got, s)
		}
		upPeer = from
		out += int64(len(s))
	}
	upApp.WriteToUDP([]byte("reply"), upPeer)
	if got, _ := recv(sbApp); got != "reply" {
		t.Fatalf("sandbox got %q, want %q", got, "reply")
	}

	start := time.Now()
	select {
	case r := <-res:
		if d := time.Since(start); d > idle+2*time.Second {
			t.Errorf("idle UDP relay ended %v after the last datagram, want about %v", d, idle)
		}
		if r.Out != out || r.In != 5 {
			t.Errorf("RelayUDP = %+v, want Out %d, In 5", r, out)
		}
		// Idle expiry is how a UDP session normally ends: no error.
		if r.Err != nil {
			t.Errorf("RelayUDP err = %v, want nil after idle expiry", r.Err)
		}
	case <-time.After(waitFor):
		t.Fatal("UDP relay did not end after the idle timeout")
	}
	if _, err := sb.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
		t.Errorf("relay's sandbox conn write after idle = %v, want net.ErrClosed", err)
	}
}

func TestRelayUDPOneWayTrafficKeepsSessionAlive(t *testing.T) {
	goroutineLeakCheck(t)
	const idle = 200 * time.Millisecond
	sbApp, sb := udpPair(t)
	upApp, up := udpPair(t)
	res := make(chan RelayResult, 1)
	go func() { res <- RelayUDP(context.Background(), sb, up, idle) }()
	go func() {
		buf := make([]byte, 100)
		for {
			if _, err := upApp.Read(buf); err != nil {
				return
			}
		}
	}()
	for range 16 {
		sbApp.WriteToUDP([]byte("tick"), sb.LocalAddr().(*net.UDPAddr))
		time.Sleep(50 * time.Millisecond)
		select {
		case r := <-res:
			t.Fatalf("UDP relay ended during one-way traffic: %+v", r)
		default:
		}
	}
	select {
	case r := <-res:
		if r.Out != 16*4 || r.In != 0 {
			t.Errorf("RelayUDP = %+v, want Out 64, In 0", r)
		}
	case <-time.After(waitFor):
		t.Fatal("UDP relay did not end after traffic stopped")
	}
}

func TestRelayUDPContextCancel(t *testing.T) {
	goroutineLeakCheck(t)
	_, sb := udpPair(t)
	_, up := udpPair(t)
	ctx, cancel := context.WithCancel(context.Background())
	res := make(chan RelayResult, 1)
	go func() { res <- RelayUDP(ctx, sb, up, time.Minute) }()
	time.Sleep(20 * time.Millisecond)
	cancel()
	select {
	case r := <-res:
		if !errors.Is(r.Err, context.Canceled) {
			t.Errorf("RelayUDP err = %v, want context.Canceled", r.Err)
		}
	case <-time.After(waitFor):
		t.Fatal("UDP relay did not end on cancel")
	}
	if _, err := up.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
		t.Errorf("relay's upstream conn write after cancel = %v, want net.ErrClosed", err)
	}
}

// A slow reader is still traffic: when the sandbox drains a large response
// slowly, RelayTCP's write towards it takes longer than idle while bytes keep
// moving. The quiet reverse direction must not make the relay idle. (The
// sandbox side is a net.Pipe: a write there returns only once the reader has
// taken every byte, so the timing does not depend on kernel buffers.)
func TestRelayTCPIdleTimeoutSparesSlowReader(t *testing.T) {
	goroutineLeakCheck(t)
	const idle = 300 * time.Millisecond
	sbApp, sb := net.Pipe()
	up, upApp := tcpPair(t)
	res := make(chan RelayResult, 1)
	go func() { res <- RelayTCP(context.Background(), sb, up, idle) }()
	defer func() {
		sbApp.Close()
		upApp.Close()
		select {
		case <-res:
		case <-time.After(waitFor):
			t.Errorf("relay did not return after both ends closed")
		}
	}()
	go upApp.Write(make([]byte, 1<<20))

	// 1 KiB every 20ms: one 64 KiB relay write takes over a second.
	buf := make([]byte, 1024)
	total := 0
	for start := time.Now(); time.Since(start) < 5*idle; {
		sbApp.SetReadDeadline(time.Now().Add(waitFor))
		n, err := sbApp.Read(buf)
		total += n
		if err != nil {
			select {
			case r := <-res:
				res <- r
				t.Fatalf("relay ended after %d bytes while the sandbox was reading: %+v", total, r)
			case <-time.After(waitFor):
				t.Fatalf("sandbox read failed after %d bytes: %v", total, err)
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	select {
	case r := <-res:
		res <- r
		t.Fatalf("relay ended while the sandbox was still reading: %+v", r)
	default:
	}
}

// A relay that ends on its own just as ctx is cancelled (or its idle timer
// fires) must still return a consistent result. Under -race this checks that
// the ctx.AfterFunc and idle-timer callbacks do not write the result while
// RelayTCP/RelayUDP read it.
func TestRelayEndRacingWithCancelOrIdleTimer(t *testing.T) {
	goroutineLeakCheck(t)
	t.Run("RelayTCP", func(t *testing.T) {
		for range 100 {
			ctx, cancel := context.WithCancel(context.Background())
			sbApp, sb := tcpPair(t)
			up, upApp := tcpPair(t)
			sbApp.Close()
			upApp.Close()
			go cancel()
			r := RelayTCP(ctx, sb, up, 0)
			cancel()
			if r.Err != nil && !errors.Is(r.Err, context.Canceled) {
				t.Fatalf("RelayTCP err = %v, want nil or context.Canceled", r.Err)
			}
		}
	})
	t.Run("RelayTCP idle timer", func(t *testing.T) {
		for i := range 100 {
			sbApp, sb := tcpPair(t)
			up, upApp := tcpPair(t)
			// Sweep the ends across the moment the idle timer fires.
			go func() {
				time.Sleep(time.Millisecond + time.Duration(i)*20*time.Microsecond)
				sbApp.Close()
				upApp.Close()
			}()
			r := RelayTCP(context.Background(), sb, up, 2*time.Millisecond)
			if r.Err != nil && !errors.Is(r.Err, ErrIdle) {
				t.Fatalf("RelayTCP err = %v, want nil or ErrIdle", r.Err)
			}
		}
	})
	t.Run("RelayUDP", func(t *testing.T) {
		for i := range 100 {
			ctx, cancel := context.WithCancel(context.Background())
			_, sb := udpPair(t)
			_, up := udpPair(t)
			// Sweep the cancel across the moment the idle timeout fires.
			go func() { time.Sleep(time.Millisecond + time.Duration(i)*20*time.Microsecond); cancel() }()
			r := RelayUDP(ctx, sb, up, time.Millisecond)
			cancel()
			if r.Err != nil && !errors.Is(r.Err, context.Canceled) {
				t.Fatalf("RelayUDP err = %v, want nil or context.Canceled", r.Err)
			}
		}
	})
}
