package procattr

import (
	"fmt"
	"net"
	"testing"

	"golang.org/x/sys/unix"
)

// BenchmarkLookup measures a full Lookup of a TCP flow of this process.
func BenchmarkLookup(b *testing.B) {
	requireRoot(b)
	ino := netnsInode(b, "self")
	for _, bc := range []struct {
		name  string
		netns uint64
	}{{"no netns filter", 0}, {"netns filter", ino}} {
		b.Run(bc.name, func(b *testing.B) {
			r := newTestResolver(b, Config{NetNS: bc.netns})
			f := tcpClient(b, "tcp4", "127.0.0.1:0")
			for b.Loop() {
				if got := r.Lookup("tcp", f.local, f.remote); got.Inode != f.inode || got.Note != "" {
					b.Fatalf("Lookup = %+v", got)
				}
			}
		})
	}
}

// BenchmarkLookupWhileHolding measures attributing a new flow of a process
// that holds many sockets: each new socket replaces the oldest one, so the
// process holds the same number all along and the new socket gets the oldest
// one's descriptor number. "hinted" is the engine's way (the oldest flow's
// record is written: Finish), "unhinted" plain Lookups (as for UDP, whose
// sessions outlive their sockets). The cost per lookup must not grow with the
// number held. (Before the fd index, with the same pattern through Lookup,
// on the shared 2-core development VM: 0.49-0.65ms at 100 sockets,
// 9.7-22.6ms at 10,000.)
func BenchmarkLookupWhileHolding(b *testing.B) {
	requireRoot(b)
	ino := netnsInode(b, "self")
	for _, hinted := range []bool{true, false} {
		for _, held := range []int{100, 10000} {
			name := fmt.Sprintf("unhinted/%d sockets", held)
			if hinted {
				name = fmt.Sprintf("hinted/%d sockets", held)
			}
			b.Run(name, func(b *testing.B) { benchHolding(b, ino, held, hinted) })
		}
	}
}

func benchHolding(b *testing.B, netns uint64, held int, hinted bool) {
	var rl unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); rl.Cur < uint64(held+1000) {
		b.Skipf("!!! SKIPPING: RLIMIT_NOFILE %d is below %d !!!", rl.Cur, held+1000)
	}
	srv, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer srv.Close()
	to := srv.LocalAddr().(*net.UDPAddr)
	r := newTestResolver(b, Config{NetNS: netns})
	type flow struct {
		c *net.UDPConn
		p *Pending
	}
	open := func() flow {
		c, err := net.DialUDP("udp4", nil, to)
		if err != nil {
			b.Fatal(err)
		}
		la := c.LocalAddr().(*net.UDPAddr).AddrPort()
		return flow{c, r.Start("udp", la, to.AddrPort())}
	}
	ring := make([]flow, held)
	for i := range ring {
		ring[i] = open()
	}
	for i := range ring {
		ring[i].p.Wait(DefaultMaxWait)
	}
	defer func() {
		for _, f := range ring {
			f.c.Close()
		}
	}()
	before := r.Stats()
	i := 0
	for b.Loop() {
		old := &ring[i%held]
		if hinted {
			old.p.Finish(0)
		}
		old.c.Close()
		*old = open()
		if o, ok := old.p.Wait(DefaultMaxWait); !ok || o.PID == 0 {
			b.Fatalf("lookup %d: %+v", i, o)
		}
		i++
	}
	st := r.Stats()
	n := float64(st.Started - before.Started)
	b.ReportMetric(float64(st.FDReads-before.FDReads)/n, "fdreads/op")
	b.ReportMetric(float64((st.CPU-before.CPU).Nanoseconds())/n, "worker-ns/op")
	b.ReportMetric(float64(st.Rescans-before.Rescans), "rescans")
}
