package dnsintercept

import (
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"time"
)

// fakeClock is a settable clock for PoolOptions.Now.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// smallPool returns a pool of size slots over the default prefixes, reusable
// after a minute, on a fake clock.
func smallPool(t *testing.T, size int, pinned ...string) (*Pool, *fakeClock) {
	t.Helper()
	clk := &fakeClock{t: time.Unix(1e9, 0)}
	p, err := NewPoolWith(DefaultPrefix4, DefaultPrefix6, DefaultReserved, PoolOptions{
		Size: size, Pinned: pinned, ReuseAfter: time.Minute, Now: clk.Now,
	})
	if err != nil {
		t.Fatal(err)
	}
	return p, clk
}

func mustAssign(t *testing.T, p *Pool, name string) netip.Addr {
	t.Helper()
	v4, _, err := p.Assign(name)
	if err != nil {
		t.Fatalf("Assign(%s): %v", name, err)
	}
	return v4
}

func TestPinnedNamesKeepTheirSlotsThroughAWildcardFlood(t *testing.T) {
	p, clk := smallPool(t, 10, "Exact.Example.", "other.example", "exact.example")
	if p.Len() != 2 {
		t.Fatalf("Len = %d after pinning two names (one twice), want 2", p.Len())
	}
	// Pinned names have the first slots, whether asked or not.
	if n, ok := p.Name(netip.MustParseAddr("198.18.1.0")); !ok || n != "exact.example" {
		t.Errorf("slot 0 = %q %v, want exact.example", n, ok)
	}
	exact := mustAssign(t, p, "exact.example")
	other := mustAssign(t, p, "other.example")
	// The flood, again and again, across many reuse times.
	for round := 0; round < 5; round++ {
		refused := 0
		for i := 0; i < 100; i++ {
			v4, _, err := p.Assign(fmt.Sprintf("r%d-%d.wild.example", round, i))
			switch {
			case errors.Is(err, ErrPoolExhausted):
				refused++
			case err != nil:
				t.Fatal(err)
			case v4 == exact || v4 == other:
				t.Fatalf("round %d: a wildcard name got a pinned name's address %v", round, v4)
			}
		}
		if refused != 92 {
			t.Errorf("round %d: %d of 100 refused, want 92 (8 free slots)", round, refused)
		}
		if v4 := mustAssign(t, p, "exact.example"); v4 != exact {
			t.Errorf("round %d: exact.example moved from %v to %v", round, exact, v4)
		}
		clk.Advance(2 * time.Hour) // pinned names never expire, however idle
	}
	if _, err := NewPoolWith(DefaultPrefix4, DefaultPrefix6, DefaultReserved, PoolOptions{Size: 2, Pinned: []string{"a.x", "b.x", "c.x"}}); err == nil {
		t.Error("more pinned names than slots was accepted")
	}
	if _, err := NewPoolWith(DefaultPrefix4, DefaultPrefix6, DefaultReserved, PoolOptions{Pinned: []string{"."}}); err == nil {
		t.Error("pinning the root name was accepted")
	}
}

func TestIdleSlotsAreReusedLeastRecentlyUsedFirst(t *testing.T) {
	p, clk := smallPool(t, 3)
	a := mustAssign(t, p, "a.example")
	clk.Advance(time.Second)
	b := mustAssign(t, p, "b.example")
	clk.Advance(time.Second)
	c := mustAssign(t, p, "c.example")
	// Not idle long enough: full.
	clk.Advance(57 * time.Second) // t=59s: a idle 59s
	if _, _, err := p.Assign("d.example"); !errors.Is(err, ErrPoolExhausted) {
		t.Fatalf("d.example before any slot was idle a minute: %v, want ErrPoolExhausted", err)
	}
	// a is asked again: now b is the least recently used.
	if got := mustAssign(t, p, "a.example"); got != a {
		t.Fatalf("a.example moved: %v -> %v", a, got)
	}
	clk.Advance(2500 * time.Millisecond) // t=61.5s: b idle 60.5s, c 59.5s, a 2.5s
	if got := mustAssign(t, p, "d.example"); got != b {
		t.Errorf("d.example got %v, want b.example's idle slot %v", got, b)
	}
	if n, _ := p.Name(b); n != "d.example" {
		t.Errorf("Name(%v) = %q, want d.example", b, n)
	}
	if _, _, err := p.Assign("e.example"); !errors.Is(err, ErrPoolExhausted) {
		t.Errorf("e.example while c is idle 59.5s: %v, want ErrPoolExhausted", err)
	}
	clk.Advance(time.Second)
	if got := mustAssign(t, p, "e.example"); got != c {
		t.Errorf("e.example got %v, want c.example's idle slot %v", got, c)
	}
	// b.example lost its slot; asked again, it needs a new one.
	if _, _, err := p.Assign("b.example"); !errors.Is(err, ErrPoolExhausted) {
		t.Errorf("b.example again: %v, want ErrPoolExhausted (a, d and e are fresh)", err)
	}
	if p.Len() != 3 {
		t.Errorf("Len = %d, want 3", p.Len())
	}
}

