package procattr

import (
	"errors"
	"net/netip"
	"time"

	"golang.org/x/sys/unix"
)

// goneTimeout bounds one TCPSocketGone exchange.
const goneTimeout = 100 * time.Millisecond

// TCPSocketGone reports whether the diag socket's namespace (the sandbox's)
// has, for certain, no TCP socket for local→remote: the client that sent
// the connection's SYN has given up on it (or never had a socket: a raw
// SYN). ok is false when it cannot tell (the Resolver is closed, the kernel
// did not answer in time, or answered with an error); callers then assume
// the socket is there. It asks the kernel for that one socket (an exact
// inet_diag lookup, in both id orders), so its cost does not grow with the
// number of sockets; a socket the exact lookup cannot find (one bound to a
// device with SO_BINDTODEVICE) is reported gone.
func (r *Resolver) TCPSocketGone(local, remote netip.AddrPort) (gone, ok bool) {
	local, remote = unmapAddrPort(local), unmapAddrPort(remote)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return false, false
	}
	r.drainLocked()
	_, err := r.exactFindLocked(unix.IPPROTO_TCP, local, remote, time.Now().Add(goneTimeout))
	if err == nil {
		return false, true
	}
	var nf *notFoundError
	if errors.As(err, &nf) && nf.last == nil {
		return true, true
	}
	return false, false
}
