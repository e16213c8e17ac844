package procattr

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"golang.org/x/sys/unix"
)

// Wire sizes and constants of <linux/netlink.h> and <linux/inet_diag.h>.
// x/sys/unix does not define the inet_diag structures, so they are encoded by
// hand here.
const (
	sizeofNlMsghdr   = 16
	sizeofSockID     = 48 // struct inet_diag_sockid
	sizeofReqV2      = 8 + sizeofSockID
	sizeofDiagMsg    = 4 + sizeofSockID + 20 // struct inet_diag_msg
	sizeofNlAttr     = 4
	sizeofNlMsgErr   = 4 + sizeofNlMsghdr
	inetDiagNoCookie = ^uint32(0)
	allStates        = ^uint32(0)
	attrSKV6Only     = 11 // INET_DIAG_SKV6ONLY
	tcpListen        = 10 // TCP_LISTEN in idiag_state

	// recvBufSize holds one netlink datagram: the kernel sizes dump skbs to
	// the reader's buffer but never above 32 KiB.
	recvBufSize = 64 << 10
	// maxRecvPerExchange bounds the receive loop of one exchange on top of
	// the deadline.
	maxRecvPerExchange = 4096
	// maxDrain bounds how many stale datagrams are discarded before a request.
	maxDrain = 256
)

var (
	errNotFound = errors.New("socket not found")
	errTimeout  = errors.New("sock_diag: timeout")
	errClosed   = errors.New(resolverClosedReason)
)

// diagSock is one socket as inet_diag reports it, from the socket's point of
// view: local is its bound address, remote its peer (unspecified:0 when
// unconnected). Addresses are unmapped.
type diagSock struct {
	family uint8
	state  uint8
	local  netip.AddrPort
	remote netip.AddrPort
	uid    uint32
	inode  uint64
	v6only bool
}

// nlMsg is one netlink message inside a datagram.
type nlMsg struct {
	typ     uint16
	flags   uint16
	seq     uint32
	payload []byte
}

// encodeDiagRequest appends an nlmsghdr and struct inet_diag_req_v2 to b.
// src and dst go into id.idiag_src/idiag_dst as given; an IPv4 address in an
// AF_INET6 request is written v4-mapped.
func encodeDiagRequest(b []byte, seq uint32, flags uint16, family, proto uint8, src, dst netip.AddrPort) []byte {
	start := len(b)
	b = append(b, make([]byte, sizeofNlMsghdr+sizeofReqV2)...)
	h := b[start:]
	ne := binary.NativeEndian
	ne.PutUint32(h[0:], uint32(sizeofNlMsghdr+sizeofReqV2))
	ne.PutUint16(h[4:], unix.SOCK_DIAG_BY_FAMILY)
	ne.PutUint16(h[6:], flags)
	ne.PutUint32(h[8:], seq)
	ne.PutUint32(h[12:], 0) // nlmsg_pid: the kernel fills in ours
	req := h[sizeofNlMsghdr:]
	req[0] = family
	req[1] = proto
	req[2] = 0 // idiag_ext: no extensions requested
	req[3] = 0
	ne.PutUint32(req[4:], allStates)
	id := req[8:]
	binary.BigEndian.PutUint16(id[0:], src.Port())
	binary.BigEndian.PutUint16(id[2:], dst.Port())
	putDiagAddr(id[4:20], family, src.Addr())
	putDiagAddr(id[20:36], family, dst.Addr())
	ne.PutUint32(id[36:], 0) // idiag_if: any interface
	ne.PutUint32(id[40:], inetDiagNoCookie)
	ne.PutUint32(id[44:], inetDiagNoCookie)
	return b
}

func putDiagAddr(dst []byte, family uint8, a netip.Addr) {
	if !a.IsValid() {
		return
	}
	if family == unix.AF_INET {
		if a.Is4() {
			v := a.As4()
			copy(dst, v[:])
		}
		return
	}
	v := a.As16()
	copy(dst, v[:])
}

