package socks5

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/things-go/go-socks5/statute"
)

// datagramPool holds receive/send buffers big enough for any UDP datagram
// plus a SOCKS header. Pointers avoid an allocation per Put (SA6002).
var datagramPool = sync.Pool{New: func() any { return new([maxDatagram + maxHeader]byte) }}

// DialUDP opens a UDP ASSOCIATE through the proxy and returns a conn bound to
// one destination, addr ("host:port" or "ip:port"; a hostname is sent as a
// hostname in each datagram's SOCKS header and never resolved locally).
//
// Each Write sends one datagram to addr. Each Read returns the payload of one
// datagram from addr; datagrams from other sources, fragments (FRAG != 0) and
// malformed datagrams are dropped. When addr is a hostname and the proxy
// labels replies with an IP address instead, the first such IP is pinned and
// later datagrams from any other IP are dropped.
//
// The association lives as long as the TCP control connection: if the proxy
// closes it, Read and Write fail. Close closes both. ctx bounds the setup
// only. If the proxy answers with reply code 7 the error wraps
// ErrUDPNotSupported.
func (d *Dialer) DialUDP(ctx context.Context, addr string) (net.Conn, error) {
	dst, err := parseTarget(addr)
	if err != nil {
		return nil, err
	}
	hctx, cancel := d.handshakeContext(ctx)
	defer cancel()
	// DST.ADDR/PORT of the request is where we will send from; we do not
	// know it before the relay socket exists, so send zeros (RFC 1928 §7).
	any4 := sockAddr{ip: netip.IPv4Unspecified()}
	ctrl, bnd, err := d.connect(ctx, hctx, statute.CommandAssociate, any4)
	if err != nil {
		var re *ReplyError
		if errors.As(err, &re) && re.Code == ReplyCommandNotSupported {
			return nil, fmt.Errorf("socks5: UDP ASSOCIATE via %s: %w: %w", d.Addr, ErrUDPNotSupported, err)
		}
		return nil, fmt.Errorf("socks5: UDP ASSOCIATE via %s: %w", d.Addr, err)
	}
	relay, err := d.relayAddr(bnd, ctrl)
	if err != nil {
		ctrl.Close()
		return nil, fmt.Errorf("socks5: UDP ASSOCIATE via %s: %w", d.Addr, err)
	}
	pc, err := d.forward(hctx, "udp", relay)
	if err != nil {
		ctrl.Close()
		return nil, fmt.Errorf("socks5: UDP ASSOCIATE via %s: opening relay socket to %s: %w",
			d.Addr, relay, d.contextErr(ctx, hctx, err))
	}
	c := &udpConn{
		ctrl:     ctrl,
		pc:       pc,
		dst:      dst,
		hdr:      datagramHeader(dst),
		ctrlDone: make(chan struct{}),
	}
	c.remote = remoteAddr(dst)
	go c.runWatchControl()
	return c, nil
}

// relayAddr picks where to send datagrams: BND.ADDR:BND.PORT from the
// ASSOCIATE reply, with an unspecified BND.ADDR (0.0.0.0 or ::) replaced by
// the address the control connection reached.
func (d *Dialer) relayAddr(bnd sockAddr, ctrl net.Conn) (string, error) {
	if bnd.port == 0 {
		return "", fmt.Errorf("%w: relay port 0 in ASSOCIATE reply", errMalformed)
	}
	port := strconv.Itoa(int(bnd.port))
	if bnd.host != "" {
		return net.JoinHostPort(bnd.host, port), nil
	}
	if !bnd.ip.IsUnspecified() {
		return net.JoinHostPort(bnd.ip.String(), port), nil
	}
	if ta, ok := ctrl.RemoteAddr().(*net.TCPAddr); ok && ta != nil && len(ta.IP) > 0 {
		if ip, ok := netip.AddrFromSlice(ta.IP); ok && !ip.IsUnspecified() {
			return net.JoinHostPort(ip.Unmap().String(), port), nil
		}
	}
	host, _, err := net.SplitHostPort(d.Addr)
	if err != nil {
		return "", fmt.Errorf("proxy address %q: %w", d.Addr, err)
	}
	return net.JoinHostPort(host, port), nil
}

func remoteAddr(dst sockAddr) net.Addr {
	if dst.host != "" {
		return hostAddr(dst.String())
	}
	return net.UDPAddrFromAddrPort(netip.AddrPortFrom(dst.ip, dst.port))
}

// hostAddr is the RemoteAddr of a UDP conn to a hostname.
type hostAddr string

func (hostAddr) Network() string  { return "udp" }
func (a hostAddr) String() string { return string(a) }

