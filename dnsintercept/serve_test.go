package dnsintercept

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// udpPair returns an unconnected client socket and a server socket connected
// to it, both on 127.0.0.1, as the stack hands ServeUDP one flow's conn.
func udpPair(t *testing.T) (client, server *net.UDPConn) {
	t.Helper()
	client, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	server, err = net.DialUDP("udp", nil, client.LocalAddr().(*net.UDPAddr))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { server.Close() })
	return client, server
}

// tcpPair returns both ends of a TCP connection on 127.0.0.1.
func tcpPair(t *testing.T) (client, server *net.TCPConn) {
	t.Helper()
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err = net.DialTCP("tcp", nil, ln.Addr().(*net.TCPAddr))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	server, err = ln.AcceptTCP()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { server.Close() })
	return client, server
}

// serveInBackground runs fn and returns a channel closed when it returns.
func serveInBackground(fn func()) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn()
	}()
	return done
}

func waitDone(t *testing.T, done <-chan struct{}, within time.Duration, what string) {
	t.Helper()
	select {
	case <-done:
	case <-time.After(within):
		t.Fatalf("%s did not return within %v", what, within)
	}
}

func pack(t *testing.T, m *dns.Msg) []byte {
	t.Helper()
	b, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func queryID(name string, qtype uint16, id uint16) *dns.Msg {
	q := query(name, qtype)
	q.Id = id
	return q
}

// readUDPReplies reads n replies (2s deadline) and indexes them by ID.
func readUDPReplies(t *testing.T, c *net.UDPConn, n int) map[uint16]*dns.Msg {
	t.Helper()
	got := make(map[uint16]*dns.Msg)
	buf := make([]byte, 65535)
	c.SetReadDeadline(time.Now().Add(2 * time.Second))
	for len(got) < n {
		k, _, err := c.ReadFromUDP(buf)
		if err != nil {
			t.Fatalf("after %d of %d replies: %v", len(got), n, err)
		}
		m := new(dns.Msg)
		if err := m.Unpack(buf[:k]); err != nil {
			t.Fatalf("reply does not parse: %v", err)
		}
		got[m.Id] = m
	}
	return got
}

func TestServeUDPAnswersSeveralQueriesOnOneConn(t *testing.T) {
	checkGoroutines(t)
	e := newTestEnv(t, func(c *Config) { c.Limits.UDPIdle = 300 * time.Millisecond })
	client, server := udpPair(t)
	src := client.LocalAddr().(*net.UDPAddr).AddrPort()
	dst := server.LocalAddr().(*net.UDPAddr).AddrPort()
	done := serveInBackground(func() { e.srv.ServeUDP(context.Background(), server, src, dst) })
	to := server.LocalAddr().(*net.UDPAddr)

	big := queryID("big.allowed.example.", dns.TypeTXT, 5)
	for _, m := range [][]byte{
		pack(t, queryID("allowed.example.", dns.TypeA, 1)),
		pack(t, queryID("allowed.example.", dns.TypeAAAA, 2)),
		{0xde, 0xad, 0xbe, 0xef, 0x01}, // garbage: dropped, counted
		pack(t, queryID("allowed.example.", dns.TypeTXT, 3)),
		pack(t, queryID("denied.example.", dns.TypeA, 4)),
		pack(t, big),
	} {
		if _, err := client.WriteToUDP(m, to); err != nil {
			t.Fatal(err)
		}
	}
	got := readUDPReplies(t, client, 5)
	checks := []struct {
		name  string
		id    uint16
		rcode int
		n     int
	}{
		{"A gets one fake address", 1, dns.RcodeSuccess, 1},
		{"AAAA gets one fake address", 2, dns.RcodeSuccess, 1},
		{"TXT gets the upstream's record", 3, dns.RcodeSuccess, 1},
		{"a denied name gets NXDOMAIN", 4, dns.RcodeNameError, 0},
	}
	for _, c := range checks {
		r := got[c.id]
		if r == nil || r.Rcode != c.rcode || len(r.Answer) != c.n {
			t.Errorf("%s: reply %v", c.name, r)
		}
	}
	if r := got[5]; r == nil || !r.Truncated || len(r.Answer) >= 40 {
		t.Errorf("a big answer over UDP was not truncated: %v", r)
	}

	waitDone(t, done, 3*time.Second, "ServeUDP after its idle timeout")
	if _, err := server.Write([]byte{0}); err == nil {
		t.Error("ServeUDP left its conn open")
	}
	st := e.srv.Stats()
	if st.Malformed != 1 || st.Queries != 5 || st.Forwarded != 2 {
		t.Errorf("Stats = %+v, want 1 malformed, 5 queries, 2 forwarded", st)
	}
	evs := e.Events()
	if len(evs) != 5 {
		t.Fatalf("%d events, want 5", len(evs))
	}
	for _, ev := range evs {
		if ev.Src != src || ev.Dst != dst || ev.Proto != "udp" {
			t.Errorf("event %+v does not carry the conn's addresses", ev)
		}
	}
}

func TestServeUDPStopsWhenTheContextIsCancelled(t *testing.T) {
	checkGoroutines(t)
	e := newTestEnv(t, func(c *Config) { c.Limits.UDPIdle = time.Minute })
	client, server := udpPair(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := serveInBackground(func() { e.srv.ServeUDP(ctx, server, netip.AddrPort{}, netip.AddrPort{}) })
	client.WriteToUDP(pack(t, queryID("allowed.example.", dns.TypeA, 9)), server.LocalAddr().(*net.UDPAddr))
	readUDPReplies(t, client, 1)
	cancel()
	waitDone(t, done, 2*time.Second, "ServeUDP after cancel")
}

func TestServeUDPStopsWhenIdle(t *testing.T) {
	checkGoroutines(t)
	e := newTestEnv(t, func(c *Config) { c.Limits.UDPIdle = 100 * time.Millisecond })
	_, server := udpPair(t)
	start := time.Now()
	done := serveInBackground(func() { e.srv.ServeUDP(context.Background(), server, netip.AddrPort{}, netip.AddrPort{}) })
	waitDone(t, done, 2*time.Second, "ServeUDP with no queries")
	if el := time.Since(start); el < 100*time.Millisecond {
		t.Errorf("ServeUDP returned after %v, before its idle timeout", el)
	}
}

func writeFrame(t *testing.T, c net.Conn, frames ...[]byte) {
	t.Helper()
	var b []byte
	for _, f := range frames {
		b = binary.BigEndian.AppendUint16(b, uint16(len(f)))
		b = append(b, f...)
	}
	if _, err := c.Write(b); err != nil {
		t.Fatal(err)
	}
}

func readFrames(t *testing.T, c net.Conn, n int) map[uint16]*dns.Msg {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(2 * time.Second))
	got := make(map[uint16]*dns.Msg)
	for len(got) < n {
		m, err := (&dns.Conn{Conn: c}).ReadMsg()
		if err != nil {
			t.Fatalf("after %d of %d replies: %v", len(got), n, err)
		}
		got[m.Id] = m
	}
	return got
}

// expectEOF checks that the server closed the conn.
func expectEOF(t *testing.T, c net.Conn) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(2 * time.Second))
	var b [1]byte
	if _, err := c.Read(b[:]); !errors.Is(err, io.EOF) {
		t.Errorf("read after the server was done: %v, want EOF", err)
	}
}