// splitMessages calls fn for each netlink message in one datagram, stopping
// when fn returns false. A malformed datagram is an error.
func splitMessages(b []byte, fn func(nlMsg) bool) error {
	ne := binary.NativeEndian
	for n := 0; len(b) > 0 && n < maxRecvPerExchange; n++ {
		if len(b) < sizeofNlMsghdr {
			return fmt.Errorf("sock_diag: truncated netlink header (%d bytes)", len(b))
		}
		l := int(ne.Uint32(b[0:]))
		if l < sizeofNlMsghdr || l > len(b) {
			return fmt.Errorf("sock_diag: bad netlink message length %d (have %d)", l, len(b))
		}
		m := nlMsg{
			typ:     ne.Uint16(b[4:]),
			flags:   ne.Uint16(b[6:]),
			seq:     ne.Uint32(b[8:]),
			payload: b[sizeofNlMsghdr:l],
		}
		if !fn(m) {
			return nil
		}
		aligned := nlmAlign(l)
		if aligned >= len(b) {
			return nil
		}
		b = b[aligned:]
	}
	return nil
}

func nlmAlign(n int) int { return (n + 3) &^ 3 }

// parseNlError returns the errno carried by an NLMSG_ERROR payload (0 for an
// ACK).
func parseNlError(p []byte) (unix.Errno, error) {
	if len(p) < 4 {
		return 0, fmt.Errorf("sock_diag: truncated NLMSG_ERROR (%d bytes)", len(p))
	}
	code := int32(binary.NativeEndian.Uint32(p))
	if code > 0 {
		return 0, fmt.Errorf("sock_diag: positive NLMSG_ERROR code %d", code)
	}
	return unix.Errno(-code), nil
}

// parseDiagMsg decodes a struct inet_diag_msg and the attributes after it.
func parseDiagMsg(p []byte) (diagSock, error) {
	if len(p) < sizeofDiagMsg {
		return diagSock{}, fmt.Errorf("sock_diag: truncated inet_diag_msg (%d bytes)", len(p))
	}
	ne := binary.NativeEndian
	s := diagSock{family: p[0], state: p[1]}
	id := p[4 : 4+sizeofSockID]
	sport := binary.BigEndian.Uint16(id[0:])
	dport := binary.BigEndian.Uint16(id[2:])
	var src, dst netip.Addr
	switch s.family {
	case unix.AF_INET:
		src = netip.AddrFrom4([4]byte(id[4:8]))
		dst = netip.AddrFrom4([4]byte(id[20:24]))
	case unix.AF_INET6:
		src = netip.AddrFrom16([16]byte(id[4:20])).Unmap()
		dst = netip.AddrFrom16([16]byte(id[20:36])).Unmap()
	default:
		return diagSock{}, fmt.Errorf("sock_diag: unexpected family %d", s.family)
	}
	s.local = netip.AddrPortFrom(src, sport)
	s.remote = netip.AddrPortFrom(dst, dport)
	rest := p[4+sizeofSockID:]
	// idiag_expires, idiag_rqueue, idiag_wqueue, idiag_uid, idiag_inode
	s.uid = ne.Uint32(rest[12:])
	s.inode = uint64(ne.Uint32(rest[16:]))
	attrs := p[sizeofDiagMsg:]
	for n := 0; len(attrs) >= sizeofNlAttr && n < 64; n++ {
		l := int(ne.Uint16(attrs[0:]))
		typ := ne.Uint16(attrs[2:]) & 0x3fff // strip NLA_F_NESTED/NET_BYTEORDER
		if l < sizeofNlAttr || l > len(attrs) {
			break
		}
		if typ == attrSKV6Only && l >= sizeofNlAttr+1 {
			s.v6only = attrs[sizeofNlAttr] != 0
		}
		a := nlmAlign(l)
		if a >= len(attrs) {
			break
		}
		attrs = attrs[a:]
	}
	return s, nil
}

