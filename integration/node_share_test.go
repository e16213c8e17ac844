package integration

import (
	"testing"
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
}
