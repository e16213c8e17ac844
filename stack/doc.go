// Package stack runs gVisor's userspace TCP/IP stack on the sandbox's TUN
// descriptor and turns every new TCP or UDP flow the sandbox starts — to any
// address, IPv4 or IPv6 — into a Handler call. It decides nothing itself: the
// Handler (policy, DNS, dialing) does. It owns the packet path, the TCP and UDP
// forwarders, ICMP rejects, relaying bytes, and the counters of what it
// dropped.
//
// It also bounds what a sandbox can make it hold, whatever the sandbox does:
// packets from any source but the sandbox's own are dropped before gVisor;
// flows, sessions and handshakes in progress are counted against limits (a
// flow beyond one is refused, and the Handler told); a handshake the sandbox
// never completes is given up after a timeout; the gVisor buffers of all
// flows share one budget, each shrinking as flows grow; and relays hold no
// goroutine or buffer while their flow waits (evrelay.go). The runtime
// these rest on (the poller, the pump runner, the budget, scratch buffers,
// the memory watch, the warm pool) is package stack/internal/rt, whose
// doc keeps the ledger of what each mechanism buys.
//
// gVisor types stay inside this package; callers see netip, net.Conn and
// context.
//
// The NIC is promiscuous and spoofing (gVisor #3876, as in tun2socks'
// core/stack.go): promiscuous so that packets to any destination are accepted
// rather than dropped as "not ours", spoofing so that replies may carry the
// destination the sandbox asked for as their source address.
package stack
