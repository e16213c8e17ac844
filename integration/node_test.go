package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/tunwall/tunwall/internal/audit"
)

// The node agent (tunwall node) and the CNI plugin (tunwall-cni), driven
// by libcni as a runtime drives them: the Debian loopback plugin, then
// tunwall-cni, on namespaces the test makes standing in for pods. The agent
// runs in the test world's agent namespace; clients run in the pods'
// namespaces (there is no sandboxed process of tunwall's: a pod's processes
// are the runtime's).

// cniPluginDir holds tunwall-cni, built once.
var (
	cniOnce sync.Once
	cniDir  string
	cniErr  error
)

// loopbackDir is where Debian's containernetworking-plugins puts loopback.
const loopbackDir = "/usr/lib/cni"

func buildCNI(t *testing.T) string {
	t.Helper()
	requireTools(t, "curl", "ip")
	if _, err := os.Stat(filepath.Join(loopbackDir, "loopback")); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("the loopback CNI plugin is not installed (containernetworking-plugins; .ci/run installs it)")
		}
		t.Skip("SKIPPING: the loopback CNI plugin is not installed (apt install containernetworking-plugins)")
	}
	cniOnce.Do(func() {
		cniDir = filepath.Join(filepath.Dir(tunwallBin), "cni")
		if cniErr = os.MkdirAll(cniDir, 0o755); cniErr != nil {
			return
		}
		out, err := exec.Command("go", "build", "-o", filepath.Join(cniDir, "tunwall-cni"), "github.com/tunwall/tunwall/cmd/tunwall-cni").CombinedOutput()
		if err != nil {
			cniErr = fmt.Errorf("building tunwall-cni: %v\n%s", err, out)
		}
	})
	if cniErr != nil {
		t.Fatal(cniErr)
	}
	return cniDir
}

// syncBuffer is a bytes.Buffer safe for a process's writes and the test's
// reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// nodeAgent is a running tunwall node.
type nodeAgent struct {
	t         *testing.T
	w         *world
	cmd       *exec.Cmd
	stderr    *syncBuffer
	stdout    *syncBuffer
	socket    string
	policyDir string
	auditDir  string
	metrics   string // host:port in the agent namespace
	done      chan struct{}
	// underUnshare: unshare --fork ignores SIGTERM; killing it sends the
	// agent SIGTERM (--kill-child).
	underUnshare bool
}

// nodeSetup is one node's files: the policies, audit directory and socket.
type nodeSetup struct {
	dir, policyDir, auditDir, socket string
	// prefix runs the agent under another program (unshare: a pid
	// namespace of its own, as a pod without hostPID has).
	prefix []string
}

// xdg is the runtime directory the agent and ctl share: the pods' control
// sockets are in xdg()/tunwall.
func (s nodeSetup) xdg() string { return filepath.Join(s.dir, "xdg") }

func newNodeSetup(t *testing.T, w *world, policies map[string]string) nodeSetup {
	t.Helper()
	dir, err := os.MkdirTemp(w.dir, "node-")
	if err != nil {
		t.Fatal(err)
	}
	s := nodeSetup{dir: dir, policyDir: filepath.Join(dir, "policies"), auditDir: filepath.Join(dir, "audit"), socket: filepath.Join(dir, "run", "node.sock")}
	if err := os.Mkdir(s.policyDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(s.xdg(), 0o700); err != nil {
		t.Fatal(err)
	}
	for name, text := range policies {
		writePolicy(t, s.policyDir, name, text)
	}
	return s
}

// writePolicy replaces a policy file as a ConfigMap update does: a new
// file renamed over the old one.
func writePolicy(t *testing.T, dir, name, text string) {
	t.Helper()
	tmp := filepath.Join(dir, "."+name+".tmp")
	if err := os.WriteFile(tmp, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, name+".yaml")); err != nil {
		t.Fatal(err)
	}
}

