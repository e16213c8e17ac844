package rt

import (
	"runtime/metrics"
	"sync/atomic"
	"time"
)

// MemWatch samples the Go runtime's memory in use and tells the flow
// admission when it nears the stack's memory limit (stack.Config.MemoryLimit): past the mark, new flows are
// refused (ErrMemoryBudget) until it falls back. The structural bounds
// (flow limits, the buffer budget, no goroutine or buffer per waiting flow)
// keep tunwall well under it; this is the backstop for what they do not
// count, such as many limits reached at once or DNS sessions.
type MemWatch struct {
	mark    uint64 // bytes in use past which new flows are refused
	samples []metrics.Sample
}

// MemSampleEvery is how often the watch samples. Sampling reads runtime
// counters; it does not stop the world.
const MemSampleEvery = 50 * time.Millisecond

// NewMemWatch watches for limit.
func NewMemWatch(limit int64) *MemWatch {
	return &MemWatch{
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
func (m *MemWatch) inUse() uint64 {
	metrics.Read(m.samples)
	var n uint64
	for _, s := range m.samples {
		if s.Value.Kind() == metrics.KindUint64 {
			n += s.Value.Uint64()
		}
	}
	return n
}

// High reports whether the memory in use now is past the mark.
func (m *MemWatch) High() bool { return m.inUse() >= m.mark }

// Watch samples until done is closed, keeping high current: whether the
// memory in use is past the mark.
func (m *MemWatch) Watch(done <-chan struct{}, high *atomic.Bool) {
	t := time.NewTicker(MemSampleEvery)
	defer t.Stop()
	for {
		high.Store(m.High())
		select {
		case <-done:
			return
		case <-t.C:
		}
	}
}
