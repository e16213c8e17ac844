// Package bench measures tunwall against the kernel path, slirp4netns and
// pasta, in one run, in the isolated test world (see package integration):
// throughput, connection rate, latency, peak RSS and CPU per GB. `make
// bench` runs it and prints one table with ratios to the kernel path.
//
// It is a benchmark, not a test: it asserts nothing about speed.
package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tunwall/tunwall/internal/testworld"
)

// reps is how many times each measurement is repeated; the median is kept.
const reps = 3

type procStats struct {
	cpu    float64 // seconds (user+system) of the path's own process
	peakKB int64   // VmHWM
}

// path is one way for a sandboxed client to reach the world.
type path struct {
	name string
	// run runs argv inside this path's sandbox and returns its stdout and
	// the stats of the process that implements the path (none for the
	// kernel).
	run func(ctx context.Context, argv []string) (string, procStats, error)
}

type env struct {
	b     *testing.B
	w     *testworld.World
	bin   string // dir with tunwall and twload
	iface string // the agent's veth
	// worldCA is the world's CA certificate: SSL_CERT_FILE of tunwall and
	// of the clients of the other paths.
	worldCA string
	auditN  int
	mu      sync.Mutex
}

func BenchmarkPaths(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("SKIPPING: the benchmark needs root (namespaces)")
	}
	for _, tool := range []string{"iperf3", "slirp4netns", "pasta", "setpriv", "unshare"} {
		if _, err := exec.LookPath(tool); err != nil {
			b.Fatalf("%s is not installed", tool)
		}
	}
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
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	e := &env{b: b, bin: dir}
	paths := []path{
		{"kernel", e.kernel},
		{"tunwall", e.tunwall(false)},
		{"tunwall --audit off", e.tunwall(true)},
		{"slirp4netns", e.slirp},
		{"pasta", e.pasta},
	}
	// TUNWALL_BENCH_PATHS=kernel,tunwall measures only those paths.
	if only := os.Getenv("TUNWALL_BENCH_PATHS"); only != "" {
		paths = slices.DeleteFunc(paths, func(p path) bool { return !slices.Contains(strings.Split(only, ","), p.name) })
	}
	results := map[string]map[string]float64{}
	for _, p := range paths {
		// A fresh world per path: thousands of connections leave
		// thousands of TIME_WAIT sockets in the agent namespace, which
		// slow connect() for whoever comes next.
		w, err := testworld.New(testworld.Options{})
		if err != nil {
			b.Fatal(err)
		}
		e.w, e.iface = w, "twa"+w.ID
		if e.worldCA, err = w.CA.WritePEM(e.bin); err != nil {
			b.Fatal(err)
		}
		srv := w.WorldCommand(ctx, "iperf3", "-s", "-B", testworld.Echo4.String(), "-p", "5201")
		if err := srv.Start(); err != nil {
			w.Close()
			b.Fatal(err)
		}
		time.Sleep(300 * time.Millisecond)
		results[p.name] = e.measure(ctx, p)
		srv.Process.Kill()
		srv.Wait()
		w.Close()
	}
	printTable(os.Stdout, paths, results)
	// The audit pair is a measurement too: TUNWALL_BENCH_MEASURE selects
	// it by the prefix of "auditpair".
	only := os.Getenv("TUNWALL_BENCH_MEASURE")
	pair := only == "" || slices.ContainsFunc(strings.Split(only, ","), func(o string) bool { return strings.HasPrefix("auditpair", o) })
	if pair && slices.ContainsFunc(paths, func(p path) bool { return p.name == "tunwall" }) &&
		slices.ContainsFunc(paths, func(p path) bool { return p.name == "tunwall --audit off" }) {
		e.auditPair(ctx, os.Stdout)
	}
	b.ReportMetric(results["tunwall"]["gbps1"], "tunwall-Gbit/s")
	b.ReportMetric(results["tunwall"]["cps"], "tunwall-conn/s")
}