// startNode starts tunwall node in the agent namespace and waits until it
// listens.
func startNode(t *testing.T, w *world, s nodeSetup, extra ...string) *nodeAgent {
	t.Helper()
	port := 9470 + w.runs.Add(1)
	a := &nodeAgent{t: t, w: w, stderr: &syncBuffer{}, socket: s.socket, policyDir: s.policyDir, auditDir: s.auditDir,
		metrics: fmt.Sprintf("127.0.0.1:%d", port), done: make(chan struct{})}
	args := []string{"node", "--policy-dir", s.policyDir, "--socket", s.socket,
		"--dns-upstream", "192.0.2.53:53", "--resolv-conf", "/dev/null", "--metrics-listen", a.metrics, "--node-name", "node-7"}
	if !hasFlag(extra, "--audit-stdout") {
		args = append(args, "--audit-dir", s.auditDir)
	}
	args = append(args, extra...)
	argv := append(append(append([]string{}, s.prefix...), tunwallBin), args...)
	a.cmd = w.AgentCommand(context.Background(), argv[0], argv[1:]...)
	a.underUnshare = len(s.prefix) > 0
	a.stdout = &syncBuffer{}
	a.cmd.Env = append(os.Environ(), "XDG_RUNTIME_DIR="+s.xdg())
	a.cmd.Stderr = a.stderr
	a.cmd.Stdout = a.stdout
	a.cmd.WaitDelay = 5 * time.Second
	if err := a.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { a.cmd.Wait(); close(a.done) }()
	t.Cleanup(a.stop)
	deadline := time.Now().Add(15 * time.Second)
	for !strings.Contains(a.stderr.String(), "serving pods on") {
		select {
		case <-a.done:
			t.Fatalf("tunwall node exited at start:\n%s", a.stderr)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("tunwall node did not start within 15s:\n%s", a.stderr)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return a
}

// stop ends the agent with SIGTERM (SIGKILL after 10 s), by its pid.
func (a *nodeAgent) stop() {
	select {
	case <-a.done:
		return
	default:
	}
	if a.underUnshare {
		a.cmd.Process.Kill()
	} else {
		a.cmd.Process.Signal(syscall.SIGTERM)
	}
	select {
	case <-a.done:
	case <-time.After(10 * time.Second):
		a.cmd.Process.Kill()
		<-a.done
		a.t.Errorf("tunwall node did not stop on SIGTERM within 10s:\n%s", a.stderr)
	}
}

// scrape reads the node's metrics.
func (a *nodeAgent) scrape() map[string]*dto.MetricFamily {
	a.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	body, err := a.w.AgentCommand(ctx, "curl", "-sS", "--fail", "--max-time", "5", "http://"+a.metrics+"/metrics").Output()
	if err != nil {
		a.t.Fatalf("scrape: %v", err)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := parser.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		a.t.Fatalf("metrics do not parse: %v\n%s", err, body)
	}
	return mfs
}

// podSeries counts the series of family name whose namespace and pod
// labels are ns and pod.
func podSeries(mfs map[string]*dto.MetricFamily, name, ns, pod string) (n int, sum float64) {
	mf := mfs[name]
	if mf == nil {
		return 0, 0
	}
	for _, m := range mf.Metric {
		var gotNS, gotPod string
		for _, l := range m.Label {
			switch l.GetName() {
			case "namespace":
				gotNS = l.GetValue()
			case "pod":
				gotPod = l.GetValue()
			}
		}
		if gotNS == ns && gotPod == pod {
			n++
			sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return n, sum
}

// fakePod is a network namespace standing in for a pod.
type fakePod struct {
	t           *testing.T
	w           *world
	name, ns    string // the pod's Kubernetes name and namespace
	id          string // container id
	netns       string // ip netns name
	annotations map[string]string
}

func newPod(t *testing.T, w *world, ns, name string) *fakePod {
	t.Helper()
	p := &fakePod{t: t, w: w, name: name, ns: ns, id: fmt.Sprintf("%s%x", strings.ReplaceAll(name, "-", ""), time.Now().UnixNano()),
		netns: fmt.Sprintf("twpod-%s-%s", name, w.ID)}
	if out, err := exec.Command("ip", "netns", "add", p.netns).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v\n%s", err, out)
	}
	t.Cleanup(func() {
		exec.Command("ip", "netns", "del", p.netns).Run()
		os.RemoveAll(filepath.Join("/etc/netns", p.netns))
	})
	if out, err := exec.Command("ip", "-n", p.netns, "link", "set", "lo", "up").CombinedOutput(); err != nil {
		t.Fatalf("lo up: %v\n%s", err, out)
	}
	return p
}

func (p *fakePod) path() string { return "/run/netns/" + p.netns }

func (p *fakePod) rt() *libcni.RuntimeConf {
	rt := &libcni.RuntimeConf{ContainerID: p.id, NetNS: p.path(), IfName: "eth0",
		Args: [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", p.ns}, {"K8S_POD_NAME", p.name}, {"K8S_POD_INFRA_CONTAINER_ID", p.id}}}
	if p.annotations != nil {
		rt.CapabilityArgs = map[string]any{"io.kubernetes.cri.pod-annotations": p.annotations}
	}
	return rt
}

// links lists the pod's interfaces.
func (p *fakePod) links() string {
	out, err := exec.Command("ip", "-n", p.netns, "-o", "link", "show").CombinedOutput()
	if err != nil {
		p.t.Fatalf("ip link: %v\n%s", err, out)
	}
	var names []string
	for _, l := range lines(string(out)) {
		f := strings.Fields(l)
		if len(f) > 1 {
			names = append(names, strings.TrimSuffix(strings.Split(f[1], "@")[0], ":"))
		}
	}
	return strings.Join(names, " ")
}

// curl fetches url from inside the pod; it returns the body, or the error.
func (p *fakePod) curl(url string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", p.netns, "curl", "-sS", "--fail", "--max-time", "5", url)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if err != nil {
		return out.String(), fmt.Errorf("%v: %s", err, strings.TrimSpace(errb.String()))
	}
	return out.String(), nil
}

// setResolv writes the pod's resolv.conf from the CNI result, as a runtime
// does (ip netns exec binds /etc/netns/NAME/resolv.conf).
func (p *fakePod) setResolv(r *current.Result) {
	p.t.Helper()
	dir := filepath.Join("/etc/netns", p.netns)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		p.t.Fatal(err)
	}
	var b strings.Builder
	for _, ns := range r.DNS.Nameservers {
		fmt.Fprintf(&b, "nameserver %s\n", ns)
	}
	if err := os.WriteFile(filepath.Join(dir, "resolv.conf"), []byte(b.String()), 0o644); err != nil {
		p.t.Fatal(err)
	}
}

// cniNet is the chained network config, loopback then tunwall-cni.
type cniNet struct {
	t    *testing.T
	cni  *libcni.CNIConfig
	list *libcni.NetworkConfigList
}

func newCNINet(t *testing.T, w *world, socket, defaultPolicy string) *cniNet {
	t.Helper()
	dir := buildCNI(t)
	plugin := map[string]any{"type": "tunwall-cni", "socket": socket, "capabilities": map[string]bool{"io.kubernetes.cri.pod-annotations": true}}
	if defaultPolicy != "" {
		plugin["policy"] = defaultPolicy
	}
	conf, _ := json.Marshal(map[string]any{"cniVersion": "1.0.0", "name": "tunwall-test",
		"plugins": []any{map[string]any{"type": "loopback"}, plugin}})
	list, err := libcni.ConfListFromBytes(conf)
	if err != nil {
		t.Fatal(err)
	}
	cache, err := os.MkdirTemp(w.dir, "cni-cache-")
	if err != nil {
		t.Fatal(err)
	}
	return &cniNet{t: t, cni: libcni.NewCNIConfigWithCacheDir([]string{dir, loopbackDir}, cache, nil), list: list}
}

func (n *cniNet) add(p *fakePod) (*current.Result, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	start := time.Now()
	r, err := n.cni.AddNetworkList(ctx, n.list, p.rt())
	n.t.Logf("CNI ADD %s/%s (%s): %v in %v", p.ns, p.name, p.netns, err, time.Since(start).Round(time.Millisecond))
	if err != nil {
		return nil, err
	}
	res, err := current.NewResultFromResult(r)
	if err != nil {
		n.t.Fatal(err)
	}
	return res, nil
}

func (n *cniNet) mustAdd(p *fakePod) *current.Result {
	n.t.Helper()
	r, err := n.add(p)
	if err != nil {
		n.t.Fatalf("ADD %s: %v", p.name, err)
	}
	p.setResolv(r)
	return r
}

func (n *cniNet) del(p *fakePod) error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	return n.cni.DelNetworkList(ctx, n.list, p.rt())
}

func (n *cniNet) check(p *fakePod) error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	return n.cni.CheckNetworkList(ctx, n.list, p.rt())
}

// podRecords reads a pod's audit log (NAMESPACE_POD_CONTAINERID.jsonl).
func podRecords(t *testing.T, a *nodeAgent, p *fakePod) []audit.Record {
	t.Helper()
	return records(t, filepath.Join(a.auditDir, p.ns+"_"+p.name+"_"+p.id+".jsonl"))
}

// waitFor polls cond every 100 ms until it holds or d passes.
func waitFor(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// agentFDs counts the agent's open descriptors.
func (a *nodeAgent) fds() int {
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", a.cmd.Process.Pid))
	if err != nil {
		a.t.Fatalf("agent fds: %v", err)
	}
	return len(ents)
}

// fdList says what the agent's descriptors are.
func (a *nodeAgent) fdList() string {
	dir := fmt.Sprintf("/proc/%d/fd", a.cmd.Process.Pid)
	ents, _ := os.ReadDir(dir)
	var out []string
	for _, e := range ents {
		l, _ := os.Readlink(filepath.Join(dir, e.Name()))
		out = append(out, e.Name()+"="+l)
	}
	return strings.Join(out, " ")
}

// children lists the agent's child processes (the attach helpers).
func (a *nodeAgent) children() string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", a.cmd.Process.Pid, a.cmd.Process.Pid))
	return strings.TrimSpace(string(b))
}

const (
	webPolicy   = "version: 1\nphases:\n  exec:\n    allow:\n      - host: allowed.test\n        ports: [80]\n"
	otherPolicy = "version: 1\nphases:\n  exec:\n    allow:\n      - host: other.test\n        ports: [80]\n"
)

// TestNodeServesTwoPodsEachOnlyWhatItsOwnPolicyAllows adds two pods
// through libcni: one whose annotation names its policy, one whose
// Kubernetes namespace has a policy file. Each reaches only what its
// policy allows; the records of each carry its identity; the metrics
// count each pod apart, and a deleted pod's series go away. DEL, twice,
// leaves no interface, process, descriptor or state behind.
func TestNodeServesTwoPodsEachOnlyWhatItsOwnPolicyAllows(t *testing.T) {
	w := newWorld(t)
	s := newNodeSetup(t, w, map[string]string{"web": webPolicy, "team-b": otherPolicy})
	a := startNode(t, w, s)
	n := newCNINet(t, w, a.socket, "")
	fds0 := a.fds()

	pa := newPod(t, w, "team-a", "pod-a")
	pa.annotations = map[string]string{"tunwall.dev/policy": "web"}
	pb := newPod(t, w, "team-b", "pod-b")
	ra := n.mustAdd(pa)
	n.mustAdd(pb)

	// The result: lo from loopback, then eth0 with the pod's addresses.
	if len(ra.Interfaces) != 2 || ra.Interfaces[1].Name != "eth0" || ra.Interfaces[1].Sandbox != pa.path() {
		t.Errorf("ADD result interfaces: %+v", ra.Interfaces)
	}
	var ips []string
	for _, ip := range ra.IPs {
		ips = append(ips, ip.Address.String())
	}
	if !strings.Contains(strings.Join(ips, " "), "198.18.0.2/32") || len(ra.DNS.Nameservers) == 0 {
		t.Errorf("ADD result: IPs %v, DNS %+v", ips, ra.DNS)
	}
	if got := pa.links(); got != "lo eth0" {
		t.Errorf("pod-a's interfaces: %q, want lo and the TUN only", got)
	}

	for _, c := range []struct {
		p       *fakePod
		url     string
		allowed bool
	}{
		{pa, "http://allowed.test/a", true},
		{pa, "http://other.test/a", false},
		{pb, "http://other.test/b", true},
		{pb, "http://allowed.test/b", false},
		{pb, "http://192.0.2.66/", false},
	} {
		body, err := c.p.curl(c.url)
		switch {
		case c.allowed && err != nil:
			t.Errorf("%s: %s: %v", c.p.name, c.url, err)
		case c.allowed && !strings.Contains(body, strings.Split(c.url, "/")[2]):
			t.Errorf("%s: %s answered %q", c.p.name, c.url, body)
		case !c.allowed && err == nil:
			t.Errorf("%s: %s was reached (%q), its policy does not allow it", c.p.name, c.url, body)
		}
	}
	w.noArrivals("evil")

	// Every record of each pod carries its identity, and the node.
	for _, c := range []struct {
		p            *fakePod
		policy, deny string
	}{{pa, "web", "other.test"}, {pb, "team-b", "allowed.test"}} {
		var denied bool
		waitFor(5*time.Second, func() bool {
			for _, r := range podRecords(t, a, c.p) {
				if r.Verdict == "deny" && r.Host == c.deny {
					return true
				}
			}
			return false
		})
		recs := podRecords(t, a, c.p)
		for _, r := range recs {
			l := r.Labels.Map()
			if l["k8s_namespace"] != c.p.ns || l["k8s_pod"] != c.p.name || l["container_id"] != c.p.id || l["policy"] != c.policy || l["node"] != "node-7" {
				t.Errorf("%s: a %s record's labels: %v", c.p.name, r.Kind, l)
				break
			}
			denied = denied || (r.Verdict == "deny" && r.Host == c.deny)
		}
		if !denied {
			t.Errorf("%s: no denial of %s recorded in %d records", c.p.name, c.deny, len(recs))
		}
	}

	// tunwall ctl ls lists the pods, by their labels.
	ctl := exec.Command(tunwallBin, "ctl", "ls", "--json")
	ctl.Env = append(os.Environ(), "XDG_RUNTIME_DIR="+s.xdg())
	out, err := ctl.Output()
	var runs []struct {
		Labels map[string]string `json:"labels"`
	}
	if err == nil {
		err = json.Unmarshal(out, &runs)
	}
	var listed []string
	for _, r := range runs {
		listed = append(listed, r.Labels["k8s_namespace"]+"/"+r.Labels["k8s_pod"])
	}
	if err != nil || strings.Join(listed, " ") != "team-a/pod-a team-b/pod-b" {
		t.Errorf("ctl ls --json lists %q (%v)\n%s", listed, err, out)
	}

	// Metrics per pod; DEL takes a pod's series away.
	mfs := a.scrape()
	if k, v := podSeries(mfs, "tunwall_flows_total", "team-a", "pod-a"); k == 0 || v < 1 {
		t.Errorf("pod-a: %d flow series summing %v, want its allowed flow", k, v)
	}
	if k, v := podSeries(mfs, "tunwall_dns_queries_total", "team-a", "pod-a"); k < 2 || v < 2 {
		t.Errorf("pod-a: %d DNS series summing %v, want its allowed and denied names", k, v)
	}
	if got := mfs["tunwall_served_namespaces"].GetMetric()[0].GetGauge().GetValue(); got != 2 {
		t.Errorf("tunwall_served_namespaces %v, want 2", got)
	}
	for i := range 2 {
		if err := n.del(pa); err != nil {
			t.Fatalf("DEL pod-a (%d): %v", i+1, err)
		}
	}
	mfs = a.scrape()
	if k, _ := podSeries(mfs, "tunwall_flows_total", "team-a", "pod-a"); k != 0 {
		t.Errorf("pod-a's flow series are still there after DEL: %d", k)
	}
	if k, _ := podSeries(mfs, "tunwall_flows_total", "team-b", "pod-b"); k == 0 {
		t.Errorf("pod-b's flow series went with pod-a's DEL")
	}
	if got := pa.links(); got != "lo" {
		t.Errorf("pod-a's interfaces after DEL: %q, want lo only", got)
	}
	if _, err := pa.curl("http://allowed.test/"); err == nil {
		t.Errorf("pod-a still reaches allowed.test after DEL")
	}
	for i := range 2 {
		if err := n.del(pb); err != nil {
			t.Fatalf("DEL pod-b (%d): %v", i+1, err)
		}
	}
	if got := pb.links(); got != "lo" {
		t.Errorf("pod-b's interfaces after DEL: %q", got)
	}
	if !waitFor(5*time.Second, func() bool { return a.fds() <= fds0 }) {
		t.Errorf("the agent holds %d descriptors after both DELs, %d before the ADDs: %s", a.fds(), fds0, a.fdList())
	}
	if c := a.children(); c != "" {
		t.Errorf("the agent has child processes after DEL: %s", c)
	}
	if got := a.scrape()["tunwall_served_namespaces"].GetMetric()[0].GetGauge().GetValue(); got != 0 {
		t.Errorf("tunwall_served_namespaces %v after DEL, want 0", got)
	}
	// The audit logs stay (they are the record), complete and verified.
	for _, p := range []*fakePod{pa, pb} {
		out, err := exec.Command(tunwallBin, "audit", "verify", filepath.Join(a.auditDir, p.ns+"_"+p.name+"_"+p.id+".jsonl")).CombinedOutput()
		if err != nil {
			t.Errorf("audit verify %s: %v\n%s", p.name, err, out)
		}
	}
	ents, _ := os.ReadDir(filepath.Dir(a.socket))
	if len(ents) != 1 {
		t.Errorf("the socket directory holds %d entries, want the socket only", len(ents))
	}
	if ents, _ := os.ReadDir(filepath.Join(s.xdg(), "tunwall")); len(ents) != 0 {
		t.Errorf("the pods' control sockets are still there after DEL: %v", ents)
	}
	t.Logf("agent stderr:\n%s", a.stderr)
}

// TestNodeAPolicyFileChangedOnDiskTakesEffectWithoutRestart changes a
// served pod's policy file: the new rules apply to its next flows, with no
// restart of the agent or DEL/ADD of the pod, and the open flow they deny
// is cut (recorded as revoked, after a phase record naming the policy
// directory); a broken version keeps the one in effect, said on stderr and
// counted in the metrics.
func TestNodeAPolicyFileChangedOnDiskTakesEffectWithoutRestart(t *testing.T) {
	w := newWorld(t)
	s := newNodeSetup(t, w, map[string]string{"team-c": webPolicy})
	a := startNode(t, w, s)
	n := newCNINet(t, w, a.socket, "")
	p := newPod(t, w, "team-c", "pod-c")
	n.mustAdd(p)
	defer n.del(p)
	if _, err := p.curl("http://allowed.test/"); err != nil {
		t.Fatalf("before the change: %v", err)
	}
	if _, err := p.curl("http://other.test/"); err == nil {
		t.Fatalf("before the change other.test was reached")
	}
	// Broken: the old version stays.
	writePolicy(t, a.policyDir, "team-c", "version: 1\nphases: [\n")
	if !waitFor(5*time.Second, func() bool { return strings.Contains(a.stderr.String(), "keeping the version in effect") }) {
		t.Fatalf("a broken policy file was not reported:\n%s", a.stderr)
	}
	if _, err := p.curl("http://allowed.test/"); err != nil {
		t.Errorf("after a broken change, the old rules should hold: %v", err)
	}
	if mf := a.scrape()["tunwall_policy_reload_errors_total"]; mf == nil || mf.GetMetric()[0].GetCounter().GetValue() < 1 {
		t.Errorf("tunwall_policy_reload_errors_total: %v", mf)
	}
	// A download in progress that the narrowed policy denies.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	slow := exec.CommandContext(ctx, "ip", "netns", "exec", p.netns, "curl", "-sS", "--fail", "--limit-rate", "20k", "-o", "/dev/null", "http://allowed.test/bytes/100000000")
	slowDone := make(chan error, 1)
	if err := slow.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { slowDone <- slow.Wait() }()
	time.Sleep(500 * time.Millisecond)
	// Narrowed to other.test only.
	writePolicy(t, a.policyDir, "team-c", otherPolicy)
	if !waitFor(10*time.Second, func() bool {
		_, err := p.curl("http://other.test/")
		return err == nil
	}) {
		t.Fatalf("the changed policy did not take effect within 10s:\n%s", a.stderr)
	}
	if _, err := p.curl("http://allowed.test/"); err == nil {
		t.Errorf("allowed.test is still reached after the policy dropped it")
	}
	select {
	case err := <-slowDone:
		if err == nil {
			t.Errorf("the download the new policy denies completed")
		}
	case <-time.After(10 * time.Second):
		t.Errorf("the download the new policy denies still runs 10s after the change")
	}
	var phase, revoked bool
	waitFor(5*time.Second, func() bool {
		phase, revoked = false, false
		for _, r := range podRecords(t, a, p) {
			phase = phase || (r.Kind == audit.KindPhase && strings.Contains(r.Reason, "policy-dir"))
			revoked = revoked || (r.Kind == audit.KindFlow && r.Host == "allowed.test" && r.Outcome == "revoked")
		}
		return phase && revoked
	})
	if !phase || !revoked {
		t.Errorf("records: a phase record from the policy directory %v, the download revoked %v", phase, revoked)
	}
	t.Logf("agent stderr:\n%s", a.stderr)
}

// TestNodeCheckReportsAPodWhoseTUNWasRemoved: CHECK passes for a served
// pod, fails once its TUN is deleted from inside its namespace; DEL then
// succeeds.
func TestNodeCheckReportsAPodWhoseTUNWasRemoved(t *testing.T) {
	w := newWorld(t)
	s := newNodeSetup(t, w, map[string]string{"web": webPolicy})
	a := startNode(t, w, s)
	n := newCNINet(t, w, a.socket, "web")
	p := newPod(t, w, "team-d", "pod-d")
	n.mustAdd(p)
	if err := n.check(p); err != nil {
		t.Fatalf("CHECK of a served pod: %v", err)
	}
	if out, err := exec.Command("ip", "-n", p.netns, "link", "del", "eth0").CombinedOutput(); err != nil {
		t.Fatalf("ip link del: %v\n%s", err, out)
	}
	var err error
	if !waitFor(5*time.Second, func() bool { err = n.check(p); return err != nil }) {
		t.Fatalf("CHECK passes for a pod whose TUN was removed")
	}
	t.Logf("CHECK: %v", err)
	if err := n.del(p); err != nil {
		t.Errorf("DEL: %v", err)
	}
	if got := p.links(); got != "lo" {
		t.Errorf("interfaces: %q", got)
	}
}

// TestNodeAddFailsCleanlyWithTheAgentDownOrFull: with no agent, ADD fails
// with a CNI error (try again later) and leaves the namespace as it was;
// DEL succeeds. An agent at its --max-namespaces bound, or with no policy
// for the pod, refuses the same way.
func TestNodeAddFailsCleanlyWithTheAgentDownOrFull(t *testing.T) {
	w := newWorld(t)
	s := newNodeSetup(t, w, map[string]string{"web": webPolicy})
	n := newCNINet(t, w, s.socket, "web")
	p := newPod(t, w, "team-e", "pod-e")
	_, err := n.add(p)
	var te *types.Error
	if !errors.As(err, &te) || te.Code != types.ErrTryAgainLater {
		t.Fatalf("ADD with no agent: %v (want a CNI error %d)", err, types.ErrTryAgainLater)
	}
	t.Logf("ADD with no agent: %v", err)
	if got := p.links(); got != "lo" {
		t.Errorf("interfaces after a failed ADD: %q", got)
	}
	if err := n.del(p); err != nil {
		t.Errorf("DEL with no agent: %v", err)
	}

	a := startNode(t, w, s, "--max-namespaces", "1")
	n.mustAdd(p)
	q := newPod(t, w, "team-e", "pod-f")
	_, err = n.add(q)
	if !errors.As(err, &te) || te.Code != types.ErrTryAgainLater || !strings.Contains(err.Error(), "max-namespaces") {
		t.Errorf("ADD past --max-namespaces: %v", err)
	}
	if got := q.links(); got != "lo" {
		t.Errorf("interfaces after a refused ADD: %q", got)
	}
	if err := n.del(p); err != nil {
		t.Fatal(err)
	}
	// No policy: no annotation, no file for the namespace, no default.
	bare := newCNINet(t, w, a.socket, "")
	_, err = bare.add(q)
	if !errors.As(err, &te) || te.Code != types.ErrInvalidNetworkConfig {
		t.Errorf("ADD with no policy: %v", err)
	}
	if got := q.links(); got != "lo" {
		t.Errorf("interfaces after ADD with no policy: %q", got)
	}
	// An annotation naming a policy that does not exist never falls back.
	q.annotations = map[string]string{"tunwall.dev/policy": "nope"}
	if _, err = n.add(q); err == nil || !strings.Contains(err.Error(), "nope") {
		t.Errorf("ADD with an unknown policy annotation: %v", err)
	}
	if got := q.links(); got != "lo" {
		t.Errorf("interfaces after ADD with an unknown policy: %q", got)
	}
}

// TestNodeSIGKILLLeavesPodsWithoutNetworkAndARestartedAgentServesNewPods:
// the served pods' TUNs die with the agent (fail closed); a new agent on
// the same socket serves new pods.
func TestNodeSIGKILLLeavesPodsWithoutNetworkAndARestartedAgentServesNewPods(t *testing.T) {
	w := newWorld(t)
	s := newNodeSetup(t, w, map[string]string{"web": webPolicy})
	a := startNode(t, w, s)
	n := newCNINet(t, w, a.socket, "web")
	p := newPod(t, w, "team-g", "pod-g")
	n.mustAdd(p)
	if _, err := p.curl("http://allowed.test/"); err != nil {
		t.Fatalf("served pod: %v", err)
	}
	a.cmd.Process.Kill()
	<-a.done
	if !waitFor(5*time.Second, func() bool { return p.links() == "lo" }) {
		t.Errorf("the pod keeps interfaces %q after the agent's SIGKILL", p.links())
	}
	start := time.Now()
	if _, err := p.curl("http://allowed.test/"); err == nil {
		t.Errorf("the pod reaches allowed.test with its agent dead")
	}
	t.Logf("curl with the agent dead failed in %v", time.Since(start).Round(time.Millisecond))
	if err := n.check(p); err == nil {
		t.Errorf("CHECK passes with the agent dead")
	}
	if err := n.del(p); err != nil {
		t.Errorf("DEL with the agent dead: %v", err)
	}

	b := startNode(t, w, s)
	q := newPod(t, w, "team-g", "pod-h")
	n.mustAdd(q)
	if _, err := q.curl("http://allowed.test/"); err != nil {
		t.Errorf("a new pod under the restarted agent: %v", err)
	}
	if err := n.del(q); err != nil {
		t.Error(err)
	}
	_ = b
}

// TestNodeServesTwentyPodsWithFiveFlowsEach: one agent, 20 pods added one
// after another, each fetching 5 downloads at once; every fetch arrives
// whole; all DELs leave nothing. Prints the agent's memory and descriptors.
func TestNodeServesTwentyPodsWithFiveFlowsEach(t *testing.T) {
	w := newWorld(t)
	s := newNodeSetup(t, w, map[string]string{"web": webPolicy})
	a := startNode(t, w, s)
	n := newCNINet(t, w, a.socket, "web")
	const pods, flows, size = 20, 5, 200000
	var ps []*fakePod
	start := time.Now()
	for i := range pods {
		p := newPod(t, w, "fleet", fmt.Sprintf("p%02d", i))
		n.mustAdd(p)
		ps = append(ps, p)
	}
	t.Logf("%d ADDs in %v", pods, time.Since(start).Round(time.Millisecond))
	fds, rss := a.fds(), rssKiB(a.cmd.Process.Pid)
	var wg sync.WaitGroup
	errs := make(chan error, pods)
	for _, p := range ps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			script := ""
			for i := range flows {
				script += fmt.Sprintf("curl -sS --fail --max-time 20 -o /tmp/%s-%d http://allowed.test/bytes/%d & ", p.netns, i, size)
			}
			script += "wait; for f in /tmp/" + p.netns + "-*; do wc -c <$f; done; rm -f /tmp/" + p.netns + "-*"
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			out, err := exec.CommandContext(ctx, "ip", "netns", "exec", p.netns, "sh", "-c", script).CombinedOutput()
			if err != nil || strings.Count(string(out), fmt.Sprint(size)) != flows {
				errs <- fmt.Errorf("%s: %v\n%s", p.name, err, out)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	peak := rssKiB(a.cmd.Process.Pid)
	t.Logf("agent serving %d pods: %d descriptors, RSS %d KiB idle, %d KiB after %d flows each", pods, fds, rss, peak, flows)
	for _, p := range ps {
		if err := n.del(p); err != nil {
			t.Errorf("DEL %s: %v", p.name, err)
		}
	}
	if got := a.scrape()["tunwall_served_namespaces"].GetMetric()[0].GetGauge().GetValue(); got != 0 {
		t.Errorf("served after all DELs: %v", got)
	}
}

// rssKiB is a process's resident set (VmRSS), in KiB.
func rssKiB(pid int) int {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	for _, l := range lines(string(b)) {
		if strings.HasPrefix(l, "VmRSS:") {
			var n int
			fmt.Sscanf(strings.TrimSpace(strings.TrimPrefix(l, "VmRSS:")), "%d", &n)
			return n
		}
	}
	return 0
}

// cniAs runs tunwall-cni by hand, as a runtime would, with prefix before
// it (setpriv, unshare, ip netns exec): what an attacker on the node who
// found the agent's socket can send.
func cniAs(t *testing.T, prefix []string, command string, p *fakePod, socket string) (string, error) {
	t.Helper()
	conf := fmt.Sprintf(`{"cniVersion":"1.0.0","name":"tunwall-test","type":"tunwall-cni","socket":%q,"policy":"web"}`, socket)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	argv := append(append([]string{}, prefix...), filepath.Join(buildCNI(t), "tunwall-cni"))
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), "CNI_COMMAND="+command, "CNI_CONTAINERID="+p.id, "CNI_NETNS="+p.path(), "CNI_IFNAME=eth0",
		"CNI_PATH="+buildCNI(t), "CNI_ARGS=IgnoreUnknown=1;K8S_POD_NAMESPACE="+p.ns+";K8S_POD_NAME="+p.name)
	cmd.Stdin = strings.NewReader(conf)
	out, err := cmd.CombinedOutput()
	t.Logf("%s tunwall-cni %s: %v\n%s", strings.Join(prefix, " "), command, err, out)
	return string(out), err
}

