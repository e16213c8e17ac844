package rt

import (
	"math/bits"
	"sync"
	"sync/atomic"
)

// Budget shares the stack's buffer budget (stack.Config.BufferBudget) among the gVisor buffers of the live
// flows: a TCP connection's send and receive buffers (two shares) and a UDP
// session's receive buffer (one share). Every buffer may hold at most cap
// bytes, and cap is the budget divided by the shares in use (rounded down to
// a power of two, between minBuf and maxBuf), so the data tunwall can be made
// to hold in flow buffers stays under the budget however many flows there
// are: with few flows each gets large, auto-tuned buffers (throughput); as
// flows grow, every buffer shrinks. When cap falls, every live buffer above
// it is cut to it; when it rises, auto-tuning may grow buffers again.
//
// Only data queued in a buffer costs memory; a buffer's size is its limit.
type Budget struct {
	total  int
	minBuf int
	maxBuf int
	// setCeiling sets the stack-wide TCP buffer ranges' maximum (what
	// gVisor's auto-tuning may grow a buffer to) and their default.
	setCeiling func(max int)

	capAtomic atomic.Int64 // cap, for readers that do not take mu

	mu     sync.Mutex
	owners map[Owner]int // owner -> shares
	shares int
	cap    int
}

// Owner is a flow whose gVisor buffers the budget limits.
type Owner interface {
	// CapBuffers cuts the flow's buffers that are larger than max to max.
	CapBuffers(max int)
}

// NewBudget shares total bytes among buffers of minBuf to maxBuf bytes;
// setCeiling is told each new cap.
func NewBudget(total, minBuf, maxBuf int, setCeiling func(int)) *Budget {
	b := &Budget{total: total, minBuf: minBuf, maxBuf: maxBuf, setCeiling: setCeiling, owners: map[Owner]int{}}
	b.cap = b.CapFor(0)
	b.capAtomic.Store(int64(b.cap))
	return b
}

// CapFor is the per-buffer cap when shares buffers are in use.
func (b *Budget) CapFor(shares int) int {
	if shares < 1 {
		shares = 1
	}
	c := b.total / shares
	if c >= b.maxBuf {
		return b.maxBuf
	}
	if c <= b.minBuf {
		return b.minBuf
	}
	return 1 << (bits.Len(uint(c)) - 1) // a power of two: cap changes only when the flows double or halve
}

// Add registers o with its shares and cuts its buffers to the cap.
func (b *Budget) Add(o Owner, shares int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.owners[o]; ok {
		return
	}
	b.owners[o] = shares
	b.shares += shares
	b.updateLocked()
	o.CapBuffers(b.cap)
}

// Remove forgets o.
func (b *Budget) Remove(o Owner) {
	b.mu.Lock()
	defer b.mu.Unlock()
	shares, ok := b.owners[o]
	if !ok {
		return
	}
	delete(b.owners, o)
	b.shares -= shares
	b.updateLocked()
}

func (b *Budget) updateLocked() {
	c := b.CapFor(b.shares)
	if c == b.cap {
		return
	}
	b.setCeiling(c)
	if c < b.cap {
		for o := range b.owners {
			o.CapBuffers(c)
		}
	}
	b.cap = c
	b.capAtomic.Store(int64(c))
}

// CapNow returns the per-buffer cap without locking.
func (b *Budget) CapNow() int { return int(b.capAtomic.Load()) }

// Current returns the per-buffer cap and the shares in use.
func (b *Budget) Current() (capBytes, shares int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.cap, b.shares
}

// Each calls fn for every owner, with the budget locked.
func (b *Budget) Each(fn func(Owner)) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for o := range b.owners {
		fn(o)
	}
}