func TestServeTCPAnswersPipelinedQueries(t *testing.T) {
	checkGoroutines(t)
	e := newTestEnv(t, func(c *Config) { c.Limits.TCPIdle = time.Minute })
	client, server := tcpPair(t)
	done := serveInBackground(func() { e.srv.ServeTCP(context.Background(), server, netip.AddrPort{}, netip.AddrPort{}) })

	writeFrame(t, client,
		pack(t, queryID("allowed.example.", dns.TypeA, 1)),
		pack(t, queryID("big.allowed.example.", dns.TypeTXT, 2)),
		pack(t, queryID("denied.example.", dns.TypeTXT, 3)),
	)
	got := readFrames(t, client, 3)
	if r := got[1]; r == nil || len(r.Answer) != 1 {
		t.Errorf("A: %v", r)
	}
	if r := got[2]; r == nil || r.Truncated || len(r.Answer) != 40 {
		t.Errorf("a big answer over TCP was cut: %v", r)
	}
	if r := got[3]; r == nil || r.Rcode != dns.RcodeNameError {
		t.Errorf("denied: %v", r)
	}
	// The client half-closes after one more query: it still gets its answer.
	writeFrame(t, client, pack(t, queryID("allowed.example.", dns.TypeAAAA, 4)))
	client.CloseWrite()
	if r := readFrames(t, client, 1)[4]; r == nil || len(r.Answer) != 1 {
		t.Errorf("AAAA before half-close: %v", r)
	}
	expectEOF(t, client)
	waitDone(t, done, 2*time.Second, "ServeTCP after the client's EOF")
	if st := e.srv.Stats(); st.Queries != 4 || st.Malformed != 0 {
		t.Errorf("Stats = %+v, want 4 queries, 0 malformed", st)
	}
}

