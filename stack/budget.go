package stack

import (
	"math/bits"
	"sync"
	"sync/atomic"
)

// budget shares Config.BufferBudget among the gVisor buffers of the live
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
type budget struct {
	total  int
	minBuf int
	maxBuf int
	// setCeiling sets the stack-wide TCP buffer ranges' maximum (what
	// gVisor's auto-tuning may grow a buffer to) and their default.
	setCeiling func(max int)

	capAtomic atomic.Int64 // cap, for readers that do not take mu

	mu     sync.Mutex
	owners map[bufferOwner]int // owner -> shares
	shares int
	cap    int
}

// bufferOwner is a flow whose gVisor buffers the budget limits.
type bufferOwner interface {
	// capBuffers cuts the flow's buffers that are larger than max to max.
	capBuffers(max int)
}

func newBudget(total, minBuf, maxBuf int, setCeiling func(int)) *budget {
	b := &budget{total: total, minBuf: minBuf, maxBuf: maxBuf, setCeiling: setCeiling, owners: map[bufferOwner]int{}}
	b.cap = b.capFor(0)
	b.capAtomic.Store(int64(b.cap))
	return b
}

// capFor is the per-buffer cap when shares buffers are in use.
func (b *budget) capFor(shares int) int {
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

// add registers o with its shares and cuts its buffers to the cap.
func (b *budget) add(o bufferOwner, shares int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.owners[o]; ok {
		return
	}
	b.owners[o] = shares
	b.shares += shares
	b.updateLocked()
	o.capBuffers(b.cap)
}

// remove forgets o.
func (b *budget) remove(o bufferOwner) {
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

func (b *budget) updateLocked() {
	c := b.capFor(b.shares)
	if c == b.cap {
		return
	}
	b.setCeiling(c)
	if c < b.cap {
		for o := range b.owners {
			o.capBuffers(c)
		}
	}
	b.cap = c
	b.capAtomic.Store(int64(c))
}

// capNow returns the per-buffer cap without locking.
func (b *budget) capNow() int { return int(b.capAtomic.Load()) }

// current returns the per-buffer cap and the shares in use.
func (b *budget) current() (capBytes, shares int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.cap, b.shares
}
