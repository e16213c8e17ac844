package control

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Pod is one namespace a node agent serves, as its metrics show it.
type Pod struct {
	// Namespace and Pod are the pod's Kubernetes namespace and name (the
	// labels of its series); a runtime that gives none has them "".
	Namespace, Pod string
	// Policy is the name of the policy it is served under.
	Policy string
	// Source is its session's.
	Source Source
}

// NodeSource is what the node agent's metrics ask it.
type NodeSource interface {
	// Pods are the pods served now. A pod that is no longer served is not
	// in the list, and its series go with it.
	Pods() []Pod
	// MaxPods is the bound on the pods served at once.
	MaxPods() int
	// ReloadErrors counts, per policy name, the changes of its file that
	// could not be read or parsed (the old version stayed in effect), or
	// that served pods could not take (a new dns.upstream).
	ReloadErrors() map[string]uint64
	// Refused counts the pods refused, by reason (a bound reached, no
	// policy, an attach that failed).
	Refused() map[string]uint64
	// Resolvers is how many upstream resolvers (answer caches) the pods
	// share: one per Kubernetes namespace, policy and upstream config.
	Resolvers() int
}

// Node metric names: those of a run, per pod.
var (
	podLabels    = []string{"namespace", "pod"}
	descPodFlows = prometheus.NewDesc("tunwall_flows_total",
		"Flows that ended or were denied, by pod, phase, verdict and (allowed flows) outcome.",
		append(podLabels, "phase", "verdict", "outcome"), nil)
	descPodDenials = prometheus.NewDesc("tunwall_denials_total",
		"Denied flows, DNS queries and HTTP requests, by pod, phase, kind and the rule that denied them.",
		append(podLabels, "phase", "kind", "rule"), nil)
	descPodDNS = prometheus.NewDesc("tunwall_dns_queries_total",
		"DNS queries answered, by pod, phase and verdict.",
		append(podLabels, "phase", "verdict"), nil)
	descPodHTTP = prometheus.NewDesc("tunwall_http_requests_total",
		"Requests on flows tunwall terminated, by pod, phase and verdict.",
		append(podLabels, "phase", "verdict"), nil)
	descPodBytes = prometheus.NewDesc("tunwall_bytes_total",
		"Bytes relayed by ended flows, by pod, phase and direction (out: pod to world).",
		append(podLabels, "phase", "direction"), nil)
	descPodLost = prometheus.NewDesc("tunwall_audit_records_lost_total",
		"Audit records of the pod that could not be written.", podLabels, nil)
	descPodOpen = prometheus.NewDesc("tunwall_open_tcp_flows",
		"TCP flows of the pod open now.", podLabels, nil)
	descPodInfo = prometheus.NewDesc("tunwall_pod_info",
		"A served pod: its run id, policy and phase (always 1).", append(podLabels, "run", "policy", "phase"), nil)
	descServed = prometheus.NewDesc("tunwall_served_namespaces",
		"Network namespaces (pods) served now.", nil, nil)
	descMaxServed = prometheus.NewDesc("tunwall_served_namespaces_max",
		"The bound on the namespaces served at once (--max-namespaces).", nil, nil)
	descReloadErrors = prometheus.NewDesc("tunwall_policy_reload_errors_total",
		"Changes of a policy file that could not be read or parsed (the old version stays in effect), or that served pods could not take (a new dns.upstream), by policy.",
		[]string{"policy"}, nil)
	descRefused = prometheus.NewDesc("tunwall_pods_refused_total",
		"Pods the agent refused to serve, by reason.", []string{"reason"}, nil)
	descResolvers = prometheus.NewDesc("tunwall_dns_resolvers",
		"Upstream resolvers (answer caches) held for the served pods: one per Kubernetes namespace, policy and upstream config.", nil, nil)
)

// nodeCollector makes the node's metrics at each scrape.
type nodeCollector struct{ src NodeSource }

func (c nodeCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descPodFlows, descPodDenials, descPodDNS, descPodHTTP, descPodBytes, descPodLost,
		descPodOpen, descPodInfo, descServed, descMaxServed, descReloadErrors, descRefused, descResolvers} {
		ch <- d
	}
}

func (c nodeCollector) Collect(ch chan<- prometheus.Metric) {
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	pods := c.src.Pods()
	seen := make(map[[2]string]bool, len(pods))
	for _, p := range pods {
		if seen[[2]string{p.Namespace, p.Pod}] {
			continue // duplicate series would fail the scrape; Pods says which comes first
		}
		seen[[2]string{p.Namespace, p.Pod}] = true
		st, s := p.Source.Status(), p.Source.Counts()
		ns, pod := p.Namespace, p.Pod
		for k, v := range s.Flows {
			counter(descPodFlows, v, ns, pod, k.Phase, k.Verdict, k.Outcome)
		}
		for k, v := range s.Denials {
			counter(descPodDenials, v, ns, pod, k.Phase, k.Kind, k.Rule)
		}
		for k, v := range s.DNS {
			counter(descPodDNS, v, ns, pod, k.Phase, k.Verdict)
		}
		for k, v := range s.HTTP {
			counter(descPodHTTP, v, ns, pod, k.Phase, k.Verdict)
		}
		for ph, v := range s.BytesOut {
			counter(descPodBytes, v, ns, pod, ph, "out")
		}
		for ph, v := range s.BytesIn {
			counter(descPodBytes, v, ns, pod, ph, "in")
		}
		counter(descPodLost, p.Source.Lost(), ns, pod)
		ch <- prometheus.MustNewConstMetric(descPodOpen, prometheus.GaugeValue, float64(st.OpenTCP), ns, pod)
		ch <- prometheus.MustNewConstMetric(descPodInfo, prometheus.GaugeValue, 1, ns, pod, st.Run, p.Policy, st.Phase)
	}
	ch <- prometheus.MustNewConstMetric(descServed, prometheus.GaugeValue, float64(len(pods)))
	ch <- prometheus.MustNewConstMetric(descMaxServed, prometheus.GaugeValue, float64(c.src.MaxPods()))
	ch <- prometheus.MustNewConstMetric(descResolvers, prometheus.GaugeValue, float64(c.src.Resolvers()))
	for name, v := range c.src.ReloadErrors() {
		counter(descReloadErrors, v, name)
	}
	for why, v := range c.src.Refused() {
		counter(descRefused, v, why)
	}
}

// NodeMetricsHandler serves a node agent's metrics over HTTP
// (--metrics-listen), at most maxClients scrapes at once. Of two pods with
// the same namespace and name (a sandbox recreated before the old one's
// DEL), only the first in Pods is shown.
func NodeMetricsHandler(src NodeSource) http.Handler {
	r := prometheus.NewPedanticRegistry()
	r.MustRegister(nodeCollector{src})
	return promhttp.HandlerFor(r, promhttp.HandlerOpts{MaxRequestsInFlight: maxClients, Timeout: ioTimeout})
}
