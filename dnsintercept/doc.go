// Package dnsintercept is the DNS server on the netstack side of tunwall.
//
// It owns three things:
//
//   - the fake-IP table (Pool): every name the policy allows gets a slot,
//     i.e. one fake IPv4 and one fake IPv6 address, and the reverse map from
//     fake address back to name that the flow handler consults (and holds,
//     Acquire/Release) on every new connection. Pinned names (the policy's
//     exact names) keep their slot for the sandbox's whole life; the slot
//     of any other name may go to another name once no flow holds it and it
//     has been idle for PoolOptions.ReuseAfter;
//   - the answering logic (Server): every query the sandbox sends to port 53
//     is answered here, from the pool for A/AAAA, with NXDOMAIN for names the
//     Filter does not allow, and by forwarding a few ordinary record types of
//     allowed names to the upstream resolver in queries it builds itself
//     (Resolver.Query), within Limits on sessions, queries and forwarding;
//   - the upstream client (Resolver): the only thing in this package that
//     dials, and it dials only the configured upstream resolver. The flow
//     handler calls Resolver.Resolve to learn an allowed name's real address
//     when a flow to its fake address is dialled.
//
// It must not dial anything but the upstream resolver, must never send a
// denied name upstream (DNS is not an exit: not as A, AAAA, TXT or any other
// type), and must not import gVisor, the stack package or the policy package;
// the policy decision arrives as a Filter function. It does no logging: per
// query events go to Config.OnQuery and counters to Server.Stats.
package dnsintercept
