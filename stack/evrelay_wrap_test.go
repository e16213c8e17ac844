package stack

import (
	"crypto/sha256"
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"sync/atomic"
	"testing"
	"time"
)

// The event relay of a wrapped sandbox connection (the engine's name
// checks) and a tapped upstream: the same events, no goroutine per flow.

// passWrap reads the sandbox's connection through itself, as a checker
// does; with firstDeadline it sets a read deadline at its first read.
type passWrap struct {
	net.Conn
	firstDeadline time.Duration
	armed         bool
	blocked       atomic.Int64 // reads that said ErrWouldBlock
}

func (w *passWrap) Read(p []byte) (int, error) {
	if w.firstDeadline > 0 && !w.armed {
		w.armed = true
		w.Conn.SetReadDeadline(time.Now().Add(w.firstDeadline))
	}
	n, err := w.Conn.Read(p)
	if errors.Is(err, ErrWouldBlock) {
		w.blocked.Add(1)
	}
	return n, err
}

func (w *passWrap) CloseWrite() error {
	return w.Conn.(interface{ CloseWrite() error }).CloseWrite()
}

func (w *passWrap) Abort() { w.Conn.(interface{ Abort() }).Abort() }

func (w *passWrap) ReadByEvents() {}

// countTap counts what the relay shows it of upstream's bytes.
type countTap struct {
	net.Conn
	seen atomic.Int64
	eof  atomic.Bool
}

func (u *countTap) Tap(b []byte, err error) bool {
	u.seen.Add(int64(len(b)))
	if err == io.EOF {
		u.eof.Store(true)
	}
	return true
}

func wrapBoth(w **passWrap, tap **countTap, firstDeadline time.Duration) func(*relayHandler) {
	return func(h *relayHandler) {
		h.wrap = func(sb, up net.Conn) (ClientFilter, func([]byte, error) bool) {
			pw, ct := &passWrap{Conn: sb, firstDeadline: firstDeadline}, &countTap{Conn: up}
			if w != nil {
				*w, *tap = pw, ct
			}
			return pw, ct.Tap
		}
	}
}

func TestEventRelayOfAWrapperMovesBulkBytesIntactAndShowsTheTapAll(t *testing.T) {
	goroutineLeakCheck(t)
	var (
		w   *passWrap
		tap *countTap
	)
	tb := newRelayTestbed(t, nil, 0, wrapBoth(&w, &tap, 0))
	c, u := tb.connect(t)
	const n = 4 << 20
	up, down := randomBytes(n, 3), randomBytes(n, 4)
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
		case <-time.After(4 * waitFor):
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
	if tap.seen.Load() != n || !tap.eof.Load() {
		t.Errorf("the tap saw %d bytes (EOF %v), want %d and the EOF", tap.seen.Load(), tap.eof.Load(), n)
	}
	if w.blocked.Load() == 0 {
		t.Error("the wrapper never got ErrWouldBlock: it was read blocking")
	}
}

// A wrapper's read deadline (a checker's timeout) still fires while the
// relay waits for the sandbox: it wakes the relay, which fails the flow.
func TestEventRelayWakesAWrapperWhoseReadDeadlinePassed(t *testing.T) {
	goroutineLeakCheck(t)
	tb := newRelayTestbed(t, nil, time.Hour, wrapBoth(nil, nil, 300*time.Millisecond))
	c, u := tb.connect(t)
	defer c.Close()
	defer u.Close()
	start := time.Now()
	r := tb.h.result(t)
	if !errors.Is(r.Err, os.ErrDeadlineExceeded) {
		t.Fatalf("RelayResult = %+v, want the wrapper's deadline", r)
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Errorf("the deadline fired after %v, want about 300ms", el)
	}
}

func TestEventRelayOfAWrapperHoldsNoGoroutinePerWaitingFlow(t *testing.T) {
	goroutineLeakCheck(t)
	tb := newRelayTestbed(t, nil, time.Hour, wrapBoth(nil, nil, 0))
	var conns []io.Closer
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	c, u := tb.connect(t)
	conns = append(conns, c, u)
	before := runtime.NumGoroutine()
	const flows = 300
	one := make([]byte, 1)
	for range flows {
		c, u := tb.connect(t)
		conns = append(conns, c, u)
		c.Write([]byte("x"))
		readFull(t, u, one)
		u.Write([]byte("y"))
		readFull(t, c, one)
	}
	deadline := time.Now().Add(waitFor)
	for {
		after := runtime.NumGoroutine()
		if after-before < flows/10 {
			t.Logf("%d waiting wrapped flows: %d goroutines more", flows, after-before)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d waiting wrapped flows hold %d goroutines more: a goroutine per flow", flows, after-before)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
