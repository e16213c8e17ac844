package dnsintercept

import (
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"testing"
)

func mustPool(t testing.TB, v4, v6 string, reserved int) *Pool {
	t.Helper()
	p, err := NewPoolReserved(netip.MustParsePrefix(v4), netip.MustParsePrefix(v6), reserved)
	if err != nil {
		t.Fatalf("NewPoolReserved(%s, %s, %d): %v", v4, v6, reserved, err)
	}
	return p
}

func TestNewPoolValidatesPrefixes(t *testing.T) {
	tests := []struct {
		name     string
		v4, v6   string
		reserved int
		wantErr  bool
	}{
		{"the defaults are accepted", "198.18.0.0/15", "fd74:756e:7761:6c6d::/64", 256, false},
		{"the widest prefixes are accepted", "10.0.0.0/8", "fd00:1::/48", 256, false},
		{"a /23 and a /119 leave 256 slots", "198.18.0.0/23", "fd74:756e:7761:6c6d::/119", 256, false},
		{"a /24 leaves nothing after 256 reserved", "198.18.0.0/24", "fd74:756e:7761:6c6d::/64", 256, true},
		{"a /120 leaves nothing after 256 reserved", "198.18.0.0/15", "fd74:756e:7761:6c6d::/120", 256, true},
		{"a /24 with 254 reserved leaves two", "198.18.0.0/24", "fd74:756e:7761:6c6d::/120", 254, false},
		{"a /7 is too wide", "0.0.0.0/7", "fd74:756e:7761:6c6d::/64", 256, true},
		{"a /25 is too narrow", "198.18.0.0/25", "fd74:756e:7761:6c6d::/64", 0, true},
		{"a /47 is too wide", "198.18.0.0/15", "fd74:756e:7760::/47", 256, true},
		{"a /121 is too narrow", "198.18.0.0/15", "fd74:756e:7761:6c6d::/121", 0, true},
		{"an IPv6 prefix in the IPv4 slot is rejected", "fd74::/64", "fd74:756e:7761:6c6d::/64", 256, true},
		{"an IPv4 prefix in the IPv6 slot is rejected", "198.18.0.0/15", "198.20.0.0/16", 256, true},
		{"an IPv4-mapped prefix in the IPv6 slot is rejected", "198.18.0.0/15", "::ffff:198.18.0.0/112", 256, true},
		{"host bits in the IPv4 prefix are rejected", "198.18.1.0/15", "fd74:756e:7761:6c6d::/64", 256, true},
		{"host bits in the IPv6 prefix are rejected", "198.18.0.0/15", "fd74:756e:7761:6c6d::1/64", 256, true},
		{"a negative reserved count is rejected", "198.18.0.0/15", "fd74:756e:7761:6c6d::/64", -1, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := NewPoolReserved(netip.MustParsePrefix(tt.v4), netip.MustParsePrefix(tt.v6), tt.reserved)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tt.wantErr)
			}
		})
	}
	if _, err := NewPool(netip.Prefix{}, DefaultPrefix6); err == nil {
		t.Error("NewPool accepted an invalid IPv4 prefix")
	}
	if _, err := NewPool(DefaultPrefix4, DefaultPrefix6); err != nil {
		t.Errorf("NewPool(defaults): %v", err)
	}
}

