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
		res       RelayResult
		closeOnce sync.Once
		lastSeen  atomic.Int64
		writing   atomic.Int32
	)
	var errMu sync.Mutex
	var firstErr error
	setErr := func(err error) {
		errMu.Lock()
		if firstErr == nil {
			firstErr = err
		}
		errMu.Unlock()
	}
	closeBoth := func() {
		closeOnce.Do(func() {
			sandbox.Close()
			upstream.Close()
		})
	}
	stop := context.AfterFunc(ctx, func() {
		setErr(ctx.Err())
		closeBoth()
	})
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
			setErr(ErrIdle)
			closeBoth()
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
					setErr(werr)
					closeBoth()
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
			} else {
				setErr(rerr)
			}
			closeBoth()
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
	closeBoth()
	errMu.Lock()
	res.Err = firstErr
	errMu.Unlock()
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
		errMu    sync.Mutex
		firstErr error
		lastSeen atomic.Int64
		wg       sync.WaitGroup
	)
	lastSeen.Store(time.Now().UnixNano())
	setErr := func(err error) {
		errMu.Lock()
		if firstErr == nil {
			firstErr = err
		}
		errMu.Unlock()
	}
	closeBoth := func() {
		sandbox.Close()
		upstream.Close()
	}
	stop := context.AfterFunc(ctx, func() {
		setErr(ctx.Err())
		closeBoth()
	})
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
					setErr(ErrIdle)
				} else {
					setErr(err)
				}
				closeBoth()
				return
			}
			lastSeen.Store(time.Now().UnixNano())
			if _, err := dst.Write(bp[:nr]); err != nil {
				// An ICMP error from one side (e.g. port unreachable) makes a
				// later write fail; that ends the session.
				setErr(err)
				closeBoth()
				return
			}
			*n += int64(nr)
		}
	}
	wg.Add(2)
	go dir(upstream, sandbox, &res.Out)
	go dir(sandbox, upstream, &res.In)
	wg.Wait()
	errMu.Lock()
	res.Err = firstErr
	errMu.Unlock()
	if errors.Is(res.Err, ErrIdle) || isClosedErr(res.Err) {
		res.Err = nil
	}
	return res
}
