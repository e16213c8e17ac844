package node

import (
	"net/netip"
	"testing"
	"time"

	"github.com/tunwall/tunwall/internal/session"
)

// TestResolversAreSharedOnlyWithinOneKeyAndGoWithTheirLastUser: pods of
// one namespace, policy and upstream get one resolver; another namespace,
// policy, upstream, timeout, hosts file or search list gets its own; the
// last release drops it, so nothing stays once every pod is deleted.
func TestResolversAreSharedOnlyWithinOneKeyAndGoWithTheirLastUser(t *testing.T) {
	base := session.DNSOptions{Upstream: []netip.AddrPort{netip.MustParseAddrPort("192.0.2.53:53")}}
	other := func(f func(d *session.DNSOptions)) session.DNSOptions {
		d := base
		f(&d)
		return d
	}
	var rs resolvers
	k := resolverKey("team-a", "web", base)
	r1, err := rs.acquire(k, base)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := rs.acquire(resolverKey("team-a", "web", base), base)
	if err != nil {
		t.Fatal(err)
	}
	if r1 != r2 {
		t.Errorf("two pods of team-a under web got two resolvers")
	}
	keys := []string{k}
	for what, key := range map[string]string{
		"another namespace": resolverKey("team-b", "web", base),
		"another policy":    resolverKey("team-a", "web-copy", base),
		"another upstream": resolverKey("team-a", "web", other(func(d *session.DNSOptions) {
			d.Upstream = []netip.AddrPort{netip.MustParseAddrPort("192.0.2.54:53")}
		})),
		"another timeout":    resolverKey("team-a", "web", other(func(d *session.DNSOptions) { d.ServerTimeout = time.Second })),
		"another hosts file": resolverKey("team-a", "web", other(func(d *session.DNSOptions) { d.HostsFile = "/etc/hosts" })),
		"another search":     resolverKey("team-a", "web", other(func(d *session.DNSOptions) { d.Search = []string{"example.test"} })),
		// The parts cannot run into each other.
		"a namespace ending as the policy begins": resolverKey("team-aweb", "", base),
	} {
		r, err := rs.acquire(key, base)
		if err != nil {
			t.Fatal(err)
		}
		if r == r1 {
			t.Errorf("%s shares team-a/web's resolver", what)
		}
		keys = append(keys, key)
	}
	if got, want := rs.len(), len(keys); got != want {
		t.Errorf("%d resolvers held, want %d", got, want)
	}
	rs.release(k) // one of team-a/web's two pods
	if r3, _ := rs.acquire(k, base); r3 != r1 {
		t.Errorf("team-a/web's resolver went while a pod still used it")
	} else {
		rs.release(k)
	}
	for _, key := range keys {
		rs.release(key)
	}
	if n := rs.len(); n != 0 {
		t.Errorf("%d resolvers held after every pod released its own", n)
	}
	defer func() {
		if recover() == nil {
			t.Errorf("a release of a resolver not held did not panic")
		}
	}()
	rs.release(k)
}
