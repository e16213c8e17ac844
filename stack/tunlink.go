package stack

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/rawfile"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	gstack "gvisor.dev/gvisor/pkg/tcpip/stack"
)

// tunLink is the link endpoint on the TUN descriptor: one packet per read,
// one per write, no link header. It replaces gVisor's fdbased endpoint for
// one reason: fdbased waits for the TUN in a blocking ppoll, which holds an
// OS thread in a system call; Go's scheduler takes that thread's P away
// after 20µs and wakes another thread, and its sysmon thread keeps polling
// every 20µs while that goes on (9% of tunwall's samples in an upload
// profile; the relay's socket writes keep some of it). tunLink waits in Go's netpoller instead, and delivers each
// packet to the stack on the reading goroutine, without fdbased's hand-off
// to a processor goroutine.
//
// On a TUN with IFF_VNET_HDR (package tun opens it so, with checksum
// offload) each packet is preceded by a virtio-net header: the sandbox's
// kernel then leaves TCP and UDP checksums to the reader instead of
// computing them in software, which gVisor (told the checksums are valid)
// never needs. tunLink writes an all-zero header before its packets, so the
// kernel verifies gVisor's checksums as it did without the header.
type tunLink struct {
	rfd  *os.File // a dup of the Stack's descriptor, non-blocking, in the netpoller
	rc   syscall.RawConn
	mtu  uint32
	caps gstack.LinkEndpointCapabilities
	// vnet: every packet on the descriptor is preceded by a virtio-net
	// header (the TUN has IFF_VNET_HDR; see package tun).
	vnet bool

	// closed is called once when reading stops, with the reason (nil
	// when the NIC was removed).
	closed func(tcpip.Error)
	// badVersion is told of each packet whose IP version is neither 4
	// nor 6 (or which is empty), or whose virtio-net header tunwall does
	// not accept; such packets are dropped.
	badVersion func()

	mu         sync.RWMutex
	dispatcher gstack.NetworkDispatcher
	onClose    func()
	wg         sync.WaitGroup
}

var _ gstack.LinkEndpoint = (*tunLink)(nil)

func newTUNLink(fd int, mtu uint32, closed func(tcpip.Error), badVersion func()) (*tunLink, error) {
	rfd, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("stack: dup TUN: %w", err)
	}
	// Non-blocking: on the shared open file description, so writes on fd
	// do not block either (a full socketpair drops, as a full TUN does).
	if err := unix.SetNonblock(rfd, true); err != nil {
		unix.Close(rfd)
		return nil, fmt.Errorf("stack: TUN non-blocking: %w", err)
	}
	f := os.NewFile(uintptr(rfd), "tun")
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("stack: TUN raw conn: %w", err)
	}
	return &tunLink{
		rfd: f, rc: rc, mtu: mtu, vnet: hasVNetHdr(fd),
		// The sandbox's kernel computes full checksums for packets it
		// writes to a TUN without offloads, so verifying them again is
		// wasted work. We must still compute ours: the kernel verifies
		// what it reads.
		caps:       gstack.CapabilityRXChecksumOffload,
		closed:     closed,
		badVersion: badVersion,
	}, nil
}

// MTU implements stack.LinkEndpoint.
func (l *tunLink) MTU() uint32 {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.mtu
}

// SetMTU implements stack.LinkEndpoint.
func (l *tunLink) SetMTU(mtu uint32) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.mtu = mtu
}

// MaxHeaderLength implements stack.LinkEndpoint: a TUN has no link header.
func (*tunLink) MaxHeaderLength() uint16 { return 0 }

// LinkAddress implements stack.LinkEndpoint.
func (*tunLink) LinkAddress() tcpip.LinkAddress { return "" }

// SetLinkAddress implements stack.LinkEndpoint.
func (*tunLink) SetLinkAddress(tcpip.LinkAddress) {}

// Capabilities implements stack.LinkEndpoint.
func (l *tunLink) Capabilities() gstack.LinkEndpointCapabilities { return l.caps }

// ARPHardwareType implements stack.LinkEndpoint.
func (*tunLink) ARPHardwareType() header.ARPHardwareType { return header.ARPHardwareNone }