// TestNodeSocketRefusesAllButTheHostsRoot attacks the agent's socket the
// ways a pod or an unprivileged user on the node could: as nobody; as root
// of a user namespace of its own (as a pod with user namespaces is); and
// as root of the host but from inside a served pod's network namespace (a
// privileged pod that found the socket). Every call is refused: nothing is
// added, and the served pod is not deleted.
func TestNodeSocketRefusesAllButTheHostsRoot(t *testing.T) {
	requireTools(t, "setpriv", "unshare")
	w := newWorld(t)
	s := newNodeSetup(t, w, map[string]string{"web": webPolicy})
	os.Chmod(filepath.Dir(filepath.Dir(s.socket)), 0o755)
	a := startNode(t, w, s)
	n := newCNINet(t, w, a.socket, "web")
	served := newPod(t, w, "team-x", "served")
	n.mustAdd(served)
	victim := newPod(t, w, "team-x", "victim")

	for _, c := range []struct {
		name   string
		prefix []string
		pod    *fakePod
		cmd    string
	}{
		{"nobody adds a pod", []string{"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"}, victim, "ADD"},
		{"root of another user namespace adds a pod", []string{"unshare", "--user", "--map-root-user", "--"}, victim, "ADD"},
		{"root of another user namespace deletes the served pod", []string{"unshare", "--user", "--map-root-user", "--"}, served, "DEL"},
		{"the served pod's namespace adds another pod", []string{"ip", "netns", "exec", served.netns}, victim, "ADD"},
		{"the served pod's namespace deletes itself", []string{"ip", "netns", "exec", served.netns}, served, "DEL"},
	} {
		out, err := cniAs(t, c.prefix, c.cmd, c.pod, a.socket)
		if c.cmd == "ADD" && err == nil {
			t.Errorf("%s: ADD succeeded:\n%s", c.name, out)
		}
		if got := victim.links(); got != "lo" {
			t.Errorf("%s: the victim namespace has %q", c.name, got)
		}
		if _, err := served.curl("http://allowed.test/"); err != nil {
			t.Errorf("%s: the served pod lost its network: %v", c.name, err)
		}
	}
	if strings.Contains(a.stderr.String(), "victim") {
		t.Errorf("the agent served or mentions the victim:\n%s", a.stderr)
	}
	if strings.Contains(a.stderr.String(), "stopped serving") {
		t.Errorf("the agent stopped serving a pod:\n%s", a.stderr)
	}
	if err := n.del(served); err != nil {
		t.Error(err)
	}
}

