package control

import (
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Commands of the approvals (tunwall --ask).
const (
	CmdPending = "pending"
	CmdAllow   = "allow" // Request.ID, Request.Scope (once, run, always)
	CmdDeny    = "deny"  // Request.ID, Request.Scope (once, run)
)

// descPending is the pending approvals gauge (Status.PendingApprovals).
var descPending = prometheus.NewDesc("tunwall_pending_approvals",
	"Requests --ask holds for a decision now.", nil, nil)

// Pending is a request held for a decision, as ctl pending shows it.
type Pending struct {
	ID    string    `json:"id"`
	Phase string    `json:"phase"`
	Proto string    `json:"proto"`
	Host  string    `json:"host"`
	Port  uint16    `json:"port"`
	PID   int       `json:"pid"`
	Comm  string    `json:"comm"`
	Exe   string    `json:"exe"`
	Since time.Time `json:"since"`
	Age   float64   `json:"age_seconds"`
}

// Approvals is the run's pending set, as the control socket asks it;
// ServeConfig.Approvals is nil when the run has no --ask.
type Approvals interface {
	Pending() []Pending
	// Decide answers the pending request id; by says who asked (for the
	// audit record).
	Decide(id string, allow bool, scope, by string) error
}

// ErrNoAsk is the answer to an approval command of a run without --ask.
var ErrNoAsk = errors.New("this run holds nothing for approval (it was not started with --ask)")

// answerApprovals answers the approval commands; ok is false for others.
func answerApprovals(req Request, cfg ServeConfig, c *net.UnixConn) (Response, bool) {
	switch req.Cmd {
	case CmdPending, CmdAllow, CmdDeny:
	default:
		return Response{}, false
	}
	if cfg.Approvals == nil {
		return Response{Error: ErrNoAsk.Error()}, true
	}
	if req.Cmd == CmdPending {
		p := cfg.Approvals.Pending()
		if p == nil {
			p = []Pending{}
		}
		return Response{Pending: p}, true
	}
	if req.ID == "" {
		return Response{Error: req.Cmd + ": no request id"}, true
	}
	if err := cfg.Approvals.Decide(req.ID, req.Cmd == CmdAllow, req.Scope, who(c)); err != nil {
		return Response{Error: fmt.Sprintf("%s %s: %v", req.Cmd, req.ID, err)}, true
	}
	return Response{Done: req.Cmd + " " + req.ID}, true
}

// who names the client for an audit record: "ctl uid U pid P (EXE)".
func who(c *net.UnixConn) string {
	p, err := peerOf(c)
	if err != nil {
		return "ctl (peer unknown)"
	}
	exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", p.Pid))
	if exe == "" {
		exe = "?"
	}
	return fmt.Sprintf("ctl uid %d pid %d (%s)", p.UID, p.Pid, exe)
}
