package rt

import "testing"

// fakeOwner records the caps the budget gives it.
type fakeOwner struct{ max int }

func (o *fakeOwner) CapBuffers(max int) {
	if o.max == 0 || max < o.max {
		o.max = max
	}
}

func TestBudgetDividesItselfAmongBuffersAndCutsThemAsFlowsGrow(t *testing.T) {
	var ceilings []int
	b := NewBudget(1<<20, 2<<10, 256<<10, func(c int) { ceilings = append(ceilings, c) })
	if c, _ := b.Current(); c != 256<<10 {
		t.Fatalf("cap with no flows = %d, want the maximum", c)
	}
	owners := make([]*fakeOwner, 64)
	for i := range owners {
		owners[i] = &fakeOwner{}
		b.Add(owners[i], 2)
	}
	// 128 shares of 1 MiB: 8 KiB each.
	if c, sh := b.Current(); c != 8<<10 || sh != 128 {
		t.Fatalf("cap, shares = %d, %d; want 8192, 128", c, sh)
	}
	for i, o := range owners {
		if o.max != 8<<10 {
			t.Fatalf("owner %d was cut to %d, want 8192", i, o.max)
		}
	}
	if last := ceilings[len(ceilings)-1]; last != 8<<10 {
		t.Errorf("the auto-tuning ceiling is %d, want 8192", last)
	}
	// Never below the minimum, however many flows.
	for range 10000 {
		b.Add(&fakeOwner{}, 1)
	}
	if c, _ := b.Current(); c != 2<<10 {
		t.Errorf("cap with 10128 shares = %d, want the 2 KiB minimum", c)
	}
	// As flows go, the cap rises again (in powers of two).
	b2 := NewBudget(1<<20, 2<<10, 256<<10, func(int) {})
	o := &fakeOwner{}
	b2.Add(o, 2)
	b2.Remove(o)
	if c, sh := b2.Current(); c != 256<<10 || sh != 0 {
		t.Errorf("after the last flow left: cap %d shares %d, want the maximum and 0", c, sh)
	}
	for _, c := range []struct{ shares, want int }{{1, 256 << 10}, {4, 256 << 10}, {5, 128 << 10}, {300, 2 << 10}, {100, 8 << 10}} {
		if got := b2.CapFor(c.shares); got != c.want {
			t.Errorf("capFor(%d) = %d, want %d", c.shares, got, c.want)
		}
	}
}
