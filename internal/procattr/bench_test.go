package procattr

import (
	"os"
	"testing"
)

// BenchmarkScanProc measures one procfs scan of this machine for an inode
// nobody holds (the worst case: every fd of every process in scope is read).
func BenchmarkScanProc(b *testing.B) {
	for _, bc := range []struct {
		name  string
		netns uint64
	}{{"every process", 0}, {"processes in our netns", netnsInode(b, "self")}} {
		b.Run(bc.name, func(b *testing.B) {
			pt := procTable{root: "/proc", netns: bc.netns}
			procs, fds := 0, 0
			for b.Loop() {
				if _, err := pt.scan(1, false); err != nil {
					b.Fatal(err)
				}
			}
			ents, _ := os.ReadDir("/proc")
			for _, e := range ents {
				if _, ok := parsePID([]byte(e.Name())); ok {
					procs++
					if f, err := os.ReadDir("/proc/" + e.Name() + "/fd"); err == nil {
						fds += len(f)
					}
				}
			}
			b.ReportMetric(float64(procs), "procs")
			b.ReportMetric(float64(fds), "fds")
		})
	}
}

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
