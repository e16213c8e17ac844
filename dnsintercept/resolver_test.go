package dnsintercept

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
)

func addrs(ss ...string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

func TestResolveAnswers(t *testing.T) {
	checkGoroutines(t)
	u := startUpstream(t)
	r := u.resolver(t, ResolverConfig{Timeout: 2 * time.Second, MinTTL: time.Minute, MaxTTL: time.Hour})
	tests := []struct {
		name      string
		host      string
		want      []netip.Addr
		wantRcode int // when want is nil and the upstream answers with an error rcode
		wantErr   error
	}{
		{"a name with A and AAAA returns both, IPv4 first", "dual.example", addrs("192.0.2.1", "2001:db8::1"), 0, nil},
		{"a CNAME chain is followed to its target", "alias.example", addrs("192.0.2.10", "2001:db8::10"), 0, nil},
		{"case and a trailing dot do not matter", "DUAL.Example.", addrs("192.0.2.1", "2001:db8::1"), 0, nil},
		{"a name with only A returns it", "v4only.example", addrs("192.0.2.30"), 0, nil},
		{"a truncated UDP answer is retried over TCP", "tconly.example", addrs("192.0.2.77", "2001:db8::77"), 0, nil},
		{"NXDOMAIN is an RcodeError", "nx.example", nil, dns.RcodeNameError, nil},
		{"SERVFAIL is an RcodeError", "fail.example", nil, dns.RcodeServerFailure, nil},
		{"a name without addresses wraps ErrNoAddresses", "nodata.example", nil, 0, ErrNoAddresses},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := r.Resolve(context.Background(), tt.host)
			switch {
			case tt.want != nil:
				if err != nil || !slices.Equal(got, tt.want) {
					t.Fatalf("Resolve(%s) = %v, %v; want %v", tt.host, got, err, tt.want)
				}
			case tt.wantRcode != 0:
				var re *RcodeError
				if !errors.As(err, &re) || re.Rcode != tt.wantRcode || re.Name != normalizeName(tt.host) {
					t.Fatalf("Resolve(%s) = %v, %v; want rcode %s", tt.host, got, err, rcodeString(tt.wantRcode))
				}
				if !strings.Contains(err.Error(), rcodeString(tt.wantRcode)) {
					t.Errorf("error %q does not name the rcode", err)
				}
			default:
				if !errors.Is(err, tt.wantErr) || got != nil {
					t.Fatalf("Resolve(%s) = %v, %v; want %v", tt.host, got, err, tt.wantErr)
				}
			}
			// Cached, positive or negative: a second call asks nothing new.
			before := len(u.Log())
			got2, err2 := r.Resolve(context.Background(), tt.host)
			if len(u.Log()) != before {
				t.Errorf("second Resolve(%s) queried the upstream again: %v", tt.host, u.Log()[before:])
			}
			if !slices.Equal(got, got2) || (err == nil) != (err2 == nil) {
				t.Errorf("cached result %v, %v differs from %v, %v", got2, err2, got, err)
			}
		})
	}
	if n := u.Count("tconly.example", dns.TypeA); n != 2 {
		t.Errorf("tconly.example A asked %d times, want 2 (UDP then TCP)", n)
	}
	for _, l := range u.Log() {
		if l.Name == "tconly.example." && l.Proto == "tcp" {
			return
		}
	}
	t.Error("no TCP retry reached the upstream")
}

func TestResolveReturnsACopyOfTheCache(t *testing.T) {
	u := startUpstream(t)
	r := u.resolver(t, ResolverConfig{MinTTL: time.Minute})
	a, err := r.Resolve(context.Background(), "dual.example")
	if err != nil {
		t.Fatal(err)
	}
	a[0] = netip.MustParseAddr("203.0.113.66")
	b, _ := r.Resolve(context.Background(), "dual.example")
	if b[0] != netip.MustParseAddr("192.0.2.1") {
		t.Errorf("caller's edit leaked into the cache: %v", b)
	}
}

