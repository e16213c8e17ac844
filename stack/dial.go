package stack

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// DialTCP connects to ap from tunwall's own network namespace, as a
// net.Dialer would (TCP_NODELAY, keep-alive 15 s), and returns a socket the
// event relay takes over as it is.
//
// It is the connection path's dial: a net.Dialer parks the dialling
// goroutine until Go's poller reports the connect done, although on a near
// network (a veth, a bridge, loopback) the kernel has finished the
// handshake before connect(2) returns; it registers the socket with Go's
// poller and out again, asks its two addresses, and the relay then
// duplicates the descriptor to take it. DialTCP asks the socket once,
// without waiting, whether it is connected already, and waits on the
// stack's own poller only when it is not; the connection it returns becomes
// a net.Conn of Go's (net.FileConn) only if something reads or writes it
// other than the relay (TLS termination), and the relay takes its
// descriptor without a dup.
//
// ctx bounds the wait: when it ends first, the socket is closed and the
// error is a timeout (deadline) or context.Canceled, wrapped in a
// *net.OpError as a net.Dialer's is.
func (s *Stack) DialTCP(ctx context.Context, ap netip.AddrPort) (net.Conn, error) {
	addr := ap.Addr().Unmap()
	raddr := net.TCPAddrFromAddrPort(netip.AddrPortFrom(addr, ap.Port()))
	opErr := func(call string, err error) error {
		if call != "" {
			err = os.NewSyscallError(call, err)
		}
		return &net.OpError{Op: "dial", Net: "tcp", Addr: raddr, Err: err}
	}
	if !addr.IsValid() || addr.Zone() != "" {
		// A scoped address needs its interface's index: Go's dialer knows.
		var d net.Dialer
		return d.DialContext(ctx, "tcp", raddr.String())
	}
	if err := ctx.Err(); err != nil {
		return nil, opErr("", ctxErr(err))
	}
	var family int
	var sa unix.Sockaddr
	if addr.Is4() {
		family, sa = unix.AF_INET, &unix.SockaddrInet4{Port: int(ap.Port()), Addr: addr.As4()}
	} else {
		family, sa = unix.AF_INET6, &unix.SockaddrInet6{Port: int(ap.Port()), Addr: addr.As16()}
	}
	fd, err := unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, unix.IPPROTO_TCP)
	if err != nil {
		return nil, opErr("socket", err)
	}
	setDialOptions(fd)
	switch err := unix.Connect(fd, sa); err {
	case nil, unix.EISCONN:
		return newUpSocket(fd, raddr), nil
	case unix.EINPROGRESS, unix.EALREADY, unix.EINTR:
	default:
		unix.Close(fd)
		return nil, opErr("connect", err)
	}
	if err := s.awaitConnect(ctx, fd); err != nil {
		unix.Close(fd)
		if errors.Is(err, errConnecting) {
			return nil, opErr("", ctxErr(ctx.Err()))
		}
		return nil, opErr("connect", err)
	}
	return newUpSocket(fd, raddr), nil
}

// Keep-alive as a net.Dialer sets it by default: an upstream that vanishes
// without a word is noticed within minutes, not at the relay's idle
// timeout.
const (
	dialKeepAliveIdle     = 15 * time.Second
	dialKeepAliveInterval = 15 * time.Second
	dialKeepAliveCount    = 9
)

func setDialOptions(fd int) {
	unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1)
	unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_KEEPALIVE, 1)
	unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_KEEPIDLE, int(dialKeepAliveIdle/time.Second))
	unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_KEEPINTVL, int(dialKeepAliveInterval/time.Second))
	unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_KEEPCNT, dialKeepAliveCount)
}

// errConnecting is awaitConnect's answer when ctx ended first.
var errConnecting = errors.New("stack: connect still in progress")

// ctxErr is the dial error for a context that ended: a timeout for a
// deadline (a net.Error whose Timeout() is true), as net.Dialer reports it.
func ctxErr(err error) error {
	if errors.Is(err, context.DeadlineExceeded) {
		return os.ErrDeadlineExceeded
	}
	return err
}

// awaitConnect waits for fd's non-blocking connect to finish and returns
// its error (nil: connected), or errConnecting if ctx ended first.
func (s *Stack) awaitConnect(ctx context.Context, fd int) error {
	if done, err := connectDone(fd); done {
		return err
	}
	w := &connectWait{ch: make(chan struct{}, 1)}
	id, err := s.poller.Add(fd, w)
	if err != nil {
		return err
	}
	defer s.poller.Del(fd, id)
	s.poller.WatchOut(fd, id, true)
	for {
		if done, err := connectDone(fd); done {
			return err
		}
		select {
		case <-w.ch:
		case <-ctx.Done():
			return errConnecting
		}
	}
}

