package stack

import (
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"
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
