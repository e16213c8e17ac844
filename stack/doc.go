// Package stack runs gVisor's userspace TCP/IP stack on the sandbox's TUN
// descriptor and turns every new TCP or UDP flow the sandbox starts — to any
// address, IPv4 or IPv6 — into a Handler call. It decides nothing itself: the
// Handler (policy, DNS, dialing) does. It owns the packet path, the TCP and UDP
// forwarders, ICMP rejects, relaying bytes, and the counters of what it
// dropped.
//
// gVisor types stay inside this package; callers see netip, net.Conn and
// context.
//
// The NIC is promiscuous and spoofing (gVisor #3876, as in tun2socks'
// core/stack.go): promiscuous so that packets to any destination are accepted
// rather than dropped as "not ours", spoofing so that replies may carry the
// destination the sandbox asked for as their source address.
package stack
