package main

import (
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"syscall"
)

// watchStats prints one line of tunwall's own counters to stderr each time
// tunwall gets SIGUSR1, until stop is called: how many goroutines run, how
// much heap is live after a collection, and what the engine has pending. It
// is for checking, from outside, that a burst of flows leaves nothing
// behind (the load tests use it).
func (s *session) watchStats() (stop func()) {
	c := make(chan os.Signal, 1)
	signal.Notify(c, syscall.SIGUSR1)
	done := make(chan struct{})
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		for {
			select {
			case <-c:
				fmt.Fprintln(s.stderr, s.statsLine())
			case <-done:
				return
			}
		}
	}()
	return func() {
		signal.Stop(c)
		close(done)
		<-exited
	}
}

// statsLine formats the counters as "tunwall: stats key=value ...".
func (s *session) statsLine() string {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	var b strings.Builder
	fmt.Fprintf(&b, "tunwall: stats goroutines=%d heap_live=%d heap_sys=%d", runtime.NumGoroutine(), ms.HeapAlloc, ms.HeapSys)
	if s.stack != nil {
		st := s.stack.Stats()
		fmt.Fprintf(&b, " tcp_live=%d tcp_inflight=%d handshake_timeouts=%d", st.TCPLive, st.TCPInFlight, st.HandshakeTimeouts)
	}
	if s.attr != nil {
		a := s.attr.Stats()
		fmt.Fprintf(&b, " attr_pending=%d attr_started=%d attr_found=%d attr_overloaded=%d attr_discoveries=%d attr_rescans=%d attr_fdreads=%d attr_dumps=%d attr_batches=%d attr_deferred=%d attr_cpu_us=%d",
			a.Pending, a.Started, a.Found, a.Overloaded, a.Discoveries, a.Rescans, a.FDReads, a.Dumps, a.Batches, a.Deferred, a.CPU.Microseconds())
	}
	return b.String()
}
