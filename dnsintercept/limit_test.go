package dnsintercept

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/tunwall/tunwall/flow"
)

func TestAdmitEvictsTheSessionIdleLongestAndRefusesWhenAllAreBusy(t *testing.T) {
	e := newTestEnv(t, func(c *Config) { c.Limits.MaxTCPConns = 2; c.Limits.MaxUDPSessions = 1 })
	a, ok1 := e.srv.Admit("tcp")
	b, ok2 := e.srv.Admit("tcp")
	if !ok1 || !ok2 {
		t.Fatal("Admit refused below the limit")
	}
	// a answers a query after b was admitted: b is now idle longest.
	if !a.begin() {
		t.Fatal("begin on a live session failed")
	}
	a.end()
	c, ok := e.srv.Admit("tcp")
	if !ok {
		t.Fatal("Admit at the limit with idle sessions refused")
	}
	if b.begin() {
		t.Error("the session idle longest (b) was not the one evicted")
	}
	if !a.begin() { // a is busy from now on
		t.Fatal("a was evicted instead of b")
	}
	if !c.begin() {
		t.Fatal("the new session was evicted")
	}
	// Both places busy: refused, counted.
	if _, ok := e.srv.Admit("tcp"); ok {
		t.Fatal("Admit succeeded with every session busy")
	}
	// UDP has its own limit, untouched by TCP's.
	u, ok := e.srv.Admit("udp")
	if !ok {
		t.Fatal("UDP Admit refused while only TCP is full")
	}
	st := e.srv.Stats()
	if st.TCPConns != 2 || st.UDPSessions != 1 || st.Evicted != 1 || st.Refused != 1 {
		t.Errorf("Stats = %+v, want 2 TCP, 1 UDP, 1 evicted, 1 refused", st)
	}
	// An answer ends: c is idle and can make room again.
	c.end()
	d, ok := e.srv.Admit("tcp")
	if !ok {
		t.Fatal("Admit refused with an idle session")
	}
	// Released places are free places; Release twice is harmless.
	a.end()
	a.Release()
	a.Release()
	d.Release()
	u.Release()
	b.Release() // evicted already: no effect on the count
	if st := e.srv.Stats(); st.TCPConns != 0 || st.UDPSessions != 0 {
		t.Errorf("after every Release: %+v", st)
	}
}

func TestServeTCPClosesTheConnEvictedToMakeRoom(t *testing.T) {
	checkGoroutines(t)
	// OnQuery runs once the query no longer keeps its session busy; the
	// reply reaches the client a little before that.
	answered := make(chan struct{}, 8)
	e := newTestEnv(t, func(c *Config) {
		c.Limits.MaxTCPConns = 1
		c.Limits.TCPIdle = time.Minute
		c.OnQuery = func(QueryEvent) {
			select {
			case answered <- struct{}{}:
			default:
			}
		}
	})
	client, server := tcpPair(t)
	done := serveInBackground(func() { e.srv.ServeTCP(context.Background(), server, netip.AddrPort{}, netip.AddrPort{}) })
	writeFrame(t, client, pack(t, queryID("allowed.example.", dns.TypeA, 1)))
	readFrames(t, client, 1)
	select {
	case <-answered:
	case <-time.After(2 * time.Second):
		t.Fatal("the first query was not done within 2s")
	}

	// A second conn takes the idle first one's place.
	client2, server2 := tcpPair(t)
	done2 := serveInBackground(func() { e.srv.ServeTCP(context.Background(), server2, netip.AddrPort{}, netip.AddrPort{}) })
	expectEOF(t, client)
	waitDone(t, done, 2*time.Second, "the evicted ServeTCP")
	writeFrame(t, client2, pack(t, queryID("allowed.example.", dns.TypeA, 2)))
	if r := readFrames(t, client2, 1)[2]; r == nil || len(r.Answer) != 1 {
		t.Errorf("the new conn: %v", r)
	}
	client2.Close()
	waitDone(t, done2, 2*time.Second, "the second ServeTCP")

	// A session evicted before it is served closes its conn at once.
	ss, _ := e.srv.Admit("tcp")
	e.srv.Admit("tcp")
	client3, server3 := tcpPair(t)
	ss.Serve(context.Background(), server3, netip.AddrPort{}, netip.AddrPort{})
	expectEOF(t, client3)
	if st := e.srv.Stats(); st.Evicted != 2 {
		t.Errorf("Evicted = %d, want 2", st.Evicted)
	}
}