func TestResolveRequeriesAfterTheTTLExpires(t *testing.T) {
	checkGoroutines(t)
	u := startUpstream(t)
	r := u.resolver(t, ResolverConfig{MinTTL: 100 * time.Millisecond, MaxTTL: 200 * time.Millisecond})
	tests := []struct{ name, host string }{
		{"a zero TTL is raised to MinTTL and then expires", "short.example"},
		{"a long TTL is cut to MaxTTL and then expires", "dual.example"},
		{"a negative answer expires after MinTTL", "nx.example"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r.Resolve(context.Background(), tt.host)
			if n := u.Count(tt.host, dns.TypeA); n != 1 {
				t.Fatalf("first lookup asked A %d times, want 1", n)
			}
			// (That a lookup within the TTL is served from the cache is
			// TestResolveAnswers' job: with TTLs this short, a loaded
			// machine could make it flaky here.)
			deadline := time.Now().Add(3 * time.Second)
			for u.Count(tt.host, dns.TypeA) < 2 {
				if time.Now().After(deadline) {
					t.Fatal("no new upstream query 3s after a TTL of at most 200ms")
				}
				time.Sleep(20 * time.Millisecond)
				r.Resolve(context.Background(), tt.host)
			}
		})
	}
}

func TestResolveTimeoutIsReportedAndNotCached(t *testing.T) {
	checkGoroutines(t)
	u := startUpstream(t)
	r := u.resolver(t, ResolverConfig{Timeout: 300 * time.Millisecond, MinTTL: time.Minute})
	start := time.Now()
	_, err := r.Resolve(context.Background(), "silent.example")
	if !errors.Is(err, ErrTimeout) {
		t.Fatalf("Resolve(silent.example) err = %v, want a timeout (ErrTimeout)", err)
	}
	if el := time.Since(start); el > 2*time.Second {
		t.Errorf("timeout of 300ms took %v", el)
	}
	// The server logs asynchronously: wait for the retransmissions to land.
	waitCount := func(min int) int {
		deadline := time.Now().Add(2 * time.Second)
		for u.Count("silent.example", dns.TypeA) < min && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		return u.Count("silent.example", dns.TypeA)
	}
	if n := waitCount(udpAttempts); n != udpAttempts {
		t.Errorf("A sent %d times, want %d UDP attempts", n, udpAttempts)
	}
	r.Resolve(context.Background(), "silent.example")
	if n := waitCount(udpAttempts + 1); n <= udpAttempts {
		t.Errorf("a timeout was cached: A sent %d times after two lookups", n)
	}
}

