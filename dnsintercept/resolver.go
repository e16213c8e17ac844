package dnsintercept

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/miekg/dns"
)

// ResolverConfig configures a Resolver. It is copied by NewResolver.
type ResolverConfig struct {
	// Server is the upstream resolver, e.g. 192.0.2.53:53. Required unless
	// Servers is given.
	Server netip.AddrPort
	// Servers are upstream resolvers tried in order, as a host's
	// resolv.conf lists them: a server that does not answer within
	// ServerTimeout (or fails: no route, refused, SERVFAIL, REFUSED) is
	// passed over for the next. The server that answered last is asked
	// first from then on, so a dead first server costs one ServerTimeout
	// once, not on every lookup. When set, Server is ignored.
	Servers []netip.AddrPort
	// ServerTimeout is how long one server is waited for before the next
	// is tried. 0 means 1s. Unused with a single server, which has the
	// whole Timeout.
	ServerTimeout time.Duration
	// Timeout bounds one Exchange, every server, UDP attempt and TCP retry
	// included. 0 means 3s, or ServerTimeout per server if that is more.
	Timeout time.Duration
	// Dial opens connections to a server ("udp" or "tcp", its address).
	// nil means a zero net.Dialer. It lets callers send DNS through a SOCKS
	// proxy or a namespace-bound dialer. A "udp" conn must keep datagram
	// boundaries: one Write is one query, one Read one reply.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// HostsFile is a hosts(5) file (e.g. /etc/hosts) Resolve reads before
	// asking DNS, as glibc's "files" source comes before "dns": a name it
	// lists resolves to its addresses there and DNS is not asked. It is
	// re-read when it changes. "" means none.
	HostsFile string
	// Search is the host's search list (normalized domains). The Resolver
	// does not expand names with it (the sandbox's resolver library does,
	// and asks for the full name); it is kept for Search. nil: none.
	Search []string
	// MinTTL and MaxTTL clamp how long Resolve caches an answer. Negative
	// answers are cached for MinTTL. 0 means 5s and 5m.
	MinTTL, MaxTTL time.Duration
	// FailTTL is how long a family (A or AAAA) whose lookup failed
	// (timeout, transport error) while the other family had addresses
	// counts as failed: those addresses are returned without asking it
	// again until then, so a burst of dials does not wait on it each time.
	// 0 means 1s.
	FailTTL time.Duration
}

// Resolver is the upstream client: the only part of this package that dials,
// and it dials only ResolverConfig.Servers. It is safe for concurrent use.
type Resolver struct {
	servers       []string
	serverTimeout time.Duration
	good          atomic.Int32 // index of the server that answered last
	timeout       time.Duration
	search        []string
	hosts         *hostsFile // nil: none
	dial          func(ctx context.Context, network, addr string) (net.Conn, error)
	minTTL        time.Duration
	maxTTL        time.Duration

	failTTL time.Duration

	mu       sync.Mutex
	cache    map[famKey]*famEntry // one entry per name and family
	inflight map[string]*lookup   // normalized name -> lookup in progress
}

// famKey names one family of one name in the cache.
type famKey struct {
	name  string // normalized
	qtype uint16 // dns.TypeA or dns.TypeAAAA
}

// famEntry is the cached result of one family: an answer (addresses, no
// data or a failure rcode) for its TTL, or, for FailTTL, a failure.
type famEntry struct {
	res     familyResult
	expires time.Time
}

type lookup struct {
	done  chan struct{}
	addrs []netip.Addr
	err   error
}

// maxCacheEntries bounds the Resolve cache (one entry per name and family).
// Past it, expired entries are swept and then arbitrary ones dropped; a
// dropped family is simply queried again.
const maxCacheEntries = 16384

// resolveUDPSize is the EDNS0 payload size advertised upstream (the DNS flag
// day 2020 value, which avoids IP fragmentation).
const resolveUDPSize = 1232

// maxCNAMEHops bounds how far Resolve follows a CNAME chain in one answer.
const maxCNAMEHops = 16

