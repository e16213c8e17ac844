package dnsintercept

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/miekg/dns"
)

// maxInFlightPerConn bounds the queries one conn may have being answered
// at once; Limits.MaxInFlight bounds them across all conns, reporting to
// OnQuery included. When either is reached a TCP conn's read loop waits,
// which pushes back on the client; a UDP session drops the datagram
// (counted as Overrun), so that queued datagrams never pile up behind it.
const maxInFlightPerConn = 64

// maxUDPQuery is the largest UDP query read; a longer datagram is cut and
// does not parse. Real queries are a few hundred bytes.
const maxUDPQuery = 4096

// udpBufs recycles the read buffers of UDP sessions.
var udpBufs = sync.Pool{New: func() any { return new([maxUDPQuery]byte) }}

// Admit reserves a place for a new DNS conn ("tcp") or UDP session ("udp")
// before the caller accepts it. At the limit (Limits.MaxTCPConns or
// MaxUDPSessions) the session of that protocol idle longest (no query being
// answered) is ended to make room and counted as Evicted; if every session
// is busy, Admit reports false and counts the refusal, and the caller
// refuses the conn at once (TCP RST, ICMP unreachable). A session Admit
// returns must be served with Session.Serve or given back with
// Session.Release.
func (s *Server) Admit(proto string) (*Session, bool) {
	if proto == "tcp" {
		ss, ok := s.tcp.admit("tcp")
		if ok {
			ss.srv = s
		}
		return ss, ok
	}
	ss, ok := s.udp.admit("udp")
	if ok {
		ss.srv = s
	}
	return ss, ok
}

// Serve serves the conn the session was admitted for: ServeTCP's or
// ServeUDP's loop, on the Server that admitted it. It releases the session
// when it returns.
func (ss *Session) Serve(ctx context.Context, c net.Conn, src, dst netip.AddrPort) {
	ss.srv.serve(ctx, ss, c, src, dst)
}

// ServeUDP answers the datagrams on c, a connected UDP conn between one
// sandbox socket (src) and the address it sent to (dst). It loops, because
// glibc reuses one socket for the A and AAAA queries, until Limits.UDPIdle
// passes with no query, ctx is done, the session is evicted, or c fails;
// then it waits for the queries in flight and closes c. Datagrams that do
// not parse are dropped and counted as malformed. Replies are truncated to
// the client's payload size with TC set. If no session can be admitted, it
// closes c at once.
func (s *Server) ServeUDP(ctx context.Context, c net.Conn, src, dst netip.AddrPort) {
	ss, ok := s.Admit("udp")
	if !ok {
		c.Close()
		return
	}
	s.serve(ctx, ss, c, src, dst)
}

// ServeTCP serves length-prefixed DNS on c until the client closes its side,
// Limits.TCPIdle passes with no query, Limits.MaxQueriesPerConn queries were
// answered, ctx is done, the session is evicted, c fails, or a frame does not
// parse (counted as malformed); then it waits for the queries in flight and
// closes c. Pipelined queries are answered concurrently, possibly out of
// order (RFC 7766). If no session can be admitted, it closes c at once.
func (s *Server) ServeTCP(ctx context.Context, c net.Conn, src, dst netip.AddrPort) {
	ss, ok := s.Admit("tcp")
	if !ok {
		c.Close()
		return
	}
	s.serve(ctx, ss, c, src, dst)
}

