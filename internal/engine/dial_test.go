package engine

import (
	"context"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/tunwall/tunwall/stack"
)

func TestEyeballsOrder(t *testing.T) {
	a := func(s string) netip.Addr { return netip.MustParseAddr(s) }
	in := []netip.Addr{a("192.0.2.1"), a("192.0.2.2"), a("192.0.2.3"), a("2001:db8::1"), a("2001:db8::2")}
	for _, tc := range []struct {
		prefer4 bool
		want    string
	}{
		{true, "192.0.2.1 2001:db8::1 192.0.2.2 2001:db8::2 192.0.2.3"},
		{false, "2001:db8::1 192.0.2.1 2001:db8::2 192.0.2.2 192.0.2.3"},
	} {
		var got []string
		for _, x := range eyeballsOrder(in, tc.prefer4) {
			got = append(got, x.String())
		}
		if strings.Join(got, " ") != tc.want {
			t.Errorf("prefer4=%v: %v, want %s", tc.prefer4, got, tc.want)
		}
	}
}

// fakeDialer dials by script: "hang" waits for its context, "refuse"
// fails at once, "ok" connects at once, "late" connects after 100ms
// whatever its context says (the winner must close it).
type fakeDialer struct {
	how    map[string]string
	mu     sync.Mutex
	order  []string
	at     map[string]time.Time
	open   atomic.Int64 // conns handed out and not closed
	closed chan struct{}
}

type countedConn struct {
	net.Conn
	d    *fakeDialer
	once sync.Once
}

func (c *countedConn) Close() error {
	c.once.Do(func() {
		c.d.open.Add(-1)
		c.d.closed <- struct{}{}
	})
	return c.Conn.Close()
}

func (d *fakeDialer) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	d.mu.Lock()
	d.order = append(d.order, addr)
	d.at[addr] = time.Now()
	d.mu.Unlock()
	conn := func() net.Conn {
		a, _ := net.Pipe()
		d.open.Add(1)
		return &countedConn{Conn: a, d: d}
	}
	switch d.how[addr] {
	case "hang":
		<-ctx.Done()
		return nil, ctx.Err()
	case "refuse":
		return nil, &net.OpError{Op: "dial", Net: network, Err: syscall.ECONNREFUSED}
	case "late":
		time.Sleep(100 * time.Millisecond)
		return conn(), nil
	}
	return conn(), nil
}

func raceSetup(how map[string]string, timeout time.Duration) (*Engine, *fakeDialer, *flowRecord) {
	d := &fakeDialer{how: how, at: map[string]time.Time{}, closed: make(chan struct{}, 16)}
	e := &Engine{cfg: Config{DialTimeout: timeout, Dial: d.dial}}
	fr := &flowRecord{f: stack.Flow{Proto: stack.TCP, Dst: netip.MustParseAddrPort("198.18.0.5:80")}}
	return e, d, fr
}

func addrs(s ...string) []netip.Addr {
	var out []netip.Addr
	for _, x := range s {
		out = append(out, netip.MustParseAddr(x))
	}
	return out
}

func TestRaceDialFirstAddressHangs(t *testing.T) {
	e, _, fr := raceSetup(map[string]string{"192.0.2.40:80": "hang", "192.0.2.10:80": "ok"}, 10*time.Second)
	t0 := time.Now()
	c, err := e.raceDial(context.Background(), fr, addrs("192.0.2.40", "192.0.2.10"), 80)
	took := time.Since(t0)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if took < attemptDelay || took > attemptDelay+500*time.Millisecond {
		t.Errorf("connected after %v, want about the attempt delay %v", took, attemptDelay)
	}
	if fr.Dial.String() != "192.0.2.10:80" {
		t.Errorf("dial %v, want 192.0.2.10:80", fr.Dial)
	}
	if !strings.HasPrefix(fr.DialFailed, "192.0.2.40:80: no answer within") || !strings.Contains(fr.DialFailed, "another address answered first") {
		t.Errorf("dialFailed %q", fr.DialFailed)
	}
}

func TestRaceDialFailureStartsTheNextAtOnce(t *testing.T) {
	e, _, fr := raceSetup(map[string]string{"[2001:db8::1]:80": "refuse", "192.0.2.10:80": "ok"}, 10*time.Second)
	t0 := time.Now()
	c, err := e.raceDial(context.Background(), fr, addrs("2001:db8::1", "192.0.2.10"), 80)
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	if took := time.Since(t0); took > attemptDelay/2 {
		t.Errorf("a refused first address delayed the second by %v, want at once", took)
	}
	if !strings.Contains(fr.DialFailed, "[2001:db8::1]:80: dial tcp: connection refused") {
		t.Errorf("dialFailed %q", fr.DialFailed)
	}
}

func TestRaceDialAllFail(t *testing.T) {
	e, d, fr := raceSetup(map[string]string{"192.0.2.40:80": "hang", "192.0.2.41:80": "hang", "192.0.2.30:80": "refuse"}, 600*time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 600*time.Millisecond)
	defer cancel()
	t0 := time.Now()
	_, err := e.raceDial(ctx, fr, addrs("192.0.2.40", "192.0.2.41", "192.0.2.30"), 80)
	if err == nil {
		t.Fatal("want an error")
	}
	if took := time.Since(t0); took > time.Second {
		t.Errorf("took %v, want within the dial timeout", took)
	}
	if n := len(d.order); n != 3 {
		t.Errorf("tried %v, want all three", d.order)
	}
	// Each attempt has its own timeout: half the dial timeout here.
	if got := strings.Count(fr.DialFailed, "no answer within"); got != 2 {
		t.Errorf("dialFailed %q, want two hung attempts", fr.DialFailed)
	}
	if !strings.Contains(err.Error(), "connection refused") {
		t.Errorf("err %v does not say the third was refused", err)
	}
}

func TestRaceDialClosesTheLosers(t *testing.T) {
	// The first connects late (ignoring its cancellation); the second wins
	// once the first has had its attempt delay: the late one is closed.
	e, d, fr := raceSetup(map[string]string{"192.0.2.10:80": "ok"}, 10*time.Second)
	d.how["192.0.2.11:80"] = "late"
	e.cfg.Dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
		if addr == "192.0.2.11:80" {
			// connect only after the other has won
			time.Sleep(attemptDelay + 100*time.Millisecond)
		}
		return d.dial(ctx, network, addr)
	}
	c, err := e.raceDial(context.Background(), fr, addrs("192.0.2.11", "192.0.2.10"), 80)
	if err != nil {
		t.Fatal(err)
	}
	if fr.Dial.String() != "192.0.2.10:80" {
		t.Fatalf("dial %v", fr.Dial)
	}
	select {
	case <-d.closed:
	case <-time.After(5 * time.Second):
		t.Fatal("the losing attempt's connection was never closed")
	}
	if n := d.open.Load(); n != 1 {
		t.Errorf("%d conns open, want only the winner", n)
	}
	c.Close()
}
