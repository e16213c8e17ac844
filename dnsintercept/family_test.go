package dnsintercept

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// A lookup where one family (A or AAAA) times out once must not be cached
// as the whole answer: the family that answered is cached, the failed one
// is asked again, and the name gets both families back (issue 13.7: under
// load an A query timed out, and for the TTL every IPv4 connect was sent to
// the IPv6 address only, and refused).
func TestResolveCachesEachFamilyAndOnlyCompleteAnswers(t *testing.T) {
	for _, fail := range []uint16{dns.TypeA, dns.TypeAAAA} {
		t.Run(typeString(fail)+" fails once", func(t *testing.T) {
			checkGoroutines(t)
			u := startUpstream(t)
			r := u.resolver(t, ResolverConfig{Timeout: 300 * time.Millisecond, MinTTL: time.Minute, MaxTTL: time.Hour})
			other := uint16(dns.TypeAAAA)
			if fail == dns.TypeAAAA {
				other = dns.TypeA
			}
			both := addrs("192.0.2.1", "2001:db8::1")

			u.setDrop("dual.example", fail, true)
			got, err := r.Resolve(context.Background(), "dual.example")
			if err != nil || len(got) != 1 {
				t.Fatalf("with %s lost: Resolve = %v, %v; want the other family's address", typeString(fail), got, err)
			}
			u.setDrop("dual.example", fail, false)

			// The failed family is asked again (within a bounded time) and
			// the whole answer comes back; the family that answered is
			// not asked again, its TTL (300 s) has not run out.
			deadline := time.Now().Add(3 * time.Second)
			for !slices.Equal(got, both) {
				if time.Now().After(deadline) {
					t.Fatalf("3s after %s was lost once, Resolve still gives %v, %v; want %v", typeString(fail), got, err, both)
				}
				time.Sleep(20 * time.Millisecond)
				got, err = r.Resolve(context.Background(), "dual.example")
			}
			if n := u.Count("dual.example", other); n != 1 {
				t.Errorf("%s, which answered, was asked %d times, want once (cached per family)", typeString(other), n)
			}
			// Now complete, the answer is cached: nothing more is asked.
			before := len(u.Log())
			if got, err := r.Resolve(context.Background(), "dual.example"); err != nil || !slices.Equal(got, both) {
				t.Fatalf("cached Resolve = %v, %v", got, err)
			}
			if len(u.Log()) != before {
				t.Errorf("a complete cached answer queried the upstream again: %v", u.Log()[before:])
			}
		})
	}
}

// "No records" of one family is an answer and is cached; it is not a
// failure.
func TestResolveCachesNoDataOfOneFamily(t *testing.T) {
	checkGoroutines(t)
	u := startUpstream(t)
	r := u.resolver(t, ResolverConfig{MinTTL: time.Minute, MaxTTL: time.Hour})
	for range 3 {
		if got, err := r.Resolve(context.Background(), "v4only.example"); err != nil || !slices.Equal(got, addrs("192.0.2.30")) {
			t.Fatalf("Resolve(v4only.example) = %v, %v", got, err)
		}
	}
	if a, aaaa := u.Count("v4only.example", dns.TypeA), u.Count("v4only.example", dns.TypeAAAA); a != 1 || aaaa != 1 {
		t.Errorf("asked A %d and AAAA %d times, want once each", a, aaaa)
	}
}
