package rt

import "sync"

// Scratch buffers are used only while a pump moves bytes, never while a flow
// waits. A pump moves at most a buffer's cap (the budget's share) at a time,
// so it takes the smallest buffer that holds that: with many flows the cap
// is small and many pumps may run at once (each holds its buffer through a
// syscall, and an idle P picks up the next pump meanwhile), and what they
// hold together stays small too. With few flows the cap is large and so are
// the moves.
var scratchClasses = [...]scratchClass{
	{size: 4 << 10},
	{size: 16 << 10},
	{size: MaxScratch},
}

type scratchClass struct {
	size int
	// pool holds *[]byte of len size. A pointer: a []byte in a sync.Pool
	// allocates on every Put (SA6002).
	pool sync.Pool
}

// MaxScratch is the largest scratch buffer: the most a pump moves at once.
const MaxScratch = 64 << 10

// GetScratch returns a pooled buffer of at least n bytes (at most
// MaxScratch), sliced to n, and the handle to give it back with.
func GetScratch(n int) (b []byte, h *[]byte) {
	n = min(n, MaxScratch)
	for i := range scratchClasses {
		c := &scratchClasses[i]
		if n > c.size {
			continue
		}
		h, _ = c.pool.Get().(*[]byte)
		if h == nil {
			s := make([]byte, c.size)
			h = &s
		}
		return (*h)[:n], h
	}
	panic("unreachable: the last class is MaxScratch")
}

// PutScratch gives back a buffer from GetScratch.
func PutScratch(h *[]byte) {
	for i := range scratchClasses {
		if c := &scratchClasses[i]; len(*h) == c.size {
			c.pool.Put(h)
			return
		}
	}
}