// udpConn is one destination over a UDP association.
type udpConn struct {
	ctrl   net.Conn // TCP control connection; the association's lifetime
	pc     net.Conn // connected datagram socket to the relay
	dst    sockAddr
	hdr    []byte // SOCKS UDP header for every Write; read-only
	remote net.Addr

	pinMu  sync.Mutex
	pinned netip.Addr // first IP a hostname destination replied from

	ctrlEnded atomic.Bool // the proxy closed the control connection
	closed    atomic.Bool // Close was called
	ctrlDone  chan struct{}
	pcOnce    sync.Once
	pcErr     error
	closeOnce sync.Once
	closeErr  error
}

// errAssociationEnded is returned by Read and Write once the proxy has
// closed the control connection.
var errAssociationEnded = fmt.Errorf("socks5: UDP association ended: proxy closed the control connection: %w", net.ErrClosed)

// runWatchControl waits for the control connection to end (the proxy closed
// it, or Close did) and then closes the relay socket, unblocking readers.
func (c *udpConn) runWatchControl() {
	defer close(c.ctrlDone)
	var b [64]byte
	for {
		// Bounded by the connection: any error (EOF, reset, Close) ends it.
		if _, err := c.ctrl.Read(b[:]); err != nil {
			break
		}
	}
	if !c.closed.Load() {
		c.ctrlEnded.Store(true)
	}
	c.closePC()
}

func (c *udpConn) closePC() error {
	c.pcOnce.Do(func() { c.pcErr = c.pc.Close() })
	return c.pcErr
}

func (c *udpConn) ioErr(err error) error {
	if c.ctrlEnded.Load() && !c.closed.Load() {
		return errAssociationEnded
	}
	return err
}

// Read returns the payload of the next datagram from the destination. A
// payload longer than p is truncated, as with a UDP socket.
func (c *udpConn) Read(p []byte) (int, error) {
	buf := datagramPool.Get().(*[maxDatagram + maxHeader]byte)
	defer datagramPool.Put(buf)
	for {
		// Each iteration blocks on the socket; deadlines and Close bound it.
		n, err := c.pc.Read(buf[:])
		if err != nil {
			return 0, c.ioErr(err)
		}
		src, frag, payload, err := parseUDPHeader(buf[:n])
		if err != nil || frag != 0 || !c.fromDst(src) {
			continue
		}
		return copy(p, payload), nil
	}
}

// fromDst reports whether a datagram labelled src comes from c.dst.
func (c *udpConn) fromDst(src sockAddr) bool {
	if src.port != c.dst.port {
		return false
	}
	if c.dst.host == "" {
		return src.host == "" && src.ip.Unmap() == c.dst.ip
	}
	if src.host != "" {
		return strings.EqualFold(strings.TrimSuffix(src.host, "."), strings.TrimSuffix(c.dst.host, "."))
	}
	ip := src.ip.Unmap()
	c.pinMu.Lock()
	defer c.pinMu.Unlock()
	if !c.pinned.IsValid() {
		c.pinned = ip
	}
	return c.pinned == ip
}

// Write sends p as one datagram to the destination.
func (c *udpConn) Write(p []byte) (int, error) {
	if len(p) > maxDatagram-len(c.hdr) {
		return 0, fmt.Errorf("socks5: datagram of %d bytes too large for the relay (max %d)", len(p), maxDatagram-len(c.hdr))
	}
	buf := datagramPool.Get().(*[maxDatagram + maxHeader]byte)
	defer datagramPool.Put(buf)
	b := append(buf[:0], c.hdr...)
	b = append(b, p...)
	if _, err := c.pc.Write(b); err != nil {
		return 0, c.ioErr(err)
	}
	return len(p), nil
}

// Close ends the association: it closes the control connection and the
// relay socket and waits for the watcher goroutine. It is idempotent.
func (c *udpConn) Close() error {
	c.closeOnce.Do(func() {
		c.closed.Store(true)
		errCtrl := c.ctrl.Close()
		errPC := c.closePC()
		<-c.ctrlDone
		c.closeErr = errors.Join(errCtrl, errPC)
	})
	return c.closeErr
}

// LocalAddr is the local address of the relay socket.
func (c *udpConn) LocalAddr() net.Addr { return c.pc.LocalAddr() }

// RemoteAddr is the destination: a *net.UDPAddr for an IP, otherwise an
// address whose String is "host:port".
func (c *udpConn) RemoteAddr() net.Addr { return c.remote }

func (c *udpConn) SetDeadline(t time.Time) error      { return c.pc.SetDeadline(t) }
func (c *udpConn) SetReadDeadline(t time.Time) error  { return c.pc.SetReadDeadline(t) }
func (c *udpConn) SetWriteDeadline(t time.Time) error { return c.pc.SetWriteDeadline(t) }
