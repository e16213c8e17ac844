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

// maxInFlightPerConn bounds the queries one conn may have being answered at
// once (a forwarded query can wait for the upstream; local answers do not).
// When it is reached the read loop waits, which pushes back on the client.
const maxInFlightPerConn = 16

// ServeUDP answers the datagrams on c, a connected UDP conn between one
// sandbox socket (src) and the address it sent to (dst). It loops, because
// glibc reuses one socket for the A and AAAA queries, until IdleTimeout
// passes with no query, ctx is done, or c fails; then it waits for the
// queries in flight and closes c. Datagrams that do not parse are dropped
// and counted as malformed. Replies are truncated to the client's payload
// size with TC set.
func (s *Server) ServeUDP(ctx context.Context, c net.Conn, src, dst netip.AddrPort) {
	s.serve(ctx, c, src, dst, "udp")
}

// ServeTCP serves length-prefixed DNS on c until the client closes its side,
// IdleTimeout passes with no query, ctx is done, c fails, or a frame does not
// parse (counted as malformed); then it waits for the queries in flight and
// closes c. Pipelined queries are answered concurrently, possibly out of
// order (RFC 7766).
func (s *Server) ServeTCP(ctx context.Context, c net.Conn, src, dst netip.AddrPort) {
	s.serve(ctx, c, src, dst, "tcp")
}

func (s *Server) serve(ctx context.Context, c net.Conn, src, dst netip.AddrPort, proto string) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
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

	var buf []byte
	if proto == "udp" {
		buf = make([]byte, dns.MaxMsgSize)
	}
	for {
		if err := c.SetReadDeadline(time.Now().Add(s.cfg.IdleTimeout)); err != nil {
			return
		}
		if ctx.Err() != nil { // the AfterFunc may have run before our deadline
			return
		}
		var msg []byte
		if proto == "udp" {
			n, err := c.Read(buf)
			if err != nil {
				return
			}
			// Copied: q must not alias buf, which the next Read reuses
			// while a worker still holds q.
			msg = append([]byte(nil), buf[:n]...)
		} else {
			b, err := readTCPMsg(c)
			if errors.Is(err, errZeroLength) {
				s.malformed.Add(1)
				return
			}
			if err != nil {
				return
			}
			msg = b
		}
		q := new(dns.Msg)
		if err := q.Unpack(msg); err != nil {
			s.malformed.Add(1)
			if proto == "tcp" {
				return
			}
			continue
		}

		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			return
		}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			r, ev := s.answer(ctx, src, dst, proto, q)
			if s.writeReply(c, &writeMu, proto, r) != nil {
				cancel() // the conn is broken: stop reading too
			}
			if s.cfg.OnQuery != nil {
				s.cfg.OnQuery(ev)
			}
		}()
	}
}

// writeReply packs r and writes it to c. Answer has already truncated r to
// the client's size.
func (s *Server) writeReply(c net.Conn, mu *sync.Mutex, proto string, r *dns.Msg) error {
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
	if err := c.SetWriteDeadline(time.Now().Add(s.cfg.IdleTimeout)); err != nil {
		return err
	}
	if proto == "udp" {
		_, err = c.Write(wire)
		return err
	}
	return writeTCPMsg(c, wire)
}