// auditPair measures the audit's cost on the connection rate with the two
// tunwall paths taken in turns in one world (on, off, on, off, ...), so
// that a shared machine's load, which the table's paths see minutes
// apart, falls on both alike.
func (e *env) auditPair(ctx context.Context, out *os.File) {
	w, err := testworld.New(testworld.Options{})
	if err != nil {
		e.b.Fatal(err)
	}
	defer w.Close()
	e.w, e.iface = w, "twa"+w.ID
	argv := []string{filepath.Join(e.bin, "twload"), "cps", "-addr", testworld.Echo4.String() + ":80", "-n", "1000"}
	var on, off, onCPU, offCPU []float64
	for i := 0; i < 2*auditPairReps; i++ {
		audited := i%2 == 0
		c, cancel := context.WithTimeout(ctx, 2*time.Minute)
		o, st, err := e.tunwall(!audited)(c, argv)
		cancel()
		r := parseLoad(o)
		if err != nil || r.Failed > 0 || r.PerSec <= 0 {
			e.b.Logf("audit pair: %v (%d failed)\n%s", err, r.Failed, o)
			continue
		}
		cpu := st.cpu / float64(r.N) * 1000
		if audited {
			on, onCPU = append(on, r.PerSec), append(onCPU, cpu)
		} else {
			off, offCPU = append(off, r.PerSec), append(offCPU, cpu)
		}
	}
	if len(on) == 0 || len(off) == 0 {
		return
	}
	mOn, mOff := median(on), median(off)
	fmt.Fprintf(out, "audit on vs off, taken in turns in one world (median of %d each, 1,000 connections, 1 worker): %.0f vs %.0f conn/s, "+
		"the audit costs %.1f%% of the connection rate (target <= 5%%); CPU per 1,000 connections %.3g vs %.3g s\n",
		auditPairReps, mOn, mOff, 100*(1-mOn/mOff), median(onCPU), median(offCPU))
}

// auditPairReps is how many runs of each tunwall path auditPair takes.
const auditPairReps = 5