func TestPoolAssignsSlotsInOrderAfterTheReservedPart(t *testing.T) {
	p, err := NewPool(DefaultPrefix4, DefaultPrefix6)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		in     string
		v4, v6 string
	}{
		{"the first name gets the first free address", "a.example", "198.18.1.0", "fd74:756e:7761:6c6d::100"},
		{"the second name gets the next one", "b.example", "198.18.1.1", "fd74:756e:7761:6c6d::101"},
		{"a repeated name keeps its slot", "a.example", "198.18.1.0", "fd74:756e:7761:6c6d::100"},
		{"case and a trailing dot do not make a new name", "A.Example.", "198.18.1.0", "fd74:756e:7761:6c6d::100"},
		{"a third name continues the sequence", "c.example", "198.18.1.2", "fd74:756e:7761:6c6d::102"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v4, v6, err := p.Assign(tt.in)
			if err != nil {
				t.Fatal(err)
			}
			if v4 != netip.MustParseAddr(tt.v4) || v6 != netip.MustParseAddr(tt.v6) {
				t.Errorf("Assign(%q) = %v, %v; want %s, %s", tt.in, v4, v6, tt.v4, tt.v6)
			}
		})
	}
	if p.Len() != 3 {
		t.Errorf("Len = %d, want 3", p.Len())
	}
	if p.Cap() != DefaultPoolSize {
		t.Errorf("Cap = %d, want DefaultPoolSize %d", p.Cap(), DefaultPoolSize)
	}
	whole, err := NewPoolWith(DefaultPrefix4, DefaultPrefix6, DefaultReserved, PoolOptions{Size: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if want := 1<<17 - 256; whole.Cap() != want {
		t.Errorf("Cap with a size above the prefix's = %d, want what the /15 holds, %d", whole.Cap(), want)
	}
	if _, _, err := p.Assign(""); err == nil {
		t.Error("Assign of the root name succeeded")
	}
}

func TestPoolNameMapsAddressesBack(t *testing.T) {
	p, err := NewPool(DefaultPrefix4, DefaultPrefix6)
	if err != nil {
		t.Fatal(err)
	}
	v4, v6, _ := p.Assign("a.example")
	p.Assign("b.example")
	tests := []struct {
		name   string
		ip     string
		want   string
		wantOK bool
	}{
		{"an assigned IPv4 address maps to its name", v4.String(), "a.example", true},
		{"an assigned IPv6 address maps to its name", v6.String(), "a.example", true},
		{"an IPv4-mapped IPv6 address maps like the IPv4 one", "::ffff:" + v4.String(), "a.example", true},
		{"the second slot maps to the second name", "198.18.1.1", "b.example", true},
		{"an unassigned pool address maps to nothing", "198.18.1.2", "", false},
		{"an unassigned IPv6 pool address maps to nothing", "fd74:756e:7761:6c6d::102", "", false},
		{"the virtual resolver address is reserved", "198.18.0.1", "", false},
		{"the reserved IPv6 resolver address is reserved", "fd74:756e:7761:6c6d::1", "", false},
		{"the last IPv4 pool address is unassigned", "198.19.255.255", "", false},
		{"an IPv6 pool address far beyond any slot maps to nothing", "fd74:756e:7761:6c6d:1::100", "", false},
		{"an address outside the pool maps to nothing", "192.0.2.1", "", false},
		{"an IPv6 address outside the pool maps to nothing", "2001:db8::100", "", false},
		{"an IPv6 pool address with a zone still maps", v6.String() + "%eth0", "a.example", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := p.Name(netip.MustParseAddr(tt.ip))
			if got != tt.want || ok != tt.wantOK {
				t.Errorf("Name(%s) = %q, %v; want %q, %v", tt.ip, got, ok, tt.want, tt.wantOK)
			}
		})
	}
	if _, ok := p.Name(netip.Addr{}); ok {
		t.Error("Name of the zero Addr reported a name")
	}
}

func TestPoolContainsBothPrefixesIncludingTheReservedPart(t *testing.T) {
	p, err := NewPool(DefaultPrefix4, DefaultPrefix6)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		ip   string
		want bool
	}{
		{"198.18.0.1", true},
		{"198.19.255.255", true},
		{"::ffff:198.18.0.1", true},
		{"fd74:756e:7761:6c6d::1", true},
		{"fd74:756e:7761:6c6d:ffff:ffff:ffff:ffff", true},
		{"198.20.0.0", false},
		{"198.17.255.255", false},
		{"fd74:756e:7761:6c6e::1", false},
		{"192.0.2.1", false},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%s is in the pool: %v", tt.ip, tt.want), func(t *testing.T) {
			if got := p.Contains(netip.MustParseAddr(tt.ip)); got != tt.want {
				t.Errorf("Contains(%s) = %v, want %v", tt.ip, got, tt.want)
			}
		})
	}
	v4, v6 := p.Prefixes()
	if v4 != DefaultPrefix4 || v6 != DefaultPrefix6 {
		t.Errorf("Prefixes = %v, %v", v4, v6)
	}
}

