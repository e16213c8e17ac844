package stack

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// relayBufSize is the copy buffer per direction. Buffers are pooled as
// pointers to arrays (a []byte in a sync.Pool allocates on every Put, SA6002).
const relayBufSize = 64 << 10

var relayBufs = sync.Pool{New: func() any { return new([relayBufSize]byte) }}

// RelayResult says how a relay ended.
type RelayResult struct {
	Out, In int64 // bytes sandbox->upstream and upstream->sandbox
	Err     error // first error other than a clean EOF, or ErrIdle
}

// ErrIdle ends a relay that moved no byte in either direction for the idle
// timeout.
var ErrIdle = errors.New("stack: idle timeout")

type closeWriter interface{ CloseWrite() error }

// relayEnd is how a relay ends: the first error, and closing both conns
// once. Both relays, their ctx callback and their idle checks share it.
type relayEnd struct {
	a, b      net.Conn
	closeOnce sync.Once
	mu        sync.Mutex
	err       error
}

// fail records err if it is the first, and closes both conns.
func (r *relayEnd) fail(err error) {
	r.mu.Lock()
	if r.err == nil {
		r.err = err
	}
	r.mu.Unlock()
	r.close()
}

func (r *relayEnd) close() {
	r.closeOnce.Do(func() {
		r.a.Close()
		r.b.Close()
	})
}

// firstErr returns the first error, after the relay's goroutines are done.
func (r *relayEnd) firstErr() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}

// RelayTCP copies bytes both ways between the sandbox's connection and the
// upstream one until both directions are finished. When one side stops
// sending (EOF) the other side's write half is closed, so half-closed
// protocols work. A direction that errors tears both down. If no byte moves
// in either direction for idle (0 means never), both are closed with ErrIdle.
// ctx cancellation closes both. It closes both conns before returning.
//
// One direction runs on the caller's goroutine and one on a new goroutine;
// reads carry no deadlines (a single timer watches for idleness), so the
// per-read cost is a read and a write.
func RelayTCP(ctx context.Context, sandbox, upstream net.Conn, idle time.Duration) RelayResult {
	var (
		res      RelayResult
		end      = &relayEnd{a: sandbox, b: upstream}
		lastSeen atomic.Int64
		writing  atomic.Int32
	)
	stop := context.AfterFunc(ctx, func() { end.fail(ctx.Err()) })
	defer stop()
	if idle > 0 {
		lastSeen.Store(time.Now().UnixNano())
		var t *time.Timer
		t = time.AfterFunc(idle, func() {
			if writing.Load() > 0 {
				t.Reset(idle)
				return
			}
			if quiet := time.Since(time.Unix(0, lastSeen.Load())); quiet < idle {
				t.Reset(idle - quiet)
				return
			}
			end.fail(ErrIdle)
		})
		defer t.Stop()
	}
	dir := func(dst, src net.Conn, n *int64) {
		bp := relayBufs.Get().(*[relayBufSize]byte)
		defer relayBufs.Put(bp)
		buf := bp[:]
		for {
			nr, rerr := src.Read(buf)
			if nr > 0 {
				if idle > 0 {
					lastSeen.Store(time.Now().UnixNano())
				}
				// A write to a slow reader may block longer than the idle
				// timeout while bytes are still moving: it counts as activity.
				writing.Add(1)
				nw, werr := dst.Write(buf[:nr])
				writing.Add(-1)
				*n += int64(nw)
				if idle > 0 {
					lastSeen.Store(time.Now().UnixNano())
				}
				if werr != nil {
					end.fail(werr)
					return
				}
			}
			if rerr == nil {
				continue
			}
			if rerr == io.EOF {
				if cw, ok := dst.(closeWriter); ok && cw.CloseWrite() == nil {
					return
				}
				end.close()
			} else {
				end.fail(rerr)
			}
			return
		}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		dir(sandbox, upstream, &res.In)
	}()
	dir(upstream, sandbox, &res.Out)
	<-done
	end.close()
	res.Err = end.firstErr()
	if isClosedErr(res.Err) {
		res.Err = nil
	}
	return res
}

// isClosedErr reports errors that only mean "the other direction already
// closed this conn".
func isClosedErr(err error) bool {
	return err != nil && errors.Is(err, net.ErrClosed)
}

// RelayUDP copies datagrams both ways between the sandbox's session and a
// connected upstream socket until neither side has sent anything for idle
// (0 means 60s), ctx is cancelled, or a side fails. It closes both. An idle
// expiry is the normal end of a UDP session: Err is nil then.
func RelayUDP(ctx context.Context, sandbox, upstream net.Conn, idle time.Duration) RelayResult {
	if idle == 0 {
		idle = 60 * time.Second
	}
	var (
		res      RelayResult
		end      = &relayEnd{a: sandbox, b: upstream}
		lastSeen atomic.Int64
		wg       sync.WaitGroup
	)
	lastSeen.Store(time.Now().UnixNano())
	stop := context.AfterFunc(ctx, func() { end.fail(ctx.Err()) })
	defer stop()
	dir := func(dst, src net.Conn, n *int64) {
		defer wg.Done()
		bp := relayBufs.Get().(*[relayBufSize]byte)
		defer relayBufs.Put(bp)
		for {
			src.SetReadDeadline(time.Now().Add(idle))
			nr, err := src.Read(bp[:])
			if err != nil {
				if errors.Is(err, os.ErrDeadlineExceeded) {
					if time.Since(time.Unix(0, lastSeen.Load())) < idle {
						continue
					}
					err = ErrIdle
				}
				end.fail(err)
				return
			}
			lastSeen.Store(time.Now().UnixNano())
			if _, err := dst.Write(bp[:nr]); err != nil {
				// An ICMP error from one side (e.g. port unreachable) makes a
				// later write fail; that ends the session.
				end.fail(err)
				return
			}
			*n += int64(nr)
		}
	}
	wg.Add(2)
	go dir(upstream, sandbox, &res.Out)
	go dir(sandbox, upstream, &res.In)
	wg.Wait()
	res.Err = end.firstErr()
	if errors.Is(res.Err, ErrIdle) || isClosedErr(res.Err) {
		res.Err = nil
	}
	return res
}
