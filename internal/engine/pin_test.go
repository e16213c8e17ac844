package engine

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/tunwall/tunwall/dnsintercept"
	"github.com/tunwall/tunwall/policy"
)

// pinnedAddr keeps the client's address only when it is one of the name's
// own addresses and the guard passes it.
func TestPinnedAddrIsOneOfTheNamesAddressesAndGuarded(t *testing.T) {
	hosts := filepath.Join(t.TempDir(), "hosts")
	if err := os.WriteFile(hosts, []byte("192.0.2.10 pin.test\n192.0.2.11 pin.test\n2001:db8::11 pin.test\n169.254.169.254 meta.test\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// The hosts file answers; the DNS server (a documentation address,
	// never reached here) is not asked.
	r, err := dnsintercept.NewResolver(dnsintercept.ResolverConfig{Server: netip.MustParseAddrPort("192.0.2.53:53"), HostsFile: hosts})
	if err != nil {
		t.Fatal(err)
	}
	p, err := policy.Parse("p.yaml", []byte("version: 1\nphases:\n  e:\n    allow:\n      - host: pin.test\n        ports: [443]\n      - host: meta.test\n        ports: [443]\n"))
	if err != nil {
		t.Fatal(err)
	}
	rs, err := policy.Select(p, "", nil, policy.Guard{})
	if err != nil {
		t.Fatal(err)
	}
	e := &Engine{cfg: Config{Rules: rs, Resolver: r, DialTimeout: time.Second}}
	for _, tt := range []struct {
		name, dst string
		want      bool
	}{
		{"pin.test", "192.0.2.11:443", true},
		{"pin.test", "[::ffff:192.0.2.11]:443", true},
		{"pin.test", "[2001:db8::11]:443", true},
		{"pin.test", "192.0.2.66:443", false},       // not one of its addresses
		{"meta.test", "169.254.169.254:443", false}, // its address, but guarded
	} {
		dst := netip.MustParseAddrPort(tt.dst)
		got, ok := e.pinnedAddr(context.Background(), tt.name, dst)
		if ok != tt.want || (ok && got != netip.AddrPortFrom(dst.Addr().Unmap(), dst.Port())) {
			t.Errorf("pinnedAddr(%s, %s) = %v, %v; want %v", tt.name, tt.dst, got, ok, tt.want)
		}
	}
}

func TestPinReason(t *testing.T) {
	got := pinReason("rule 1 allows pin.test:443; raw IP 192.0.2.11 ignored, dialled by name", netip.MustParseAddr("192.0.2.11"), "pin.test")
	want := "rule 1 allows pin.test:443; raw IP 192.0.2.11 is one of pin.test's addresses: dialled as the client pinned it"
	if got != want {
		t.Errorf("pinReason = %q, want %q", got, want)
	}
}
