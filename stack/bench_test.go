package stack

import (
	"context"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/header"
)

// BenchmarkTCPToSandbox measures handler -> sandbox TCP throughput through the
// stack over the socketpair, with the test acting as the sandbox's TCP (MSS
// 1460, unscaled 64 KiB window, an ACK per segment).
func BenchmarkTCPToSandbox(b *testing.B) {
	h := newFakeHandler()
	_, p := newTestStack(b, h, nil)
	c := newTCPClient(p, netip.AddrPortFrom(sandbox4, 46000), netip.AddrPortFrom(remote4, 80))
	c.syn()
	call := h.nextTCP(b)
	res := call.acceptAsync()
	c.handshake(b)
	r := <-res
	if r.err != nil {
		b.Fatalf("accept: %v", r.err)
	}
	defer r.c.Close()

	const chunk = 64 << 10
	b.SetBytes(chunk)
	total := b.N * chunk
	go func() {
		buf := make([]byte, chunk)
		for range b.N {
			if _, err := r.c.Write(buf); err != nil {
				return
			}
		}
	}()
	b.ResetTimer()
	buf := make([]byte, 65536)
	fds := []unix.PollFd{{Fd: int32(p.fd), Events: unix.POLLIN}}
	got := 0
	for got < total {
		if n, err := unix.Poll(fds, int(waitFor/time.Millisecond)); err == nil && n == 0 {
			b.Fatalf("stalled after %d of %d bytes", got, total)
		}
		n, err := unix.Read(p.fd, buf)
		if err != nil || n == 0 {
			b.Fatalf("read: %v", err)
		}
		k, ok := parse(buf[:n])
		if !ok || !c.fromStack()(k) {
			continue
		}
		th := header.TCP(k.l4)
		if data := th.Payload(); len(data) > 0 && th.SequenceNumber() == c.rcvNxt {
			got += len(data)
			c.rcvNxt += uint32(len(data))
		}
		c.ack()
	}
}

// cpuTime is this process's user+system CPU time.
func cpuTime() time.Duration {
	var ru unix.Rusage
	unix.Getrusage(unix.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// reportCPU reports the process's CPU time per op since start (the client
// stack and the upstream included: compare modes, not absolutes).
func reportCPU(b *testing.B, start time.Duration) {
	b.ReportMetric(float64((cpuTime()-start).Microseconds())/float64(b.N), "cpu-µs/op")
}

// BenchmarkRelay measures a relayed flow end to end, sandbox app (a gVisor
// client stack over the socketpair) <-> Stack <-> relay <-> a loopback TCP
// upstream, with the event relay and with the two-goroutine relay:
// request/response round trips on one connection, and bulk bytes each way.
func BenchmarkRelay(b *testing.B) {
	for _, mode := range []string{"events", "goroutines"} {
		setup := func(b *testing.B) (*gonet.TCPConn, net.Conn) {
			tb := newRelayTestbed(b, nil, 0, func(h *relayHandler) { h.goroutines = mode == "goroutines" })
			c, u := tb.connect(b)
			b.Cleanup(func() { c.Close(); u.Close() })
			return c, u
		}
		b.Run(mode+"/rr", func(b *testing.B) {
			c, u := setup(b)
			go func() {
				buf := make([]byte, 64)
				for {
					n, err := u.Read(buf)
					if err != nil {
						return
					}
					if _, err := u.Write(buf[:n]); err != nil {
						return
					}
				}
			}()
			msg, got := []byte("x"), make([]byte, 1)
			b.ResetTimer()
			cpu := cpuTime()
			for range b.N {
				c.Write(msg)
				if _, err := io.ReadFull(c, got); err != nil {
					b.Fatal(err)
				}
			}
			reportCPU(b, cpu)
		})
		b.Run(mode+"/cps", func(b *testing.B) {
			tb := newRelayTestbed(b, nil, 0, func(h *relayHandler) { h.goroutines = mode == "goroutines" })
			go func() {
				for u := range tb.ups {
					go func() {
						defer u.Close()
						buf := make([]byte, 64)
						if _, err := u.Read(buf); err == nil {
							u.Write([]byte("ok\n"))
						}
						io.Copy(io.Discard, u)
					}()
				}
			}()
			got := make([]byte, 3)
			b.ResetTimer()
			cpu := cpuTime()
			defer func() { reportCPU(b, cpu) }()
			for range b.N {
				ctx, cancel := context.WithTimeout(context.Background(), waitFor)
				c, err := tb.sb.dial(ctx, tb.dst)
				cancel()
				if err != nil {
					b.Fatal(err)
				}
				c.Write([]byte("x"))
				if _, err := io.ReadFull(c, got); err != nil {
					b.Fatal(err)
				}
				c.Close()
			}
		})
		b.Run(mode+"/up", func(b *testing.B) {
			c, u := setup(b)
			const chunk = 64 << 10
			b.SetBytes(chunk)
			done := make(chan int64)
			go func() {
				n, _ := io.CopyN(io.Discard, u, int64(b.N)*chunk)
				done <- n
			}()
			buf := make([]byte, chunk)
			b.ResetTimer()
			for range b.N {
				if _, err := c.Write(buf); err != nil {
					b.Fatal(err)
				}
			}
			<-done
		})
		b.Run(mode+"/down", func(b *testing.B) {
			c, u := setup(b)
			const chunk = 64 << 10
			b.SetBytes(chunk)
			go func() {
				buf := make([]byte, chunk)
				for range b.N {
					if _, err := u.Write(buf); err != nil {
						return
					}
				}
			}()
			b.ResetTimer()
			if _, err := io.CopyN(io.Discard, c, int64(b.N)*chunk); err != nil {
				b.Fatal(err)
			}
		})
	}
}
