package dnsintercept

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestParseHosts(t *testing.T) {
	m := parseHosts([]byte(`# comment
127.0.0.1	localhost
::1 localhost ip6-localhost
192.0.2.11 Intra.Corp.Test intra # alias
2001:db8::11 intra.corp.test
192.0.2.12 intra.corp.test
192.0.2.11 intra.corp.test
not-an-ip bogus.test
fe80::1%eth0 zoned.test
::ffff:192.0.2.13 mapped.test
192.0.2.14 bad..name ok.test x/y
192.0.2.15
`))
	want := map[string][]string{
		"localhost":       {"127.0.0.1", "::1"},
		"ip6-localhost":   {"::1"},
		"intra.corp.test": {"192.0.2.11", "192.0.2.12", "2001:db8::11"},
		"intra":           {"192.0.2.11"},
		"mapped.test":     {"192.0.2.13"},
		"ok.test":         {"192.0.2.14"},
	}
	if len(m) != len(want) {
		t.Errorf("parsed names %v, want %d names", m, len(want))
	}
	for n, w := range want {
		if got := m[n]; !slices.Equal(got, addrs(w...)) {
			t.Errorf("%s: %v, want %v", n, got, w)
		}
	}
}

// A name in the hosts file resolves there, and DNS is not asked; the file
// is re-read when it changes; other names go to DNS.
func TestResolveReadsTheHostsFileFirst(t *testing.T) {
	checkGoroutines(t)
	u := startUpstream(t)
	path := filepath.Join(t.TempDir(), "hosts")
	if err := os.WriteFile(path, []byte("192.0.2.11 hostsonly.example\n192.0.2.12 dual.example\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r := u.resolver(t, ResolverConfig{HostsFile: path})
	for _, tt := range []struct {
		name string
		want []string
	}{
		{"hostsonly.example", []string{"192.0.2.11"}},
		{"DUAL.example.", []string{"192.0.2.12"}}, // the file wins over DNS
		{"v4only.example", []string{"192.0.2.30"}},
	} {
		got, err := r.Resolve(context.Background(), tt.name)
		if err != nil || !slices.Equal(got, addrs(tt.want...)) {
			t.Errorf("Resolve(%s) = %v, %v; want %v", tt.name, got, err, tt.want)
		}
	}
	if u.Count("hostsonly.example", 0)+u.Count("dual.example", 0) != 0 {
		t.Errorf("DNS was asked about names the hosts file has: %v", u.Log())
	}
	if u.Count("v4only.example", 0) == 0 {
		t.Errorf("a name the hosts file lacks was not asked of DNS")
	}
	// Changed (another size, so the change shows whatever the clock's
	// resolution): read again within a bounded time.
	if err := os.WriteFile(path, []byte("192.0.2.21 hostsonly.example\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(3 * time.Second)
	for {
		got, _ := r.Resolve(context.Background(), "hostsonly.example")
		if slices.Equal(got, addrs("192.0.2.21")) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("3s after the hosts file changed, Resolve still gives %v", got)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Removed: DNS alone.
	os.Remove(path)
	deadline = time.Now().Add(3 * time.Second)
	for {
		got, _ := r.Resolve(context.Background(), "dual.example")
		if slices.Equal(got, addrs("192.0.2.1", "2001:db8::1")) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("3s after the hosts file went away, Resolve(dual.example) still gives %v", got)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A hosts file too large to hold is not used: names go to DNS.
func TestResolveIgnoresAnOversizedHostsFile(t *testing.T) {
	checkGoroutines(t)
	u := startUpstream(t)
	path := filepath.Join(t.TempDir(), "hosts")
	big := "192.0.2.12 dual.example\n" + strings.Repeat("# padding\n", maxHostsFileSize/10+1)
	if err := os.WriteFile(path, []byte(big), 0o644); err != nil {
		t.Fatal(err)
	}
	r := u.resolver(t, ResolverConfig{HostsFile: path})
	got, err := r.Resolve(context.Background(), "dual.example")
	if err != nil || !slices.Equal(got, addrs("192.0.2.1", "2001:db8::1")) {
		t.Errorf("Resolve = %v, %v; want DNS's answer", got, err)
	}
}

// FuzzHosts checks that the hosts parser never panics and returns only
// valid names with valid, unzoned, unmapped addresses, IPv4 first.
func FuzzHosts(f *testing.F) {
	f.Add("127.0.0.1 localhost\n::1 localhost # x\n")
	f.Add("192.0.2.1 A.b.C a..b\nfe80::1%lo z\n::ffff:1.2.3.4 m\n")
	f.Fuzz(func(t *testing.T, s string) {
		for n, as := range parseHosts([]byte(s)) {
			if !validHostname(n) || len(as) == 0 {
				t.Fatalf("name %q with %v", n, as)
			}
			v6 := false
			for _, a := range as {
				if !a.IsValid() || a.Zone() != "" || a.Is4In6() {
					t.Fatalf("%s: address %v", n, a)
				}
				if v6 && a.Is4() {
					t.Fatalf("%s: %v not IPv4 first", n, as)
				}
				v6 = v6 || a.Is6()
			}
		}
	})
}