func TestServeTCPClosesAfterMaxQueriesPerConn(t *testing.T) {
	checkGoroutines(t)
	e := newTestEnv(t, func(c *Config) { c.Limits.MaxQueriesPerConn = 3; c.Limits.TCPIdle = time.Minute })
	client, server := tcpPair(t)
	done := serveInBackground(func() { e.srv.ServeTCP(context.Background(), server, netip.AddrPort{}, netip.AddrPort{}) })
	var frames [][]byte
	for id := uint16(1); id <= 5; id++ {
		frames = append(frames, pack(t, queryID("allowed.example.", dns.TypeA, id)))
	}
	writeFrame(t, client, frames...)
	got := readFrames(t, client, 3)
	for id := uint16(1); id <= 3; id++ {
		if got[id] == nil {
			t.Errorf("query %d unanswered", id)
		}
	}
	// Closed: EOF, or RST since queries 4 and 5 were never read.
	client.SetReadDeadline(time.Now().Add(2 * time.Second))
	var b [1]byte
	if _, err := client.Read(b[:]); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("read after the last answer: %v, want the conn closed", err)
	}
	waitDone(t, done, 2*time.Second, "ServeTCP after its last query")
	if st := e.srv.Stats(); st.Queries != 3 {
		t.Errorf("Queries = %d, want 3", st.Queries)
	}
}