// measure runs every measurement for one path.
func (e *env) measure(ctx context.Context, p path) map[string]float64 {
	m := map[string]float64{}
	twload := filepath.Join(e.bin, "twload")
	echo := testworld.Echo4.String()
	// TUNWALL_BENCH_MEASURE=cps,cps8 takes only the measurements whose
	// name starts with one of those (for A/B runs of one change).
	var only []string
	if s := os.Getenv("TUNWALL_BENCH_MEASURE"); s != "" {
		only = strings.Split(s, ",")
	}
	run := func(what string, argv []string, parse func(string, procStats) map[string]float64) {
		if only != nil && !slices.ContainsFunc(only, func(o string) bool { return strings.HasPrefix(what, o) }) {
			return
		}
		var samples []map[string]float64
		for i := 0; i < reps; i++ {
			c, cancel := context.WithTimeout(ctx, 2*time.Minute)
			out, st, err := p.run(c, argv)
			cancel()
			if err != nil {
				e.b.Logf("%s: %s: %v\n%s", p.name, what, err, out)
				continue
			}
			samples = append(samples, parse(out, st))
		}
		for k := range firstKeys(samples) {
			var vs []float64
			for _, s := range samples {
				if v, ok := s[k]; ok {
					vs = append(vs, v)
				}
			}
			m[k] = median(vs)
		}
		fmt.Fprintf(os.Stderr, "bench: %-20s %-24s %v\n", p.name, what, compact(m))
	}
	iperf := func(key string, extra ...string) {
		argv := append([]string{"iperf3", "-c", echo, "-p", "5201", "-t", "3", "-J"}, extra...)
		run("iperf3 "+strings.Join(extra, " "), argv, func(out string, st procStats) map[string]float64 {
			bps, bytes := parseIperf(out)
			r := map[string]float64{key: bps / 1e9}
			if key == "gbps1" && st.cpu > 0 && bytes > 0 {
				r["cpu_per_gb"] = st.cpu / (float64(bytes) / 1e9)
			}
			return r
		})
	}
	iperf("gbps1")
	iperf("gbps4", "-P", "4")
	iperf("gbps_down", "-R")
	run("cps client-closes", []string{twload, "cps", "-addr", echo + ":80", "-n", "2000"}, func(out string, st procStats) map[string]float64 {
		r := parseLoad(out)
		m := map[string]float64{"cps": r.PerSec, "conn_p50": r.P50us, "conn_p99": r.P99us, "cps_failed": float64(r.Failed)}
		if st.cpu > 0 && r.N > 0 {
			m["cpu_per_kconn"] = st.cpu / float64(r.N) * 1000
		}
		return m
	})
	// Another port for 8 workers: 6,000 connections to :80 and then 12,000
	// more would leave 18,000 in TIME_WAIT towards one destination within
	// a minute, and the last run measured connect(2)'s search for a free
	// port (9-16 s of tunwall's CPU in its connect calls in that run, a
	// CPU profile showed) instead of the path.
	run("cps8 client-closes, 8 workers", []string{twload, "cps", "-addr", echo + ":82", "-n", "4000", "-workers", "8"}, func(out string, _ procStats) map[string]float64 {
		r := parseLoad(out)
		return map[string]float64{"cps8": r.PerSec, "cps8_p50": r.P50us, "cps8_failed": float64(r.Failed)}
	})
	run("cps server-closes", []string{twload, "cps", "-addr", echo + ":81", "-n", "2000", "-server-closes"}, func(out string, _ procStats) map[string]float64 {
		r := parseLoad(out)
		return map[string]float64{"cps_sc": r.PerSec, "cps_sc_failed": float64(r.Failed)}
	})
	run("rr on open connection", []string{twload, "rr", "-addr", echo + ":80", "-n", "5000"}, func(out string, _ procStats) map[string]float64 {
		r := parseLoad(out)
		return map[string]float64{"rr_p50": r.P50us, "rr_p99": r.P99us}
	})
	// HTTPS: passed through end to end (every path), and terminated by
	// tunwall's terminator (tunwall's paths: www.allowed.test has an http rule).
	connect := ""
	if !strings.HasPrefix(p.name, "tunwall") {
		connect = testworld.Web4.String() + ":443"
	}
	httpsRR := func(key, host string) {
		run("https rr "+host, []string{twload, "https", "-url", "https://" + host + "/bytes/64", "-n", "2000", "-connect", connect}, func(out string, _ procStats) map[string]float64 {
			r := parseLoad(out)
			return map[string]float64{key + "_p50": r.P50us, key + "_p99": r.P99us, key + "_failed": float64(r.Failed)}
		})
	}
	download := func(key, host string) {
		run("https download "+host, []string{twload, "download", "-url", "https://" + host + "/bytes/1000000000", "-connect", connect}, func(out string, _ procStats) map[string]float64 {
			r := parseLoad(out)
			if r.Failed > 0 {
				return map[string]float64{key + "_failed": 1}
			}
			return map[string]float64{key: r.Gbps}
		})
	}
	httpsRR("https_pass", "allowed.test")
	download("https_pass_gbps", "allowed.test")
	if strings.HasPrefix(p.name, "tunwall") {
		httpsRR("https_term", "www.allowed.test")
		download("https_term_gbps", "www.allowed.test")
	}
	// A new process's first DNS answer: 200 processes one after another,
	// each sending one query to the world's resolver (intercepted by
	// tunwall, forwarded by slirp4netns and pasta, direct on the kernel
	// path) and exiting once answered.
	run("dnsfirst new process", []string{twload, "dnsfirst", "-addr", testworld.DNS4.String() + ":53", "-n", "200", "-name", "allowed.test"}, func(out string, _ procStats) map[string]float64 {
		r := parseLoad(out)
		return map[string]float64{"dnsfirst_p50": r.P50us, "dnsfirst_p99": r.P99us, "dnsfirst_failed": float64(r.Failed)}
	})
	run("hold 300 connections", []string{twload, "hold", "-addr", echo + ":7", "-n", "300", "-hold", "1s"}, func(out string, st procStats) map[string]float64 {
		r := parseLoad(out)
		v := map[string]float64{"hold_failed": float64(r.Failed)}
		if st.peakKB > 0 {
			v["rss300_mib"] = float64(st.peakKB) / 1024
		}
		return v
	})
	return m
}