// matchScore says how well socket s owns the flow local→remote (both
// unmapped, from the sandbox's side): -1 for not at all, higher is more
// specific. A TCP flow belongs only to a connected socket with exactly that
// 4-tuple (never a listener); a UDP flow may belong to a socket bound to a
// wildcard address and/or unconnected.
func matchScore(ipProto uint8, s diagSock, local, remote netip.AddrPort) int {
	if s.local.Port() != local.Port() {
		return -1
	}
	score := 0
	switch la := s.local.Addr(); {
	case la == local.Addr():
		score += 2
	case la.IsUnspecified():
		if local.Addr().Is4() && s.family == unix.AF_INET6 && s.v6only {
			return -1
		}
		if local.Addr().Is6() && s.family == unix.AF_INET {
			return -1
		}
	default:
		return -1
	}
	switch {
	case s.remote == remote:
		score += 2
	case ipProto == unix.IPPROTO_UDP && s.remote.Port() == 0 && s.remote.Addr().IsUnspecified():
	default:
		return -1
	}
	if ipProto == unix.IPPROTO_TCP && s.state == tcpListen {
		return -1
	}
	return score
}

// exchangeLocked sends one request and feeds every inet_diag_msg of the reply
// to fn until the reply ends (one message for an exact lookup, NLMSG_DONE for
// a dump), fn returns false, or deadline passes. r.mu must be held.
func (r *Resolver) exchangeLocked(req []byte, seq uint32, dump bool, deadline time.Time, fn func(diagSock) bool) error {
	// Unless the reply is read to its end, datagrams of it may be left
	// for drainLocked.
	finished := false
	defer func() {
		if !finished {
			r.stale = true
		}
	}()
	if err := unix.Sendto(r.fd, req, unix.MSG_DONTWAIT, nil); err != nil {
		finished = true // nothing was sent
		return fmt.Errorf("sock_diag: send: %w", err)
	}
	// The kernel answers inside sendmsg (and produces each further dump
	// part inside recvmsg), so a reply is normally queued already: read
	// first, and only wait, up to the deadline, when nothing is there. A
	// caller descheduled past its deadline still gets a queued answer.
	for i := 0; i < maxRecvPerExchange; i++ {
		nr, _, rflags, _, err := unix.Recvmsg(r.fd, r.buf, nil, unix.MSG_DONTWAIT)
		if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
			remaining := time.Until(deadline)
			if remaining <= 0 {
				return errTimeout
			}
			ms := int((remaining + time.Millisecond - 1) / time.Millisecond)
			pfd := []unix.PollFd{{Fd: int32(r.fd), Events: unix.POLLIN}}
			if _, err := unix.Poll(pfd, ms); err != nil && !errors.Is(err, unix.EINTR) {
				return fmt.Errorf("sock_diag: poll: %w", err)
			}
			continue
		}
		if err != nil {
			return fmt.Errorf("sock_diag: receive: %w", err)
		}
		if rflags&unix.MSG_TRUNC != 0 {
			return fmt.Errorf("sock_diag: reply truncated to %d bytes", nr)
		}
		done, perr := handleDatagram(r.buf[:nr], seq, dump, fn)
		if done {
			// An NLMSG_ERROR or NLMSG_DONE, or the one reply of an
			// exact lookup, ends the reply; after a malformed one
			// more may be left.
			var errno unix.Errno
			finished = perr == nil || errors.As(perr, &errno)
			return perr
		}
		if perr != nil {
			return perr
		}
	}
	return fmt.Errorf("sock_diag: reply did not end after %d datagrams", maxRecvPerExchange)
}