func TestServeUDPDropsQueriesPastItsInFlightBound(t *testing.T) {
	checkGoroutines(t)
	e := newTestEnv(t, func(c *Config) { c.Limits.UDPIdle = time.Minute })
	client, server := udpPair(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := serveInBackground(func() { e.srv.ServeUDP(ctx, server, netip.AddrPort{}, netip.AddrPort{}) })
	// The upstream never answers silent.example: each query stays in
	// flight for the resolver's timeout.
	const n = maxInFlightPerConn + 4
	for id := uint16(1); id <= n; id++ {
		if _, err := client.WriteTo(pack(t, queryID("silent.example.", dns.TypeTXT, id)), server.LocalAddr()); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(2 * time.Second)
	for e.srv.Stats().Overrun < n-maxInFlightPerConn {
		if time.Now().After(deadline) {
			t.Fatalf("Overrun = %d, want %d", e.srv.Stats().Overrun, n-maxInFlightPerConn)
		}
		time.Sleep(5 * time.Millisecond)
	}
	// Meanwhile another query on the same session is dropped too, but a
	// second session is answered.
	client2, server2 := udpPair(t)
	done2 := serveInBackground(func() { e.srv.ServeUDP(ctx, server2, netip.AddrPort{}, netip.AddrPort{}) })
	client2.WriteTo(pack(t, queryID("allowed.example.", dns.TypeA, 99)), server2.LocalAddr())
	if r := readUDPReplies(t, client2, 1)[99]; r == nil || len(r.Answer) != 1 {
		t.Errorf("the second session: %v", r)
	}
	cancel()
	waitDone(t, done, 5*time.Second, "ServeUDP after cancel")
	waitDone(t, done2, 5*time.Second, "the second ServeUDP after cancel")
	if st := e.srv.Stats(); st.Overrun != n-maxInFlightPerConn || st.UDPSessions != 0 {
		t.Errorf("Stats = %+v, want %d overrun, no session left", st, n-maxInFlightPerConn)
	}
}

func TestNewServerRejectsNegativeLimits(t *testing.T) {
	pool, _ := NewPool(DefaultPrefix4, DefaultPrefix6)
	f := func(string) flow.Decision { return flow.Decision{} }
	for _, l := range []Limits{{MaxTCPConns: -1}, {MaxUDPSessions: -1}, {UDPIdle: -1}, {MaxQueriesPerConn: -1}, {MaxForwarding: -1}, {MaxInFlight: -1}} {
		if _, err := NewServer(Config{Pool: pool, Filter: f, Limits: l}); err == nil {
			t.Errorf("NewServer accepted %+v", l)
		}
	}
	srv, err := NewServer(Config{Pool: pool, Filter: f})
	if err != nil {
		t.Fatal(err)
	}
	want := Limits{DefaultMaxTCPConns, DefaultMaxUDPSessions, DefaultTCPIdle, DefaultUDPIdle, DefaultMaxQueriesPerConn, DefaultMaxForwarding, DefaultMaxInFlight}
	if srv.cfg.Limits != want {
		t.Errorf("default limits = %+v, want %+v", srv.cfg.Limits, want)
	}
}

func TestEvictedSessionsCountUntilTheyEnd(t *testing.T) {
	e := newTestEnv(t, func(c *Config) { c.Limits.MaxTCPConns = 1 })
	cancelled := 0
	a, _ := e.srv.Admit("tcp")
	if !a.start(func() { cancelled++ }) {
		t.Fatal("start of a live session failed")
	}
	b, ok := e.srv.Admit("tcp")
	if !ok || cancelled != 1 {
		t.Fatalf("Admit at the limit: ok=%v, cancelled %d times; want a evicted", ok, cancelled)
	}
	b.start(func() {})
	// a has not ended yet (its Serve still writes a record, say): it still
	// counts, and with 2*max sessions in existence the next is refused.
	if st := e.srv.Stats(); st.TCPConns != 2 {
		t.Errorf("TCPConns = %d, want 2 (one ending)", st.TCPConns)
	}
	if _, ok := e.srv.Admit("tcp"); ok {
		t.Fatal("Admit succeeded with 2*max sessions in existence")
	}
	a.Release()
	c, ok := e.srv.Admit("tcp")
	if !ok {
		t.Fatal("Admit refused once the evicted session ended")
	}
	if b.begin() {
		t.Error("b was not evicted for c")
	}
	b.Release()
	c.Release()
	if st := e.srv.Stats(); st.TCPConns != 0 || st.Evicted != 2 || st.Refused != 1 {
		t.Errorf("Stats = %+v, want 0 conns, 2 evicted, 1 refused", st)
	}
}

func TestMaxInFlightBoundsQueriesAcrossSessions(t *testing.T) {
	checkGoroutines(t)
	e := newTestEnv(t, func(c *Config) { c.Limits.MaxInFlight = 2; c.Limits.UDPIdle = time.Minute })
	ctx, cancel := context.WithCancel(context.Background())
	var dones []<-chan struct{}
	// Two sessions each hold a query the upstream never answers.
	for id := uint16(1); id <= 2; id++ {
		client, server := udpPair(t)
		dones = append(dones, serveInBackground(func() { e.srv.ServeUDP(ctx, server, netip.AddrPort{}, netip.AddrPort{}) }))
		client.WriteTo(pack(t, queryID("silent.example.", dns.TypeTXT, id)), server.LocalAddr())
	}
	deadline := time.Now().Add(2 * time.Second)
	for e.u.Count("silent.example", dns.TypeTXT) < 2 {
		if time.Now().After(deadline) {
			t.Fatal("the two queries never reached the upstream")
		}
		time.Sleep(5 * time.Millisecond)
	}
	// A third session's query finds no place: dropped, counted.
	client, server := udpPair(t)
	dones = append(dones, serveInBackground(func() { e.srv.ServeUDP(ctx, server, netip.AddrPort{}, netip.AddrPort{}) }))
	client.WriteTo(pack(t, queryID("allowed.example.", dns.TypeA, 3)), server.LocalAddr())
	for e.srv.Stats().Overrun < 1 {
		if time.Now().After(deadline) {
			t.Fatal("the third session's query was not dropped")
		}
		time.Sleep(5 * time.Millisecond)
	}
	// Once the upstream times out (2s), a place is free again.
	deadline = time.Now().Add(5 * time.Second)
	for {
		client.WriteTo(pack(t, queryID("allowed.example.", dns.TypeA, 4)), server.LocalAddr())
		client.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		buf := make([]byte, 512)
		if n, _, err := client.ReadFrom(buf); err == nil {
			m := new(dns.Msg)
			if m.Unpack(buf[:n]) == nil && m.Id == 4 && len(m.Answer) == 1 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("no answer after the places were freed")
		}
	}
	cancel()
	for _, d := range dones {
		waitDone(t, d, 5*time.Second, "ServeUDP after cancel")
	}
}