// connectDone says, without waiting, whether fd's connect has finished,
// and with what error.
func connectDone(fd int) (bool, error) {
	for {
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLOUT}}
		n, err := unix.Poll(pfd, 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return true, err
		}
		if n == 0 || pfd[0].Revents == 0 {
			return false, nil
		}
		break
	}
	soErr, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ERROR)
	if err != nil {
		return true, err
	}
	if soErr != 0 {
		return true, unix.Errno(soErr)
	}
	return true, nil
}

// connectWait is a dial's target on the poller while its connect is in
// progress.
type connectWait struct{ ch chan struct{} }

func (w *connectWait) PollEvent(uint32) {
	select {
	case w.ch <- struct{}{}:
	default:
	}
}

// upSocket is a connected upstream socket from DialTCP: the relay takes
// its descriptor as it is (take); anything else that uses it as a
// net.Conn gets Go's own connection over it, made on first use.
type upSocket struct {
	raddr *net.TCPAddr

	mu     sync.Mutex
	fd     int      // -1 once taken, closed or handed to conn
	conn   net.Conn // Go's connection, once made
	err    error    // why conn could not be made
	closed bool
}

func newUpSocket(fd int, raddr *net.TCPAddr) *upSocket {
	return &upSocket{fd: fd, raddr: raddr}
}

// take hands the descriptor over to the caller, who must close it; false
// if it is closed or already in Go's hands.
func (u *upSocket) take() (int, bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.closed || u.fd < 0 {
		return -1, false
	}
	fd := u.fd
	u.fd, u.closed = -1, true
	return fd, true
}

// goConn returns Go's connection over the socket, making it on first use.
func (u *upSocket) goConn() (net.Conn, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.conn != nil || u.err != nil {
		return u.conn, u.err
	}
	if u.closed {
		return nil, net.ErrClosed
	}
	f := os.NewFile(uintptr(u.fd), "tcp")
	c, err := net.FileConn(f) // a dup of the descriptor
	f.Close()
	u.fd = -1
	if err != nil {
		u.err = &net.OpError{Op: "dial", Net: "tcp", Addr: u.raddr, Err: err}
		return nil, u.err
	}
	u.conn = c
	return c, nil
}

func (u *upSocket) Read(b []byte) (int, error) {
	c, err := u.goConn()
	if err != nil {
		return 0, err
	}
	return c.Read(b)
}

func (u *upSocket) Write(b []byte) (int, error) {
	c, err := u.goConn()
	if err != nil {
		return 0, err
	}
	return c.Write(b)
}

// CloseWrite half-closes the connection.
func (u *upSocket) CloseWrite() error {
	c, err := u.goConn()
	if err != nil {
		return err
	}
	if cw, ok := c.(closeWriter); ok {
		return cw.CloseWrite()
	}
	return nil
}

// Abort makes the next Close reset the connection.
func (u *upSocket) Abort() {
	u.mu.Lock()
	defer u.mu.Unlock()
	switch {
	case u.conn != nil:
		if tc, ok := u.conn.(*net.TCPConn); ok {
			tc.SetLinger(0)
		}
	case u.fd >= 0:
		lingerZero(u.fd)
	}
}

func (u *upSocket) Close() error {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.conn != nil {
		return u.conn.Close()
	}
	if u.closed {
		return net.ErrClosed
	}
	u.closed = true
	if u.fd >= 0 {
		fd := u.fd
		u.fd = -1
		return unix.Close(fd)
	}
	return nil
}

func (u *upSocket) LocalAddr() net.Addr {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.conn != nil {
		return u.conn.LocalAddr()
	}
	if u.fd >= 0 {
		if sa, err := unix.Getsockname(u.fd); err == nil {
			switch sa := sa.(type) {
			case *unix.SockaddrInet4:
				return net.TCPAddrFromAddrPort(netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), uint16(sa.Port)))
			case *unix.SockaddrInet6:
				return net.TCPAddrFromAddrPort(netip.AddrPortFrom(netip.AddrFrom16(sa.Addr), uint16(sa.Port)))
			}
		}
	}
	return &net.TCPAddr{}
}

func (u *upSocket) RemoteAddr() net.Addr { return u.raddr }

func (u *upSocket) SetDeadline(t time.Time) error {
	c, err := u.goConn()
	if err != nil {
		return err
	}
	return c.SetDeadline(t)
}

func (u *upSocket) SetReadDeadline(t time.Time) error {
	c, err := u.goConn()
	if err != nil {
		return err
	}
	return c.SetReadDeadline(t)
}

func (u *upSocket) SetWriteDeadline(t time.Time) error {
	c, err := u.goConn()
	if err != nil {
		return err
	}
	return c.SetWriteDeadline(t)
}