// handleDatagram processes one received datagram for the exchange with
// sequence number seq; messages of other exchanges are ignored.
func handleDatagram(b []byte, seq uint32, dump bool, fn func(diagSock) bool) (finished bool, err error) {
	perr := splitMessages(b, func(m nlMsg) bool {
		if m.seq != seq {
			return true // a stale reply to an earlier, timed-out request
		}
		switch m.typ {
		case unix.NLMSG_ERROR:
			errno, e := parseNlError(m.payload)
			switch {
			case e != nil:
				err = e
			case errno != 0:
				err = fmt.Errorf("sock_diag: %w", errno)
			}
			finished = true
			return false
		case unix.NLMSG_DONE:
			finished = true
			return false
		case unix.SOCK_DIAG_BY_FAMILY:
			s, e := parseDiagMsg(m.payload)
			if e != nil {
				err = e
				finished = true
				return false
			}
			if !fn(s) || !dump {
				finished = true
				return false
			}
		}
		return true
	})
	if err == nil && perr != nil {
		return true, perr
	}
	return finished, err
}

// drainLocked discards datagrams left over from timed-out or failed
// exchanges (which also lets an interrupted dump run to its end), if any
// may be left. r.mu must be held.
func (r *Resolver) drainLocked() {
	if !r.stale {
		return
	}
	r.stale = false
	for i := 0; i < maxDrain; i++ {
		_, _, _, _, err := unix.Recvmsg(r.fd, r.buf, nil, unix.MSG_DONTWAIT)
		if err != nil {
			return
		}
	}
}

func (r *Resolver) nextSeqLocked() uint32 {
	r.seq++
	if r.seq == 0 {
		r.seq = 1
	}
	return r.seq
}

// exactLocked asks the kernel for the one socket with id src/dst.
func (r *Resolver) exactLocked(family, ipProto uint8, src, dst netip.AddrPort, deadline time.Time) (diagSock, error) {
	seq := r.nextSeqLocked()
	var req [sizeofNlMsghdr + sizeofReqV2]byte
	b := encodeDiagRequest(req[:0], seq, unix.NLM_F_REQUEST, family, ipProto, src, dst)
	var got diagSock
	found := false
	err := r.exchangeLocked(b, seq, false, deadline, func(s diagSock) bool {
		got, found = s, true
		return false
	})
	if err != nil {
		return diagSock{}, err
	}
	if !found {
		return diagSock{}, errNotFound
	}
	return got, nil
}

// dumpLocked lists every socket of family/ipProto in the diag socket's netns.
func (r *Resolver) dumpLocked(family, ipProto uint8, deadline time.Time, fn func(diagSock)) error {
	seq := r.nextSeqLocked()
	var req [sizeofNlMsghdr + sizeofReqV2]byte
	b := encodeDiagRequest(req[:0], seq, unix.NLM_F_REQUEST|unix.NLM_F_DUMP, family, ipProto, netip.AddrPort{}, netip.AddrPort{})
	return r.exchangeLocked(b, seq, true, deadline, func(s diagSock) bool {
		fn(s)
		return true
	})
}

// lookupOrder is one exact-lookup attempt: which side goes into idiag_src.
type lookupOrder struct{ src, dst netip.AddrPort }

// exactOrders returns the id orders to try, the expected one first. For TCP,
// inet_diag_find_one_icsk passes id.src as the socket's local address. For
// UDP, udp_dump_one calls __udp4_lib_lookup(net, src, sport, dst, dport),
// which treats id.src as a packet's source, that is the socket's REMOTE side
// ("src and dst are swapped for historical reasons" in net/ipv4/udp_diag.c).
// Both orders are tried; matchScore rejects a socket that only matches the
// swapped order by accident.
func exactOrders(ipProto uint8, local, remote netip.AddrPort) [2]lookupOrder {
	if ipProto == unix.IPPROTO_UDP {
		return [2]lookupOrder{{remote, local}, {local, remote}}
	}
	return [2]lookupOrder{{local, remote}, {remote, local}}
}

