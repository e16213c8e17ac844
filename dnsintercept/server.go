package dnsintercept

import (
	"context"
	"errors"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/miekg/dns"

	"github.com/tunwall/tunwall/flow"
)

// Forwarder asks an upstream resolver for one type of a name (Resolver.Query
// says how). It must be safe for concurrent use.
type Forwarder interface {
	Query(ctx context.Context, name string, qtype uint16) (*dns.Msg, error)
}

// Filter decides about a query name. qname is normalized: ASCII lower-case,
// no trailing dot, and made only of LDH and underscore labels (other names
// are answered NXDOMAIN without calling Filter). Filter must be safe for
// concurrent use and must not block. An allowed name is answered (with fake
// addresses, or by forwarding; in learn mode every name is allowed); the
// decision's Rule and Reason go to the audit log.
type Filter func(qname string) flow.Decision

// Config configures a Server. It is copied by NewServer.
type Config struct {
	// Pool hands out the fake addresses. Required.
	Pool *Pool
	// Filter decides which names are answered. Required.
	Filter Filter
	// Upstream answers the record types that are not answered locally
	// (MX, TXT, SRV, CAA, CNAME, NS, SOA, ...) for allowed names: a
	// *Resolver, or a fake in tests. nil answers those with SERVFAIL.
	Upstream Forwarder
	// TTL is the TTL of fake A/AAAA (and PTR) answers, in seconds. 0 means
	// 60. It is lowered to half the Pool's ReuseAfter if that is shorter,
	// so a client caching an answer for its TTL never finds its address
	// handed to another name.
	TTL uint32
	// OnQuery is called once per query, after it is answered, e.g. to write
	// the audit log. It runs on the serving goroutine and must not block
	// long. nil means none.
	OnQuery func(QueryEvent)
	// Limits bound the sessions and queries the sandbox can make the Server
	// hold at once.
	Limits Limits
	// Hold, if set, is called for each name the Filter denied, with the
	// Filter's decision and the query's source: it may hold the answer
	// (tunwall --ask) until a decision or until ctx is done, and returns
	// the final decision, or pending true when none was made in time: the
	// query is then answered SERVFAIL, so that the client asks again
	// (RFC 2308 section 7.1: not a denial it may cache). It is called on
	// the query's own goroutine, within MaxInFlight; it must return
	// promptly when ctx is done.
	Hold func(ctx context.Context, src netip.AddrPort, qname string, d flow.Decision) (_ flow.Decision, pending bool)
}

// Defaults of Limits.
const (
	DefaultMaxTCPConns       = 128
	DefaultMaxUDPSessions    = 512
	DefaultTCPIdle           = 5 * time.Second
	DefaultUDPIdle           = 2 * time.Second
	DefaultMaxQueriesPerConn = 128
	DefaultMaxForwarding     = 64
	DefaultMaxInFlight       = 512
)

// Limits bound what the sandbox can make the Server hold. Zero values mean
// the defaults above. Past MaxTCPConns or MaxUDPSessions, a new session takes
// the place of the session idle longest (one with no query being answered;
// RFC 7766 lets a server close idle conns at any time), and is refused only
// when every session is busy (see Server.Admit).
type Limits struct {
	// MaxTCPConns bounds DNS-over-TCP conns served at once.
	MaxTCPConns int
	// MaxUDPSessions bounds UDP sessions (one per sandbox socket) served
	// at once.
	MaxUDPSessions int
	// TCPIdle is how long ServeTCP waits for the next query on a conn, for
	// the rest of a started message, and for a reply to be written.
	TCPIdle time.Duration
	// UDPIdle is how long ServeUDP waits for the next datagram of a
	// session, and for a reply to be written.
	UDPIdle time.Duration
	// MaxQueriesPerConn is how many queries one TCP conn may ask; after
	// the last answer the conn is closed (the client reconnects).
	MaxQueriesPerConn int
	// MaxForwarding bounds queries waiting on the upstream resolver at
	// once; more are answered SERVFAIL at once and counted.
	MaxForwarding int
	// MaxInFlight bounds queries being answered and reported (OnQuery,
	// which may wait for the audit log) at once, across all sessions; past
	// it UDP queries are dropped (Overrun) and TCP conns stop reading.
	MaxInFlight int
}

