// Package tunlink is a gVisor link endpoint for a TUN whose packets carry a
// virtio-net header (IFF_VNET_HDR), so that TCP checksums and segmentation
// are left to the offloads in both directions: gVisor's TCP hands the TUN
// segments with a partial checksum (host GSO), and the sandbox's kernel
// hands tunwall segments it neither linearized nor checksummed.
//
// It is gVisor's fdbased endpoint (gvisor.dev/gvisor/pkg/tcpip/link/fdbased,
// Apache License 2.0, The gVisor Authors) cut down to one TUN descriptor,
// with the same dedicated reading goroutine blocked in readv/ppoll and the
// same processor goroutines that deliver packets to the stack, hashed by
// connection; what differs is the header: fdbased offers GSO only on a
// socket, skips the header it reads unread, and places the checksum start
// after an Ethernet header a TUN does not have. Here every header read is
// checked against the packet it precedes, and a packet whose header does
// not fit it is dropped and counted (Malformed).
package tunlink

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/rawfile"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/link/stopfd"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
)

// GSOMaxSize is the largest TCP segment, headers included, gVisor may hand
// the TUN: an IP packet's largest size (gVisor keeps its segments 161 bytes
// under it).
const GSOMaxSize = 1 << 16

// Options configure New.
type Options struct {
	// FD is the TUN's descriptor, opened with IFF_VNET_HDR and a header of
	// HdrSize bytes. The caller keeps it open until Wait returns.
	FD int
	// MTU is the TUN's MTU.
	MTU uint32
	// RXChecksumOffload: the stack does not verify the checksums of
	// packets read (the sandbox's kernel wrote them, or left them partial
	// under the offload).
	RXChecksumOffload bool
	// ClosedFunc is called when reading the TUN fails for good.
	ClosedFunc func(tcpip.Error)
	// Processors is the number of goroutines delivering packets to the
	// stack; 0 means GOMAXPROCS.
	Processors int
}

// Endpoint is the link endpoint; see the package comment.
type Endpoint struct {
	fd     int
	caps   stack.LinkEndpointCapabilities
	closed func(tcpip.Error)
	rd     *reader

	mu         sync.RWMutex
	dispatcher stack.NetworkDispatcher // guarded by mu
	mtu        uint32                  // guarded by mu

	wg sync.WaitGroup

	malformed atomic.Uint64
}

var (
	_ stack.LinkEndpoint = (*Endpoint)(nil)
	_ stack.GSOEndpoint  = (*Endpoint)(nil)
)

// New makes fd non-blocking and returns an endpoint reading and writing it.
// It does not own fd.
func New(opts Options) (*Endpoint, error) {
	if err := unix.SetNonblock(opts.FD, true); err != nil {
		return nil, fmt.Errorf("tunlink: set non-blocking: %w", err)
	}
	e := &Endpoint{fd: opts.FD, mtu: opts.MTU, closed: opts.ClosedFunc}
	if opts.RXChecksumOffload {
		e.caps |= stack.CapabilityRXChecksumOffload
	}
	n := opts.Processors
	if n <= 0 {
		n = max(1, runtime.GOMAXPROCS(0))
	}
	rd, err := newReader(e, n)
	if err != nil {
		return nil, err
	}
	e.rd = rd
	return e, nil
}

// Malformed is the number of packets dropped because their virtio-net
// header did not fit them (checkHdr), or because they were shorter than one.
func (e *Endpoint) Malformed() uint64 { return e.malformed.Load() }

// StopFDs returns the eventfd the reader's blocking read also waits on, for
// the owner to close once the reader has stopped (Wait), as it closes
// fdbased's.
func (e *Endpoint) StopFDs() []int { return []int{e.rd.EFD} }

// Attach implements stack.LinkEndpoint.Attach: it starts the reader, or
// stops it and waits for it when dispatcher is nil.
func (e *Endpoint) Attach(dispatcher stack.NetworkDispatcher) {
	e.mu.Lock()
	if dispatcher == nil && e.dispatcher != nil {
		e.rd.Stop()
		e.dispatcher = nil
		e.mu.Unlock()
		e.Wait()
		return
	}
	defer e.mu.Unlock()
	if dispatcher != nil && e.dispatcher == nil {
		e.dispatcher = dispatcher
		e.wg.Add(1)
		go func() {
			defer e.wg.Done()
			e.dispatchLoop()
		}()
	}
}

