package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tunwall/tunwall/internal/testworld"
)

// BenchmarkConcurrentTCP is the table of issue "Hold under load": one client
// process in the sandbox opens N TCP connections to the echo server (64
// connecting at once) and holds them for concurrentHold, each sending a
// record every 5 s, through the kernel path (the agent's veth), tunwall
// with --audit off and tunwall audited (the default, hardening bounds in
// force); for N = 1,000, 10,000 and 20,000. It prints connections that failed or stalled, the sandbox's
// packets dropped at the TUN, connect latency, and tunwall's goroutines
// and RSS before the burst, while it holds the connections, and
// concurrentSettle after they are closed, and the memory per open
// connection: tunwall's RSS while it holds them above its RSS before,
// divided by N.
//
// TUNWALL_BENCH_CONCURRENT=10000 measures only that N.
func BenchmarkConcurrentTCP(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("SKIPPING: the benchmark needs root (namespaces)")
	}
	sizes := []int{1000, 10000, 20000}
	if s := os.Getenv("TUNWALL_BENCH_CONCURRENT"); s != "" {
		sizes = nil
		for _, f := range strings.Split(s, ",") {
			if n, err := strconv.Atoi(f); err == nil && n > 0 {
				sizes = append(sizes, n)
			}
		}
	}
	// The client, tunwall (one socket upstream per connection) and the
	// world's echo server (in this process) each hold N descriptors.
	// Without CAP_SYS_RESOURCE the hard limit stays: connections past it
	// fail on every path alike, and the table says so.
	rl := raiseNOFILE(uint64(2*slices.Max(sizes) + 8192))
	dir, err := os.MkdirTemp("", "tunwall-bench-")
	if err != nil {
		b.Fatal(err)
	}
	defer os.RemoveAll(dir)
	os.Chmod(dir, 0o755)
	for _, p := range []string{"github.com/tunwall/tunwall/cmd/tunwall", "github.com/tunwall/tunwall/integration/bench/twload"} {
		out, err := exec.Command("go", "build", "-o", dir+"/", p).CombinedOutput()
		if err != nil {
			b.Fatalf("build %s: %v\n%s", p, err, out)
		}
	}
	e := &env{b: b, bin: dir}
	paths := []string{"kernel", "tunwall --audit off", "tunwall"}
	res := map[int]map[string]concurrentRun{}
	for _, n := range sizes {
		res[n] = map[string]concurrentRun{}
		for _, p := range paths {
			// A fresh world each time: N connections leave N TIME_WAIT
			// sockets behind.
			w, err := testworld.New(testworld.Options{})
			if err != nil {
				b.Fatal(err)
			}
			e.w = w
			r, err := e.concurrent(p, n)
			w.Close()
			if err != nil {
				b.Logf("%s, %d connections: %v", p, n, err)
				continue
			}
			fmt.Fprintf(os.Stderr, "bench: %-20s %6d concurrent: %+v\n", p, n, r)
			res[n][p] = r
		}
	}
	printConcurrent(os.Stdout, sizes, paths, res)
	fmt.Fprintf(os.Stdout, "RLIMIT_NOFILE %d (the client, tunwall and the world's echo server each hold one descriptor per connection)\n", rl.Cur)
}

const (
	concurrentHold   = 15 * time.Second // three records per connection
	concurrentSettle = 5 * time.Second
)

// concurrentRun is one path's run of twload many.
type concurrentRun struct {
	manyResult
	// tunwall's, before the burst, while it held the connections, and
	// concurrentSettle after they were closed (-1 for the kernel path).
	goroutines [3]int64
	rssMiB     [3]float64
}

// manyResult is what twload many prints.
type manyResult struct {
	N          int     `json:"n"`
	Failed     int     `json:"failed"`
	Stalled    int     `json:"stalled"`
	Records    int     `json:"records"`
	ConnectSec float64 `json:"connect_seconds"`
	P50ms      float64 `json:"p50_ms"`
	P99ms      float64 `json:"p99_ms"`
	MaxMs      float64 `json:"max_ms"`
	TUNTx      int64   `json:"tun_tx"`
	TUNDropped int64   `json:"tun_dropped"`
}

