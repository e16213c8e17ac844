package stack

import (
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	gstack "gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
)

// A new SYN on a 4-tuple whose sandbox-side endpoint is in TIME_WAIT (tunwall
// closed first: the server did) reopens the tuple, as a kernel's TIME_WAIT
// socket accepts a new SYN (RFC 1122 4.2.2.13, RFC 6191). gVisor hands such a
// SYN only to a listening endpoint, and a forwarding stack has none, so it
// drops it: the sandbox's connect waited for its SYN's retransmission (1 s),
// or failed, whenever its kernel reused a source port within TimeWait.
//
// The link between the sandbox and tunwall is one TUN, a FIFO with one peer:
// a segment of the old connection cannot arrive after the SYN of a new one,
// which TIME_WAIT's sequence and timestamp checks guard against on a real
// network, and the sandbox's kernel reuses a tuple only once its own socket
// of it is closed, so no retransmitted FIN can still need our last ACK. So
// any SYN (without ACK) on a tuple in TIME_WAIT ends that endpoint before
// gVisor sees the SYN, which then reaches the forwarder as a new flow.
// Ending it makes gVisor send an RST for the old connection; the sandbox's
// new socket, in SYN-SENT, ignores it (its ACK does not acknowledge the new
// SYN, RFC 793 p. 66).

// reopenTimeWait ends the TIME_WAIT endpoint of the connection a SYN from
// the sandbox (src -> dst) reuses, if there is one.
func (s *Stack) reopenTimeWait(proto tcpip.NetworkProtocolNumber, src, dst tcpip.Address, srcPort, dstPort uint16) {
	id := gstack.TransportEndpointID{LocalPort: dstPort, LocalAddress: dst, RemotePort: srcPort, RemoteAddress: src}
	ep, ok := s.ns.FindTransportEndpoint(proto, tcp.ProtocolNumber, id, nicID).(*tcp.Endpoint)
	if !ok {
		return
	}
	switch tcp.EndpointState(ep.State()) {
	case tcp.StateTimeWait:
	case tcp.StateFinWait1, tcp.StateFinWait2, tcp.StateClosing:
		// gVisor ACKs the sandbox's FIN before it moves to TIME_WAIT, so
		// the sandbox may reuse the tuple while gVisor's processor is
		// still between the two. A SYN without ACK means the sandbox's
		// kernel holds no socket of this tuple any more (it refuses to
		// reuse one it holds), so this connection is over for it as well.
	default:
		return
	}
	ep.Abort()
	s.timeWaitReopened.Add(1)
}

// newSYN returns the ports of a TCP segment that carries SYN without ACK, in
// the transport header th (as much of it as the packet holds).
func newSYN(th []byte) (srcPort, dstPort uint16, ok bool) {
	if len(th) < header.TCPMinimumSize {
		return 0, 0, false
	}
	t := header.TCP(th)
	if f := t.Flags(); !f.Contains(header.TCPFlagSyn) || f.Intersects(header.TCPFlagAck|header.TCPFlagRst) {
		return 0, 0, false
	}
	return t.SourcePort(), t.DestinationPort(), true
}
