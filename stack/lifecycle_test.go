package stack

import (
	"context"
	"errors"
	"io"
	"net/netip"
	"os"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tunwall/tunwall/internal/testenv"
)

func TestNewRejectsBadConfig(t *testing.T) {
	goroutineLeakCheck(t)
	h := newFakeHandler()
	tests := []struct {
		name string
		mod  func(*Config)
	}{
		{"a nil Handler", func(c *Config) { c.Handler = nil }},
		{"an MTU below the IPv6 minimum", func(c *Config) { c.MTU = 1279 }},
		{"a zero MTU", func(c *Config) { c.MTU = 0 }},
		{"an MTU above 65535", func(c *Config) { c.MTU = 65536 }},
		{"a negative FD", func(c *Config) { c.FD = -1 }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer unix.Close(fds[0])
			defer unix.Close(fds[1])
			cfg := Config{FD: fds[0], MTU: testMTU, Handler: h}
			tc.mod(&cfg)
			s, err := New(cfg)
			if err == nil {
				s.Close()
				t.Fatalf("New succeeded, want an error")
			}
			if cfg.FD >= 0 {
				// Not owned on error: the caller's descriptor is still open.
				if _, err := unix.FcntlInt(uintptr(cfg.FD), unix.F_GETFD, 0); err != nil {
					t.Errorf("New closed the caller's FD on error: %v", err)
				}
			}
		})
	}
	t.Run("a descriptor that is not open", func(t *testing.T) {
		if _, err := New(Config{FD: 1 << 20, MTU: testMTU, Handler: h}); err == nil {
			t.Fatalf("New succeeded on a closed descriptor")
		}
	})
}

// New fails after it opened the fdbased link (here: a congestion control
// gVisor does not know). It must release what it started: fdbased.New starts
// its packet processor goroutines and opens an eventfd before the link is
// attached to anything.
func TestNewFailureLeaksNoGoroutinesOrDescriptors(t *testing.T) {
	goroutineLeakCheck(t)
	fdsBefore := openFDs(t)
	for range 3 {
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		s, err := New(Config{FD: fds[0], MTU: testMTU, Handler: newFakeHandler(), CongestionControl: "bbr-but-not-really"})
		if err == nil {
			s.Close()
			t.Fatalf("New accepted an unknown congestion control")
		}
		unix.Close(fds[0])
		unix.Close(fds[1])
	}
	if after := openFDs(t); after != fdsBefore {
		t.Errorf("open descriptors: %d before, %d after three failed New calls", fdsBefore, after)
	}
}

// openFDs counts this process's open descriptors, eventfds included:
// gVisor's fdbased readv dispatcher opens one (link/stopfd) per endpoint
// and never closes it; the Stack does (linkStopFDs).
func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		testenv.Skip(t, "cannot count descriptors: %v", err)
	}
	n, events := 0, 0
	for _, e := range ents {
		target, _ := os.Readlink("/proc/self/fd/" + e.Name())
		if target == "anon_inode:[eventfd]" {
			events++
		}
		n++
	}
	t.Logf("%d open descriptors and %d eventfds", n, events)
	return n
}

// TestCloseReleasesEveryDescriptor starts and closes stacks one after
// another, as a node agent serving pods does: every descriptor a Stack
// opened is closed by Close, gVisor's eventfds included.
func TestCloseReleasesEveryDescriptor(t *testing.T) {
	goroutineLeakCheck(t)
	before := openFDs(t)
	for range 5 {
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		s, err := New(Config{FD: fds[0], MTU: testMTU, Handler: newFakeHandler()})
		if err != nil {
			t.Fatal(err)
		}
		if len(s.stopFDs) == 0 {
			t.Fatal("no stop eventfd found in gVisor's fdbased endpoint (linkStopFDs): has a gVisor bump renamed its fields?")
		}
		closeWithin(t, s, waitFor)
		unix.Close(fds[1])
	}
	if after := openFDs(t); after != before {
		t.Errorf("open descriptors: %d before, %d after five stacks started and closed", before, after)
	}
}

