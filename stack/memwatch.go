package stack

import (
	"runtime/metrics"
	"time"
)

// memWatch samples the Go runtime's memory in use and tells the flow
// admission when it nears Config.MemoryLimit: past the mark, new flows are
// refused (ErrMemoryBudget) until it falls back. The structural bounds
// (flow limits, the buffer budget, no goroutine or buffer per waiting flow)
// keep tunwall well under it; this is the backstop for what they do not
// count, such as many limits reached at once or DNS sessions.
type memWatch struct {
	mark    uint64 // bytes in use past which new flows are refused
	samples []metrics.Sample
}

// memSampleEvery is how often the watch samples. Sampling reads runtime
// counters; it does not stop the world.
const memSampleEvery = 50 * time.Millisecond

func newMemWatch(limit int64) *memWatch {
	return &memWatch{
		// Below the Go runtime's soft limit (cmd/tunwall: 3/4 of the
		// target), so that the live heap it admits leaves the collector
		// room under it.
		mark: uint64(limit) / 8 * 5,
		samples: []metrics.Sample{
			{Name: "/gc/heap/live:bytes"},               // heap reachable at the last GC
			{Name: "/memory/classes/heap/stacks:bytes"}, // goroutine stacks
		},
	}
}

// inUse is the memory the runtime cannot give back by collecting garbage.
func (m *memWatch) inUse() uint64 {
	metrics.Read(m.samples)
	var n uint64
	for _, s := range m.samples {
		if s.Value.Kind() == metrics.KindUint64 {
			n += s.Value.Uint64()
		}
	}
	return n
}

// MemoryHigh reports whether the memory in use is past the mark where new
// flows are refused (Config.MemoryLimit; false without one).
func (s *Stack) MemoryHigh() bool { return s.memHigh.Load() }

// run samples until done is closed, keeping s.memHigh current.
func (s *Stack) watchMemory(m *memWatch, done <-chan struct{}) {
	defer close(s.memWatchDone)
	t := time.NewTicker(memSampleEvery)
	defer t.Stop()
	for {
		s.memHigh.Store(m.inUse() >= m.mark)
		select {
		case <-done:
			return
		case <-t.C:
		}
	}
}
