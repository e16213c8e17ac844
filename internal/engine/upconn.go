package engine

import (
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tunwall/tunwall/internal/sniff"
)

// upConn is the upstream side of a checked flow. It can be cut (its reads
// then end as at EOF, so the relay half-closes the sandbox's side), and it
// watches the server's first response when the client asked to switch
// protocols.
type upConn struct {
	net.Conn
	got      atomic.Bool // the server has sent something
	cut      atomic.Bool
	watching atomic.Bool
	mu       sync.Mutex
	sw       sniff.Switch
	decided  chan struct{} // closed once the switch is decided
	switched bool
}

func (u *upConn) Read(p []byte) (int, error) {
	if u.cut.Load() {
		return 0, io.EOF
	}
	n, err := u.Conn.Read(p)
	if u.cut.Load() {
		return 0, io.EOF
	}
	if n > 0 && !u.got.Load() {
		u.got.Store(true)
	}
	if u.watching.Load() {
		u.observe(p[:n], err)
	}
	return n, err
}

// observe feeds the server's bytes to the switch watcher.
func (u *upConn) observe(b []byte, err error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if !u.watching.Load() {
		return
	}
	_, st, sw := u.sw.Feed(b)
	if st == sniff.NeedMore && err == nil {
		return
	}
	u.switched = st == sniff.Done && sw
	u.watching.Store(false)
	close(u.decided)
}

// arm starts watching the server's answer to an Upgrade request. The
// caller arms before the request is passed on, so every byte of the
// answer is seen.
func (u *upConn) arm() {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.sw = sniff.Switch{}
	u.decided = make(chan struct{})
	u.watching.Store(true)
}

// heard reports whether the server has sent anything yet.
func (u *upConn) heard() bool { return u.got.Load() }

// Tap is the relay's stack.RelayOptions.Tap: the stack's relay reads the
// upstream itself and shows upConn what it read.
func (u *upConn) Tap(b []byte, err error) bool {
	if u.cut.Load() {
		return false
	}
	if len(b) > 0 && !u.got.Load() {
		u.got.Store(true)
	}
	if u.watching.Load() && (len(b) > 0 || err != nil) {
		u.observe(b, err)
	}
	return !u.cut.Load()
}

// stop cuts the upstream's reads.
func (u *upConn) stop() {
	u.cut.Store(true)
	u.Conn.SetReadDeadline(time.Unix(1, 0))
}

// CloseWrite half-closes the upstream connection.
func (u *upConn) CloseWrite() error {
	if cw, ok := u.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.New("engine: the upstream connection cannot half-close")
}