// TestCloseReleasesEveryDescriptorOfATUNWithAVirtioNetHeader: a TUN opened
// with IFF_VNET_HDR (as tun.Setup opens it) gets tunlink's endpoint, and
// Close releases its stop eventfd and the TUN as it does fdbased's.
func TestCloseReleasesEveryDescriptorOfATUNWithAVirtioNetHeader(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.Skip(t, "needs root to create a TUN in a network namespace of its own")
	}
	// A thread in a fresh network namespace opens the TUNs, and keeps the
	// namespace until the test is done (it is never unlocked: retired).
	open := make(chan chan int)
	done := make(chan struct{})
	defer close(done)
	go func() {
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			t.Error(err)
			close(open)
			return
		}
		for {
			select {
			case reply, ok := <-open:
				if !ok {
					return
				}
				fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
				if err == nil {
					ifr, _ := unix.NewIfreq("twvnet0")
					ifr.SetUint16(unix.IFF_TUN | unix.IFF_NO_PI | unix.IFF_VNET_HDR)
					if err = unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
						unix.Close(fd)
						fd = -1
					}
				}
				if err != nil {
					t.Error(err)
				}
				reply <- fd
			case <-done:
				return
			}
		}
	}()
	tunFD := func() int {
		reply := make(chan int)
		open <- reply
		return <-reply
	}
	goroutineLeakCheck(t)
	before := openFDs(t)
	for range 3 {
		fd := tunFD()
		if fd < 0 {
			t.FailNow()
		}
		s, err := New(Config{FD: fd, MTU: testMTU, Handler: newFakeHandler()})
		if err != nil {
			t.Fatal(err)
		}
		if s.vnetLink == nil || !s.link.vnet {
			t.Fatal("a TUN with IFF_VNET_HDR did not get the virtio-net link endpoint")
		}
		closeWithin(t, s, waitFor)
	}
	if after := openFDs(t); after != before {
		t.Errorf("open descriptors: %d before, %d after three stacks on a TUN started and closed", before, after)
	}
}

func TestCloseCancelsHandlersAndWaitsForThem(t *testing.T) {
	goroutineLeakCheck(t)
	h := newFakeHandler()
	s, p := newTestStack(t, h, nil)
	c := newTCPClient(p, netip.AddrPortFrom(sandbox4, 44000), netip.AddrPortFrom(remote4, 80))
	c.syn()
	call := h.nextTCP(t)

	// The handler blocks inside its ctx, like a dial; once cancelled it takes
	// a little while to unwind. Close must wait for it.
	var unwound atomic.Bool
	running := make(chan struct{})
	call.act <- func() {
		close(running)
		<-call.ctx.Done()
		time.Sleep(50 * time.Millisecond)
		unwound.Store(true)
	}
	<-running // (else the handler may see ctx done before it picks the action)
	closeWithin(t, s, 2*time.Second)
	if !unwound.Load() {
		t.Errorf("Close returned before Handler.TCP did")
	}
	if !errors.Is(call.ctx.Err(), context.Canceled) {
		t.Errorf("handler ctx err = %v, want context.Canceled", call.ctx.Err())
	}
	select {
	case <-s.Done():
	default:
		t.Errorf("Done not closed after Close returned")
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close = %v, want nil", err)
	}

	// The stack's end of the socketpair is closed: after whatever the stack
	// sent while closing (the RST for the pending SYN), the sandbox reads EOF.
	var err error
	for range 100 {
		if _, err = p.recv(waitFor); err != nil {
			break
		}
	}
	if err != io.EOF && !errors.Is(err, unix.ECONNRESET) {
		t.Errorf("peer read after Close = %v, want EOF or ECONNRESET", err)
	}
	// And a flow arriving after Close reaches no Handler.
	if _, err := unix.Write(p.fd, synPacket(netip.AddrPortFrom(sandbox4, 44001), netip.AddrPortFrom(remote4, 80), 1)); err == nil {
		t.Errorf("write to a closed stack succeeded")
	}
}

