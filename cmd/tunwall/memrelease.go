package main

import (
	"runtime/debug"
	"runtime/metrics"
	"time"
)

// After a burst (a SYN flood, a spike of connections) the Go runtime keeps
// the heap the burst needed: the flows are gone and the live heap is back to
// a few MiB, but the pages stay in tunwall's RSS, returned to the system by
// the background scavenger at about 1% of a CPU's time (measured: RSS 19 MiB
// before 20,000 SYNs and 3,000 connections, 102 MiB ten seconds after, with
// 8 MiB live). releaseIdleMemory returns them once the burst is over.

const (
	// idleHeapRelease is how much heap the runtime must hold beyond what
	// is live before it is worth returning.
	idleHeapRelease = 16 << 20
	// releaseSampleEvery is how often the heap is looked at (reading
	// runtime counters; it does not stop the world).
	releaseSampleEvery = time.Second
	// releaseAtMostEvery bounds the cost: a release is a full collection.
	releaseAtMostEvery = 3 * time.Second
)

// releaseIdleMemory returns idle heap to the system when at least
// idleHeapRelease of it has been held for two samples in a row while the
// live heap did not grow (the burst is over), at most once every
// releaseAtMostEvery. It runs until stop is called.
func releaseIdleMemory() (stop func()) {
	done := make(chan struct{})
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		samples := []metrics.Sample{
			{Name: "/memory/classes/heap/free:bytes"},   // free, not yet returned
			{Name: "/memory/classes/heap/unused:bytes"}, // in spans, not holding objects
			{Name: "/gc/heap/live:bytes"},
		}
		read := func() (idle, live uint64) {
			metrics.Read(samples)
			for _, s := range samples[:2] {
				if s.Value.Kind() == metrics.KindUint64 {
					idle += s.Value.Uint64()
				}
			}
			if samples[2].Value.Kind() == metrics.KindUint64 {
				live = samples[2].Value.Uint64()
			}
			return idle, live
		}
		t := time.NewTicker(releaseSampleEvery)
		defer t.Stop()
		var (
			last     time.Time
			prevIdle bool
			prevLive uint64
		)
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			idle, live := read()
			// Calm: the live heap did not grow by more than a sixteenth
			// since the last sample. What a finished burst leaves (endpoints
			// in TIME_WAIT expiring, timers, a map shrinking) moves the live
			// heap a little either way from one collection to the next;
			// "not grown at all" missed a release in one run of four (RSS
			// 65 MiB ten seconds after a SYN burst, against 21 MiB before).
			calm := prevIdle && live <= prevLive+prevLive/16
			prevIdle, prevLive = idle >= idleHeapRelease, live
			if calm && prevIdle && time.Since(last) >= releaseAtMostEvery {
				debug.FreeOSMemory()
				last = time.Now()
				prevIdle = false
			}
		}
	}()
	return func() {
		close(done)
		<-exited
	}
}
