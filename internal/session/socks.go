package session

import (
	"context"
	"fmt"
	"net"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tunwall/tunwall/internal/procattr"
	"github.com/tunwall/tunwall/internal/socksserver"
)

// DefaultDrain is how long ServeSOCKS lets open flows run on, once it is
// told to stop, before it ends them.
const DefaultDrain = socksserver.DefaultDrain

// ServeSOCKS serves a SOCKS5 proxy on ln with the session's policy and
// audit log (no TUN: New is all it needs) until ctx is done; open flows
// then run on for at most drain (0 means DefaultDrain) and are recorded
// before it returns. The caller closes ln and then the session.
func (s *Session) ServeSOCKS(ctx context.Context, ln net.Listener, drain time.Duration) error {
	// No TUN, no Start: the control socket is served from here.
	if err := s.serveControl(); err != nil {
		return err
	}
	return socksserver.Serve(ctx, s.engine, ln, socksserver.Options{Drain: drain, Logger: s.o.Logger})
}

// LocalNamespace identifies tunwall's own network namespace, for a
// session whose clients are local processes (a SOCKS5 proxy's): a
// sock_diag socket in it for Options.DiagFD (-1 when none can be opened:
// flows are then not attributed), and its inode for Options.NetNS, which
// tells local clients from tunwall's own sockets. The caller owns the
// socket; an error (the namespace cannot be read) leaves none open.
func LocalNamespace() (diagFD int, netns uint64, err error) {
	diagFD, err = procattr.OpenDiag()
	if err != nil {
		diagFD = -1
	}
	var st unix.Stat_t
	if err := unix.Stat("/proc/self/ns/net", &st); err != nil {
		if diagFD >= 0 {
			unix.Close(diagFD)
		}
		return -1, 0, fmt.Errorf("cannot read this network namespace (/proc/self/ns/net): %w", err)
	}
	return diagFD, st.Ino, nil
}