func TestResolveHonoursTheCallersContext(t *testing.T) {
	checkGoroutines(t)
	u := startUpstream(t)
	r := u.resolver(t, ResolverConfig{Timeout: 2 * time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := r.Resolve(ctx, "silent.example")
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("err = %v, want context.DeadlineExceeded", err)
	}
	if el := time.Since(start); el > time.Second {
		t.Errorf("Resolve returned %v after its context expired", el)
	}
}

func TestResolveSharesOneLookupBetweenConcurrentCallers(t *testing.T) {
	u := startUpstream(t)
	r := u.resolver(t, ResolverConfig{MinTTL: time.Minute})
	var wg sync.WaitGroup
	for i := 0; i < 20; i++ {
		wg.Go(func() {
			got, err := r.Resolve(context.Background(), "target.example")
			if err != nil || len(got) != 2 {
				t.Errorf("Resolve = %v, %v", got, err)
			}
		})
	}
	wg.Wait()
	if a, aaaa := u.Count("target.example", dns.TypeA), u.Count("target.example", dns.TypeAAAA); a != 1 || aaaa != 1 {
		t.Errorf("upstream asked A %d and AAAA %d times, want once each", a, aaaa)
	}
}

func TestResolveRejectsInvalidNamesWithoutQuerying(t *testing.T) {
	u := startUpstream(t)
	r := u.resolver(t, ResolverConfig{})
	for _, n := range []string{"", ".", `a\.b.example`, "a..example", "*.example"} {
		if _, err := r.Resolve(context.Background(), n); err == nil {
			t.Errorf("Resolve(%q) succeeded", n)
		}
	}
	if l := u.Log(); len(l) != 0 {
		t.Errorf("invalid names reached the upstream: %v", l)
	}
}

func TestExchange(t *testing.T) {
	checkGoroutines(t)
	u := startUpstream(t)
	var dials atomic.Int32
	r := u.resolver(t, ResolverConfig{
		Timeout: 2 * time.Second,
		Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
			dials.Add(1)
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		},
	})
	t.Run("the reply carries the query's ID and answer", func(t *testing.T) {
		q := new(dns.Msg)
		q.SetQuestion("allowed.example.", dns.TypeMX)
		q.Id = 4242
		resp, err := r.exchange(context.Background(), q)
		if err != nil {
			t.Fatal(err)
		}
		if resp.Id != 4242 || len(resp.Answer) != 1 || resp.Answer[0].(*dns.MX).Mx != "mx.allowed.example." {
			t.Errorf("reply = %v", resp)
		}
		if q.Id != 4242 {
			t.Errorf("Exchange changed the caller's query ID to %d", q.Id)
		}
	})
	t.Run("a reply too big for UDP is fetched over TCP", func(t *testing.T) {
		q := new(dns.Msg)
		q.SetQuestion("big.allowed.example.", dns.TypeTXT)
		resp, err := r.exchange(context.Background(), q)
		if err != nil {
			t.Fatal(err)
		}
		if resp.Truncated || len(resp.Answer) != 40 {
			t.Errorf("got TC=%v and %d records, want all 40", resp.Truncated, len(resp.Answer))
		}
		var protos []string
		for _, l := range u.Log() {
			if l.Name == "big.allowed.example." {
				protos = append(protos, l.Proto)
			}
		}
		if !slices.Equal(protos, []string{"udp", "tcp"}) {
			t.Errorf("upstream saw %v, want [udp tcp]", protos)
		}
	})
	t.Run("a query without exactly one question is rejected", func(t *testing.T) {
		before := dials.Load()
		if _, err := r.exchange(context.Background(), new(dns.Msg)); err == nil {
			t.Error("Exchange of an empty message succeeded")
		}
		if dials.Load() != before {
			t.Error("Exchange dialled for an invalid query")
		}
	})
	if dials.Load() < 3 {
		t.Errorf("custom Dial used %d times, want at least 3 (udp, udp, tcp)", dials.Load())
	}
}

