package control

import (
	"io"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/tunwall/tunwall/internal/audit"
)

// fakeNode is a NodeSource whose pods the test changes.
type fakeNode struct {
	mu   sync.Mutex
	pods []Pod
}

func (f *fakeNode) Pods() []Pod {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]Pod(nil), f.pods...)
}
func (f *fakeNode) MaxPods() int                    { return 64 }
func (f *fakeNode) ReloadErrors() map[string]uint64 { return map[string]uint64{"web": 2} }
func (f *fakeNode) Refused() map[string]uint64      { return map[string]uint64{"max-namespaces": 1} }
func (f *fakeNode) Resolvers() int                  { return 2 }

func scrapeNode(t *testing.T, src NodeSource) string {
	t.Helper()
	rec := httptest.NewRecorder()
	NodeMetricsHandler(src).ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	b, _ := io.ReadAll(rec.Result().Body)
	p := expfmt.NewTextParser(model.UTF8Validation)
	if _, err := p.TextToMetricFamilies(strings.NewReader(string(b))); err != nil {
		t.Fatalf("the node's metrics do not parse: %v\n%s", err, b)
	}
	return string(b)
}

// TestNodeMetricsArePerPodAndADeletedPodsSeriesGo: each pod's counts carry
// its namespace and pod labels; a pod no longer served has no series; two
// entries for one pod do not break the scrape.
func TestNodeMetricsArePerPodAndADeletedPodsSeriesGo(t *testing.T) {
	a, b := NewCounts(), NewCounts()
	a.Observe(audit.Record{Kind: audit.KindFlow, Phase: "exec", Verdict: audit.VerdictAllow, Outcome: "ok", BytesIn: 10})
	b.Observe(audit.Record{Kind: audit.KindFlow, Phase: "exec", Verdict: audit.VerdictDeny, Rule: "default-deny"})
	n := &fakeNode{pods: []Pod{
		{Namespace: "team-a", Pod: "pod-a", Policy: "web", Source: fakeSource{a}},
		{Namespace: "team-b", Pod: "pod-b", Policy: "other", Source: fakeSource{b}},
		{Namespace: "team-b", Pod: "pod-b", Policy: "other", Source: fakeSource{b}},
	}}
	text := scrapeNode(t, n)
	for _, want := range []string{
		`tunwall_flows_total{namespace="team-a",outcome="ok",phase="exec",pod="pod-a",verdict="allow"} 1`,
		`tunwall_denials_total{kind="flow",namespace="team-b",phase="exec",pod="pod-b",rule="default-deny"} 1`,
		`tunwall_bytes_total{direction="in",namespace="team-a",phase="exec",pod="pod-a"} 10`,
		`tunwall_served_namespaces 3`,
		`tunwall_dns_resolvers 2`,
		`tunwall_policy_reload_errors_total{policy="web"} 2`,
		`tunwall_pods_refused_total{reason="max-namespaces"} 1`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("missing %s in:\n%s", want, text)
		}
	}
	n.mu.Lock()
	n.pods = n.pods[1:2]
	n.mu.Unlock()
	text = scrapeNode(t, n)
	if strings.Contains(text, `pod="pod-a"`) {
		t.Errorf("pod-a's series are still there after it went:\n%s", text)
	}
	if !strings.Contains(text, `pod="pod-b"`) {
		t.Errorf("pod-b's series went with pod-a:\n%s", text)
	}
}