func (l *Limits) setDefaults() error {
	if l.MaxTCPConns < 0 || l.MaxUDPSessions < 0 || l.TCPIdle < 0 || l.UDPIdle < 0 || l.MaxQueriesPerConn < 0 || l.MaxForwarding < 0 || l.MaxInFlight < 0 {
		return errors.New("dnsintercept: Config.Limits must not be negative")
	}
	if l.MaxTCPConns == 0 {
		l.MaxTCPConns = DefaultMaxTCPConns
	}
	if l.MaxUDPSessions == 0 {
		l.MaxUDPSessions = DefaultMaxUDPSessions
	}
	if l.TCPIdle == 0 {
		l.TCPIdle = DefaultTCPIdle
	}
	if l.UDPIdle == 0 {
		l.UDPIdle = DefaultUDPIdle
	}
	if l.MaxQueriesPerConn == 0 {
		l.MaxQueriesPerConn = DefaultMaxQueriesPerConn
	}
	if l.MaxForwarding == 0 {
		l.MaxForwarding = DefaultMaxForwarding
	}
	if l.MaxInFlight == 0 {
		l.MaxInFlight = DefaultMaxInFlight
	}
	return nil
}

// QueryEvent describes one answered query.
type QueryEvent struct {
	Src, Dst  netip.AddrPort // the sandbox's socket and the address it sent the query to
	Proto     string         // "udp" or "tcp"
	QName     string         // normalized; empty when the query had no single question
	QType     string         // "A", "AAAA", "TXT", "TYPE65280", ...
	RCode     string         // "NOERROR", "NXDOMAIN", ...
	Decision  flow.Decision  // zero when the Filter was not consulted
	Forwarded bool           // sent to the upstream resolver
	Answers   []netip.Addr   // fake addresses handed out, if any
	// UpstreamErr says why a forwarded query got no answer from the
	// upstream resolver (the client was answered SERVFAIL or REFUSED):
	// the exchange's error (a timeout), an *RcodeError for an upstream
	// that answered SERVFAIL or REFUSED, ErrUpstreamBusy or ErrNoUpstream.
	// nil for a query that was not forwarded or got an answer (NXDOMAIN
	// included).
	UpstreamErr error
}

// ErrUpstreamBusy is a forwarded query's UpstreamErr when Limits.MaxForwarding
// queries were already waiting on the upstream resolver.
var ErrUpstreamBusy = errors.New("too many queries were waiting on the DNS upstream")

// ErrNoUpstream is a forwarded query's UpstreamErr when the Server has no
// upstream resolver.
var ErrNoUpstream = errors.New("there is no DNS upstream")

// Stats are a Server's counters, read atomically.
type Stats struct {
	Queries      uint64 // parseable messages answered
	Allowed      uint64 // queries whose name the Filter allowed
	Denied       uint64 // queries answered NXDOMAIN by the Filter or for an invalid name
	Forwarded    uint64 // queries sent to the upstream resolver
	Malformed    uint64 // datagrams or TCP frames that did not parse (dropped, or the TCP conn ended)
	Exhausted    uint64 // queries refused because the pool was full
	Refused      uint64 // sessions refused at Admit: the limit was reached and every session was busy
	Evicted      uint64 // idle sessions ended to make room for a new one
	Overrun      uint64 // UDP queries dropped because too many were in flight (on their session, or in all)
	UpstreamBusy uint64 // queries answered SERVFAIL because MaxForwarding were waiting on the upstream
	Held         uint64 // queries answered SERVFAIL because Hold left their name pending
	TCPConns     uint64 // DNS-over-TCP conns admitted and not yet ended (ending ones included)
	UDPSessions  uint64 // UDP sessions admitted and not yet ended (ending ones included)
}

// Server answers the sandbox's DNS queries. It is safe for concurrent use.
type Server struct {
	cfg      Config
	tcp      limiter
	udp      limiter
	fwd      chan struct{} // one token per query waiting on the upstream
	inflight chan struct{} // one token per query being answered

	queries, allowed, denied, forwarded, malformed, exhausted atomic.Uint64
	overrun, upstreamBusy, held                               atomic.Uint64
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
	if err := cfg.Limits.setDefaults(); err != nil {
		return nil, err
	}
	if cfg.TTL == 0 {
		cfg.TTL = 60
	}
	if ra := cfg.Pool.ReuseAfter(); ra > 0 && time.Duration(cfg.TTL)*time.Second > ra/2 {
		cfg.TTL = uint32(max(ra/2/time.Second, 1))
	}
	s := &Server{
		cfg:      cfg,
		fwd:      make(chan struct{}, cfg.Limits.MaxForwarding),
		inflight: make(chan struct{}, cfg.Limits.MaxInFlight),
	}
	s.tcp.max = cfg.Limits.MaxTCPConns
	s.udp.max = cfg.Limits.MaxUDPSessions
	return s, nil
}