func firstKeys(s []map[string]float64) map[string]bool {
	k := map[string]bool{}
	for _, m := range s {
		for x := range m {
			k[x] = true
		}
	}
	return k
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	slices.Sort(v)
	return v[len(v)/2]
}

func compact(m map[string]float64) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%s=%.4g ", k, m[k])
	}
	return b.String()
}

type loadResult struct {
	N       int     `json:"n"`
	Failed  int     `json:"failed"`
	PerSec  float64 `json:"per_sec"`
	P50us   float64 `json:"p50_us"`
	P99us   float64 `json:"p99_us"`
	Seconds float64 `json:"seconds"`
	Gbps    float64 `json:"gbps"`
}

func parseLoad(out string) loadResult {
	var r loadResult
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "{") {
			json.Unmarshal([]byte(line), &r)
		}
	}
	return r
}

func parseIperf(out string) (bps float64, bytes int64) {
	i := strings.Index(out, "{")
	if i < 0 {
		return 0, 0
	}
	var r struct {
		End struct {
			SumReceived struct {
				Bytes         int64   `json:"bytes"`
				BitsPerSecond float64 `json:"bits_per_second"`
			} `json:"sum_received"`
		} `json:"end"`
	}
	json.Unmarshal([]byte(out[i:]), &r)
	return r.End.SumReceived.BitsPerSecond, r.End.SumReceived.Bytes
}

// sampler follows a process's CPU time and peak RSS until stop is called,
// keeping the last values read (the process may be gone by then).
type sampler struct {
	pid  int
	stop chan struct{}
	done chan procStats
}

func sample(pid int) *sampler {
	s := &sampler{pid: pid, stop: make(chan struct{}), done: make(chan procStats, 1)}
	tick := float64(100) // USER_HZ
	go func() {
		var last procStats
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil {
				f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
				if len(f) > 13 {
					u, _ := strconv.ParseFloat(f[11], 64)
					sy, _ := strconv.ParseFloat(f[12], 64)
					last.cpu = (u + sy) / tick
				}
			}
			if f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid)); err == nil {
				sc := bufio.NewScanner(f)
				for sc.Scan() {
					if v, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
						kb, _ := strconv.ParseInt(strings.Fields(v)[0], 10, 64)
						last.peakKB = kb
					}
				}
				f.Close()
			}
			select {
			case <-s.stop:
				s.done <- last
				return
			case <-t.C:
			}
		}
	}()
	return s
}

func (s *sampler) finish() procStats {
	close(s.stop)
	return <-s.done
}

// runSampled starts cmd, samples the process whose pid pidOf returns, and
// waits for cmd.
func runSampled(cmd *exec.Cmd, pidOf func() int) (string, procStats, error) {
	var out strings.Builder
	cmd.Stdout = &out
	var errb strings.Builder
	cmd.Stderr = &errb
	if err := cmd.Start(); err != nil {
		return "", procStats{}, err
	}
	var s *sampler
	if pidOf != nil {
		s = sample(pidOf())
	}
	err := cmd.Wait()
	var st procStats
	if s != nil {
		st = s.finish()
	}
	if err != nil {
		return out.String() + errb.String(), st, err
	}
	return out.String(), st, nil
}

func (e *env) kernel(ctx context.Context, argv []string) (string, procStats, error) {
	cmd := e.w.AgentCommand(ctx, argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), "SSL_CERT_FILE="+e.worldCA)
	return runSampled(cmd, nil)
}

// benchPolicy writes (once) the policy of tunwall's paths: the echo host on
// every port, allowed.test passed through, www.allowed.test terminated.
func (e *env) benchPolicy() string {
	p := filepath.Join(e.bin, "bench.yaml")
	if _, err := os.Stat(p); err == nil {
		return p
	}
	os.WriteFile(p, []byte(`version: 1
phases:
  bench:
    allow:
      - cidr: `+testworld.Echo4.String()+`/32
        ports: ["*"]
      - host: allowed.test
      - host: www.allowed.test
        http: [{methods: [GET], paths: ["/bytes/*"]}]
`), 0o644)
	return p
}