func TestCloseCancelsUDPServe(t *testing.T) {
	goroutineLeakCheck(t)
	h := newFakeHandler()
	h.udpOK = true
	s, p := newTestStack(t, h, nil)
	p.send(udpPacket(netip.AddrPortFrom(sandbox6, 51000), netip.AddrPortFrom(remote6, 9999), []byte("x")))
	h.nextUDP(t)
	ss := h.nextSession(t)
	done := make(chan error, 1)
	go func() { done <- s.Close() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Close: %v", err)
		}
	case <-time.After(waitFor):
		t.Fatal("Close did not return with a serve blocked in its ctx")
	}
	select {
	case <-ss.done:
	default:
		t.Errorf("Close returned before serve did")
	}
	if ss.ctx.Err() == nil {
		t.Errorf("serve ctx not cancelled by Close")
	}
}

// Close while accept is blocked in the handshake (the sandbox never ACKs the
// SYN-ACK) must not wait for gVisor's SYN-ACK retransmissions to give up.
func TestCloseDuringHandshakeReturnsPromptly(t *testing.T) {
	goroutineLeakCheck(t)
	h := newFakeHandler()
	s, p := newTestStack(t, h, nil)
	c := newTCPClient(p, netip.AddrPortFrom(sandbox4, 44002), netip.AddrPortFrom(remote4, 80))
	c.syn()
	call := h.nextTCP(t)
	res := call.acceptAsync()
	c.expectSynAck(t) // and never ACK it

	done := make(chan error, 1)
	go func() { done <- s.Close() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Close: %v", err)
		}
	case <-time.After(waitFor):
		t.Fatal("Close hung while accept was blocked in the handshake")
	}
	if r := <-res; r.err == nil {
		r.c.Close()
		t.Errorf("accept succeeded although the handshake never completed")
	}
}

func TestCloseWithAcceptedConnOpen(t *testing.T) {
	goroutineLeakCheck(t)
	h := newFakeHandler()
	s, p := newTestStack(t, h, nil)
	c := newTCPClient(p, netip.AddrPortFrom(sandbox6, 44003), netip.AddrPortFrom(remote6, 443))
	c.syn()
	call := h.nextTCP(t)
	res := call.acceptAsync()
	c.handshake(t)
	r := <-res
	if r.err != nil {
		t.Fatalf("accept: %v", r.err)
	}
	defer r.c.Close()
	<-call.done

	// A relay-like reader on the accepted conn must be unblocked by Close.
	readErr := make(chan error, 1)
	go func() {
		_, err := r.c.Read(make([]byte, 1))
		readErr <- err
	}()
	closeWithin(t, s, waitFor)
	select {
	case err := <-readErr:
		if err == nil {
			t.Errorf("read on the accepted conn returned nil error after Close")
		}
	case <-time.After(waitFor):
		t.Fatal("read on the accepted conn still blocked after Close")
	}
}

func TestPeerGoneWhenSandboxEndCloses(t *testing.T) {
	goroutineLeakCheck(t)
	h := newFakeHandler()
	s, p := newTestStack(t, h, nil)
	select {
	case <-s.PeerGone():
		t.Fatal("PeerGone closed before the peer went away")
	default:
	}
	unix.Close(p.fd)
	p.fd = -1
	select {
	case <-s.PeerGone():
	case <-time.After(waitFor):
		t.Fatal("PeerGone not closed after the sandbox end closed")
	}
	closeWithin(t, s, waitFor)
}

func TestCloseReleasesDescriptors(t *testing.T) {
	goroutineLeakCheck(t)
	before := openFDs(t)
	for range 3 {
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		s, err := New(Config{FD: fds[0], MTU: testMTU, Handler: newFakeHandler()})
		if err != nil {
			t.Fatalf("New: %v", err)
		}
		closeWithin(t, s, waitFor)
		unix.Close(fds[1])
	}
	if after := openFDs(t); after != before {
		t.Errorf("open descriptors: %d before, %d after three New/Close cycles", before, after)
	}
}
