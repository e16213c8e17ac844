package tun

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"

	"golang.org/x/sys/unix"
)

// MaxFDs is the largest number of descriptors one message may carry.
const MaxFDs = 4

// maxMsg bounds a control message's JSON body.
const maxMsg = 64 << 10

// Send writes one message (v encoded as JSON) with fds attached over a unix
// socket. The descriptors stay open in the sender; the receiver gets its own
// copies.
func Send(c *net.UnixConn, v any, fds ...int) error {
	if len(fds) > MaxFDs {
		return fmt.Errorf("tun: %d fds in one message, max %d", len(fds), MaxFDs)
	}
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	n, oobn, err := c.WriteMsgUnix(b, oob, nil)
	if err != nil {
		return fmt.Errorf("tun: send: %w", err)
	}
	if n != len(b) || oobn != len(oob) {
		return fmt.Errorf("tun: short send (%d/%d bytes)", n, len(b))
	}
	return nil
}

// ErrPeerGone is returned by Recv when the other side closed the socket.
var ErrPeerGone = errors.New("tun: control peer closed the connection")

// Recv reads one message sent by Send into v and returns the descriptors that
// came with it (close-on-exec; the caller owns them). The socket should be
// SOCK_SEQPACKET so that messages keep their boundaries.
func Recv(c *net.UnixConn, v any) (fds []int, err error) {
	b := make([]byte, maxMsg)
	oob := make([]byte, unix.CmsgSpace(MaxFDs*4))
	n, oobn, flags, _, err := c.ReadMsgUnix(b, oob)
	if errors.Is(err, io.EOF) {
		return nil, ErrPeerGone
	}
	if err != nil {
		return nil, fmt.Errorf("tun: recv: %w", err)
	}
	if oobn > 0 {
		msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
		if err != nil {
			return nil, fmt.Errorf("tun: parse control message: %w", err)
		}
		for _, m := range msgs {
			got, err := unix.ParseUnixRights(&m)
			if err != nil {
				continue
			}
			fds = append(fds, got...)
		}
	}
	defer func() {
		if err != nil {
			for _, fd := range fds {
				unix.Close(fd)
			}
			fds = nil
		}
	}()
	if flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 {
		return nil, fmt.Errorf("tun: control message truncated")
	}
	if n == 0 && oobn == 0 {
		return nil, ErrPeerGone
	}
	if err := json.Unmarshal(b[:n], v); err != nil {
		return nil, fmt.Errorf("tun: decode control message: %w", err)
	}
	for _, fd := range fds {
		unix.CloseOnExec(fd)
	}
	return fds, nil
}

// SocketPair returns a connected pair of SOCK_SEQPACKET unix sockets: one as
// a *net.UnixConn for this process and one as an *os.File to hand to a child
// (exec.Cmd.ExtraFiles).
func SocketPair() (*net.UnixConn, *os.File, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("tun: socketpair: %w", err)
	}
	mine := os.NewFile(uintptr(fds[0]), "control")
	defer mine.Close()
	c, err := net.FileConn(mine)
	if err != nil {
		unix.Close(fds[1])
		return nil, nil, fmt.Errorf("tun: socketpair: %w", err)
	}
	return c.(*net.UnixConn), os.NewFile(uintptr(fds[1]), "control-child"), nil
}

// FileConn turns an inherited socket descriptor into a *net.UnixConn.
func FileConn(f *os.File) (*net.UnixConn, error) {
	defer f.Close()
	c, err := net.FileConn(f)
	if err != nil {
		return nil, err
	}
	uc, ok := c.(*net.UnixConn)
	if !ok {
		c.Close()
		return nil, fmt.Errorf("tun: fd %d is not a unix socket", f.Fd())
	}
	return uc, nil
}