func (e *env) tunwall(auditOff bool) func(ctx context.Context, argv []string) (string, procStats, error) {
	return func(ctx context.Context, argv []string) (string, procStats, error) {
		e.mu.Lock()
		e.auditN++
		n := e.auditN
		e.mu.Unlock()
		audit := filepath.Join(e.bin, fmt.Sprintf("audit-%d.jsonl", n))
		if auditOff {
			audit = "off"
		}
		args := []string{"run", "--quiet", "--audit", audit, "--dns-upstream", "192.0.2.53:53", "--policy", e.benchPolicy(), "--"}
		cmd := e.w.AgentCommand(ctx, filepath.Join(e.bin, "tunwall"), append(args, argv...)...)
		cmd.Env = append(os.Environ(), "SSL_CERT_FILE="+e.worldCA)
		var c *exec.Cmd = cmd
		out, st, err := runSampled(cmd, func() int { return c.Process.Pid })
		os.Remove(audit)
		return out, st, err
	}
}

// slirp runs argv in a user+network namespace served by slirp4netns.
func (e *env) slirp(ctx context.Context, argv []string) (string, procStats, error) {
	ready := filepath.Join(e.bin, fmt.Sprintf("slirp-ready-%d", time.Now().UnixNano()))
	script := fmt.Sprintf(`while [ ! -e %s ]; do sleep 0.01; done; exec "$@"`, ready)
	cmd := e.w.AgentCommand(ctx, "unshare", append([]string{"--user", "--map-root-user", "--net", "sh", "-c", script, "sh"}, argv...)...)
	cmd.Env = append(os.Environ(), "SSL_CERT_FILE="+e.worldCA)
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Start(); err != nil {
		return "", procStats{}, err
	}
	defer os.Remove(ready)
	time.Sleep(100 * time.Millisecond) // the namespace exists once unshare has exec'd sh
	rr, rw, _ := os.Pipe()
	slirp := e.w.AgentCommand(ctx, "slirp4netns", "--configure", "--mtu=65520", "--disable-host-loopback", "--ready-fd=3", strconv.Itoa(cmd.Process.Pid), "tap0")
	slirp.ExtraFiles = []*os.File{rw}
	if err := slirp.Start(); err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		return "", procStats{}, err
	}
	rw.Close()
	buf := make([]byte, 1)
	rr.Read(buf)
	rr.Close()
	s := sample(slirp.Process.Pid)
	os.WriteFile(ready, nil, 0o644)
	err := cmd.Wait()
	st := s.finish()
	slirp.Process.Kill()
	slirp.Wait()
	if err != nil {
		return out.String() + errb.String(), st, err
	}
	return out.String(), st, nil
}

// pasta runs argv under pasta, unprivileged (pasta refuses to run as root),
// configured like the agent's veth.
func (e *env) pasta(ctx context.Context, argv []string) (string, procStats, error) {
	args := []string{"--reuid=65534", "--regid=65534", "--clear-groups", "pasta", "--quiet", "--config-net",
		"-i", e.iface, "-a", "10.77.0.5", "-n", "29", "-g", testworld.WorldVeth4.String(), "--mtu", "65520", "--"}
	cmd := e.w.AgentCommand(ctx, "setpriv", append(args, argv...)...)
	cmd.Env = append(os.Environ(), "SSL_CERT_FILE="+e.worldCA)
	var c *exec.Cmd = cmd
	return runSampled(cmd, func() int { return c.Process.Pid })
}

