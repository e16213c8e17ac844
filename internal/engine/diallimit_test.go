package engine

import (
	"fmt"
	"testing"
	"time"
)

func TestDialLimiterPerDestination(t *testing.T) {
	g := newDialLimiter(DialLimits{Pending: 1024, PerDest: 4, Rate: -1})
	now := time.Now()
	var rel []func()
	for i := range 4 {
		r, why, _ := g.admit("dead.test:80", now)
		if r == nil {
			t.Fatalf("dial %d refused: %s", i, why)
		}
		rel = append(rel, r)
	}
	if r, _, _ := g.admit("dead.test:80", now); r != nil {
		t.Fatal("a fifth dial to one destination was admitted with PerDest 4")
	}
	// Another destination is not affected.
	r, why, _ := g.admit("ok.test:80", now)
	if r == nil {
		t.Fatalf("another destination refused: %s", why)
	}
	r()
	r() // release is idempotent
	rel[0]()
	if r, why, _ := g.admit("dead.test:80", now); r == nil {
		t.Fatalf("a slot released, yet refused: %s", why)
	}
	if g.total != 4 || g.active != 1 {
		t.Fatalf("total %d active %d, want 4 and 1", g.total, g.active)
	}
}

func TestDialLimiterFairShare(t *testing.T) {
	// 16 dead destinations, each under its PerDest, together must not take
	// every slot: a new destination still gets one.
	g := newDialLimiter(DialLimits{Pending: 64, PerDest: 16, Rate: -1})
	now := time.Now()
	admitted := 0
	for d := range 16 {
		for range 16 {
			if r, _, _ := g.admit(fmt.Sprintf("dead%d.test:80", d), now); r != nil {
				admitted++
			}
		}
	}
	if g.total >= 64 {
		t.Fatalf("dead destinations hold %d of 64 slots", g.total)
	}
	if r, why, _ := g.admit("new.test:443", now); r == nil {
		t.Fatalf("a new destination was refused with %d of 64 slots taken by dead ones: %s", g.total, why)
	}
	t.Logf("16 dead destinations hold %d of 64 slots", admitted)
}

func TestDialLimiterRate(t *testing.T) {
	g := newDialLimiter(DialLimits{Pending: 1 << 20, PerDest: 1 << 20, Rate: 10})
	now := time.Now()
	n := 0
	for range 100 {
		if r, _, rate := g.admit("x.test:80", now); r != nil {
			r()
			n++
		} else if !rate {
			t.Fatal("refused for another reason than the rate")
		}
	}
	if n != 10 {
		t.Fatalf("%d dials admitted at once with Rate 10, want the burst of 10", n)
	}
	// Half a second later, five more.
	now = now.Add(500 * time.Millisecond)
	n = 0
	for range 100 {
		if r, _, _ := g.admit("x.test:80", now); r != nil {
			r()
			n++
		}
	}
	if n != 5 {
		t.Fatalf("%d dials admitted after 0.5s at Rate 10, want 5", n)
	}
}

func TestDialLimiterForgets(t *testing.T) {
	g := newDialLimiter(DialLimits{Rate: 100})
	now := time.Now()
	for i := range maxDialDests {
		r, _, _ := g.admit(fmt.Sprintf("h%d.test:80", i), now)
		r()
	}
	if r, _, _ := g.admit("one-more.test:80", now); r != nil {
		t.Fatal("a destination beyond maxDialDests admitted while every bucket is recent")
	}
	// A second later every bucket is full again: they are forgotten.
	if r, why, _ := g.admit("one-more.test:80", now.Add(time.Second)); r == nil {
		t.Fatalf("refused after the buckets refilled: %s", why)
	}
	if len(g.dests) != 1 {
		t.Fatalf("%d destinations kept, want 1", len(g.dests))
	}
}