// TestNodeAuditStdoutInterleavesWholeSelfDescribingLines: with
// --audit-stdout, two pods' records come out on the agent's stdout, whole
// lines interleaved, each naming its run and carrying its pod's labels;
// tunwall audit verify checks every run's chain in the capture, and
// summary --by k8s_pod groups by pod.
func TestNodeAuditStdoutInterleavesWholeSelfDescribingLines(t *testing.T) {
	w := newWorld(t)
	s := newNodeSetup(t, w, map[string]string{"web": webPolicy})
	a := startNode(t, w, s, "--audit-stdout")
	n := newCNINet(t, w, a.socket, "web")
	pods := []*fakePod{newPod(t, w, "team-s", "pod-s1"), newPod(t, w, "team-s", "pod-s2")}
	for _, p := range pods {
		n.mustAdd(p)
	}
	var wg sync.WaitGroup
	for _, p := range pods {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 3 {
				p.curl("http://allowed.test/")
				p.curl("http://denied.test/")
			}
		}()
	}
	wg.Wait()
	for _, p := range pods {
		if err := n.del(p); err != nil {
			t.Fatal(err)
		}
	}
	byRun := map[string][]string{}
	podOf := map[string]string{}
	for _, l := range lines(a.stdout.String()) {
		var rec struct {
			Run    string            `json:"run"`
			Labels map[string]string `json:"labels"`
		}
		if err := json.Unmarshal([]byte(l), &rec); err != nil {
			t.Fatalf("a line on stdout is not one record: %v\n%q", err, l)
		}
		if rec.Run == "" || rec.Labels["k8s_pod"] == "" || rec.Labels["node"] != "node-7" {
			t.Errorf("a line does not say whose it is: %s", l)
		}
		if prev, ok := podOf[rec.Run]; ok && prev != rec.Labels["k8s_pod"] {
			t.Errorf("run %s has lines of %s and %s", rec.Run, prev, rec.Labels["k8s_pod"])
		}
		podOf[rec.Run] = rec.Labels["k8s_pod"]
		byRun[rec.Run] = append(byRun[rec.Run], l)
	}
	if len(byRun) != 2 {
		t.Fatalf("%d runs on stdout, want 2 (one a pod):\n%s", len(byRun), a.stdout)
	}
	// The capture, as a log shipper keeps it: tunwall audit verify tells
	// the runs apart and checks each chain; summary groups by pod.
	capture := filepath.Join(w.dir, "node-stdout.jsonl")
	if err := os.WriteFile(capture, []byte(a.stdout.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(tunwallBin, "audit", "verify", capture).CombinedOutput(); err != nil {
		t.Errorf("audit verify of the capture: %v\n%s", err, out)
	} else {
		t.Logf("audit verify:\n%s", out)
	}
	out, err := exec.Command(tunwallBin, "audit", "summary", "--by", "k8s_pod", capture).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "pod-s1") || !strings.Contains(string(out), "pod-s2") {
		t.Errorf("audit summary --by k8s_pod of the capture: %v\n%s", err, out)
	}
}

