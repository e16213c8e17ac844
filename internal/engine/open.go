package engine

import (
	"fmt"
	"net"

	"github.com/tunwall/tunwall/internal/inspect"
	"github.com/tunwall/tunwall/policy"
)

// A raw-IP TCP flow that a phase's default: public allowed (by address: a
// public address no rule names) is dialled to that address first, as any
// allowed raw-IP flow is, and then relayed through an open inspector: a
// name the client sends (TLS SNI, HTTP Host) is judged as a flow to that
// name would be, so that connecting by address cannot get round a deny
// rule (or the checks of a host with http or inject rules); a client that
// sends no name is judged by the address alone. The TUN path and SOCKS
// requests by address both get it (relay).

// openInspect returns the inspected conn of such a flow: fr was allowed
// with rule policy.RuleDefaultPublic and has no name.
func (e *Engine) openInspect(fr *flowRecord, c net.Conn) *inspectConn {
	addr := fr.f.Dst.Addr().Unmap()
	ic := e.inspectWith(c, inspect.Config{Rule: fr.v.Rule, Decide: e.openDecide(fr), Open: true, Addr: addr.String()}, fr.f.Dst.Port())
	ic.why = "raw IP " + addr.String() + " (allowed by default: public): "
	if fr.req != nil {
		ic.reset = fr.req.Reset
	}
	return ic
}

// openDecide judges the first name the client of fr sends.
func (e *Engine) openDecide(fr *flowRecord) func(name, from string) (verdict, bool) {
	port := fr.f.Dst.Port()
	return func(name, from string) (verdict, bool) {
		v := e.decideName(fr.rs, name, port, policy.TCP)
		if !v.Allowed() {
			v.Reason = fmt.Sprintf("name %s (%s): %s", name, from, v.Reason)
			return v, false
		}
		if e.rules().HTTPFor(name, port).Terminate {
			return verdict{Rule: v.Rule, Reason: fmt.Sprintf("name %s (%s): its requests are checked by tunwall, which happens only on a connection to the name (connect by name, not by address)", name, from)}, false
		}
		return v, true
	}
}
