package control

import (
	"fmt"
	"time"
)

// Bounds of the control socket: a client that floods or hangs holds at
// most one of maxClients slots, for at most ioTimeout, and makes tunwall
// read at most maxRequest bytes.
const (
	maxClients  = 4
	maxRequest  = 4 << 10
	ioTimeout   = 5 * time.Second
	maxResponse = 16 << 20 // what a client reads at most
)

// Commands of the protocol (Request.Cmd).
const (
	CmdStatus  = "status"
	CmdMetrics = "metrics"
	CmdFlows   = "flows"
	CmdPhase   = "phase"  // switch to Request.Phase
	CmdReload  = "reload" // re-read the policy file
)

// Request is what a client sends: one JSON object on one line.
type Request struct {
	Cmd   string `json:"cmd"`
	Phase string `json:"phase,omitempty"` // CmdPhase's phase
	// ID and Scope: of CmdAllow and CmdDeny.
	ID    string `json:"id,omitempty"`
	Scope string `json:"scope,omitempty"`
}

// Response is the server's answer, one JSON object, after which it closes
// the connection. Error is set when the request was refused or failed.
type Response struct {
	Error   string  `json:"error,omitempty"`
	Status  *Status `json:"status,omitempty"`
	Metrics string  `json:"metrics,omitempty"` // Prometheus text format
	// Flows are the open flows (CmdFlows).
	Flows []Flow `json:"flows,omitempty"`
	// Pending are the requests held for approval (CmdPending).
	Pending []Pending `json:"pending,omitempty"`
	// Done says what an allow or deny did.
	Done string `json:"done,omitempty"`
	// Change is what CmdPhase and CmdReload did.
	Change *Change `json:"change,omitempty"`
}

// Change is a change of the policy in effect: a phase switch or a reload.
type Change struct {
	From         string `json:"from"` // the phase before
	To           string `json:"to"`   // the phase now
	PolicySHA256 string `json:"policy_sha256,omitempty"`
	// Added and Removed are the rules the change added and removed
	// (policy.Diff).
	Added   []string `json:"added,omitempty"`
	Removed []string `json:"removed,omitempty"`
	// Revoked are the open flows the new policy denies, cut by the change.
	Revoked []Revoked `json:"revoked,omitempty"`
}

// Revoked is one open flow a change cut, and why.
type Revoked struct {
	Flow
	Reason string `json:"reason"`
}

// Requester is who asked for a change: the control socket's peer, or a
// signal (then PID is the sender's when the kernel says, else 0).
type Requester struct {
	UID  uint32 `json:"uid"`
	PID  int32  `json:"pid"`
	Comm string `json:"comm,omitempty"`
	Exe  string `json:"exe,omitempty"`
	// Via says how: "ctl phase", "ctl reload", "SIGHUP".
	Via string `json:"via"`
}

// String says who asked, for records and messages.
func (r Requester) String() string {
	s := r.Via
	if r.PID > 0 {
		s += fmt.Sprintf(" from pid %d", r.PID)
		if r.Comm != "" {
			s += " (" + r.Comm + ")"
		}
		s += fmt.Sprintf(", uid %d", r.UID)
	}
	return s
}

// Status describes a live run.
type Status struct {
	Run   string   `json:"run"`
	Pid   int      `json:"pid"` // tunwall's own
	Argv  []string `json:"argv"`
	Phase string   `json:"phase"`
	Learn bool     `json:"learn,omitempty"`
	// Labels are the run's (--label KEY=VALUE), as on its audit records.
	Labels       map[string]string `json:"labels,omitempty"`
	PolicyFile   string            `json:"policy_file,omitempty"`
	PolicySHA256 string            `json:"policy_sha256,omitempty"`
	AuditPath    string            `json:"audit_path,omitempty"` // "" when not audited
	Started      time.Time         `json:"started"`
	Uptime       float64           `json:"uptime_seconds"`
	OpenTCP      uint64            `json:"open_tcp_flows"`
	Totals       Totals            `json:"totals"`
	AuditLost    uint64            `json:"audit_records_lost"`
	// Ask says the run holds unknown names for approval (--ask), and
	// PendingApprovals how many requests wait now.
	Ask              bool `json:"ask,omitempty"`
	PendingApprovals int  `json:"pending_approvals"`
}