func TestPoolExhaustsWithoutRecycling(t *testing.T) {
	p := mustPool(t, "198.18.0.0/24", "fd74:756e:7761:6c6d::/120", 253) // 3 slots
	var got []netip.Addr
	for _, n := range []string{"a.example", "b.example", "c.example"} {
		v4, _, err := p.Assign(n)
		if err != nil {
			t.Fatalf("Assign(%s): %v", n, err)
		}
		got = append(got, v4)
	}
	if got[2] != netip.MustParseAddr("198.18.0.255") {
		t.Errorf("last slot = %v, want 198.18.0.255", got[2])
	}
	for i := 0; i < 3; i++ {
		if _, _, err := p.Assign("d.example"); !errors.Is(err, ErrPoolExhausted) {
			t.Fatalf("Assign on a full pool: err = %v, want ErrPoolExhausted", err)
		}
	}
	if v4, _, err := p.Assign("B.example."); err != nil || v4 != got[1] {
		t.Errorf("existing name on a full pool = %v, %v; want %v", v4, err, got[1])
	}
	if p.Len() != 3 {
		t.Errorf("Len = %d, want 3", p.Len())
	}
}

func TestPoolWideIPv6PrefixCarriesIntoTheHighHalf(t *testing.T) {
	// /48 prefix: slot addresses stay inside the low 64 bits, but offset()
	// must reject addresses that differ in bits 48..63.
	p := mustPool(t, "10.0.0.0/8", "fd00:1:2::/48", 0)
	v4, v6, _ := p.Assign("x.example")
	if v4 != netip.MustParseAddr("10.0.0.0") || v6 != netip.MustParseAddr("fd00:1:2::") {
		t.Errorf("slot 0 = %v %v", v4, v6)
	}
	if n, ok := p.Name(netip.MustParseAddr("fd00:1:2:1::")); ok {
		t.Errorf("Name of a different /64 = %q", n)
	}
	if n, ok := p.Name(v6); !ok || n != "x.example" {
		t.Errorf("Name(%v) = %q %v", v6, n, ok)
	}
}

func TestPoolIsStableUnderConcurrentAssignment(t *testing.T) {
	p, err := NewPool(DefaultPrefix4, DefaultPrefix6)
	if err != nil {
		t.Fatal(err)
	}
	const workers, names = 16, 500
	results := make([]map[string]netip.Addr, workers)
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Go(func() {
			m := make(map[string]netip.Addr)
			for i := 0; i < names; i++ {
				n := fmt.Sprintf("host%d.example", (i*7+w*13)%names) // overlapping, in different orders
				v4, v6, err := p.Assign(n)
				if err != nil {
					t.Errorf("Assign: %v", err)
					return
				}
				if got, ok := p.Name(v6); !ok || got != n {
					t.Errorf("Name(%v) = %q, want %q", v6, got, n)
					return
				}
				if prev, ok := m[n]; ok && prev != v4 {
					t.Errorf("%s changed from %v to %v", n, prev, v4)
				}
				m[n] = v4
			}
			results[w] = m
		})
	}
	wg.Wait()
	if p.Len() != names {
		t.Fatalf("Len = %d, want %d", p.Len(), names)
	}
	owner := make(map[netip.Addr]string)
	for _, m := range results {
		for n, a := range m {
			if results[0][n] != a {
				t.Errorf("%s: %v in one goroutine, %v in another", n, a, results[0][n])
			}
			if o, ok := owner[a]; ok && o != n {
				t.Errorf("%v handed to both %s and %s", a, o, n)
			}
			owner[a] = n
		}
	}
}

func TestPoolNameDoesNotAllocate(t *testing.T) {
	p, _ := NewPool(DefaultPrefix4, DefaultPrefix6)
	v4, v6, _ := p.Assign("a.example")
	mapped := netip.AddrFrom16(v4.As16())
	for _, ip := range []netip.Addr{v4, v6, mapped} {
		if n := testing.AllocsPerRun(100, func() { p.Name(ip) }); n != 0 {
			t.Errorf("Name(%v) allocs = %v, want 0", ip, n)
		}
	}
}

func BenchmarkPoolName(b *testing.B) {
	p, _ := NewPool(DefaultPrefix4, DefaultPrefix6)
	var addrs []netip.Addr
	for i := 0; i < 1000; i++ {
		v4, v6, _ := p.Assign(fmt.Sprintf("host%d.example", i))
		addrs = append(addrs, v4, v6)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		if _, ok := p.Name(addrs[i%len(addrs)]); !ok {
			b.Fatal("lost a name")
		}
	}
}
