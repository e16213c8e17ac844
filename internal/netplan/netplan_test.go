package netplan

import (
	"net/netip"
	"testing"

	"github.com/tunwall/tunwall/internal/testenv"
)

// TestDefaultIsConsistent pins how the plan's addresses relate: the
// sandbox's and the resolver's addresses sit in the reserved start of the
// IPv4 pool (so no name is ever given them) and in Ours6, which also
// covers the IPv6 pool, so the guard keeps every one of them from being
// dialled.
func TestDefaultIsConsistent(t *testing.T) {
	p := Default
	reserved4 := netip.PrefixFrom(p.Fake4.Addr(), 32-8) // 256 addresses
	if p.Reserved != 256 {
		t.Fatalf("Reserved = %d; the /24 check below assumes 256", p.Reserved)
	}
	for _, c := range []struct {
		name string
		in   netip.Prefix
		a    netip.Addr
	}{
		{"Addr4 in Fake4's reserved start", reserved4, p.Addr4.Addr()},
		{"Resolver4 in Fake4's reserved start", reserved4, p.Resolver4},
		{"Addr6 in Ours6", p.Ours6, p.Addr6.Addr()},
		{"Resolver6 in Ours6", p.Ours6, p.Resolver6},
		{"Fake6's first address in Ours6", p.Ours6, p.Fake6.Addr()},
		{"Fake6's last address in Ours6", p.Ours6, last(p.Fake6)},
	} {
		if !c.in.Contains(c.a) {
			t.Errorf("%s: %v not in %v", c.name, c.a, c.in)
		}
	}
	if p.Addr4.Bits() != 32 || p.Addr6.Bits() != 128 {
		t.Errorf("sandbox addresses %v, %v: want a /32 and a /128", p.Addr4, p.Addr6)
	}
	if p.Fake6.Contains(p.Addr6.Addr()) || p.Fake6.Contains(p.Resolver6) {
		t.Errorf("the sandbox's IPv6 addresses lie in the fake pool %v", p.Fake6)
	}
	for _, a := range []netip.Addr{p.Addr4.Addr(), p.Resolver4, p.Addr6.Addr(), p.Resolver6, p.Fake4.Addr(), p.Fake6.Addr(), last(p.Fake6)} {
		guarded := false
		for _, g := range p.Guarded() {
			guarded = guarded || g.Contains(a)
		}
		if !guarded {
			t.Errorf("%v is not in Guarded() %v", a, p.Guarded())
		}
	}
}

// TestDefaultValues pins the addresses README and the sandboxes' users rely
// on: changing one is a change of behaviour, not a refactor.
func TestDefaultValues(t *testing.T) {
	got := []string{Default.Addr4.String(), Default.Addr6.String(), Default.Resolver4.String(), Default.Resolver6.String(), Default.Fake4.String(), Default.Fake6.String(), Default.Ours6.String()}
	want := []string{"198.18.0.2/32", "fd74:756e:7761:6c6c::2/128", "198.18.0.1", "fd74:756e:7761:6c6c::1", "198.18.0.0/15", "fd74:756e:7761:6c6d::/64", "fd74:756e:7761:6c6c::/63"}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("address %d = %s, want %s", i, got[i], want[i])
		}
	}
}

// TestDeps keeps the package importable by every other (tun and
// dnsintercept import nothing else of tunwall): the standard library only.
func TestDeps(t *testing.T) {
	testenv.CheckDeps(t, "netplan", []string{"os", "syscall"}, []string{"github.com/tunwall/tunwall/internal/netplan"})
	for _, d := range testenv.Deps(t) {
		if d.Path == "net" {
			t.Errorf("netplan depends on net (sockets); net/netip is all it needs")
		}
	}
}

func last(p netip.Prefix) netip.Addr {
	b := p.Addr().As16()
	for i := p.Bits() / 8; i < 16; i++ {
		if i == p.Bits()/8 && p.Bits()%8 != 0 {
			b[i] |= byte(0xff >> (p.Bits() % 8))
			continue
		}
		b[i] = 0xff
	}
	return netip.AddrFrom16(b)
}
