package stack

import (
	"errors"
	"fmt"
	"net"
	"syscall"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/tcpip"
)

// Resets stay resets. When one end of a relayed TCP flow aborts (RST), the
// relay aborts the other end too, instead of closing it gracefully: a clean
// FIN or EOF would make a truncated transfer look complete. The sandbox's
// side is aborted in gVisor (it sends RST); the upstream socket is closed
// with SO_LINGER 0 (the host kernel sends RST). The relay's error then wraps
// ErrSandboxReset or ErrUpstreamReset, so the caller can record the flow as
// reset.

// ErrUpstreamReset is how a relay ends when the upstream reset the
// connection (ECONNRESET, or EPIPE on a write after it).
var ErrUpstreamReset = errors.New("stack: the upstream reset the connection")

// IsReset reports whether a relay ended because one end reset the
// connection (ErrSandboxReset or ErrUpstreamReset).
func IsReset(err error) bool {
	return errors.Is(err, ErrSandboxReset) || errors.Is(err, ErrUpstreamReset)
}

// upstreamReset wraps err in ErrUpstreamReset when it is a socket error
// that means the upstream reset the connection.
func upstreamReset(err error) error {
	if err == nil || errors.Is(err, ErrUpstreamReset) {
		return err
	}
	if errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) {
		return fmt.Errorf("%w (%w)", ErrUpstreamReset, err)
	}
	return err
}

// connResetText is how gonet reports a reset endpoint: it turns the tcpip
// error into text.
var connResetText = (&tcpip.ErrConnectionReset{}).String()

// sandboxReset wraps err in ErrSandboxReset when it is an error of a
// sandbox-side connection that means the sandbox reset it (a gVisor
// endpoint's, through gonet; or a socket's, when the sandbox's side is one).
func sandboxReset(err error) error {
	if err == nil || errors.Is(err, ErrSandboxReset) {
		return err
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Err != nil && op.Err.Error() == connResetText ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) {
		return fmt.Errorf("%w (%w)", ErrSandboxReset, err)
	}
	return err
}

// abortConn closes c with a reset rather than a FIN: Abort if c has it (the
// sandbox's side, or a wrapper of it), else SO_LINGER 0 on the TCP socket
// under c and its wrappers (NetConn, as crypto/tls names it); then Close.
func abortConn(c net.Conn) {
	if a, ok := c.(interface{ Abort() }); ok {
		a.Abort()
		c.Close()
		return
	}
	for under := c; under != nil; {
		if tc, ok := under.(*net.TCPConn); ok {
			tc.SetLinger(0)
			break
		}
		w, ok := under.(interface{ NetConn() net.Conn })
		if !ok {
			break
		}
		under = w.NetConn()
	}
	c.Close()
}

// lingerZero makes closing the socket fd send RST.
func lingerZero(fd int) {
	unix.SetsockoptLinger(fd, unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{Onoff: 1, Linger: 0})
}

// SandboxReset reports whether err, an error of a sandbox-side connection
// (or of a wrapper of it), means the sandbox reset the connection: for a
// front end that speaks to the sandbox itself (the terminator), as the relay
// tells its own.
func SandboxReset(err error) bool { return errors.Is(sandboxReset(err), ErrSandboxReset) }

// AbortConn closes c with a reset rather than a FIN: the sandbox's side
// (or a wrapper of it, through NetConn) is aborted in gVisor, an upstream
// socket closed with SO_LINGER 0.
func AbortConn(c net.Conn) { abortConn(c) }