// NewResolver validates cfg and returns a Resolver.
func NewResolver(cfg ResolverConfig) (*Resolver, error) {
	servers := cfg.Servers
	if len(servers) == 0 {
		servers = []netip.AddrPort{cfg.Server}
	}
	if cfg.Timeout < 0 || cfg.ServerTimeout < 0 || cfg.MinTTL < 0 || cfg.MaxTTL < 0 || cfg.FailTTL < 0 {
		return nil, errors.New("dnsintercept: resolver timeouts and TTLs must not be negative")
	}
	r := &Resolver{
		serverTimeout: cfg.ServerTimeout,
		timeout:       cfg.Timeout,
		dial:          cfg.Dial,
		minTTL:        cfg.MinTTL,
		maxTTL:        cfg.MaxTTL,
		search:        slices.Clone(cfg.Search),
		failTTL:       cfg.FailTTL,
		cache:         make(map[famKey]*famEntry),
		inflight:      make(map[string]*lookup),
	}
	for _, s := range servers {
		if !s.IsValid() || s.Port() == 0 {
			return nil, fmt.Errorf("dnsintercept: upstream resolver address %v is not a valid ip:port", s)
		}
		a := netip.AddrPortFrom(s.Addr().Unmap(), s.Port()).String()
		if !slices.Contains(r.servers, a) {
			r.servers = append(r.servers, a)
		}
	}
	if r.serverTimeout == 0 {
		r.serverTimeout = time.Second
	}
	if r.timeout == 0 {
		r.timeout = max(3*time.Second, time.Duration(len(r.servers))*r.serverTimeout)
	}
	if cfg.HostsFile != "" {
		r.hosts = &hostsFile{path: cfg.HostsFile}
	}
	if r.failTTL == 0 {
		r.failTTL = time.Second
	}
	if r.minTTL == 0 {
		r.minTTL = 5 * time.Second
	}
	if r.maxTTL == 0 {
		r.maxTTL = 5 * time.Minute
	}
	if r.minTTL > r.maxTTL {
		return nil, fmt.Errorf("dnsintercept: resolver MinTTL %v exceeds MaxTTL %v", r.minTTL, r.maxTTL)
	}
	if r.dial == nil {
		var d net.Dialer
		r.dial = d.DialContext
	}
	return r, nil
}

// Search returns the host's search list (ResolverConfig.Search). The
// caller must not modify it.
func (r *Resolver) Search() []string {
	if r == nil {
		return nil
	}
	return r.search
}

// Servers returns the upstream resolvers in the order they are tried
// before any has failed.
func (r *Resolver) Servers() []string { return slices.Clone(r.servers) }

// Query asks the upstream resolver for one type of name and returns its
// reply. The query is built here, from the name and the type alone: a fresh
// random ID, RD set and every other flag clear, the normalized (lower-case)
// name, class IN, and an EDNS0 OPT record of tunwall's own (payload size
// 1232, DO clear, no options). So nothing a client chose beyond the name and
// the type (letter case, CD/AD/DO, EDNS options such as cookies, padding or
// client subnet) can reach the upstream. The caller decides which types may
// be asked. It is the only way this package sends a query upstream.
func (r *Resolver) Query(ctx context.Context, name string, qtype uint16) (*dns.Msg, error) {
	name = normalizeName(name)
	if !validHostname(name) {
		return nil, fmt.Errorf("dnsintercept: query %q: not a valid hostname", name)
	}
	return r.exchange(ctx, upstreamQuery(name, qtype))
}

// upstreamQuery builds the query Query sends. name must be normalized.
func upstreamQuery(name string, qtype uint16) *dns.Msg {
	q := new(dns.Msg)
	q.Id = dns.Id()
	q.RecursionDesired = true
	q.Question = []dns.Question{{Name: name + ".", Qtype: qtype, Qclass: dns.ClassINET}}
	q.SetEdns0(resolveUDPSize, false)
	return q
}

