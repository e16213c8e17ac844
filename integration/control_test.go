package integration

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// TestCtlStatusAndMetricsCountALiveRunsFlowsAndQueries runs a sandbox that
// makes one allowed download of a known size, one denied connection and
// one denied name, then waits; from the host, ctl ls, ctl status --json,
// ctl metrics and the --metrics-listen endpoint must all count them, and
// the metrics must parse with the Prometheus client's text parser.
func TestCtlStatusAndMetricsCountALiveRunsFlowsAndQueries(t *testing.T) {
	w := newWorld(t)
	requireTools(t, "curl")
	xdg := filepath.Join(w.dir, "xdg-metrics")
	if err := os.Mkdir(xdg, 0o700); err != nil {
		t.Fatal(err)
	}
	release := filepath.Join(w.dir, "release-metrics")
	const size = 100000
	script := fmt.Sprintf(`curl -sS --fail -o /dev/null http://allowed.test/bytes/%d
curl -sS --max-time 5 -o /dev/null http://denied.test/ 2>/dev/null
curl -sS --max-time 5 -o /dev/null http://192.0.2.66/ 2>/dev/null
echo COUNTED; n=0; while [ ! -e %s ] && [ $n -lt 600 ]; do sleep 0.05; n=$((n+1)); done`, size, release)
	pol := []byte("version: 1\nphases:\n  exec:\n    allow:\n      - host: allowed.test\n        ports: [80]\n")
	polFile := filepath.Join(w.dir, "ctl-policy.yaml")
	if err := os.WriteFile(polFile, pol, 0o644); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(pol)
	o := runOpts{flags: []string{"--policy", polFile, "--metrics-listen", "127.0.0.1:9464"}, script: script,
		env: []string{"XDG_RUNTIME_DIR=" + xdg}}
	var ls, text, scraped string
	_, st := w.runWithCtl(t, o, "COUNTED", release, func(ctx context.Context, _ int) {
		var err error
		if ls, err = w.ctl(ctx, o, "ls"); err != nil {
			t.Errorf("ctl ls: %v\n%s", err, ls)
		}
		// The flow records of ended flows may still be on their way.
		deadline := time.Now().Add(10 * time.Second)
		for {
			if text, err = w.ctl(ctx, o, "metrics"); err != nil {
				t.Errorf("ctl metrics: %v\n%s", err, text)
				return
			}
			if strings.Contains(text, `verdict="deny"`) || time.Now().After(deadline) {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		out, err := w.AgentCommand(ctx, "curl", "-sS", "--max-time", "5", "http://127.0.0.1:9464/metrics").CombinedOutput()
		if err != nil {
			t.Errorf("scraping --metrics-listen: %v\n%s", err, out)
		}
		scraped = string(out)
	})
	if st.Phase != "exec" || st.PolicyFile != polFile || st.PolicySHA256 != hex.EncodeToString(sum[:]) {
		t.Errorf("ctl status: phase %q, policy %q sha256 %s; want exec, %s, %x", st.Phase, st.PolicyFile, st.PolicySHA256, polFile, sum)
	}
	if st.Run == "" || !strings.Contains(ls, st.Run) {
		t.Errorf("ctl ls does not list the run %q:\n%s", st.Run, ls)
	}
	if st.Totals.FlowsAllowed != 1 || st.Totals.FlowsDenied < 1 || st.Totals.DNSAllowed < 1 || st.Totals.DNSDenied < 1 || st.Totals.BytesIn < size {
		t.Errorf("ctl status counts %+v, want 1 flow allowed, denials, DNS allowed and denied, at least %d bytes in", st.Totals, size)
	}
	for name, text := range map[string]string{"ctl metrics": text, "--metrics-listen": scraped} {
		mfs := parseMetrics(t, name, text)
		for _, c := range []struct {
			name   string
			labels map[string]string
			min    float64
			max    float64
		}{
			{"tunwall_flows_total", map[string]string{"verdict": "allow", "outcome": "ok"}, 1, 1},
			{"tunwall_flows_total", map[string]string{"verdict": "deny"}, 1, 10},
			{"tunwall_denials_total", map[string]string{"kind": "flow", "rule": "default-deny"}, 1, 10},
			{"tunwall_denials_total", map[string]string{"kind": "dns", "rule": "default-deny"}, 1, 10},
			{"tunwall_dns_queries_total", map[string]string{"verdict": "allow"}, 1, 10},
			{"tunwall_bytes_total", map[string]string{"direction": "in"}, size, 10 * size},
			{"tunwall_audit_records_lost_total", nil, 0, 0},
			{"tunwall_run_info", map[string]string{"run": st.Run, "phase": "exec"}, 1, 1},
			{"tunwall_flows_total", map[string]string{"phase": "exec", "verdict": "allow"}, 1, 1},
		} {
			v, ok := metricValue(mfs, c.name, c.labels)
			if !ok || v < c.min || v > c.max {
				t.Errorf("%s: %s%v = %v (found %v), want %v..%v\n%s", name, c.name, c.labels, v, ok, c.min, c.max, text)
			}
		}
	}
}

// parseMetrics parses the Prometheus text format with the client's parser.
func parseMetrics(t *testing.T, name, text string) map[string]*dto.MetricFamily {
	t.Helper()
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(strings.NewReader(text))
	if err != nil {
		t.Fatalf("%s: not the Prometheus text format: %v\n%s", name, err, text)
	}
	return mfs
}

// metricValue sums the samples of family name whose labels include want.
func metricValue(mfs map[string]*dto.MetricFamily, name string, want map[string]string) (float64, bool) {
	mf, ok := mfs[name]
	if !ok {
		return 0, false
	}
	var sum float64
	found := false
	for _, m := range mf.GetMetric() {
		match := true
		for k, v := range want {
			got := ""
			for _, l := range m.GetLabel() {
				if l.GetName() == k {
					got = l.GetValue()
				}
			}
			if got != v {
				match = false
			}
		}
		if !match {
			continue
		}
		found = true
		switch {
		case m.Counter != nil:
			sum += m.Counter.GetValue()
		case m.Gauge != nil:
			sum += m.Gauge.GetValue()
		}
	}
	return sum, found
}

// TestCtlFlowsListsAnOpenConnectionWithItsProcess holds a connection open
// from the sandbox and lists it from the host with ctl flows --json: its
// name, the address dialled and the process; once the sandbox closes it,
// it is gone.
func TestCtlFlowsListsAnOpenConnectionWithItsProcess(t *testing.T) {
	w := newWorld(t)
	requireTools(t, "python3")
	xdg := filepath.Join(w.dir, "xdg-flows")
	if err := os.Mkdir(xdg, 0o700); err != nil {
		t.Fatal(err)
	}
	release := filepath.Join(w.dir, "release-flows")
	holder := fmt.Sprintf(`import os, socket, time
s = socket.create_connection(("allowed.test", 80))
print("OPEN", flush=True)
for _ in range(600):
    if os.path.exists(%q): break
    time.sleep(0.05)
s.close()`, release)
	script := fmt.Sprintf(`python3 -c '%s'; sleep 0.5; echo CLOSED; n=0; while [ ! -e %s.2 ] && [ $n -lt 600 ]; do sleep 0.05; n=$((n+1)); done`, holder, release)
	o := runOpts{flags: []string{"--allow", "allowed.test:80"}, script: script, env: []string{"XDG_RUNTIME_DIR=" + xdg}}
	type flow struct {
		Proto, Host, Dial, Comm, Dst string
		PID                          int
	}
	var open, closed []flow
	ask := func(ctx context.Context, into *[]flow, want int) {
		// The start record names the process once attribution found it.
		for deadline := time.Now().Add(10 * time.Second); ; {
			out, err := w.ctl(ctx, o, "flows", "--json")
			if err != nil {
				t.Errorf("ctl flows: %v\n%s", err, out)
				return
			}
			*into = nil
			if err := json.Unmarshal([]byte(out), into); err != nil {
				t.Errorf("ctl flows --json: %v\n%s", err, out)
				return
			}
			if len(*into) == want || time.Now().After(deadline) {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	// Two marks: OPEN (ask, then let the holder close) and CLOSED (ask).
	_, _ = w.runWithCtlMarks(t, o, map[string]func(ctx context.Context){
		"OPEN":   func(ctx context.Context) { ask(ctx, &open, 1); os.WriteFile(release, nil, 0o644) },
		"CLOSED": func(ctx context.Context) { ask(ctx, &closed, 0); os.WriteFile(release+".2", nil, 0o644) },
	}, release+".2")
	if len(open) != 1 || open[0].Proto != "tcp" || open[0].Host != "allowed.test" || !(strings.HasPrefix(open[0].Dial, "192.0.2.") || strings.HasPrefix(open[0].Dial, "[2001:db8::")) || open[0].Comm != "python3" || open[0].PID == 0 {
		t.Errorf("open flows %+v, want the python3 connection to allowed.test, dialled at its world address", open)
	}
	if len(closed) != 0 {
		t.Errorf("after the connection closed: %+v, want none", closed)
	}
}

// TestCtlStatusAnswersForASocksProxy asks a running tunwall socks, which
// has no sandbox and so no Start, for its status.
func TestCtlStatusAnswersForASocksProxy(t *testing.T) {
	w := newWorld(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	xdg := filepath.Join(w.dir, "xdg-socks")
	if err := os.Mkdir(xdg, 0o700); err != nil {
		t.Fatal(err)
	}
	o := runOpts{flags: []string{"--listen", "127.0.0.1:1082", "--allow", "allowed.test:80"}, env: []string{"XDG_RUNTIME_DIR=" + xdg}}
	proxy, _, _ := w.startBackground(ctx, "socks", o, "SOCKS5 proxy on")
	defer func() {
		proxy.Process.Signal(syscall.SIGTERM)
		proxy.Wait()
	}()
	st := w.ctlStatus(t, ctx, o)
	if st.Run == "" || len(st.Argv) < 2 || st.Argv[1] != "socks" {
		t.Errorf("ctl status of tunwall socks: %+v", st)
	}
}