// rows of the table: key, label, unit, higher is better.
var rows = []struct {
	key, label, unit string
	higher           bool
}{
	{"gbps1", "TCP upload, 1 stream", "Gbit/s", true},
	{"gbps4", "TCP upload, 4 streams", "Gbit/s", true},
	{"gbps_down", "TCP download, 1 stream", "Gbit/s", true},
	{"cps", "connections/s (client closes)", "conn/s", true},
	{"cps_sc", "connections/s (server closes)", "conn/s", true},
	{"cps8", "connections/s, 8 workers", "conn/s", true},
	{"cpu_per_kconn", "CPU per 1,000 connections (1 worker)", "s", false},
	{"cps8_p50", "connect+request p50, 8 workers", "µs", false},
	{"conn_p50", "connect+request p50", "µs", false},
	{"conn_p99", "connect+request p99", "µs", false},
	{"rr_p50", "request on open conn p50", "µs", false},
	{"rr_p99", "request on open conn p99", "µs", false},
	{"https_pass_p50", "HTTPS request p50, passed through", "µs", false},
	{"https_term_p50", "HTTPS request p50, terminated", "µs", false},
	{"https_pass_p99", "HTTPS request p99, passed through", "µs", false},
	{"https_term_p99", "HTTPS request p99, terminated", "µs", false},
	{"https_pass_gbps", "HTTPS download, passed through", "Gbit/s", true},
	{"https_term_gbps", "HTTPS download, terminated", "Gbit/s", true},
	{"dnsfirst_p50", "new process's first DNS answer p50", "µs", false},
	{"dnsfirst_p99", "new process's first DNS answer p99", "µs", false},
	{"rss300_mib", "peak RSS, 300 open conns", "MiB", false},
	{"cpu_per_gb", "CPU per GB (1 stream)", "s/GB", false},
	{"cps_failed", "failed connections (cps)", "", false},
	{"cps_sc_failed", "failed connections (server closes)", "", false},
	{"cps8_failed", "failed connections (8 workers)", "", false},
	{"hold_failed", "failed of 300 concurrent", "", false},
	{"https_pass_failed", "failed HTTPS requests, passed through", "", false},
	{"https_term_failed", "failed HTTPS requests, terminated", "", false},
	{"dnsfirst_failed", "failed first DNS queries (of 200)", "", false},
}

func printTable(w *os.File, paths []path, res map[string]map[string]float64) {
	fmt.Fprintf(w, "\n%-36s", "metric (median of 3)")
	for _, p := range paths {
		fmt.Fprintf(w, " %22s", p.name)
	}
	fmt.Fprintln(w)
	kernel := res["kernel"]
	for _, r := range rows {
		label := r.label
		if r.unit != "" {
			label += " (" + r.unit + ")"
		}
		fmt.Fprintf(w, "%-36s", label)
		for _, p := range paths {
			v, ok := res[p.name][r.key]
			if !ok {
				fmt.Fprintf(w, " %22s", "—")
				continue
			}
			cell := fmt.Sprintf("%.4g", v)
			if k, ok := kernel[r.key]; ok && p.name != "kernel" && k > 0 && !strings.Contains(r.key, "failed") {
				cell += fmt.Sprintf(" (%.2fx)", v/k)
			}
			fmt.Fprintf(w, " %22s", cell)
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintln(w, "\n(x) = ratio to the kernel path in this run. RSS and CPU are of the path's own process (tunwall, slirp4netns, pasta).")
	on, off := res["tunwall"], res["tunwall --audit off"]
	for _, k := range []struct{ key, what string }{{"cps", "one worker"}, {"cps8", "8 workers"}} {
		if on[k.key] > 0 && off[k.key] > 0 {
			fmt.Fprintf(w, "audit on vs off, connections/s (%s): %.0f vs %.0f, the audit costs %.1f%% of the connection rate (target <= 5%%)\n",
				k.what, on[k.key], off[k.key], 100*(1-on[k.key]/off[k.key]))
		}
	}
	if t, p := res["tunwall"], res["pasta"]; t["cps"] > 0 && p["cps"] > 0 {
		fmt.Fprintf(w, "tunwall vs pasta in this run: connections/s %.2fx (1 worker), %.2fx (8 workers); connect+request p50 %.2fx (targets >= 1, >= 1, <= 1)\n",
			t["cps"]/p["cps"], t["cps8"]/max(p["cps8"], 1e-9), t["conn_p50"]/max(p["conn_p50"], 1e-9))
	}
	if t := res["tunwall"]; t["https_pass_p50"] > 0 {
		fmt.Fprintf(w, "tunwall, terminated vs passed through in this run: HTTPS request p50 %.2fx (target <= 2x); terminated download %.3g Gbit/s (target >= 1)\n",
			t["https_term_p50"]/t["https_pass_p50"], t["https_term_gbps"])
	}
}
