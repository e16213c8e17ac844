package dnsintercept

import (
	"context"
	"errors"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/miekg/dns"
)

// Verdict is the caller's decision about a query name.
type Verdict struct {
	// Allow is whether the name may be answered (with fake addresses, or by
	// forwarding). In learn mode it is always true.
	Allow bool
	// Rule and Reason say why, for the audit log.
	Rule, Reason string
	// WouldAllow is what enforce mode would have said. It equals Allow
	// outside learn mode.
	WouldAllow bool
}

// Filter decides about a query name. qname is normalized: ASCII lower-case,
// no trailing dot, and made only of LDH and underscore labels (other names
// are answered NXDOMAIN without calling Filter). Filter must be safe for
// concurrent use and must not block.
type Filter func(qname string) Verdict

// Config configures a Server. It is copied by NewServer.
type Config struct {
	// Pool hands out the fake addresses. Required.
	Pool *Pool
	// Filter decides which names are answered. Required.
	Filter Filter
	// Upstream answers the record types that are not answered locally
	// (MX, TXT, SRV, CAA, CNAME, NS, SOA, ...) for allowed names. nil
	// answers those with SERVFAIL.
	Upstream *Resolver
	// TTL is the TTL of fake A/AAAA (and PTR) answers, in seconds. 0 means
	// 60. The mapping never changes, so a long TTL is safe.
	TTL uint32
	// OnQuery is called once per query, after it is answered, e.g. to write
	// the audit log. It runs on the serving goroutine and must not block
	// long. nil means none.
	OnQuery func(QueryEvent)
	// IdleTimeout is how long ServeUDP and ServeTCP wait for the next query
	// on a conn (on TCP also: for the rest of a started message, and for a
	// reply to be written). 0 means 5s.
	IdleTimeout time.Duration
}

// QueryEvent describes one answered query.
type QueryEvent struct {
	Src, Dst  netip.AddrPort // the sandbox's socket and the address it sent the query to
	Proto     string         // "udp" or "tcp"
	QName     string         // normalized; empty when the query had no single question
	QType     string         // "A", "AAAA", "TXT", "TYPE65280", ...
	RCode     string         // "NOERROR", "NXDOMAIN", ...
	Verdict   Verdict        // zero when the Filter was not consulted
	Forwarded bool           // sent to the upstream resolver
	Answers   []netip.Addr   // fake addresses handed out, if any
}

// Stats are a Server's counters, read atomically.
type Stats struct {
	Queries   uint64 // parseable messages answered
	Allowed   uint64 // queries whose name the Filter allowed
	Denied    uint64 // queries answered NXDOMAIN by the Filter or for an invalid name
	Forwarded uint64 // queries sent to the upstream resolver
	Malformed uint64 // datagrams or TCP frames that did not parse (dropped, or the TCP conn ended)
	Exhausted uint64 // queries refused because the pool was full
}

// Server answers the sandbox's DNS queries. It is safe for concurrent use.
type Server struct {
	cfg Config

	queries, allowed, denied, forwarded, malformed, exhausted atomic.Uint64
}

// ednsUDPSize is the payload size the Server advertises in its OPT records.
const ednsUDPSize = 1232

// NewServer validates cfg and returns a Server.
func NewServer(cfg Config) (*Server, error) {
	if cfg.Pool == nil {
		return nil, errors.New("dnsintercept: Config.Pool is required")
	}
	if cfg.Filter == nil {
		return nil, errors.New("dnsintercept: Config.Filter is required")
	}
	if cfg.IdleTimeout < 0 {
		return nil, errors.New("dnsintercept: Config.IdleTimeout must not be negative")
	}
	if cfg.TTL == 0 {
		cfg.TTL = 60
	}
	if cfg.IdleTimeout == 0 {
		cfg.IdleTimeout = 5 * time.Second
	}
	return &Server{cfg: cfg}, nil
}

// Stats returns a snapshot of the counters.
func (s *Server) Stats() Stats {
	return Stats{
		Queries:   s.queries.Load(),
		Allowed:   s.allowed.Load(),
		Denied:    s.denied.Load(),
		Forwarded: s.forwarded.Load(),
		Malformed: s.malformed.Load(),
		Exhausted: s.exhausted.Load(),
	}
}