// findSocket finds the socket owning local→remote in the diag socket's netns.
// It returns errNotFound when no socket matches.
func (r *Resolver) findSocket(ipProto uint8, local, remote netip.AddrPort, deadline time.Time) (diagSock, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return diagSock{}, errClosed
	}
	r.drainLocked()
	s, err := r.exactFindLocked(ipProto, local, remote, deadline)
	var nf *notFoundError
	if !errors.As(err, &nf) {
		return s, err
	}
	f := dumpFlow{ipProto: ipProto, local: local, remote: remote}
	if err := r.dumpFindLocked(ipProto, []*dumpFlow{&f}, deadline); err != nil {
		return diagSock{}, err
	}
	if f.score >= 0 {
		return f.best, nil
	}
	if nf.last != nil {
		return diagSock{}, nf.last
	}
	return diagSock{}, errNotFound
}

// notFoundError is the exact lookups' "not found": the dump fallback is the
// next step. last is the last error other than "not found" they met, if any.
type notFoundError struct{ last error }

func (e *notFoundError) Error() string { return errNotFound.Error() }
func (e *notFoundError) Unwrap() error { return errNotFound }

// exactFindLocked asks the kernel for the socket of local→remote in both id
// orders. It returns a *notFoundError when neither finds it. r.mu must be
// held.
func (r *Resolver) exactFindLocked(ipProto uint8, local, remote netip.AddrPort, deadline time.Time) (diagSock, error) {
	family := uint8(unix.AF_INET6)
	if local.Addr().Is4() {
		// Dual-stack AF_INET6 sockets talking IPv4 live in the IPv4 lookup
		// tables, so one AF_INET query finds both kinds.
		family = unix.AF_INET
	}
	var lastErr error
	for i, o := range exactOrders(ipProto, local, remote) {
		s, err := r.exactLocked(family, ipProto, o.src, o.dst, deadline)
		if errors.Is(err, errTimeout) {
			return diagSock{}, err
		}
		if err == nil && matchScore(ipProto, s, local, remote) >= 0 {
			r.stats.exact[i].Add(1)
			return s, nil
		}
		if err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, errNotFound) {
			lastErr = err
		}
	}
	return diagSock{}, &notFoundError{last: lastErr}
}

// dumpFlow is one flow the dump fallback looks for, and the best match so
// far (score -1: none).
type dumpFlow struct {
	ipProto       uint8
	local, remote netip.AddrPort
	best          diagSock
	score         int
}

// dumpFindLocked lists the tables of ipProto once and finds the socket of
// each of flows by local port. This finds sockets the exact lookup cannot,
// such as ones bound to a device (SO_BINDTODEVICE), since the exact lookup
// runs with idiag_if 0. inet_diag dumps filter by sk_family, so an IPv4 flow
// may belong to an AF_INET6 dual-stack socket listed only in the AF_INET6
// dump. r.mu must be held.
func (r *Resolver) dumpFindLocked(ipProto uint8, flows []*dumpFlow, deadline time.Time) error {
	byPort := make(map[uint16][]*dumpFlow, len(flows))
	v4 := false
	for _, f := range flows {
		f.score = -1
		byPort[f.local.Port()] = append(byPort[f.local.Port()], f)
		v4 = v4 || f.local.Addr().Is4()
	}
	families := []uint8{unix.AF_INET6}
	if v4 {
		families = []uint8{unix.AF_INET, unix.AF_INET6}
	}
	var lastErr error
	for _, fam := range families {
		err := r.dumpLocked(fam, ipProto, deadline, func(s diagSock) {
			for _, f := range byPort[s.local.Port()] {
				if sc := matchScore(ipProto, s, f.local, f.remote); sc > f.score || (sc == f.score && f.best.inode == 0 && s.inode != 0) {
					f.best, f.score = s, sc
				}
			}
		})
		if errors.Is(err, errTimeout) {
			return err
		}
		if err != nil {
			lastErr = err
		}
	}
	found := false
	for _, f := range flows {
		if f.score >= 0 {
			r.stats.dump.Add(1)
			found = true
		}
	}
	if !found && lastErr != nil {
		return lastErr
	}
	return nil
}
