package integration

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tunwall/tunwall/internal/audit"
)

// upstreamAsked counts the questions about name the world's resolver has
// received, any type.
func upstreamAsked(w *world, name string) int {
	n := 0
	for _, q := range w.DNS.Log() {
		if q.Name == name {
			n++
		}
	}
	return n
}

// TestNodePodsShareAResolverCacheOnlyWithinANamespaceAndPolicy: two pods
// of one Kubernetes namespace under one policy share the upstream
// resolver, so the second one's lookup of a name is a cache hit (no
// upstream question). A pod of another Kubernetes namespace, or under
// another policy with the same rules, has its own cache: its lookup goes
// upstream, so it cannot tell by timing what another tenant looked up.
func TestNodePodsShareAResolverCacheOnlyWithinANamespaceAndPolicy(t *testing.T) {
	w := newWorld(t)
	s := newNodeSetup(t, w, map[string]string{"web": webPolicy, "web-copy": webPolicy})
	a := startNode(t, w, s)
	n := newCNINet(t, w, a.socket, "web")

	a1 := newPod(t, w, "team-a", "pod-a1")
	a2 := newPod(t, w, "team-a", "pod-a2")
	b1 := newPod(t, w, "team-b", "pod-b1")
	c1 := newPod(t, w, "team-a", "pod-c1")
	c1.annotations = map[string]string{"tunwall.dev/policy": "web-copy"}
	for _, p := range []*fakePod{a1, a2, b1, c1} {
		n.mustAdd(p)
		defer n.del(p)
	}

	const name = "allowed.test"
	step := func(p *fakePod) int {
		t.Helper()
		before := upstreamAsked(w, name)
		if _, err := p.curl("http://" + name + "/"); err != nil {
			t.Fatalf("%s/%s: %v", p.ns, p.name, err)
		}
		return upstreamAsked(w, name) - before
	}
	if got := step(a1); got == 0 {
		t.Fatalf("team-a/pod-a1's first lookup of %s asked the upstream nothing", name)
	}
	if got := step(a2); got != 0 {
		t.Errorf("team-a/pod-a2 (same namespace, same policy) asked the upstream %d questions about %s: want 0, a cache hit", got, name)
	}
	if got := step(b1); got == 0 {
		t.Errorf("team-b/pod-b1 (another namespace) asked the upstream nothing about %s: it shares team-a's cache", name)
	}
	if got := step(c1); got == 0 {
		t.Errorf("team-a/pod-c1 (another policy) asked the upstream nothing about %s: it shares policy web's cache", name)
	}

	// team-a under web, team-b under web, team-a under web-copy; none
	// left once every pod is deleted.
	if got := resolversHeld(a); got != 3 {
		t.Errorf("tunwall_dns_resolvers %v with 4 pods in 3 trust boundaries, want 3", got)
	}
	for _, p := range []*fakePod{a1, a2, b1, c1} {
		if err := n.del(p); err != nil {
			t.Errorf("DEL %s: %v", p.name, err)
		}
	}
	if got := resolversHeld(a); got != 0 {
		t.Errorf("tunwall_dns_resolvers %v after every pod's DEL, want 0", got)
	}
}

// resolversHeld is the agent's tunwall_dns_resolvers, or -1 if absent.
func resolversHeld(a *nodeAgent) float64 {
	mf := a.scrape()["tunwall_dns_resolvers"]
	if mf == nil || len(mf.GetMetric()) != 1 {
		return -1
	}
	return mf.GetMetric()[0].GetGauge().GetValue()
}

// headerUpstream is the dns_upstream of p's audit header.
func headerUpstream(t *testing.T, a *nodeAgent, p *fakePod) string {
	t.Helper()
	lines := auditRaw(t, filepath.Join(a.auditDir, p.ns+"_"+p.name+"_"+p.id+".jsonl"))
	if len(lines) == 0 || auditStr(lines[0], "kind") != audit.KindHeader {
		t.Fatalf("%s: no header", p.name)
	}
	cfg, _ := lines[0]["config"].(map[string]any)
	up, _ := cfg["dns_upstream"].(string)
	return up
}

// TestNodeAChangedDNSUpstreamIsSaidAndReachesOnlyNewPods: a served pod's
// resolver cannot change, so a policy change naming another dns.upstream
// puts its rules into effect for the served pod, says on stderr that its
// upstream stays (counted as a reload error, never silently ignored), and
// a pod added after it resolves through the new upstream.
func TestNodeAChangedDNSUpstreamIsSaidAndReachesOnlyNewPods(t *testing.T) {
	w := newWorld(t)
	s := newNodeSetup(t, w, map[string]string{"team-d": webPolicy})
	a := startNode(t, w, s)
	n := newCNINet(t, w, a.socket, "")
	p1 := newPod(t, w, "team-d", "pod-d1")
	n.mustAdd(p1)
	defer n.del(p1)
	if _, err := p1.curl("http://allowed.test/"); err != nil {
		t.Fatalf("before the change: %v", err)
	}
	writePolicy(t, a.policyDir, "team-d", otherPolicy+"dns:\n  upstream: 192.0.2.54:53\n")
	if !waitFor(10*time.Second, func() bool { return strings.Contains(a.stderr.String(), "resolver cannot change") }) {
		t.Fatalf("the changed dns.upstream was not said:\n%s", a.stderr)
	}
	if mf := a.scrape()["tunwall_policy_reload_errors_total"]; mf == nil || mf.GetMetric()[0].GetCounter().GetValue() < 1 {
		t.Errorf("tunwall_policy_reload_errors_total: %v", mf)
	}
	// The new rules are in effect; the old upstream still answers.
	if _, err := p1.curl("http://other.test/"); err != nil {
		t.Errorf("after the change, other.test: %v", err)
	}
	if _, err := p1.curl("http://allowed.test/"); err == nil {
		t.Errorf("after the change, allowed.test is still reached")
	}
	if got := headerUpstream(t, a, p1); !strings.HasPrefix(got, "192.0.2.53:53") {
		t.Errorf("pod-d1's header: dns_upstream %q", got)
	}
	p2 := newPod(t, w, "team-d", "pod-d2")
	n.mustAdd(p2)
	defer n.del(p2)
	if got := headerUpstream(t, a, p2); !strings.HasPrefix(got, "192.0.2.54:53") {
		t.Errorf("pod-d2, added after the change: dns_upstream %q, want the policy's new 192.0.2.54:53", got)
	}
}