// Answer is the pure core: it answers one parsed query from src to dst that
// arrived over proto ("udp" or "tcp"), then calls OnQuery. It returns nil only
// for a nil q. For "udp" the reply is truncated to the client's EDNS0 payload
// size (512 without EDNS0) with TC set, so the client retries over TCP.
//
// Rules, in order:
//   - not a query (QR set), not exactly one question, or a question name
//     that is not fully qualified: FORMERR. Opcode other than QUERY:
//     NOTIMP. Class other than IN: REFUSED. EDNS version other than 0:
//     BADVERS.
//   - a reverse name (PTR or any type) of an address inside the pool: answered
//     from the pool, before and without the Filter, never forwarded.
//   - a name that is not a plain hostname, or one the Filter does not allow:
//     NXDOMAIN, for every type, never forwarded.
//   - allowed A, AAAA, ANY: the name's fake addresses (REFUSED when the pool
//     is exhausted). HTTPS and SVCB: NOERROR with no answers, because their
//     ipv4hint/ipv6hint/ech parameters would hand the client real addresses
//     that bypass the fake-IP mapping. Zone transfers and meta types:
//     REFUSED. Every other type is forwarded upstream with the client's
//     question and the reply copied back with the client's ID, minus any A,
//     AAAA, SVCB and HTTPS records (and their signatures), which would
//     likewise leak real addresses; upstream failure is SERVFAIL.
//
// Replies set RA, never AA, and echo an OPT record when the query had one.
func (s *Server) Answer(ctx context.Context, src, dst netip.AddrPort, proto string, q *dns.Msg) *dns.Msg {
	r, ev := s.answer(ctx, src, dst, proto, q)
	if r != nil && s.cfg.OnQuery != nil {
		s.cfg.OnQuery(ev)
	}
	return r
}

// answer is Answer without the OnQuery call, so that the serve loops can
// report the event after the reply is written.
func (s *Server) answer(ctx context.Context, src, dst netip.AddrPort, proto string, q *dns.Msg) (*dns.Msg, QueryEvent) {
	if q == nil {
		return nil, QueryEvent{}
	}
	s.queries.Add(1)
	ev := QueryEvent{Src: src, Dst: dst, Proto: proto}
	r := new(dns.Msg)
	r.Id = q.Id
	r.Response = true
	r.Opcode = q.Opcode
	r.RecursionAvailable = true
	if q.Opcode == dns.OpcodeQuery {
		r.RecursionDesired = q.RecursionDesired
		r.CheckingDisabled = q.CheckingDisabled
	}
	if len(q.Question) == 1 && dns.IsFqdn(q.Question[0].Name) {
		qq := q.Question[0]
		r.Question = []dns.Question{qq}
		ev.QName = normalizeName(qq.Name)
		ev.QType = typeString(qq.Qtype)
	}
	opt := q.IsEdns0()
	if opt != nil {
		r.SetEdns0(ednsUDPSize, opt.Do())
	}

	s.decide(ctx, q, r, &ev)

	if opt == nil && r.Rcode > 0xF {
		r.Rcode = dns.RcodeServerFailure // an extended rcode needs an OPT record
	}
	size := dns.MaxMsgSize
	if proto == "udp" {
		size = dns.MinMsgSize
		if opt != nil {
			size = max(int(opt.UDPSize()), dns.MinMsgSize)
		}
	}
	r.Truncate(size)
	ev.RCode = rcodeString(r.Rcode)
	return r, ev
}