// AddHeader implements stack.LinkEndpoint.
func (*tunLink) AddHeader(*gstack.PacketBuffer) {}

// ParseHeader implements stack.LinkEndpoint.
func (*tunLink) ParseHeader(*gstack.PacketBuffer) bool { return true }

// IsAttached implements stack.LinkEndpoint.
func (l *tunLink) IsAttached() bool {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.dispatcher != nil
}

// Attach implements stack.LinkEndpoint. Attaching starts the reader;
// attaching nil (the NIC is being removed) stops it: no read or write on
// the descriptor starts after Attach(nil) returns. It does not wait for a
// packet the reader is handing to the stack: gVisor removes the NIC (and
// calls Wait) holding its stack lock, which that packet's processing may
// be waiting for. Stack.Close waits for the reader (waitReader) afterwards.
func (l *tunLink) Attach(d gstack.NetworkDispatcher) {
	l.mu.Lock()
	if d == nil {
		had := l.dispatcher != nil
		l.dispatcher = nil
		l.mu.Unlock()
		if had {
			l.rfd.Close() // wakes the reader; later reads and writes fail
		}
		return
	}
	defer l.mu.Unlock()
	if l.dispatcher == nil {
		l.dispatcher = d
		l.wg.Add(1)
		go l.readLoop(d)
	}
}

// release closes the read descriptor of a link that was never attached.
func (l *tunLink) release() { l.rfd.Close() }

// Wait implements stack.LinkEndpoint. It returns at once (see Attach).
func (*tunLink) Wait() {}

// waitReader waits for the reader to end, once the NIC is removed.
func (l *tunLink) waitReader() { l.wg.Wait() }

// Close implements stack.LinkEndpoint.
func (l *tunLink) Close() {
	l.mu.RLock()
	f := l.onClose
	l.mu.RUnlock()
	if f != nil {
		f()
	}
}

// SetOnCloseAction implements stack.LinkEndpoint.
func (l *tunLink) SetOnCloseAction(f func()) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.onClose = f
}

// smallPacket is the size under which a packet is copied into a buffer of
// its own, so that the reader's big buffer is used again (an ACK does not
// pin 64 KiB while it waits in a queue).
const smallPacket = 4 << 10

// readLoop reads packets from the TUN and hands each, on this goroutine,
// to d, until the descriptor fails or is closed.
func (l *tunLink) readLoop(d gstack.NetworkDispatcher) {
	defer l.wg.Done()
	var v *buffer.View
	defer func() {
		if v != nil {
			v.Release()
		}
	}()
	for {
		if v == nil {
			v = buffer.NewViewSize(int(l.MTU()) + vnetHdrLen)
		}
		b := v.AsSlice()
		var n int
		var rerr error
		err := l.rc.Read(func(fd uintptr) bool {
			n, rerr = unix.Read(int(fd), b)
			return rerr != unix.EAGAIN
		})
		if err == nil {
			err = rerr
		}
		var errno unix.Errno
		switch {
		case err == unix.EINTR:
			continue
		case errors.As(err, &errno):
			l.closed(tcpip.TranslateErrno(errno))
			return
		case err != nil: // rfd closed: the NIC is being removed
			l.closed(nil)
			return
		case n == 0: // a socketpair's peer is gone (unit tests)
			l.closed(&tcpip.ErrClosedForReceive{})
			return
		}
		off := 0
		if l.vnet {
			if !vnetHdrOK(b[:n]) {
				l.badVersion() // counted as malformed, dropped
				continue
			}
			off = vnetHdrLen
		}
		var proto tcpip.NetworkProtocolNumber
		switch header.IPVersion(b[off:n]) {
		case header.IPv4Version:
			proto = header.IPv4ProtocolNumber
		case header.IPv6Version:
			proto = header.IPv6ProtocolNumber
		default:
			l.badVersion()
			continue
		}
		var payload *buffer.View
		if n-off < smallPacket {
			payload = buffer.NewViewWithData(b[off:n])
		} else {
			v.CapLength(n)
			v.TrimFront(off)
			payload, v = v, nil
		}
		pkt := gstack.NewPacketBuffer(gstack.PacketBufferOptions{Payload: buffer.MakeWithView(payload)})
		pkt.NetworkProtocolNumber = proto
		d.DeliverNetworkPacket(proto, pkt)
		pkt.DecRef()
	}
}

