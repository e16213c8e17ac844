package control

import (
	"io"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/common/expfmt"
)

// Source is what the control plane asks the session for. Its methods are
// called from the control socket's and the metrics listener's goroutines,
// concurrently with the data path; they must not block on it.
type Source interface {
	// Status describes the run now.
	Status() Status
	// Counts are the counters the session feeds from its audit records.
	Counts() Snapshot
	// Lost is how many audit records could not be written.
	Lost() uint64
	// Flows are the flows open now (the engine's registry, bounded by
	// the flow limits).
	Flows() []Flow
}

// Steerer is a Source whose policy can change while it runs (CmdPhase,
// CmdReload). A Source that is not one refuses them.
type Steerer interface {
	// SetPhase switches to phase.
	SetPhase(phase string, by Requester) (Change, error)
	// Reload re-reads the policy file.
	Reload(by Requester) (Change, error)
}

// Metric names (the namespace is tunwall_).
var (
	descFlows = prometheus.NewDesc("tunwall_flows_total",
		"Flows that ended or were denied, by phase, verdict and (allowed flows) outcome.",
		[]string{"phase", "verdict", "outcome"}, nil)
	descDenials = prometheus.NewDesc("tunwall_denials_total",
		"Denied flows, DNS queries and HTTP requests, by phase, kind and the rule that denied them.",
		[]string{"phase", "kind", "rule"}, nil)
	descDNS = prometheus.NewDesc("tunwall_dns_queries_total",
		"DNS queries answered, by phase and verdict.",
		[]string{"phase", "verdict"}, nil)
	descHTTP = prometheus.NewDesc("tunwall_http_requests_total",
		"Requests on flows tunwall terminated, by phase and verdict.",
		[]string{"phase", "verdict"}, nil)
	descBytes = prometheus.NewDesc("tunwall_bytes_total",
		"Bytes relayed by ended flows, by phase and direction (out: sandbox to world).",
		[]string{"phase", "direction"}, nil)
	descLost = prometheus.NewDesc("tunwall_audit_records_lost_total",
		"Audit records that could not be written.", nil, nil)
	descOpen = prometheus.NewDesc("tunwall_open_tcp_flows",
		"TCP flows open now.", nil, nil)
	descUptime = prometheus.NewDesc("tunwall_uptime_seconds",
		"Seconds since the run started.", nil, nil)
	descInfo = prometheus.NewDesc("tunwall_run_info",
		"The run: its id and the phase in effect (always 1).", []string{"run", "phase"}, nil)
)

// collector makes the metrics from a Source at each scrape.
type collector struct{ src Source }

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descFlows, descDenials, descDNS, descHTTP, descBytes, descLost, descOpen, descUptime, descInfo, descPending} {
		ch <- d
	}
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	st, s := c.src.Status(), c.src.Counts()
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	for k, v := range s.Flows {
		counter(descFlows, v, k.Phase, k.Verdict, k.Outcome)
	}
	for k, v := range s.Denials {
		counter(descDenials, v, k.Phase, k.Kind, k.Rule)
	}
	for k, v := range s.DNS {
		counter(descDNS, v, k.Phase, k.Verdict)
	}
	for k, v := range s.HTTP {
		counter(descHTTP, v, k.Phase, k.Verdict)
	}
	for p, v := range s.BytesOut {
		counter(descBytes, v, p, "out")
	}
	for p, v := range s.BytesIn {
		counter(descBytes, v, p, "in")
	}
	counter(descLost, c.src.Lost())
	ch <- prometheus.MustNewConstMetric(descOpen, prometheus.GaugeValue, float64(st.OpenTCP))
	ch <- prometheus.MustNewConstMetric(descPending, prometheus.GaugeValue, float64(st.PendingApprovals))
	ch <- prometheus.MustNewConstMetric(descUptime, prometheus.GaugeValue, time.Since(st.Started).Seconds())
	ch <- prometheus.MustNewConstMetric(descInfo, prometheus.GaugeValue, 1, st.Run, st.Phase)
}

// registry is a fresh registry holding src's metrics only (no process or
// Go runtime collectors: what it shows is the run's).
func registry(src Source) *prometheus.Registry {
	r := prometheus.NewPedanticRegistry()
	r.MustRegister(collector{src})
	return r
}

// WriteMetrics writes src's metrics in the Prometheus text format.
func WriteMetrics(w io.Writer, src Source) error {
	mfs, err := registry(src).Gather()
	if err != nil {
		return err
	}
	enc := expfmt.NewEncoder(w, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, mf := range mfs {
		if err := enc.Encode(mf); err != nil {
			return err
		}
	}
	return nil
}

// MetricsHandler serves src's metrics over HTTP (--metrics-listen), at
// most maxClients scrapes at once.
func MetricsHandler(src Source) http.Handler {
	return promhttp.HandlerFor(registry(src), promhttp.HandlerOpts{MaxRequestsInFlight: maxClients, Timeout: ioTimeout})
}