func TestASlotHeldByAFlowIsNeverReused(t *testing.T) {
	p, clk := smallPool(t, 2)
	a4, a6, _ := p.Assign("a.example")
	mustAssign(t, p, "b.example")
	// Two flows on a.example, one by its IPv6 and one by its IPv4-mapped form.
	if n, ok := p.Acquire(a6); !ok || n != "a.example" {
		t.Fatalf("Acquire(%v) = %q %v", a6, n, ok)
	}
	if n, ok := p.Acquire(netip.AddrFrom16(a4.As16())); !ok || n != "a.example" {
		t.Fatalf("Acquire(mapped %v) = %q %v", a4, n, ok)
	}
	clk.Advance(time.Hour)
	// b.example is idle: it goes. a.example is held: it stays.
	if got := mustAssign(t, p, "c.example"); got == a4 {
		t.Fatal("a held slot was reused")
	}
	clk.Advance(time.Hour)
	if _, _, err := p.Assign("d.example"); err == nil {
		// c.example's slot was reused: fine, but a.example's must not be.
		if n, _ := p.Name(a4); n != "a.example" {
			t.Fatalf("a held slot now maps to %q", n)
		}
	}
	p.Release(a6)
	clk.Advance(time.Hour)
	for i := 0; i < 3; i++ {
		if v4, _, err := p.Assign(fmt.Sprintf("x%d.example", i)); err == nil && v4 == a4 {
			t.Fatal("a slot still held by one flow was reused")
		}
	}
	p.Release(a4)
	// Released now: idle from now on, so not yet reusable...
	clk.Advance(30 * time.Second)
	for i := 0; i < 3; i++ {
		if v4, _, err := p.Assign(fmt.Sprintf("y%d.example", i)); err == nil && v4 == a4 {
			t.Fatal("a slot was reused 30s after its last flow ended")
		}
	}
	// ...until it has been idle for ReuseAfter.
	clk.Advance(31 * time.Second)
	found := false
	for i := 0; i < 3 && !found; i++ {
		v4, _, err := p.Assign(fmt.Sprintf("z%d.example", i))
		found = err == nil && v4 == a4
	}
	if !found {
		t.Error("a slot idle a minute after its last flow ended was not reused")
	}
	// Release without Acquire, and of foreign addresses, changes nothing.
	p.Release(a4)
	p.Release(a4)
	p.Release(netip.MustParseAddr("192.0.2.1"))
	p.Release(netip.MustParseAddr("198.18.0.1"))
	if n, ok := p.Acquire(netip.MustParseAddr("198.18.200.0")); ok {
		t.Errorf("Acquire of an address beyond the pool's size = %q", n)
	}
}

func TestNegativeReuseAfterNeverReuses(t *testing.T) {
	clk := &fakeClock{t: time.Unix(1e9, 0)}
	p, err := NewPoolWith(DefaultPrefix4, DefaultPrefix6, DefaultReserved, PoolOptions{Size: 1, ReuseAfter: -1, Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	mustAssign(t, p, "a.example")
	clk.Advance(1000 * time.Hour)
	if _, _, err := p.Assign("b.example"); !errors.Is(err, ErrPoolExhausted) {
		t.Errorf("Assign with ReuseAfter < 0: %v, want ErrPoolExhausted", err)
	}
	if p.ReuseAfter() >= 0 {
		t.Errorf("ReuseAfter = %v", p.ReuseAfter())
	}
}

func TestPoolReuseUnderConcurrentFlowsAndFloods(t *testing.T) {
	p, clk := smallPool(t, 16, "pinned.example")
	held := mustAssign(t, p, "held.example")
	if _, ok := p.Acquire(held); !ok {
		t.Fatal("Acquire failed")
	}
	var wg sync.WaitGroup
	for w := 0; w < 8; w++ {
		wg.Go(func() {
			for i := 0; i < 2000; i++ {
				name := fmt.Sprintf("w%d-%d.example", w, i)
				v4, _, err := p.Assign(name)
				if err != nil {
					continue
				}
				if n, ok := p.Acquire(v4); ok {
					if n == "pinned.example" || v4 == held {
						t.Errorf("%s got %v, which belongs to %s", name, v4, n)
					}
					p.Release(v4)
				}
				if i%100 == 0 {
					clk.Advance(time.Minute)
				}
			}
		})
	}
	wg.Wait()
	if n, _ := p.Name(held); n != "held.example" {
		t.Errorf("the held slot maps to %q", n)
	}
	if v4, _, err := p.Assign("pinned.example"); err != nil || v4 != netip.MustParseAddr("198.18.1.0") {
		t.Errorf("pinned.example = %v, %v", v4, err)
	}
}