// exchange sends q upstream and returns the reply. It asks the servers in
// turn (the one that answered last first, then the others in order), each
// for at most ServerTimeout, the last for what is left of Timeout. With one
// server it tries UDP first (retransmitting within the timeout) and retries
// over TCP when the UDP reply is truncated. A server that fails (transport
// error, timeout, SERVFAIL, REFUSED, NOTIMP) is passed over for the next;
// when every server fails, the last SERVFAIL-like reply is returned, or
// else the errors. The upstream sees a fresh random message ID; the reply
// carries q's ID. q must hold exactly one question and is not modified.
func (r *Resolver) exchange(ctx context.Context, q *dns.Msg) (*dns.Msg, error) {
	if q == nil || len(q.Question) != 1 {
		return nil, errors.New("dnsintercept: exchange: query must have exactly one question")
	}
	qq := q.Question[0]
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()

	out := q.Copy()
	out.Id = dns.Id()
	out.Response = false
	wire, err := out.Pack()
	if err != nil {
		return nil, fmt.Errorf("dnsintercept: exchange %s %s: pack query: %w", qq.Name, typeString(qq.Qtype), err)
	}
	n := len(r.servers)
	first := int(r.good.Load())
	var errs []error
	var failed *dns.Msg // the last SERVFAIL-like reply
	for i := range n {
		idx := (first + i) % n
		server := r.servers[idx]
		sctx, scancel := ctx, context.CancelFunc(func() {})
		if i < n-1 {
			sctx, scancel = context.WithTimeout(ctx, r.serverTimeout)
		}
		resp, err := r.exchangeWith(sctx, server, out, wire)
		scancel()
		if err == nil && !serverFailed(resp.Rcode) {
			if idx != first {
				r.good.CompareAndSwap(int32(first), int32(idx))
			}
			resp.Id = q.Id
			return resp, nil
		}
		if err == nil {
			failed = resp
			err = fmt.Errorf("answered %s", rcodeString(resp.Rcode))
		} else if sctx.Err() != nil || errors.Is(err, os.ErrDeadlineExceeded) {
			err = fmt.Errorf("%w: %w", ErrTimeout, err)
		}
		errs = append(errs, fmt.Errorf("%s: %w", server, err))
		if ctx.Err() != nil {
			break
		}
	}
	if failed != nil {
		failed.Id = q.Id
		return failed, nil
	}
	err = errors.Join(errs...)
	if len(errs) == 1 {
		err = errs[0]
	}
	if ctx.Err() != nil && !errors.Is(err, ErrTimeout) {
		err = fmt.Errorf("%w: %w", ErrTimeout, err)
	}
	return nil, fmt.Errorf("dnsintercept: exchange %s %s with %s: %w", qq.Name, typeString(qq.Qtype), strings.Join(r.servers, ", "), err)
}

// serverFailed reports an rcode after which the next server is asked, as
// glibc does: the server could not answer, which says nothing about the
// name.
func serverFailed(rcode int) bool {
	return rcode == dns.RcodeServerFailure || rcode == dns.RcodeRefused || rcode == dns.RcodeNotImplemented
}

// exchangeWith asks one server: UDP, then TCP if the reply was truncated.
func (r *Resolver) exchangeWith(ctx context.Context, server string, out *dns.Msg, wire []byte) (*dns.Msg, error) {
	resp, err := r.exchangeUDP(ctx, server, out, wire)
	if err == nil && resp.Truncated {
		resp, err = r.exchangeTCP(ctx, server, out, wire)
	}
	return resp, err
}

// udpAttempts is how many times exchangeUDP sends a query before giving up;
// the timeout is split evenly between the attempts.
const udpAttempts = 3