func TestExchangeReportsDialErrors(t *testing.T) {
	boom := errors.New("boom")
	r, err := NewResolver(ResolverConfig{
		Server: netip.MustParseAddrPort("192.0.2.53:53"),
		Dial: func(context.Context, string, string) (net.Conn, error) {
			return nil, boom
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	q := new(dns.Msg)
	q.SetQuestion("example.com.", dns.TypeTXT)
	if _, err := r.exchange(context.Background(), q); !errors.Is(err, boom) || !strings.Contains(err.Error(), "192.0.2.53:53") {
		t.Errorf("err = %v, want it to wrap the dial error and name the server", err)
	}
}

func TestNewResolverValidatesItsConfig(t *testing.T) {
	ok := netip.MustParseAddrPort("192.0.2.53:53")
	tests := []struct {
		name    string
		cfg     ResolverConfig
		wantErr bool
	}{
		{"a server alone is enough", ResolverConfig{Server: ok}, false},
		{"a missing server is an error", ResolverConfig{}, true},
		{"port zero is an error", ResolverConfig{Server: netip.MustParseAddrPort("192.0.2.53:0")}, true},
		{"a negative timeout is an error", ResolverConfig{Server: ok, Timeout: -1}, true},
		{"MinTTL above MaxTTL is an error", ResolverConfig{Server: ok, MinTTL: time.Hour, MaxTTL: time.Minute}, true},
		{"MinTTL above the default MaxTTL is an error", ResolverConfig{Server: ok, MinTTL: time.Hour}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := NewResolver(tt.cfg); (err != nil) != tt.wantErr {
				t.Errorf("err = %v, wantErr %v", err, tt.wantErr)
			}
		})
	}
}

func TestHostResolvConf(t *testing.T) {
	tests := []struct {
		name    string
		content string
		want    string // "" means an error
	}{
		{"the first nameserver wins", "search example\nnameserver 192.0.2.53\nnameserver 192.0.2.54\n", "192.0.2.53:53"},
		{"comments are ignored", "# nameserver 192.0.2.1\n; nameserver 192.0.2.2\nnameserver 192.0.2.3 # trailing\n", "192.0.2.3:53"},
		{"IPv6 nameservers are read", "nameserver 2001:db8::53\n", "[2001:db8::53]:53"},
		{"an IPv6 zone is kept", "nameserver fe80::1%eth0\n", "[fe80::1%eth0]:53"},
		{"an unparsable nameserver is skipped", "nameserver dns.example\nnameserver 192.0.2.9\n", "192.0.2.9:53"},
		{"tabs separate fields too", "nameserver\t192.0.2.10\n", "192.0.2.10:53"},
		{"no nameserver is an error", "search example\noptions ndots:1\n", ""},
		{"only unparsable nameservers is an error", "nameserver dns.example\n", ""},
		{"an empty file is an error", "", ""},
	}
	dir := t.TempDir()
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(dir, "resolv"+string(rune('a'+i))+".conf")
			if err := os.WriteFile(path, []byte(tt.content), 0o644); err != nil {
				t.Fatal(err)
			}
			got, err := HostResolvConf(path)
			if tt.want == "" {
				if err == nil {
					t.Errorf("HostResolvConf = %v, want an error", got)
				}
				return
			}
			if err != nil || got.String() != tt.want {
				t.Errorf("HostResolvConf = %v, %v; want %s", got, err, tt.want)
			}
		})
	}
	if _, err := HostResolvConf(filepath.Join(dir, "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: err = %v, want os.ErrNotExist", err)
	}
}

// FuzzResolvConf checks that the parser never panics, only returns
// nameserver addresses that appear in the input, on port 53, and carries
// into the sandbox only valid search domains and options without spaces.
func FuzzResolvConf(f *testing.F) {
	f.Add("nameserver 192.0.2.53\n")
	f.Add("# c\nnameserver fe80::1%eth0 ; x\n")
	f.Add("nameserver\n nameserver 1\n")
	f.Add("search a.test b.test\ndomain c.test\noptions ndots:3 timeout:99 attempts:0 rotate no-aaaa\n")
	f.Fuzz(func(t *testing.T, s string) {
		rc, err := ParseResolvConf([]byte(s))
		if err != nil {
			return
		}
		for _, ap := range rc.Servers {
			if !ap.IsValid() || ap.Port() != 53 {
				t.Fatalf("server %v", ap)
			}
		}
		if len(rc.Servers) > 0 && !strings.Contains(s, "nameserver") {
			t.Fatalf("found %v in a file without a nameserver line", rc.Servers)
		}
		for _, d := range rc.Search {
			if !validHostname(d) {
				t.Fatalf("search domain %q is not a valid name", d)
			}
		}
		for _, o := range rc.Options {
			if o == "" || strings.ContainsAny(o, " \t\r\n#;") {
				t.Fatalf("option %q", o)
			}
		}
		if rc.Timeout < 0 || rc.Timeout > maxCarriedTimeout*time.Second {
			t.Fatalf("timeout %v", rc.Timeout)
		}
	})
}