func TestServeTCPEndsTheConnOnGarbage(t *testing.T) {
	tests := []struct {
		name  string
		frame []byte // written raw, after one good query
	}{
		{"a frame that does not parse", []byte{0, 5, 1, 2, 3, 4, 5}},
		{"a zero-length frame", []byte{0, 0}},
	}
	for _, tt := range tests {
		t.Run(tt.name+" ends the conn and counts as malformed", func(t *testing.T) {
			checkGoroutines(t)
			e := newTestEnv(t, func(c *Config) { c.Limits.TCPIdle = time.Minute })
			client, server := tcpPair(t)
			done := serveInBackground(func() { e.srv.ServeTCP(context.Background(), server, netip.AddrPort{}, netip.AddrPort{}) })
			writeFrame(t, client, pack(t, queryID("allowed.example.", dns.TypeA, 1)))
			readFrames(t, client, 1)
			if _, err := client.Write(tt.frame); err != nil {
				t.Fatal(err)
			}
			expectEOF(t, client)
			waitDone(t, done, 2*time.Second, "ServeTCP after garbage")
			if st := e.srv.Stats(); st.Malformed != 1 {
				t.Errorf("Malformed = %d, want 1", st.Malformed)
			}
		})
	}
}

func TestServeTCPStops(t *testing.T) {
	t.Run("an idle conn is closed after Limits.TCPIdle", func(t *testing.T) {
		checkGoroutines(t)
		e := newTestEnv(t, func(c *Config) { c.Limits.TCPIdle = 100 * time.Millisecond })
		client, server := tcpPair(t)
		start := time.Now()
		done := serveInBackground(func() { e.srv.ServeTCP(context.Background(), server, netip.AddrPort{}, netip.AddrPort{}) })
		expectEOF(t, client)
		waitDone(t, done, 2*time.Second, "idle ServeTCP")
		if el := time.Since(start); el < 100*time.Millisecond {
			t.Errorf("closed after %v, before the idle timeout", el)
		}
	})
	t.Run("a half-written frame does not hold the conn past Limits.TCPIdle", func(t *testing.T) {
		checkGoroutines(t)
		e := newTestEnv(t, func(c *Config) { c.Limits.TCPIdle = 100 * time.Millisecond })
		client, server := tcpPair(t)
		done := serveInBackground(func() { e.srv.ServeTCP(context.Background(), server, netip.AddrPort{}, netip.AddrPort{}) })
		client.Write([]byte{0, 40, 1, 2})
		expectEOF(t, client)
		waitDone(t, done, 2*time.Second, "ServeTCP with a partial frame")
	})
	t.Run("cancelling the context closes the conn", func(t *testing.T) {
		checkGoroutines(t)
		e := newTestEnv(t, func(c *Config) { c.Limits.TCPIdle = time.Minute })
		client, server := tcpPair(t)
		ctx, cancel := context.WithCancel(context.Background())
		done := serveInBackground(func() { e.srv.ServeTCP(ctx, server, netip.AddrPort{}, netip.AddrPort{}) })
		writeFrame(t, client, pack(t, queryID("allowed.example.", dns.TypeA, 1)))
		readFrames(t, client, 1)
		cancel()
		expectEOF(t, client)
		waitDone(t, done, 2*time.Second, "ServeTCP after cancel")
	})
	t.Run("cancelling the context aborts a forwarded query in flight", func(t *testing.T) {
		checkGoroutines(t)
		e := newTestEnv(t, nil)
		slow := e.u.resolver(t, ResolverConfig{Timeout: time.Minute})
		srv, err := NewServer(Config{Pool: e.pool, Filter: e.filter, Upstream: slow, Limits: Limits{TCPIdle: time.Minute}})
		if err != nil {
			t.Fatal(err)
		}
		client, server := tcpPair(t)
		ctx, cancel := context.WithCancel(context.Background())
		done := serveInBackground(func() { srv.ServeTCP(ctx, server, netip.AddrPort{}, netip.AddrPort{}) })
		writeFrame(t, client, pack(t, queryID("silent.example.", dns.TypeTXT, 1)))
		deadline := time.Now().Add(2 * time.Second)
		for e.u.Count("silent.example", dns.TypeTXT) == 0 {
			if time.Now().After(deadline) {
				t.Fatal("the query was not forwarded within 2s: nothing in flight to abort")
			}
			time.Sleep(5 * time.Millisecond)
		}
		cancel()
		waitDone(t, done, 2*time.Second, "ServeTCP with a forward in flight after cancel")
	})
}