func (e *Endpoint) dispatchLoop() {
	for {
		cont, err := e.rd.dispatch()
		if err != nil || !cont {
			if e.closed != nil {
				e.closed(err)
			}
			e.rd.release()
			return
		}
	}
}

// IsAttached implements stack.LinkEndpoint.IsAttached.
func (e *Endpoint) IsAttached() bool {
	e.mu.RLock()
	defer e.mu.RUnlock()
	return e.dispatcher != nil
}

// MTU implements stack.LinkEndpoint.MTU.
func (e *Endpoint) MTU() uint32 {
	e.mu.RLock()
	defer e.mu.RUnlock()
	return e.mtu
}

// SetMTU implements stack.LinkEndpoint.SetMTU.
func (e *Endpoint) SetMTU(mtu uint32) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.mtu = mtu
}

// Capabilities implements stack.LinkEndpoint.Capabilities.
func (e *Endpoint) Capabilities() stack.LinkEndpointCapabilities { return e.caps }

// MaxHeaderLength implements stack.LinkEndpoint: a TUN has no link header
// (the virtio-net header is written beside the packet, not into it).
func (e *Endpoint) MaxHeaderLength() uint16 { return 0 }

// LinkAddress implements stack.LinkEndpoint: a TUN has none.
func (e *Endpoint) LinkAddress() tcpip.LinkAddress { return "" }

// SetLinkAddress implements stack.LinkEndpoint; a TUN has none.
func (e *Endpoint) SetLinkAddress(tcpip.LinkAddress) {}

// Wait implements stack.LinkEndpoint.Wait: it waits for the reader to stop.
func (e *Endpoint) Wait() { e.wg.Wait() }

// ARPHardwareType implements stack.LinkEndpoint.
func (e *Endpoint) ARPHardwareType() header.ARPHardwareType { return header.ARPHardwareNone }

// AddHeader implements stack.LinkEndpoint; there is no link header.
func (e *Endpoint) AddHeader(*stack.PacketBuffer) {}

// ParseHeader implements stack.LinkEndpoint; there is no link header.
func (e *Endpoint) ParseHeader(*stack.PacketBuffer) bool { return true }

// Close implements stack.LinkEndpoint.
func (e *Endpoint) Close() {}

// SetOnCloseAction implements stack.LinkEndpoint.
func (e *Endpoint) SetOnCloseAction(func()) {}

// GSOMaxSize implements stack.GSOEndpoint.
func (e *Endpoint) GSOMaxSize() uint32 { return GSOMaxSize }

// SupportedGSO implements stack.GSOEndpoint: the TUN's kernel segments and
// checksums what gVisor leaves to it.
func (e *Endpoint) SupportedGSO() stack.SupportedGSO { return stack.HostGSOSupported }

