package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"

	"github.com/tunwall/tunwall/internal/testworld"
	"github.com/tunwall/tunwall/tun"
)

// BenchmarkNodeMemory is the node agent's table (issue 24): one tunwall
// node serving 50 pods (namespaces added through tunwall-cni by libcni),
// then 20 TCP flows held open from each; the agent's resident memory and
// descriptors idle, per served namespace and per open flow.
// TUNWALL_BENCH_NODE_PODS and _FLOWS change the sizes.
func BenchmarkNodeMemory(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("SKIPPING: the benchmark needs root (namespaces)")
	}
	pods, flows := envInt("TUNWALL_BENCH_NODE_PODS", 50), envInt("TUNWALL_BENCH_NODE_FLOWS", 20)
	dir, err := os.MkdirTemp("", "tunwall-nodebench-")
	if err != nil {
		b.Fatal(err)
	}
	defer os.RemoveAll(dir)
	for _, p := range []string{"github.com/tunwall/tunwall/cmd/tunwall", "github.com/tunwall/tunwall/cmd/tunwall-cni"} {
		if out, err := exec.Command("go", "build", "-o", dir+"/", p).CombinedOutput(); err != nil {
			b.Fatalf("build %s: %v\n%s", p, err, out)
		}
	}
	w, err := testworld.New(testworld.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer w.Close()
	pol := filepath.Join(dir, "policies")
	os.Mkdir(pol, 0o755)
	os.WriteFile(filepath.Join(pol, "echo.yaml"), []byte("version: 1\nphases:\n  exec:\n    allow:\n      - cidr: 192.0.2.20/32\n        ports: [7]\n"), 0o644)
	sock := filepath.Join(dir, "run", "node.sock")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	agent := w.AgentCommand(ctx, filepath.Join(dir, "tunwall"), "node", "--policy-dir", pol, "--audit-dir", filepath.Join(dir, "audit"),
		"--socket", sock, "--dns-upstream", "192.0.2.53:53", "--resolv-conf", "/dev/null", "--control-dir", "off",
		"--max-namespaces", fmt.Sprint(pods), "--max-memory", "2GiB")
	stderr, _ := agent.StderrPipe()
	if err := agent.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { agent.Process.Kill(); agent.Wait() }()
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stderr)
		said := false
		for sc.Scan() {
			if !said && strings.Contains(sc.Text(), "serving pods on") {
				said = true
				close(ready)
			}
		}
	}()
	select {
	case <-ready:
	case <-time.After(20 * time.Second):
		b.Fatal("tunwall node did not start")
	}
	pid := agent.Process.Pid
	settled(pid)
	rss0, fds0 := vmRSSKiB(pid), countFDs(pid)

	conf, _ := json.Marshal(map[string]any{"cniVersion": "1.0.0", "name": "bench",
		"plugins": []any{map[string]any{"type": "tunwall-cni", "socket": sock, "policy": "echo"}}})
	list, err := libcni.ConfListFromBytes(conf)
	if err != nil {
		b.Fatal(err)
	}
	cni := libcni.NewCNIConfigWithCacheDir([]string{dir}, filepath.Join(dir, "cache"), nil)
	type pod struct {
		ns string
		rt *libcni.RuntimeConf
	}
	var ps []pod
	defer func() {
		for _, p := range ps {
			cni.DelNetworkList(context.Background(), list, p.rt)
			exec.Command("ip", "netns", "del", p.ns).Run()
		}
	}()
	start := time.Now()
	for i := range pods {
		ns := fmt.Sprintf("twbench-%s-%d", w.ID, i)
		if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
			b.Fatalf("%v: %s", err, out)
		}
		exec.Command("ip", "-n", ns, "link", "set", "lo", "up").Run()
		p := pod{ns: ns, rt: &libcni.RuntimeConf{ContainerID: fmt.Sprintf("bench%d", i), NetNS: "/run/netns/" + ns, IfName: "eth0",
			Args: [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", "bench"}, {"K8S_POD_NAME", fmt.Sprintf("p%d", i)}}}}
		ps = append(ps, p)
		if _, err := cni.AddNetworkList(ctx, list, p.rt); err != nil {
			b.Fatalf("ADD %d: %v", i, err)
		}
	}
	addTime := time.Since(start)
	settled(pid)
	rss1, fds1 := vmRSSKiB(pid), countFDs(pid)

	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for _, p := range ps {
		f, err := os.Open("/run/netns/" + p.ns)
		if err != nil {
			b.Fatal(err)
		}
		err = tun.InNetNS(int(f.Fd()), func() error {
			for range flows {
				c, err := net.DialTimeout("tcp", "192.0.2.20:7", 10*time.Second)
				if err != nil {
					return err
				}
				conns = append(conns, c)
				c.SetDeadline(time.Now().Add(10 * time.Second))
				if _, err := c.Write([]byte("x")); err != nil {
					return err
				}
				if _, err := io.ReadFull(c, make([]byte, 1)); err != nil {
					return err
				}
			}
			return nil
		})
		f.Close()
		if err != nil {
			b.Fatalf("flows from %s: %v", p.ns, err)
		}
	}
	settled(pid)
	rss2, fds2 := vmRSSKiB(pid), countFDs(pid)
	n := int64(pods)
	nf := int64(pods * flows)
	fmt.Printf("\ntunwall node: %d pods, %d flows each (echo, held open)\n", pods, flows)
	fmt.Printf("  %-34s %10s %8s\n", "", "RSS", "fds")
	fmt.Printf("  %-34s %10s %8d\n", "agent, no pod", fmt.Sprintf("%.1f MiB", float64(rss0)/1024), fds0)
	fmt.Printf("  %-34s %10s %8d\n", fmt.Sprintf("%d pods served, idle", pods), fmt.Sprintf("%.1f MiB", float64(rss1)/1024), fds1)
	fmt.Printf("  %-34s %10s %8d\n", fmt.Sprintf("%d flows open", nf), fmt.Sprintf("%.1f MiB", float64(rss2)/1024), fds2)
	fmt.Printf("  per served namespace: %.0f KiB, %.1f fds; per open flow: %.1f KiB, %.1f fds; %d ADDs in %v (%v each)\n",
		float64(rss1-rss0)/float64(n), float64(fds1-fds0)/float64(n), float64(rss2-rss1)/float64(nf), float64(fds2-fds1)/float64(nf),
		pods, addTime.Round(time.Millisecond), (addTime / time.Duration(pods)).Round(time.Millisecond))
	b.ReportMetric(float64(rss1-rss0)/float64(n), "KiB/namespace")
	b.ReportMetric(float64(rss2-rss1)/float64(nf), "KiB/flow")
}

func envInt(name string, def int) int {
	var n int
	if _, err := fmt.Sscanf(os.Getenv(name), "%d", &n); err == nil && n > 0 {
		return n
	}
	return def
}

func countFDs(pid int) int {
	ents, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	return len(ents)
}

// settled waits, at most 5 s, until process pid's RSS and descriptors stop
// changing between two looks 200 ms apart: the figures read after it are
// of the state reached, not of work still going.
func settled(pid int) {
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	rss, fds := vmRSSKiB(pid), countFDs(pid)
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); {
		<-t.C
		r, f := vmRSSKiB(pid), countFDs(pid)
		if f == fds && r >= rss-rss/100 && r <= rss+rss/100 {
			return
		}
		rss, fds = r, f
	}
}
