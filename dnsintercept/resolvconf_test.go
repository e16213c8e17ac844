package dnsintercept

import (
	"context"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestParseResolvConf(t *testing.T) {
	tests := []struct {
		name    string
		content string
		servers []string
		search  []string
		options []string
		timeout time.Duration
	}{
		{"every nameserver in order", "nameserver 192.0.2.53\nnameserver 2001:db8::53\nnameserver 192.0.2.54\n",
			[]string{"192.0.2.53:53", "[2001:db8::53]:53", "192.0.2.54:53"}, nil, nil, 0},
		{"a repeated nameserver is listed once", "nameserver 192.0.2.53\nnameserver 192.0.2.53\n",
			[]string{"192.0.2.53:53"}, nil, nil, 0},
		{"search list and options", "search corp.test Lab.Corp.Test.\noptions ndots:2 timeout:2 attempts:3 rotate edns0 single-request\nnameserver 192.0.2.53\n",
			[]string{"192.0.2.53:53"}, []string{"corp.test", "lab.corp.test"}, []string{"ndots:2", "timeout:2", "attempts:3", "single-request"}, 2 * time.Second},
		{"domain is a one-name search list", "domain corp.test\nnameserver 192.0.2.53\n",
			[]string{"192.0.2.53:53"}, []string{"corp.test"}, nil, 0},
		{"the last of search and domain wins (glibc)", "search a.test b.test\ndomain c.test\n",
			nil, []string{"c.test"}, nil, 0},
		{"invalid search domains are skipped", "search ok.test bad..test x/y .\n",
			nil, []string{"ok.test"}, nil, 0},
		{"out-of-range options are clamped, malformed ones ignored", "options ndots:99 timeout:0 attempts:100 ndots:x timeout:-1 no-aaaa:1\n",
			nil, nil, []string{"ndots:15", "timeout:1", "attempts:5"}, time.Second},
		{"a later option replaces an earlier one in place", "options ndots:2 attempts:2\noptions ndots:3\n",
			nil, nil, []string{"ndots:3", "attempts:2"}, 0},
		{"comments are ignored", "search a.test # b.test\n; search c.test\n",
			nil, []string{"a.test"}, nil, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rc, err := ParseResolvConf([]byte(tt.content))
			if err != nil {
				t.Fatal(err)
			}
			var servers []string
			for _, s := range rc.Servers {
				servers = append(servers, s.String())
			}
			if !slices.Equal(servers, tt.servers) || !slices.Equal(rc.Search, tt.search) || !slices.Equal(rc.Options, tt.options) || rc.Timeout != tt.timeout {
				t.Errorf("got servers %q search %q options %q timeout %v\nwant servers %q search %q options %q timeout %v",
					servers, rc.Search, rc.Options, rc.Timeout, tt.servers, tt.search, tt.options, tt.timeout)
			}
		})
	}
}

// deadServer is a UDP socket that reads queries and never answers: a
// nameserver that is down or blackholed. It counts what it receives.
func deadServer(t *testing.T) (netip.AddrPort, *atomic.Int32) {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var n atomic.Int32
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 1500)
		for {
			if _, _, err := pc.ReadFrom(buf); err != nil {
				return
			}
			n.Add(1)
		}
	}()
	t.Cleanup(func() { pc.Close(); <-done })
	return pc.LocalAddr().(*net.UDPAddr).AddrPort(), &n
}

// A dead first nameserver costs one ServerTimeout, once: the next server
// answers, and is asked first from then on.
func TestResolveFailsOverToTheNextServer(t *testing.T) {
	checkGoroutines(t)
	u := startUpstream(t)
	dead, got := deadServer(t)
	// A closed port: the kernel refuses (ICMP port unreachable).
	closed, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := closed.LocalAddr().(*net.UDPAddr).AddrPort()
	closed.Close()

	r, err := NewResolver(ResolverConfig{Servers: []netip.AddrPort{dead, refused, u.Addr}, ServerTimeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	addrs, err := r.Resolve(context.Background(), "dual.example")
	took := time.Since(start)
	if err != nil || len(addrs) != 2 {
		t.Fatalf("Resolve with a dead first server = %v, %v", addrs, err)
	}
	if took > 2*time.Second {
		t.Errorf("failover took %v, want about one ServerTimeout (300ms)", took)
	}
	if got.Load() == 0 {
		t.Errorf("the first server was never asked")
	}
	t.Logf("first lookup, dead first server: %v", took)

	before := got.Load()
	start = time.Now()
	if _, err := r.Resolve(context.Background(), "v4only.example"); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 250*time.Millisecond {
		t.Errorf("second lookup took %v: the server that answered should be asked first", took)
	}
	if got.Load() != before {
		t.Errorf("the dead server was asked again (%d more queries)", got.Load()-before)
	}
}

// When every server fails, the error names each and says timeout.
func TestResolveAllServersDead(t *testing.T) {
	checkGoroutines(t)
	d1, _ := deadServer(t)
	d2, _ := deadServer(t)
	r, err := NewResolver(ResolverConfig{Servers: []netip.AddrPort{d1, d2}, ServerTimeout: 100 * time.Millisecond, Timeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	_, err = r.Resolve(context.Background(), "dual.example")
	if err == nil {
		t.Fatal("Resolve with every server dead succeeded")
	}
	for _, want := range []string{d1.String(), d2.String(), "timeout"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
}

// SERVFAIL from the first server is passed over for the next; NXDOMAIN is an
// answer and is not.
func TestExchangeServfailTriesTheNextServer(t *testing.T) {
	checkGoroutines(t)
	u1 := startUpstream(t)
	u2 := startUpstream(t)
	r, err := NewResolver(ResolverConfig{Servers: []netip.AddrPort{u1.Addr, u2.Addr}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Resolve(context.Background(), "fail.example"); err == nil {
		t.Fatal("fail.example resolved")
	}
	if u1.Count("fail.example", 0) == 0 || u2.Count("fail.example", 0) == 0 {
		t.Errorf("SERVFAIL: first server asked %d times, second %d; want both", u1.Count("fail.example", 0), u2.Count("fail.example", 0))
	}
	if _, err := r.Resolve(context.Background(), "nx.example"); err == nil {
		t.Fatal("nx.example resolved")
	}
	if n := u2.Count("nx.example", 0) + u1.Count("nx.example", 0); n != 2 {
		t.Errorf("NXDOMAIN: %d queries in all, want 2 (A and AAAA, one server)", n)
	}
}