// WritePackets implements stack.LinkEndpoint: one write per packet, as a
// TUN takes them. A packet the descriptor cannot take now is dropped, as a
// full device queue drops; TCP sends it again.
func (l *tunLink) WritePackets(pkts gstack.PacketBufferList) (int, tcpip.Error) {
	var iovs [8]unix.Iovec
	sent := 0
	for _, pkt := range pkts.AsSlice() {
		views := pkt.AsSlices()
		iov := iovs[:0]
		if l.vnet {
			iov = rawfile.AppendIovecFromBytes(iov, zeroVNetHdr[:], len(views)+1)
		}
		for _, s := range views {
			iov = rawfile.AppendIovecFromBytes(iov, s, len(views)+1)
		}
		if e := l.writev(iov); e != nil {
			if sent == 0 {
				return 0, e
			}
			break
		}
		sent++
	}
	return sent, nil
}

// writev writes one packet. It goes through the read descriptor's RawConn,
// which holds that descriptor open for the write: once Attach(nil) has
// closed it, writes fail instead of landing on whatever file next takes
// the number.
func (l *tunLink) writev(iov []unix.Iovec) tcpip.Error {
	var e unix.Errno
	if err := l.rc.Write(func(fd uintptr) bool {
		e = rawfile.NonBlockingWriteIovec(int(fd), iov)
		return true // never wait for room: a full TUN drops, as a device does
	}); err != nil {
		return &tcpip.ErrClosedForSend{}
	}
	if e != 0 {
		return tcpip.TranslateErrno(e)
	}
	return nil
}

// write writes one packet given as bytes (an ICMP reject of filterLink's).
func (l *tunLink) write(b []byte) tcpip.Error {
	var iovs [2]unix.Iovec
	iov := iovs[:0]
	if l.vnet {
		iov = rawfile.AppendIovecFromBytes(iov, zeroVNetHdr[:], 2)
	}
	iov = rawfile.AppendIovecFromBytes(iov, b, 2)
	return l.writev(iov)
}

// The virtio-net header (struct virtio_net_hdr, linux/virtio_net.h) that a
// TUN with IFF_VNET_HDR puts before each packet: flags, gso_type, hdr_len,
// gso_size, csum_start, csum_offset.
const (
	vnetHdrLen        = 10
	vnetFlagNeedsCsum = 1 // VIRTIO_NET_HDR_F_NEEDS_CSUM
	vnetFlagDataValid = 2 // VIRTIO_NET_HDR_F_DATA_VALID
	vnetGSONone       = 0 // VIRTIO_NET_HDR_GSO_NONE
)

// zeroVNetHdr is what tunwall writes: no offload asked of the kernel, which
// verifies the checksums gVisor computed.
var zeroVNetHdr [vnetHdrLen]byte

// vnetHdrOK reports whether pkt starts with a virtio-net header tunwall
// accepts: no segmentation offload (the TUN does not offer TSO, so the
// kernel never sends one), no flags but the checksum ones. A packet whose
// checksum the kernel left to us (NEEDS_CSUM) is fine: gVisor is told not
// to verify checksums of the sandbox's packets anyway, and tunwall ends
// every flow rather than forwarding packets.
func vnetHdrOK(pkt []byte) bool {
	return len(pkt) >= vnetHdrLen &&
		pkt[0]&^(vnetFlagNeedsCsum|vnetFlagDataValid) == 0 &&
		pkt[1] == vnetGSONone
}

// hasVNetHdr reports whether fd is a TUN with IFF_VNET_HDR. Anything else
// (a socketpair in tests) carries bare packets.
func hasVNetHdr(fd int) bool {
	ifr, err := unix.NewIfreq("")
	if err != nil {
		return false
	}
	if err := unix.IoctlIfreq(fd, unix.TUNGETIFF, ifr); err != nil {
		return false
	}
	return ifr.Uint16()&unix.IFF_VNET_HDR != 0
}