func (r *Resolver) exchangeUDP(ctx context.Context, server string, q *dns.Msg, wire []byte) (*dns.Msg, error) {
	c, err := r.dial(ctx, "udp", server)
	if err != nil {
		return nil, fmt.Errorf("dial udp: %w", err)
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Now()) })
	defer stop()

	deadline, _ := ctx.Deadline() // set by exchange
	interval := time.Until(deadline) / udpAttempts
	buf := make([]byte, dns.MaxMsgSize)
	for attempt := 0; attempt < udpAttempts; attempt++ {
		if _, err := c.Write(wire); err != nil {
			return nil, fmt.Errorf("send udp: %w", err)
		}
		wait := time.Now().Add(interval)
		if attempt == udpAttempts-1 || wait.After(deadline) {
			wait = deadline
		}
		if err := c.SetReadDeadline(wait); err != nil {
			return nil, fmt.Errorf("set deadline: %w", err)
		}
		if ctx.Err() != nil { // AfterFunc may have run before SetReadDeadline
			return nil, ctx.Err()
		}
		// Read until a datagram answers q; stray or forged ones are skipped.
		for {
			n, err := c.Read(buf)
			if err != nil {
				if errors.Is(err, os.ErrDeadlineExceeded) && ctx.Err() == nil && attempt < udpAttempts-1 {
					break // retransmit
				}
				if ctx.Err() != nil {
					return nil, ctx.Err()
				}
				return nil, fmt.Errorf("read udp: %w", err)
			}
			m := new(dns.Msg)
			if m.Unpack(buf[:n]) != nil || !isReplyTo(m, q) {
				continue
			}
			return m, nil
		}
	}
	return nil, os.ErrDeadlineExceeded // not reached: the last attempt returns
}

func (r *Resolver) exchangeTCP(ctx context.Context, server string, q *dns.Msg, wire []byte) (*dns.Msg, error) {
	c, err := r.dial(ctx, "tcp", server)
	if err != nil {
		return nil, fmt.Errorf("dial tcp: %w", err)
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Now()) })
	defer stop()
	if deadline, ok := ctx.Deadline(); ok {
		if err := c.SetDeadline(deadline); err != nil {
			return nil, fmt.Errorf("set deadline: %w", err)
		}
	}
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	// miekg's Conn frames DNS over TCP (RFC 1035 4.2.2): one Write of the
	// length prefix and the message, and one length-prefixed read.
	dc := &dns.Conn{Conn: c}
	if _, err := dc.Write(wire); err != nil {
		return nil, fmt.Errorf("send tcp: %w", err)
	}
	m, err := dc.ReadMsg()
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("read tcp: %w", err)
	}
	if !isReplyTo(m, q) {
		return nil, errors.New("tcp reply does not match the query")
	}
	return m, nil
}

// isReplyTo reports whether m is a response to q: same ID, QR set, and the
// same question (name compared case-insensitively).
func isReplyTo(m, q *dns.Msg) bool {
	if m.Id != q.Id || !m.Response || len(m.Question) != 1 {
		return false
	}
	a, b := m.Question[0], q.Question[0]
	return a.Qtype == b.Qtype && a.Qclass == b.Qclass && strings.EqualFold(a.Name, b.Name)
}

// RcodeError reports that the upstream answered a Resolve query with a
// failure rcode (NXDOMAIN, SERVFAIL, REFUSED, ...).
type RcodeError struct {
	Name  string // normalized name that was resolved
	Rcode int    // dns.RcodeNameError, dns.RcodeServerFailure, ...
}

func (e *RcodeError) Error() string {
	return fmt.Sprintf("dnsintercept: resolve %s: upstream answered %s", e.Name, rcodeString(e.Rcode))
}

// ErrTimeout is wrapped by an exchange's (and so Resolve's) error when a
// server, or the exchange as a whole, ran out of time before an answer.
var ErrTimeout = errors.New("timeout")

// ErrNoAddresses is wrapped by Resolve's error when the name exists but has
// neither A nor AAAA records.
var ErrNoAddresses = errors.New("no A or AAAA records")