// WritePackets implements stack.LinkWriter: one writev per packet (a TUN
// takes one packet per write), each after its virtio-net header. A packet
// the TUN does not take now is dropped, as fdbased does.
func (e *Endpoint) WritePackets(pkts stack.PacketBufferList) (int, tcpip.Error) {
	n := 0
	for _, pkt := range pkts.AsSlice() {
		if err := e.writePacket(pkt); err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}

func (e *Endpoint) writePacket(pkt *stack.PacketBuffer) tcpip.Error {
	var hb [HdrSize]byte
	h := hdrFor(pkt)
	h.encode(&hb)
	views := pkt.AsSlices()
	numIovecs := min(len(views)+1, rawfile.MaxIovs)
	var iovecsArr [8]unix.Iovec
	iovecs := iovecsArr[:0]
	if numIovecs > len(iovecsArr) {
		iovecs = make([]unix.Iovec, 0, numIovecs)
	}
	iovecs = rawfile.AppendIovecFromBytes(iovecs, hb[:], numIovecs)
	for _, v := range views {
		iovecs = rawfile.AppendIovecFromBytes(iovecs, v, numIovecs)
	}
	if errno := rawfile.NonBlockingWriteIovec(e.fd, iovecs); errno != 0 {
		return tcpip.TranslateErrno(errno)
	}
	return nil
}

// WriteRaw writes one complete IP packet b (its checksums computed) after
// an empty virtio-net header, retrying a few times if the TUN is full. It
// is for packets built outside the stack (the ICMP errors of the filter).
func WriteRaw(fd int, b []byte) error {
	var hb [HdrSize]byte
	iov := [][]byte{hb[:], b}
	var err error
	for range 3 {
		_, err = unix.Writev(fd, iov)
		if err != unix.EAGAIN && err != unix.EINTR {
			break
		}
	}
	return err
}

// bufConfig is fdbased's: views whose sizes add up to more than an IP
// packet's largest size, so that a read of any packet fits.
var bufConfig = []int{128, 256, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768}

// bufCap is the most a read can hold after the header.
var bufCap = func() int {
	n := 0
	for _, s := range bufConfig {
		n += s
	}
	return n
}()

// iovecBuffer holds the views one readv fills, after the header's own
// buffer (fdbased's, with the header kept for checking).
type iovecBuffer struct {
	hdr    [HdrSize]byte
	views  []*buffer.View
	iovecs []unix.Iovec
}

func newIovecBuffer() *iovecBuffer {
	return &iovecBuffer{
		views:  make([]*buffer.View, len(bufConfig)),
		iovecs: make([]unix.Iovec, len(bufConfig)+1),
	}
}

func (b *iovecBuffer) nextIovecs() []unix.Iovec {
	b.iovecs[0] = unix.Iovec{Base: &b.hdr[0]}
	b.iovecs[0].SetLen(HdrSize)
	for i := range b.views {
		if b.views[i] != nil {
			break
		}
		v := buffer.NewViewSize(bufConfig[i])
		b.views[i] = v
		b.iovecs[i+1] = unix.Iovec{Base: v.BasePtr()}
		b.iovecs[i+1].SetLen(v.Size())
	}
	return b.iovecs
}

// head is the packet's first bytes as read (up to the first view's size),
// for checkHdr; n is the packet's length.
func (b *iovecBuffer) head(n int) []byte {
	return b.views[0].AsSlice()[:min(n, b.views[0].Size())]
}

// pullBuffer takes the views holding the packet's n bytes out of b (the
// next read replaces them) and returns them as a buffer.
func (b *iovecBuffer) pullBuffer(n int) buffer.Buffer {
	var views []*buffer.View
	c := 0
	for i, v := range b.views {
		c += v.Size()
		if c >= n {
			b.views[i].CapLength(v.Size() - (c - n))
			views = append(views, b.views[:i+1]...)
			break
		}
	}
	for i := range views {
		b.views[i] = nil
	}
	var pulled buffer.Buffer
	for _, v := range views {
		pulled.Append(v)
	}
	pulled.Truncate(int64(n))
	return pulled
}

func (b *iovecBuffer) release() {
	for i, v := range b.views {
		if v != nil {
			v.Release()
			b.views[i] = nil
		}
	}
}

// reader is fdbased's readv dispatcher: one goroutine blocked reading the
// TUN, which hands each packet to a processor goroutine.
type reader struct {
	stopfd.StopFD
	e   *Endpoint
	buf *iovecBuffer
	mgr *processorManager
}

func newReader(e *Endpoint, processors int) (*reader, error) {
	stop, err := stopfd.New()
	if err != nil {
		return nil, fmt.Errorf("tunlink: %w", err)
	}
	r := &reader{StopFD: stop, e: e, buf: newIovecBuffer()}
	r.mgr = newProcessorManager(processors, e)
	r.mgr.start()
	return r, nil
}

func (r *reader) release() {
	r.buf.release()
	r.mgr.close()
}

// dispatch reads one packet and queues it for a processor, or drops it if
// its header does not fit it.
func (r *reader) dispatch() (bool, tcpip.Error) {
	n, errno := rawfile.BlockingReadvUntilStopped(r.EFD, r.e.fd, r.buf.nextIovecs())
	if n <= 0 || errno != 0 {
		return false, tcpip.TranslateErrno(errno)
	}
	n -= HdrSize
	if n <= 0 || n > bufCap {
		// Shorter than a header, or longer than the buffers (the kernel
		// says how long a packet was even when it did not fit: a sandbox
		// that raised tun0's gso_max_size past 64 KiB).
		r.e.malformed.Add(1)
		return true, nil
	}
	if err := checkHdr(decodeHdr(r.buf.hdr[:]), r.buf.head(n), n); err != nil {
		r.e.malformed.Add(1)
		return true, nil
	}
	pkt := stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: r.buf.pullBuffer(n)})
	defer pkt.DecRef()
	r.mgr.queuePacket(pkt)
	r.mgr.wakeReady()
	return true, nil
}
