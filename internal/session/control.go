package session

import (
	"errors"
	"net/http"
	"os"
	"sync/atomic"
	"time"

	"github.com/tunwall/tunwall/internal/approve"
	"github.com/tunwall/tunwall/internal/audit"
	"github.com/tunwall/tunwall/internal/control"
	"github.com/tunwall/tunwall/internal/engine"
)

// countingRecorder is the engine's audit recorder: every record it writes
// is counted for the control plane (control.Counts) on its way to the log.
type countingRecorder struct {
	w      *audit.Writer
	counts *control.Counts
	phase  *atomic.Pointer[string] // the phase in effect
}

func (r countingRecorder) Admit() error { return r.w.Admit() }

func (r countingRecorder) Write(rec audit.Record) {
	r.observe(rec)
	r.w.Write(rec)
}

func (r countingRecorder) Commit(rec audit.Record) <-chan error {
	r.observe(rec)
	return r.w.Commit(rec)
}

func (r countingRecorder) observe(rec audit.Record) {
	if rec.Phase == "" {
		rec.Phase = *r.phase.Load()
	}
	r.counts.Observe(rec)
}

// controlSource answers the control socket and the metrics listener.
type controlSource struct{ s *Session }

func (c controlSource) Status() control.Status {
	s, o := c.s, c.s.o
	st := control.Status{
		Run:        s.run,
		Pid:        os.Getpid(),
		Argv:       o.Argv,
		Phase:      *s.phase.Load(),
		Learn:      o.Learn,
		Labels:     o.Audit.Labels.Map(),
		PolicyFile: o.PolicyFile,
		AuditPath:  s.auditLog,
		Started:    s.started0,
		Uptime:     time.Since(s.started0).Seconds(),
		Totals:     s.counts.Snapshot().Totals(),
		AuditLost:  c.Lost(),
	}
	st.PolicySHA256 = *s.polSHA.Load()
	if x := s.Stats().Stack; x != nil {
		st.OpenTCP = uint64(x.TCPLive)
	}
	if s.approvals != nil {
		st.Ask, st.PendingApprovals = true, s.approvals.Len()
	}
	return st
}

func (c controlSource) Counts() control.Snapshot { return c.s.counts.Snapshot() }

func (c controlSource) Flows() []control.Flow {
	now := time.Now()
	var out []control.Flow
	for _, f := range c.s.engine.OpenFlows() {
		out = append(out, controlFlow(f, now))
	}
	return out
}

func controlFlow(f engine.OpenFlow, now time.Time) control.Flow {
	return control.Flow{Proto: f.Proto, Src: f.Src, Dst: f.Dst, Host: f.Host, Dial: f.Dial, PID: f.PID, Comm: f.Comm,
		Start: f.Start, Age: now.Sub(f.Start).Seconds(), BytesOut: f.BytesOut, BytesIn: f.BytesIn}
}

func (c controlSource) SetPhase(phase string, by control.Requester) (control.Change, error) {
	return c.s.SetPhase(phase, by)
}

func (c controlSource) Reload(by control.Requester) (control.Change, error) { return c.s.Reload(by) }

func (c controlSource) Lost() uint64 {
	if w := c.s.auditNow.Load(); w != nil {
		return uint64(w.Totals().Lost)
	}
	return 0
}

// ControlPath is the control socket's path; "" when the run has none.
func (s *Session) ControlPath() string {
	if s.o.Control == nil {
		return ""
	}
	return s.o.Control.Path()
}

// serveControl serves the control socket and the metrics listener, if
// the session has them; only its first call does anything.
func (s *Session) serveControl() error {
	s.controlOnce.Do(func() { s.controlErr = s.serveControlOnce() })
	return s.controlErr
}

func (s *Session) serveControlOnce() error {
	o := s.o
	src := controlSource{s}
	if o.Control != nil {
		self, err := control.OwnNamespaces()
		if err != nil {
			return err
		}
		sb := control.Namespaces{Net: o.NetNS, Pid: o.SandboxPidNS}
		if sb.Net == self.Net {
			sb.Net = 0 // socks: no sandbox; the clients share tunwall's namespace
		}
		if sb.Pid == self.Pid {
			sb.Pid = 0 // bwrap: the sandbox shares tunwall's pid namespace
		}
		cfg := control.ServeConfig{Source: src, Sandbox: sb, Logger: o.Logger}
		if s.approvals != nil {
			cfg.Approvals = approvalsSource{s.approvals}
		}
		if err := o.Control.Serve(cfg); err != nil {
			return err
		}
	}
	if o.Metrics != nil {
		srv := &http.Server{
			Handler:           control.MetricsHandler(src),
			ReadHeaderTimeout: 5 * time.Second,
			ReadTimeout:       10 * time.Second,
			WriteTimeout:      10 * time.Second,
			IdleTimeout:       30 * time.Second,
			MaxHeaderBytes:    8 << 10,
		}
		s.metricsSrv = srv
		s.metricsDone = make(chan struct{})
		go func() {
			defer close(s.metricsDone)
			if err := srv.Serve(o.Metrics); err != nil && !errors.Is(err, http.ErrServerClosed) {
				o.Logger.Warn("metrics listener", "err", err)
			}
		}()
	}
	return nil
}

// closeControl stops the control socket and the metrics listener, and
// waits for their goroutines: nothing asks the session anything after.
func (s *Session) closeControl() {
	if s.o.Control != nil {
		s.o.Control.Close()
	}
	if s.metricsSrv != nil {
		s.metricsSrv.Close()
		<-s.metricsDone
	} else if s.o.Metrics != nil {
		s.o.Metrics.Close()
	}
}

// validRun reports whether id can name a control socket and an audit log.
func validRun(id string) bool {
	if id == "" || len(id) > 64 {
		return false
	}
	for _, r := range id {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
			return false
		}
	}
	return true
}

// approvalsSource answers ctl pending, allow and deny from the run's
// approvals queue.
type approvalsSource struct{ q *approve.Queue }

func (a approvalsSource) Pending() []control.Pending {
	now := time.Now()
	var out []control.Pending
	for _, r := range a.q.Pending() {
		out = append(out, control.Pending{ID: r.ID, Phase: r.Phase, Proto: r.Proto, Host: r.Host, Port: r.Port,
			PID: r.PID, Comm: r.Comm, Exe: r.Exe, Since: r.Since, Age: now.Sub(r.Since).Seconds()})
	}
	return out
}

func (a approvalsSource) Decide(id string, allow bool, scope, by string) error {
	sc, err := approve.ParseScope(scope)
	if err != nil {
		return err
	}
	if !allow && sc == approve.ScopeAlways {
		return errors.New("a denial is for once or for the run (the policy denies what it does not allow already)")
	}
	return a.q.Decide(id, allow, sc, by, "", "")
}

// Source is what the session tells a control plane (its status, counts,
// records lost, open flows): a node agent's metrics read it per pod.
func (s *Session) Source() control.Source { return controlSource{s} }