func (s *Server) serve(ctx context.Context, ss *Session, c net.Conn, src, dst netip.AddrPort) {
	proto := ss.proto
	idle := s.cfg.Limits.TCPIdle
	if proto == "udp" {
		idle = s.cfg.Limits.UDPIdle
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer ss.Release()
	if !ss.start(cancel) {
		c.Close() // evicted before it started
		return
	}
	// Cancellation unblocks the read loop through a deadline in the past.
	stop := context.AfterFunc(ctx, func() { c.SetReadDeadline(time.Now()) })
	defer stop()

	var (
		wg      sync.WaitGroup
		writeMu sync.Mutex
		sem     = make(chan struct{}, maxInFlightPerConn)
	)
	defer func() {
		wg.Wait()
		c.Close()
	}()

	var buf *[maxUDPQuery]byte
	if proto == "udp" {
		buf = udpBufs.Get().(*[maxUDPQuery]byte)
		defer udpBufs.Put(buf)
	}
	for n := 0; proto == "udp" || n < s.cfg.Limits.MaxQueriesPerConn; n++ {
		if err := c.SetReadDeadline(time.Now().Add(idle)); err != nil {
			return
		}
		if ctx.Err() != nil { // the AfterFunc may have run before our deadline
			return
		}
		msg, ok := s.readQuery(c, proto, buf)
		if !ok {
			return
		}
		q := new(dns.Msg)
		if err := q.Unpack(msg); err != nil {
			s.malformed.Add(1)
			if proto == "tcp" {
				return
			}
			continue
		}

		if !ss.begin() {
			return // evicted
		}
		if taken, ended := s.reserve(ctx, proto, sem); !taken {
			ss.end()
			if ended {
				return
			}
			continue
		}
		wg.Add(1)
		go func() {
			defer func() { <-s.inflight; wg.Done() }()
			r, ev := s.answer(ctx, src, dst, proto, q)
			err := s.writeReply(c, &writeMu, proto, idle, r)
			<-sem // answered; reporting counts against MaxInFlight only
			ss.end()
			if err != nil {
				cancel() // the conn is broken: stop reading too
			}
			if s.cfg.OnQuery != nil {
				s.cfg.OnQuery(ev)
			}
		}()
	}
}

// readQuery reads the next query message from c: a datagram for UDP
// (buf is the read buffer; the message returned is a copy), a frame with
// miekg's RFC 1035 4.2.2 length prefix for TCP. ok is false when the conn
// ends: a read error, a closed conn, or a TCP frame too short to hold a
// header (length 0 included), which is counted as malformed.
func (s *Server) readQuery(c net.Conn, proto string, buf *[maxUDPQuery]byte) (msg []byte, ok bool) {
	if proto == "udp" {
		k, err := c.Read(buf[:])
		if err != nil {
			return nil, false
		}
		// Copied: the query must not alias buf, which the next Read
		// reuses while a worker still holds the query.
		return append([]byte(nil), buf[:k]...), true
	}
	// A conn closed before or inside a frame just ends.
	b, err := (&dns.Conn{Conn: c}).ReadMsgHeader(nil)
	if errors.Is(err, dns.ErrShortRead) {
		s.malformed.Add(1)
		return nil, false
	}
	if err != nil {
		return nil, false
	}
	return b, true
}

// reserve takes a place among a conn's queries in flight (sem), then
// among all the Server's: UDP drops the query (counted as an overrun) if
// there is none, TCP waits until ctx ends. taken reports both places
// held; ended that the conn must stop reading (TCP's ctx ended).
func (s *Server) reserve(ctx context.Context, proto string, sem chan struct{}) (taken, ended bool) {
	if proto == "udp" {
		select {
		case sem <- struct{}{}:
		default:
			s.overrun.Add(1)
			return false, false
		}
		select {
		case s.inflight <- struct{}{}:
		default:
			<-sem
			s.overrun.Add(1)
			return false, false
		}
		return true, false
	}
	select {
	case sem <- struct{}{}:
	case <-ctx.Done():
		return false, true
	}
	select {
	case s.inflight <- struct{}{}:
	case <-ctx.Done():
		<-sem
		return false, true
	}
	return true, false
}

// writeReply packs r and writes it to c. Answer has already truncated r to
// the client's size.
func (s *Server) writeReply(c net.Conn, mu *sync.Mutex, proto string, idle time.Duration, r *dns.Msg) error {
	wire, err := r.Pack()
	if err != nil {
		// Cannot happen for replies Answer builds from parsed input; if it
		// does, tell the client rather than leave it waiting.
		fail := new(dns.Msg)
		fail.Id, fail.Response, fail.RecursionAvailable = r.Id, true, true
		fail.Opcode = r.Opcode
		fail.Rcode = dns.RcodeServerFailure
		if wire, err = fail.Pack(); err != nil {
			return err
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if err := c.SetWriteDeadline(time.Now().Add(idle)); err != nil {
		return err
	}
	if proto == "udp" {
		_, err = c.Write(wire)
		return err
	}
	_, err = (&dns.Conn{Conn: c}).Write(wire) // one Write: length prefix and message
	return err
}