// decide fills in r's rcode and records, and ev's verdict and answers.
func (s *Server) decide(ctx context.Context, q, r *dns.Msg, ev *QueryEvent) {
	switch {
	case q.Response || len(r.Question) != 1:
		// r has no question when q had none, several, or one whose name
		// is not fully qualified (only a hand-built q can have that).
		r.Rcode = dns.RcodeFormatError
		return
	case q.Opcode != dns.OpcodeQuery:
		r.Rcode = dns.RcodeNotImplemented
		return
	case q.Question[0].Qclass != dns.ClassINET:
		r.Rcode = dns.RcodeRefused
		return
	}
	if opt := q.IsEdns0(); opt != nil && opt.Version() != 0 {
		r.Rcode = dns.RcodeBadVers
		return
	}
	qq := q.Question[0]
	name := ev.QName

	if ip, ok := parseReverse(name); ok && s.cfg.Pool.Contains(ip) {
		s.answerReverse(r, qq, ip)
		return
	}

	if !validHostname(name) {
		ev.Verdict = Verdict{Reason: "query name is not a plain hostname"}
		s.denied.Add(1)
		r.Rcode = dns.RcodeNameError
		return
	}
	ev.Verdict = s.cfg.Filter(name)
	if !ev.Verdict.Allow {
		s.denied.Add(1)
		r.Rcode = dns.RcodeNameError
		return
	}
	s.allowed.Add(1)

	switch qq.Qtype {
	case dns.TypeA, dns.TypeAAAA, dns.TypeANY:
		v4, v6, err := s.cfg.Pool.Assign(name)
		if errors.Is(err, ErrPoolExhausted) {
			s.exhausted.Add(1)
			r.Rcode = dns.RcodeRefused
			return
		}
		if err != nil {
			r.Rcode = dns.RcodeServerFailure
			return
		}
		hdr := func(t uint16) dns.RR_Header {
			return dns.RR_Header{Name: qq.Name, Rrtype: t, Class: dns.ClassINET, Ttl: s.cfg.TTL}
		}
		if qq.Qtype != dns.TypeAAAA {
			r.Answer = append(r.Answer, &dns.A{Hdr: hdr(dns.TypeA), A: v4.AsSlice()})
			ev.Answers = append(ev.Answers, v4)
		}
		if qq.Qtype != dns.TypeA {
			r.Answer = append(r.Answer, &dns.AAAA{Hdr: hdr(dns.TypeAAAA), AAAA: v6.AsSlice()})
			ev.Answers = append(ev.Answers, v6)
		}
	case dns.TypeHTTPS, dns.TypeSVCB:
		// NOERROR, no data: see Answer.
	case dns.TypeAXFR, dns.TypeIXFR, dns.TypeMAILA, dns.TypeMAILB,
		dns.TypeTKEY, dns.TypeTSIG, dns.TypeOPT, dns.TypeNone:
		r.Rcode = dns.RcodeRefused
	default:
		s.forward(ctx, q, r, ev)
	}
}

// answerReverse answers a query for the reverse name of ip, a pool address.
func (s *Server) answerReverse(r *dns.Msg, qq dns.Question, ip netip.Addr) {
	target, ok := s.cfg.Pool.Name(ip)
	switch {
	case !ok:
		r.Rcode = dns.RcodeNameError
	case qq.Qtype == dns.TypePTR || qq.Qtype == dns.TypeANY:
		r.Answer = append(r.Answer, &dns.PTR{
			Hdr: dns.RR_Header{Name: qq.Name, Rrtype: dns.TypePTR, Class: dns.ClassINET, Ttl: s.cfg.TTL},
			Ptr: dns.Fqdn(target),
		})
	}
}

// stripped reports whether a forwarded record must not reach the client
// because it carries real addresses.
func stripped(rr dns.RR) bool {
	switch v := rr.(type) {
	case *dns.A, *dns.AAAA, *dns.SVCB, *dns.HTTPS, *dns.OPT:
		return true
	case *dns.RRSIG:
		switch v.TypeCovered {
		case dns.TypeA, dns.TypeAAAA, dns.TypeSVCB, dns.TypeHTTPS:
			return true
		}
	}
	return false
}

// appendUnstripped appends the records of src that may reach the client.
func appendUnstripped(dst, src []dns.RR) []dns.RR {
	for _, rr := range src {
		if !stripped(rr) {
			dst = append(dst, rr)
		}
	}
	return dst
}

// forward sends q's question upstream and copies the reply into r.
func (s *Server) forward(ctx context.Context, q, r *dns.Msg, ev *QueryEvent) {
	if s.cfg.Upstream == nil {
		r.Rcode = dns.RcodeServerFailure
		return
	}
	// A fresh query: the client's question, but none of its EDNS options
	// (client data must not ride along to the upstream).
	uq := new(dns.Msg)
	uq.Id = q.Id
	uq.RecursionDesired = true
	uq.CheckingDisabled = q.CheckingDisabled
	uq.Question = []dns.Question{q.Question[0]}
	do := false
	if opt := q.IsEdns0(); opt != nil {
		do = opt.Do()
	}
	uq.SetEdns0(ednsUDPSize, do)

	s.forwarded.Add(1)
	ev.Forwarded = true
	resp, err := s.cfg.Upstream.Exchange(ctx, uq)
	if err != nil {
		r.Rcode = dns.RcodeServerFailure
		return
	}
	r.Rcode = resp.Rcode
	r.AuthenticatedData = resp.AuthenticatedData
	r.Answer = appendUnstripped(r.Answer, resp.Answer)
	r.Ns = appendUnstripped(r.Ns, resp.Ns)
	r.Extra = appendUnstripped(r.Extra, resp.Extra)
	// Keep our OPT record (if any) last, where Truncate expects it.
	if opt := r.IsEdns0(); opt != nil {
		extra := r.Extra[:0]
		for _, rr := range r.Extra {
			if rr != opt {
				extra = append(extra, rr)
			}
		}
		r.Extra = append(extra, opt)
	}
}