// concurrent runs twload many with n connections on one path and samples
// tunwall (SIGUSR1 stats line, VmRSS) at the three points.
func (e *env) concurrent(path string, n int) (concurrentRun, error) {
	r := concurrentRun{goroutines: [3]int64{-1, -1, -1}, rssMiB: [3]float64{-1, -1, -1}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	argv := []string{filepath.Join(e.bin, "twload"), "many", "-addr", testworld.Echo4.String() + ":7", "-n", strconv.Itoa(n), "-hold", concurrentHold.String()}
	var cmd *exec.Cmd
	switch path {
	case "kernel":
		cmd = e.w.AgentCommand(ctx, argv[0], argv[1:]...)
	default:
		audit := filepath.Join(e.bin, "concurrent.jsonl")
		if path == "tunwall --audit off" {
			audit = "off"
		}
		defer os.Remove(audit)
		args := append([]string{"run", "--quiet", "--audit", audit, "--dns-upstream", "192.0.2.53:53", "--policy", e.benchPolicy(), "--"}, argv...)
		cmd = e.w.AgentCommand(ctx, filepath.Join(e.bin, "tunwall"), args...)
	}
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	stderr, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		return r, err
	}
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
	}()
	lines := make(chan string, 8)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	stats := make(chan int64, 8)
	var errs strings.Builder
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			l := sc.Text()
			if rest, ok := strings.CutPrefix(l, "tunwall: stats goroutines="); ok {
				g, _ := strconv.ParseInt(strings.Fields(rest)[0], 10, 64)
				stats <- g
				continue
			}
			errs.WriteString(l + "\n")
		}
	}()
	next := func(want string, d time.Duration) (string, error) {
		select {
		case l, ok := <-lines:
			if !ok {
				return "", fmt.Errorf("the client ended before %q\n%s", want, errs.String())
			}
			if want != "" && l != want {
				return "", fmt.Errorf("want %q from the client, got %q", want, l)
			}
			return l, nil
		case <-time.After(d):
			return "", fmt.Errorf("no %q from the client within %v\n%s", want, d, errs.String())
		}
	}
	sample := func(i int) {
		if path == "kernel" {
			return
		}
		pid := cmd.Process.Pid
		r.rssMiB[i] = float64(vmRSSKiB(pid)) / 1024
		for len(stats) > 0 {
			<-stats // a line that came too late for the last sample
		}
		if cmd.Process.Signal(syscall.SIGUSR1) == nil {
			select {
			case g := <-stats:
				r.goroutines[i] = g
			case <-time.After(10 * time.Second):
			}
		}
	}
	if _, err := next("ready", time.Minute); err != nil {
		return r, err
	}
	sample(0)
	io.WriteString(stdin, "go\n")
	if _, err := next("held", 5*time.Minute); err != nil {
		return r, err
	}
	sample(1)
	l, err := next("", concurrentHold+time.Minute)
	if err != nil {
		return r, err
	}
	if err := json.Unmarshal([]byte(l), &r.manyResult); err != nil {
		return r, fmt.Errorf("client output %q: %v", l, err)
	}
	time.Sleep(concurrentSettle) // a benchmark's fixed point of measurement, not synchronisation
	sample(2)
	io.WriteString(stdin, "\n")
	stdin.Close()
	return r, nil
}

func vmRSSKiB(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return -1
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			n, _ := strconv.ParseInt(strings.Fields(v)[0], 10, 64)
			return n
		}
	}
	return -1
}

func printConcurrent(w io.Writer, sizes []int, paths []string, res map[int]map[string]concurrentRun) {
	fmt.Fprintf(w, "\n%-44s", fmt.Sprintf("N concurrent TCP, held %v, a record each 5 s", concurrentHold))
	for _, p := range paths {
		fmt.Fprintf(w, " %24s", p)
	}
	fmt.Fprintln(w)
	rows := []struct {
		label string
		cell  func(r concurrentRun, kernel bool) string
	}{
		{"failed connects", func(r concurrentRun, _ bool) string { return strconv.Itoa(r.Failed) }},
		{"stalled (no echo within 10 s)", func(r concurrentRun, _ bool) string { return strconv.Itoa(r.Stalled) }},
		{"TUN drops (connect and hold)", func(r concurrentRun, kernel bool) string {
			if kernel || r.TUNTx < 0 {
				return "—"
			}
			return fmt.Sprintf("%d (%.2f%%)", r.TUNDropped, 100*float64(r.TUNDropped)/float64(max(1, r.TUNTx+r.TUNDropped)))
		}},
		{"connect p50 / p99 (ms)", func(r concurrentRun, _ bool) string { return fmt.Sprintf("%.2f / %.2f", r.P50ms, r.P99ms) }},
		{"connect phase (s)", func(r concurrentRun, _ bool) string { return fmt.Sprintf("%.1f", r.ConnectSec) }},
		{"records echoed", func(r concurrentRun, _ bool) string { return strconv.Itoa(r.Records) }},
		{"tunwall goroutines: before/held/+5 s", func(r concurrentRun, kernel bool) string {
			if kernel {
				return "—"
			}
			return fmt.Sprintf("%s/%s/%s", count(r.goroutines[0]), count(r.goroutines[1]), count(r.goroutines[2]))
		}},
		{"tunwall RSS MiB: before/held/+5 s", func(r concurrentRun, kernel bool) string {
			if kernel {
				return "—"
			}
			return fmt.Sprintf("%s/%s/%s", mib(r.rssMiB[0]), mib(r.rssMiB[1]), mib(r.rssMiB[2]))
		}},
		{"tunwall memory per open conn (KiB)", func(r concurrentRun, kernel bool) string {
			if kernel || r.rssMiB[0] < 0 || r.rssMiB[1] < 0 || r.N-r.Failed <= 0 {
				return "—"
			}
			return fmt.Sprintf("%.1f", (r.rssMiB[1]-r.rssMiB[0])*1024/float64(r.N-r.Failed))
		}},
	}
	for _, n := range sizes {
		for _, row := range rows {
			fmt.Fprintf(w, "%-44s", fmt.Sprintf("%d: %s", n, row.label))
			for _, p := range paths {
				r, ok := res[n][p]
				if !ok {
					fmt.Fprintf(w, " %24s", "(failed)")
					continue
				}
				fmt.Fprintf(w, " %24s", row.cell(r, p == "kernel"))
			}
			fmt.Fprintln(w)
		}
	}
	fmt.Fprintln(w, "\nstalled: a connection whose record was not echoed within 10 s. Goroutines and RSS are tunwall's, before the connections, while it holds them, and 5 s after they closed; memory per open conn is (RSS held - RSS before) / connections open.")
}

// mib and count print a sample, or "?" where tunwall gave none in time.
func mib(v float64) string {
	if v < 0 {
		return "?"
	}
	return fmt.Sprintf("%.0f", v)
}

func count(v int64) string {
	if v < 0 {
		return "?"
	}
	return strconv.FormatInt(v, 10)
}