// Resolve returns the real addresses of name, IPv4 first: those of the
// hosts file (HostsFile) if it lists name; otherwise A and AAAA are
// queried in parallel and CNAME chains followed as far as the upstream's
// answer spells them out (no further queries for a chain's target). Each
// family is cached on its own: addresses for the smallest TTL on the
// chain, clamped to [MinTTL, MaxTTL]; NXDOMAIN, no-data and other rcode
// failures for MinTTL. A family whose lookup failed (timeout, refused
// connection) is never cached as an answer: it is asked again by the next
// Resolve, except that for FailTTL the other family's addresses are
// returned alone without waiting on it. So one lost query never stands for
// the whole answer for a TTL. Concurrent calls for one name share one
// upstream lookup. Errors say what failed: an *RcodeError for
// NXDOMAIN/SERVFAIL/..., ErrNoAddresses, or a timeout.
func (r *Resolver) Resolve(ctx context.Context, name string) ([]netip.Addr, error) {
	name = normalizeName(name)
	if !validHostname(name) {
		return nil, fmt.Errorf("dnsintercept: resolve %q: not a valid hostname", name)
	}
	if r.hosts != nil {
		if a, ok := r.hosts.lookup(name); ok {
			return a, nil
		}
	}
	r.mu.Lock()
	if res, ok := r.cachedLocked(name); ok {
		r.mu.Unlock()
		return combine(name, res)
	}
	l, ok := r.inflight[name]
	if !ok {
		l = &lookup{done: make(chan struct{})}
		r.inflight[name] = l
		// The lookup outlives a caller that gives up, so that the callers
		// sharing it are not failed by one cancellation; exchange's
		// timeout bounds it.
		go r.runLookup(context.WithoutCancel(ctx), name, l)
	}
	r.mu.Unlock()

	select {
	case <-l.done:
		return cloneAddrs(l.addrs), l.err
	case <-ctx.Done():
		return nil, fmt.Errorf("dnsintercept: resolve %s: %w", name, ctx.Err())
	}
}

var families = [2]uint16{dns.TypeA, dns.TypeAAAA}

// freshLocked returns the unexpired cache entry of one family, if any.
func (r *Resolver) freshLocked(name string, qtype uint16, now time.Time) (*famEntry, bool) {
	k := famKey{name, qtype}
	e, ok := r.cache[k]
	if !ok {
		return nil, false
	}
	if !now.Before(e.expires) {
		delete(r.cache, k)
		return nil, false
	}
	return e, true
}

// cachedLocked returns both families from the cache when that is a whole
// answer: both cached as answers, or one cached with addresses and the
// other as a recent failure.
func (r *Resolver) cachedLocked(name string) ([2]familyResult, bool) {
	var res [2]familyResult
	now := time.Now()
	failed, found := false, false
	for i, t := range families {
		e, ok := r.freshLocked(name, t, now)
		if !ok {
			return res, false
		}
		res[i] = e.res
		failed = failed || e.res.err != nil
		found = found || len(e.res.addrs) > 0
	}
	if failed && !found {
		return res, false
	}
	return res, true
}

func cloneAddrs(a []netip.Addr) []netip.Addr {
	if a == nil {
		return nil
	}
	return append([]netip.Addr(nil), a...)
}

// runLookup asks the upstream for the families of name not cached as
// answers, caches each result on its own, and releases the callers
// waiting on l.
func (r *Resolver) runLookup(ctx context.Context, name string, l *lookup) {
	var res [2]familyResult
	var ask [2]bool
	r.mu.Lock()
	now := time.Now()
	for i, t := range families {
		if e, ok := r.freshLocked(name, t, now); ok && e.res.err == nil {
			res[i] = e.res
		} else {
			ask[i] = true
		}
	}
	r.mu.Unlock()

	var wg sync.WaitGroup
	for i, t := range families {
		if ask[i] {
			wg.Go(func() { res[i] = r.lookupType(ctx, name, t) })
		}
	}
	wg.Wait()

	l.addrs, l.err = combine(name, res)
	r.mu.Lock()
	delete(r.inflight, name)
	now = time.Now()
	for i, t := range families {
		if !ask[i] {
			continue
		}
		fr := res[i]
		var ttl time.Duration
		switch {
		case fr.err != nil:
			ttl = r.failTTL // counts only beside the other family's addresses
		case len(fr.addrs) > 0:
			ttl = r.clamp(time.Duration(fr.ttl) * time.Second)
		default: // no data, or an rcode
			ttl = r.minTTL
		}
		r.storeLocked(famKey{name, t}, &famEntry{res: fr, expires: now.Add(ttl)})
	}
	r.mu.Unlock()
	close(l.done)
}

// storeLocked adds e to the cache, making room if the cache is full.
func (r *Resolver) storeLocked(k famKey, e *famEntry) {
	if _, ok := r.cache[k]; !ok && len(r.cache) >= maxCacheEntries {
		now := time.Now()
		for k, v := range r.cache {
			if !now.Before(v.expires) {
				delete(r.cache, k)
			}
		}
		for k := range r.cache {
			if len(r.cache) < maxCacheEntries {
				break
			}
			delete(r.cache, k)
		}
	}
	r.cache[k] = e
}