// Stats returns a snapshot of the counters.
func (s *Server) Stats() Stats {
	tcp, udp := s.tcp.stats(), s.udp.stats()
	return Stats{
		Queries:      s.queries.Load(),
		Allowed:      s.allowed.Load(),
		Denied:       s.denied.Load(),
		Forwarded:    s.forwarded.Load(),
		Malformed:    s.malformed.Load(),
		Exhausted:    s.exhausted.Load(),
		Refused:      tcp.refused + udp.refused,
		Evicted:      tcp.evicted + udp.evicted,
		Overrun:      s.overrun.Load(),
		UpstreamBusy: s.upstreamBusy.Load(),
		Held:         s.held.Load(),
		TCPConns:     tcp.live,
		UDPSessions:  udp.live,
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
//     REFUSED. The ordinary types NS, CNAME, SOA, PTR, MX, TXT, SRV, NAPTR,
//     CAA, TLSA and SSHFP are forwarded upstream in a query tunwall builds
//     itself (Resolver.Query: the name lower-cased, no client flags or EDNS
//     options), and the reply's records copied back, minus any A, AAAA,
//     SVCB and HTTPS records (and their signatures), which would likewise
//     leak real addresses; upstream failure is SERVFAIL. Every other type
//     (DNSSEC types, NULL, HINFO, private types, ...) is NOERROR with no
//     answers, and never forwarded.
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
		ev.Decision = flow.Decision{Reason: "query name is not a plain hostname"}
		s.denied.Add(1)
		r.Rcode = dns.RcodeNameError
		return
	}
	ev.Decision = s.cfg.Filter(name)
	if !ev.Decision.Allowed() && s.cfg.Hold != nil {
		var pending bool
		if ev.Decision, pending = s.cfg.Hold(ctx, ev.Src, name, ev.Decision); pending {
			s.held.Add(1)
			r.Rcode = dns.RcodeServerFailure
			return
		}
	}
	if !ev.Decision.Allowed() {
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
		if forwardedType(qq.Qtype) {
			s.forward(ctx, name, qq.Qtype, r, ev)
		}
		// Otherwise NOERROR, no data: see Answer.
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

// forwardedType reports whether queries of type t for allowed names are
// forwarded upstream: ordinary data types only, so a client cannot choose
// what the upstream sees beyond the name and one of a few types.
func forwardedType(t uint16) bool {
	switch t {
	case dns.TypeNS, dns.TypeCNAME, dns.TypeSOA, dns.TypePTR, dns.TypeMX, dns.TypeTXT,
		dns.TypeSRV, dns.TypeNAPTR, dns.TypeCAA, dns.TypeTLSA, dns.TypeSSHFP:
		return true
	}
	return false
}

// forward asks the upstream for qtype of name (normalized) and copies the
// reply's records into r. Nothing of the client's query but the name and
// the type is sent (Resolver.Query builds the query).
func (s *Server) forward(ctx context.Context, name string, qtype uint16, r *dns.Msg, ev *QueryEvent) {
	if s.cfg.Upstream == nil {
		r.Rcode = dns.RcodeServerFailure
		ev.UpstreamErr = ErrNoUpstream
		return
	}
	select {
	case s.fwd <- struct{}{}:
		defer func() { <-s.fwd }()
	default:
		s.upstreamBusy.Add(1)
		r.Rcode = dns.RcodeServerFailure
		ev.UpstreamErr = ErrUpstreamBusy
		return
	}
	s.forwarded.Add(1)
	ev.Forwarded = true
	resp, err := s.cfg.Upstream.Query(ctx, name, qtype)
	if err != nil {
		r.Rcode = dns.RcodeServerFailure
		ev.UpstreamErr = err
		return
	}
	if resp.Rcode == dns.RcodeServerFailure || resp.Rcode == dns.RcodeRefused {
		ev.UpstreamErr = &RcodeError{Name: name, Rcode: resp.Rcode}
	}
	// AD stays clear: tunwall validates nothing, and did not ask for it.
	r.Rcode = resp.Rcode
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
