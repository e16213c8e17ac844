package control

import (
	"net/netip"
	"time"
)

// Flow is an open flow as ctl flows shows it.
type Flow struct {
	Proto string         `json:"proto"`
	Src   netip.AddrPort `json:"src"`
	Dst   netip.AddrPort `json:"dst"`            // what the sandbox asked for
	Host  string         `json:"host,omitempty"` // its name, when known
	Dial  netip.AddrPort `json:"dial,omitzero"`  // where tunwall connected, when known
	PID   int            `json:"pid,omitempty"`
	Comm  string         `json:"comm,omitempty"`
	Start time.Time      `json:"start"`
	Age   float64        `json:"age_seconds"`
	// BytesOut and BytesIn are what it moved so far, from and to the
	// sandbox (a flow tunwall terminates counts them when it ends).
	BytesOut int64 `json:"bytes_out"`
	BytesIn  int64 `json:"bytes_in"`
}