type familyResult struct {
	addrs []netip.Addr
	ttl   uint32 // smallest TTL on the chain; meaningful when addrs != nil
	rcode int
	err   error // transport failure
}

// combine joins the results of A and AAAA: their addresses, IPv4 first,
// or, when there are none, the most telling failure.
func combine(name string, res [2]familyResult) ([]netip.Addr, error) {
	var addrs []netip.Addr
	for _, fr := range res {
		addrs = append(addrs, fr.addrs...)
	}
	if len(addrs) > 0 {
		return addrs, nil
	}
	// No addresses. The most telling failure wins: NXDOMAIN, then another
	// rcode, then a transport error, then plain no-data.
	for _, fr := range res {
		if fr.err == nil && fr.rcode == dns.RcodeNameError {
			return nil, &RcodeError{Name: name, Rcode: fr.rcode}
		}
	}
	for _, fr := range res {
		if fr.err == nil && fr.rcode != dns.RcodeSuccess {
			return nil, &RcodeError{Name: name, Rcode: fr.rcode}
		}
	}
	if res[0].err != nil || res[1].err != nil {
		return nil, fmt.Errorf("dnsintercept: resolve %s: %w", name, errors.Join(res[0].err, res[1].err))
	}
	return nil, fmt.Errorf("dnsintercept: resolve %s: %w", name, ErrNoAddresses)
}

func (r *Resolver) clamp(d time.Duration) time.Duration {
	return min(max(d, r.minTTL), r.maxTTL)
}

// lookupType asks the upstream for one type and follows the CNAME chain in
// its answer.
func (r *Resolver) lookupType(ctx context.Context, name string, qtype uint16) familyResult {
	resp, err := r.Query(ctx, name, qtype)
	if err != nil {
		return familyResult{err: err}
	}
	if resp.Rcode != dns.RcodeSuccess {
		return familyResult{rcode: resp.Rcode}
	}
	addrs, ttl := followChain(resp.Answer, dns.Fqdn(name), qtype)
	return familyResult{addrs: addrs, ttl: ttl}
}

// followChain walks the CNAME chain from owner through answer and returns
// the qtype addresses of its final target and the smallest TTL on the way.
// Records not on the chain are ignored.
func followChain(answer []dns.RR, owner string, qtype uint16) ([]netip.Addr, uint32) {
	ttl := uint32(1<<32 - 1)
	for hop := 0; hop <= maxCNAMEHops; hop++ {
		var addrs []netip.Addr
		next := ""
		for _, rr := range answer {
			h := rr.Header()
			if h.Class != dns.ClassINET || !strings.EqualFold(h.Name, owner) {
				continue
			}
			switch v := rr.(type) {
			case *dns.CNAME:
				if next == "" {
					next = v.Target
					ttl = min(ttl, h.Ttl)
				}
			case *dns.A:
				if qtype == dns.TypeA {
					if a, ok := netip.AddrFromSlice(v.A.To4()); ok {
						addrs = append(addrs, a)
						ttl = min(ttl, h.Ttl)
					}
				}
			case *dns.AAAA:
				if qtype == dns.TypeAAAA {
					if a, ok := netip.AddrFromSlice(v.AAAA.To16()); ok && len(v.AAAA) == net.IPv6len {
						addrs = append(addrs, a)
						ttl = min(ttl, h.Ttl)
					}
				}
			}
		}
		if len(addrs) > 0 {
			return addrs, ttl
		}
		if next == "" {
			return nil, 0
		}
		owner = next
	}
	return nil, 0
}

func typeString(t uint16) string {
	if s, ok := dns.TypeToString[t]; ok {
		return s
	}
	return fmt.Sprintf("TYPE%d", t)
}

func rcodeString(rc int) string {
	if s, ok := dns.RcodeToString[rc]; ok {
		return s
	}
	return fmt.Sprintf("RCODE%d", rc)
}