// TestNodeGCAndStatusOfTheCNI11Verbs: STATUS says the agent is there (and
// error 50 once it is gone is the plugin's answer); GC stops serving the
// network's pods the runtime no longer lists, and keeps the rest.
// (tunwall-cni alone: Debian's loopback plugin speaks CNI 1.0 at most.)
func TestNodeGCAndStatusOfTheCNI11Verbs(t *testing.T) {
	w := newWorld(t)
	s := newNodeSetup(t, w, map[string]string{"web": webPolicy})
	a := startNode(t, w, s)
	conf, _ := json.Marshal(map[string]any{"cniVersion": "1.1.0", "name": "tunwall-gc",
		"plugins": []any{map[string]any{"type": "tunwall-cni", "socket": a.socket, "policy": "web"}}})
	list, err := libcni.ConfListFromBytes(conf)
	if err != nil {
		t.Fatal(err)
	}
	cache, _ := os.MkdirTemp(w.dir, "cni-cache-")
	n := &cniNet{t: t, cni: libcni.NewCNIConfigWithCacheDir([]string{buildCNI(t)}, cache, nil), list: list}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := n.cni.GetStatusNetworkList(ctx, list); err != nil {
		t.Fatalf("STATUS with the agent up: %v", err)
	}
	keep, drop := newPod(t, w, "team-gc", "keep"), newPod(t, w, "team-gc", "drop")
	n.mustAdd(keep)
	n.mustAdd(drop)
	if err := n.cni.GCNetworkList(ctx, list, &libcni.GCArgs{ValidAttachments: []types.GCAttachment{{ContainerID: keep.id, IfName: "eth0"}}}); err != nil {
		t.Fatalf("GC: %v", err)
	}
	if got := drop.links(); got != "lo" {
		t.Errorf("the pod GC dropped keeps %q", got)
	}
	if got := keep.links(); got != "lo eth0" {
		t.Errorf("the pod GC kept has %q", got)
	}
	if _, err := keep.curl("http://allowed.test/"); err != nil {
		t.Errorf("the kept pod: %v", err)
	}
	a.stop()
	err = n.cni.GetStatusNetworkList(ctx, list)
	var te *types.Error
	if !errors.As(err, &te) || te.Code != types.ErrPluginNotAvailable {
		t.Errorf("STATUS with the agent down: %v, want error %d", err, types.ErrPluginNotAvailable)
	}
}

