package main

import (
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"syscall"

	"github.com/tunwall/tunwall/internal/session"
)

// watchStats prints one line of tunwall's own counters to stderr each time
// tunwall gets SIGUSR1, until stop is called: how many goroutines run, how
// much heap is live after a collection, and what the engine has pending. It
// is for checking, from outside, that a burst of flows leaves nothing
// behind (the load tests use it).
func watchStats(s *session.Session, stderr io.Writer) (stop func()) {
	c := make(chan os.Signal, 1)
	signal.Notify(c, syscall.SIGUSR1)
	done := make(chan struct{})
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		for {
			select {
			case <-c:
				fmt.Fprintln(stderr, statsLine(s))
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
func statsLine(s *session.Session) string {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	var b strings.Builder
	fmt.Fprintf(&b, "tunwall: stats goroutines=%d heap_live=%d heap_sys=%d", runtime.NumGoroutine(), ms.HeapAlloc, ms.HeapSys)
	ss := s.Stats()
	if st := ss.Stack; st != nil {
		fmt.Fprintf(&b, " tcp_live=%d tcp_inflight=%d handshake_timeouts=%d", st.TCPLive, st.TCPInFlight, st.HandshakeTimeouts)
	}
	if a := ss.Attr; a != nil {
		fmt.Fprintf(&b, " attr_pending=%d attr_started=%d attr_found=%d attr_overloaded=%d attr_discoveries=%d attr_rescans=%d attr_fdreads=%d attr_dumps=%d attr_batches=%d attr_deferred=%d attr_cpu_us=%d",
			a.Pending, a.Started, a.Found, a.Overloaded, a.Discoveries, a.Rescans, a.FDReads, a.Dumps, a.Batches, a.Deferred, a.CPU.Microseconds())
	}
	return b.String()
}