// TestNodeAgentWithoutTheHostsPidNamespaceStillChecksItsPeers runs the
// agent in a pid namespace of its own, as a DaemonSet pod without hostPID:
// the plugin's process is invisible to it, yet the runtime's calls are
// served (the peer's namespaces read through its pidfd) and a call from
// inside a served pod's network namespace is still refused.
func TestNodeAgentWithoutTheHostsPidNamespaceStillChecksItsPeers(t *testing.T) {
	requireTools(t, "unshare")
	w := newWorld(t)
	s := newNodeSetup(t, w, map[string]string{"web": webPolicy})
	s.prefix = []string{"unshare", "--pid", "--fork", "--mount-proc", "--kill-child=SIGTERM"}
	a := startNode(t, w, s)
	n := newCNINet(t, w, a.socket, "web")
	p := newPod(t, w, "team-p", "pod-p")
	n.mustAdd(p)
	if _, err := p.curl("http://allowed.test/"); err != nil {
		t.Errorf("served pod: %v", err)
	}
	victim := newPod(t, w, "team-p", "victim")
	if _, err := cniAs(t, []string{"ip", "netns", "exec", p.netns}, "ADD", victim, a.socket); err == nil {
		t.Errorf("a call from inside the served pod was accepted")
	}
	if got := victim.links(); got != "lo" {
		t.Errorf("the victim has %q", got)
	}
	if err := n.del(p); err != nil {
		t.Error(err)
	}
	if got := p.links(); got != "lo" {
		t.Errorf("after DEL: %q", got)
	}
}

// TestNodeANamespaceWithAnotherWayOutIsNeverServed: an ADD of a namespace
// that already has an interface besides lo is refused (CNI error 8) and
// leaves it as it was; a served pod that gains one is dropped at once (its
// TUN removed, so tunwall never records traffic that may leave another
// way), and CHECK then fails.
func TestNodeANamespaceWithAnotherWayOutIsNeverServed(t *testing.T) {
	w := newWorld(t)
	s := newNodeSetup(t, w, map[string]string{"web": webPolicy})
	a := startNode(t, w, s)
	n := newCNINet(t, w, a.socket, "web")
	open := newPod(t, w, "team-o", "open")
	if out, err := exec.Command("ip", "-n", open.netns, "link", "add", "side0", "type", "veth", "peer", "name", "side0p").CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	_, err := n.add(open)
	var te *types.Error
	if !errors.As(err, &te) || te.Code != types.ErrInvalidNetNS || !strings.Contains(err.Error(), "side0") {
		t.Errorf("ADD of a namespace with another interface: %v", err)
	}
	// It says what the cluster's operator can do (no flag of attach's).
	if err == nil || strings.Contains(err.Error(), "--force") || !strings.Contains(err.Error(), "tunwall-cni alone") {
		t.Errorf("ADD's refusal does not say how to fix the network config: %v", err)
	}
	if got := open.links(); got != "lo side0p side0" && got != "lo side0 side0p" {
		t.Errorf("after the refused ADD: %q", got)
	}
	p := newPod(t, w, "team-o", "later")
	n.mustAdd(p)
	if out, err := exec.Command("ip", "-n", p.netns, "link", "add", "side1", "type", "veth", "peer", "name", "side1p").CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if !waitFor(5*time.Second, func() bool { return !strings.Contains(p.links(), "eth0") }) {
		t.Errorf("the pod that gained side1 is still served: %q", p.links())
	}
	if err := n.check(p); err == nil {
		t.Errorf("CHECK passes for a pod that was dropped")
	}
	if !strings.Contains(a.stderr.String(), "side1") {
		t.Errorf("the agent did not say why it dropped the pod:\n%s", a.stderr)
	}
	if err := n.del(p); err != nil {
		t.Error(err)
	}
}
