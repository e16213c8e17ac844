package dnsintercept

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/tunwall/tunwall/flow"
)

var (
	testSrc = netip.MustParseAddrPort("192.0.2.2:40000")
	testDst = netip.MustParseAddrPort("198.18.0.1:53")
)

// testEnv is a Server wired to a fake Filter and a logging fake upstream.
type testEnv struct {
	u    *fakeUpstream
	pool *Pool
	srv  *Server

	mu          sync.Mutex
	events      []QueryEvent
	filterCalls []string
}

// testFilter allows allowed.example and its subdomains, silent.example and
// fail.example; learn.example is allowed as learn mode would (WouldAllow
// false); everything else is denied.
func (e *testEnv) filter(name string) flow.Decision {
	e.mu.Lock()
	e.filterCalls = append(e.filterCalls, name)
	e.mu.Unlock()
	switch {
	case name == "allowed.example" || strings.HasSuffix(name, ".allowed.example"),
		name == "silent.example", name == "fail.example":
		return flow.Decision{Verdict: flow.Allow, Rule: "allowed.example", Reason: "host rule"}
	case name == "learn.example":
		return flow.Decision{Verdict: flow.Allow, Rule: "default-deny", Reason: "learn mode"}
	}
	return flow.Decision{Rule: "default-deny", Reason: "no rule matches"}
}

func newTestEnv(t testing.TB, mod func(*Config)) *testEnv {
	t.Helper()
	e := &testEnv{u: startUpstream(t)}
	pool, err := NewPool(DefaultPrefix4, DefaultPrefix6)
	if err != nil {
		t.Fatal(err)
	}
	e.pool = pool
	cfg := Config{
		Pool:     pool,
		Filter:   e.filter,
		Upstream: e.u.resolver(t, ResolverConfig{Timeout: 2 * time.Second}),
		TTL:      77,
		OnQuery: func(ev QueryEvent) {
			e.mu.Lock()
			e.events = append(e.events, ev)
			e.mu.Unlock()
		},
	}
	if mod != nil {
		mod(&cfg)
	}
	e.srv, err = NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func (e *testEnv) Events() []QueryEvent {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]QueryEvent(nil), e.events...)
}

func (e *testEnv) FilterCalls() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.filterCalls...)
}

func (e *testEnv) answer(t testing.TB, proto string, q *dns.Msg) *dns.Msg {
	t.Helper()
	r := e.srv.Answer(context.Background(), testSrc, testDst, proto, q)
	if r == nil {
		t.Fatalf("Answer returned nil for %v", q.Question)
	}
	if _, err := r.Pack(); err != nil {
		t.Fatalf("reply does not pack: %v\n%v", err, r)
	}
	return r
}

// query returns a query for name/qtype with RD set and a fixed ID.
func query(name string, qtype uint16) *dns.Msg {
	q := new(dns.Msg)
	q.Id = 0xbeef
	q.RecursionDesired = true
	q.Question = []dns.Question{{Name: name, Qtype: qtype, Qclass: dns.ClassINET}}
	return q
}

var everyQtype = []uint16{
	dns.TypeA, dns.TypeAAAA, dns.TypeANY, dns.TypeTXT, dns.TypeMX, dns.TypeHTTPS, dns.TypeSVCB,
	dns.TypeCNAME, dns.TypeNS, dns.TypeSOA, dns.TypeSRV, dns.TypeCAA, dns.TypePTR, dns.TypeNULL,
	dns.TypeDNSKEY, dns.TypeAXFR, 65280,
}

func TestAnswerNeverForwardsDeniedNames(t *testing.T) {
	e := newTestEnv(t, nil)
	names := []struct{ name, qname string }{
		{"a denied name", "denied.example."},
		{"a denied name in mixed case", "DeNiEd.ExAmPlE."},
		{"a denied name in upper case", "DENIED.EXAMPLE."},
		{"a subdomain of a denied name", "secret.denied.example."},
		{"an allowed name as a prefix of a denied one", "allowed.example.evil.example."},
		{"a name that merely ends in the allowed string", "evilallowed.example."},
		{"an escaped dot posing as a subdomain", `evil\.allowed.example.`},
		{"an escaped dot in an otherwise allowed name", `allowed\.example.`},
		{"a name with a binary label", `x\000y.allowed.example.`},
		{"the reverse name of a non-pool address", "1.2.0.192.in-addr.arpa."},
		{"the root", "."},
	}
	for _, n := range names {
		for _, qt := range everyQtype {
			t.Run(n.name+" asked as "+typeString(qt)+" gets NXDOMAIN", func(t *testing.T) {
				for _, proto := range []string{"udp", "tcp"} {
					r := e.answer(t, proto, query(n.qname, qt))
					if r.Rcode != dns.RcodeNameError || len(r.Answer)+len(r.Ns)+len(r.Extra) != 0 {
						t.Errorf("%s: rcode %s with %d answers, want NXDOMAIN and nothing else", proto, rcodeString(r.Rcode), len(r.Answer))
					}
				}
			})
		}
	}
	if l := e.u.Log(); len(l) != 0 {
		t.Errorf("denied names reached the upstream: %v", l)
	}
	st := e.srv.Stats()
	if want := uint64(2 * len(names) * len(everyQtype)); st.Denied != want || st.Queries != want || st.Forwarded != 0 || st.Allowed != 0 {
		t.Errorf("Stats = %+v, want %d queries, all denied, none forwarded", st, want)
	}
	for _, c := range e.FilterCalls() {
		if !validHostname(c) {
			t.Errorf("Filter was called with the unnormalized or invalid name %q", c)
		}
	}
	for _, ev := range e.Events() {
		if ev.Decision.Allowed() || ev.Forwarded || ev.RCode != "NXDOMAIN" || len(ev.Answers) != 0 {
			t.Errorf("event for a denied name: %+v", ev)
		}
	}
}

func TestAnswerAllowedNames(t *testing.T) {
	tests := []struct {
		name        string
		qname       string
		qtype       uint16
		wantRcode   int
		wantTypes   []uint16 // record types of the answer section, in order
		wantForward bool
	}{
		{"A is answered from the pool", "allowed.example.", dns.TypeA, dns.RcodeSuccess, []uint16{dns.TypeA}, false},
		{"AAAA is answered from the pool", "allowed.example.", dns.TypeAAAA, dns.RcodeSuccess, []uint16{dns.TypeAAAA}, false},
		{"ANY is answered with both fake addresses", "allowed.example.", dns.TypeANY, dns.RcodeSuccess, []uint16{dns.TypeA, dns.TypeAAAA}, false},
		{"A for a subdomain is answered from the pool", "Deep.Sub.Allowed.Example.", dns.TypeA, dns.RcodeSuccess, []uint16{dns.TypeA}, false},
		{"HTTPS is empty so its hints cannot leak real addresses", "allowed.example.", dns.TypeHTTPS, dns.RcodeSuccess, nil, false},
		{"SVCB is empty so its hints cannot leak real addresses", "allowed.example.", dns.TypeSVCB, dns.RcodeSuccess, nil, false},
		{"MX is forwarded", "allowed.example.", dns.TypeMX, dns.RcodeSuccess, []uint16{dns.TypeMX}, true},
		{"TXT is forwarded", "allowed.example.", dns.TypeTXT, dns.RcodeSuccess, []uint16{dns.TypeTXT}, true},
		{"CNAME is forwarded", "www.allowed.example.", dns.TypeCNAME, dns.RcodeSuccess, []uint16{dns.TypeCNAME}, true},
		{"an upstream NXDOMAIN is passed on", "missing.allowed.example.", dns.TypeTXT, dns.RcodeNameError, nil, true},
		{"an upstream SERVFAIL is passed on", "fail.example.", dns.TypeTXT, dns.RcodeServerFailure, nil, true},
		{"an upstream timeout is SERVFAIL", "silent.example.", dns.TypeTXT, dns.RcodeServerFailure, nil, true},
		{"a zone transfer is refused", "allowed.example.", dns.TypeAXFR, dns.RcodeRefused, nil, false},
		{"a learn-mode allow is answered like an allow", "learn.example.", dns.TypeA, dns.RcodeSuccess, []uint16{dns.TypeA}, false},
	}
	e := newTestEnv(t, nil)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := e.u.Count(tt.qname, 0)
			q := query(tt.qname, tt.qtype)
			r := e.answer(t, "udp", q)
			if r.Rcode != tt.wantRcode {
				t.Errorf("rcode = %s, want %s", rcodeString(r.Rcode), rcodeString(tt.wantRcode))
			}
			var types []uint16
			for _, rr := range r.Answer {
				types = append(types, rr.Header().Rrtype)
			}
			if !slices.Equal(types, tt.wantTypes) {
				t.Errorf("answer types = %v, want %v\n%v", types, tt.wantTypes, r)
			}
			if r.Id != q.Id || !r.Response || !r.RecursionAvailable || r.Authoritative || !r.RecursionDesired {
				t.Errorf("header: id %#x QR %v RA %v AA %v RD %v; want id %#x, QR, RA, RD, no AA",
					r.Id, r.Response, r.RecursionAvailable, r.Authoritative, r.RecursionDesired, q.Id)
			}
			if len(r.Question) != 1 || r.Question[0] != q.Question[0] {
				t.Errorf("question = %v, want the client's %v", r.Question, q.Question)
			}
			for _, sec := range [][]dns.RR{r.Answer, r.Ns, r.Extra} {
				for _, rr := range sec {
					var ip netip.Addr
					switch v := rr.(type) {
					case *dns.A:
						ip, _ = netip.AddrFromSlice(v.A.To4())
					case *dns.AAAA:
						ip, _ = netip.AddrFromSlice(v.AAAA)
					default:
						continue
					}
					if !e.pool.Contains(ip) {
						t.Errorf("a real address reached the client: %v", rr)
					}
				}
			}
			for _, rr := range r.Answer {
				switch v := rr.(type) {
				case *dns.A:
					if n, ok := e.pool.Name(netip.AddrFrom4([4]byte(v.A.To4()))); !ok || n != normalizeName(tt.qname) {
						t.Errorf("%v maps back to %q, want %q", v.A, n, normalizeName(tt.qname))
					}
					if v.Hdr.Ttl != 77 {
						t.Errorf("fake A TTL = %d, want 77", v.Hdr.Ttl)
					}
				case *dns.AAAA:
					if n, ok := e.pool.Name(netip.AddrFrom16([16]byte(v.AAAA))); !ok || n != normalizeName(tt.qname) {
						t.Errorf("%v maps back to %q, want %q", v.AAAA, n, normalizeName(tt.qname))
					}
					if v.Hdr.Ttl != 77 {
						t.Errorf("fake AAAA TTL = %d, want 77", v.Hdr.Ttl)
					}
				}
			}
			sent := e.u.Count(tt.qname, 0) - before
			if tt.wantForward && sent == 0 {
				t.Error("query was not forwarded")
			}
			if !tt.wantForward && sent != 0 {
				t.Errorf("query reached the upstream %d times, want never", sent)
			}
		})
	}
	if st := e.srv.Stats(); st.Allowed != uint64(len(tests)) || st.Denied != 0 {
		t.Errorf("Stats = %+v, want %d allowed", st, len(tests))
	}
}

func TestAnswerForwardsTheClientsQuestionAndStripsAddresses(t *testing.T) {
	e := newTestEnv(t, nil)
	q := query("AlLoWeD.example.", dns.TypeMX)
	r := e.answer(t, "udp", q)
	if len(r.Answer) != 1 || r.Answer[0].(*dns.MX).Mx != "mx.allowed.example." {
		t.Fatalf("answer = %v", r.Answer)
	}
	if len(r.Extra) != 0 {
		t.Errorf("the MX target's real A record was passed on: %v", r.Extra)
	}
	if r.Question[0].Name != "AlLoWeD.example." {
		t.Errorf("question = %v, want the client's spelling", r.Question[0])
	}
	l := e.u.Log()
	if len(l) != 1 || l[0].Name != "allowed.example." || l[0].Type != dns.TypeMX {
		t.Errorf("upstream saw %v, want one MX question for allowed.example.", l)
	}
}

func TestAnswerReverseLookupsOfFakeAddresses(t *testing.T) {
	e := newTestEnv(t, nil)
	r := e.answer(t, "udp", query("allowed.example.", dns.TypeANY))
	v4 := netip.AddrFrom4([4]byte(r.Answer[0].(*dns.A).A.To4()))
	v6 := netip.AddrFrom16([16]byte(r.Answer[1].(*dns.AAAA).AAAA))
	filterCallsBefore := len(e.FilterCalls())
	rev := func(ip netip.Addr) string { return reverseName(ip) + "." }
	tests := []struct {
		name      string
		qname     string
		qtype     uint16
		wantRcode int
		wantPTR   string
	}{
		{"PTR of a fake IPv4 address names its host", rev(v4), dns.TypePTR, dns.RcodeSuccess, "allowed.example."},
		{"PTR of a fake IPv6 address names its host", rev(v6), dns.TypePTR, dns.RcodeSuccess, "allowed.example."},
		{"PTR in upper case works too", strings.ToUpper(rev(v6)), dns.TypePTR, dns.RcodeSuccess, "allowed.example."},
		{"PTR of the IPv4-mapped form names its host", rev(netip.AddrFrom16(v4.As16())), dns.TypePTR, dns.RcodeSuccess, "allowed.example."},
		{"TXT of a fake address's reverse name is empty", rev(v4), dns.TypeTXT, dns.RcodeSuccess, ""},
		{"PTR of an unassigned pool address is NXDOMAIN", "9.9.18.198.in-addr.arpa.", dns.TypePTR, dns.RcodeNameError, ""},
		{"PTR of the reserved resolver address is NXDOMAIN", "1.0.18.198.in-addr.arpa.", dns.TypePTR, dns.RcodeNameError, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := e.answer(t, "udp", query(tt.qname, tt.qtype))
			if r.Rcode != tt.wantRcode {
				t.Fatalf("rcode = %s, want %s", rcodeString(r.Rcode), rcodeString(tt.wantRcode))
			}
			var got string
			if len(r.Answer) == 1 {
				got = r.Answer[0].(*dns.PTR).Ptr
			} else if len(r.Answer) > 1 {
				t.Fatalf("answer = %v", r.Answer)
			}
			if got != tt.wantPTR {
				t.Errorf("PTR = %q, want %q", got, tt.wantPTR)
			}
		})
	}
	if l := e.u.Log(); len(l) != 0 {
		t.Errorf("reverse lookups reached the upstream: %v", l)
	}
	if calls := e.FilterCalls()[filterCallsBefore:]; len(calls) != 0 {
		t.Errorf("reverse lookups of pool addresses consulted the Filter: %v", calls)
	}
}

func TestAnswerKeepsSlotsStable(t *testing.T) {
	e := newTestEnv(t, nil)
	want := map[string]netip.Addr{}
	for round := 0; round < 5; round++ {
		for _, n := range []string{"a.allowed.example.", "B.Allowed.Example.", "c.allowed.example.", "A.ALLOWED.EXAMPLE."} {
			r := e.answer(t, "udp", query(n, dns.TypeA))
			if len(r.Answer) != 1 {
				t.Fatalf("%s: %v", n, r)
			}
			got := netip.AddrFrom4([4]byte(r.Answer[0].(*dns.A).A.To4()))
			k := normalizeName(n)
			if w, ok := want[k]; ok && w != got {
				t.Fatalf("round %d: %s moved from %v to %v", round, n, w, got)
			}
			want[k] = got
		}
	}
	if len(want) != 3 || e.pool.Len() != 3 {
		t.Errorf("%d names, pool Len %d; want 3 and 3", len(want), e.pool.Len())
	}
}

func TestAnswerRefusesWhenThePoolIsExhausted(t *testing.T) {
	small := mustPool(t, "198.18.0.0/24", "fd74:756e:7761:6c6d::/120", 254) // two slots
	e := newTestEnv(t, func(c *Config) { c.Pool = small })
	first := e.answer(t, "udp", query("a.allowed.example.", dns.TypeA))
	e.answer(t, "udp", query("b.allowed.example.", dns.TypeAAAA))
	for _, qt := range []uint16{dns.TypeA, dns.TypeAAAA, dns.TypeANY} {
		r := e.answer(t, "udp", query("c.allowed.example.", qt))
		if r.Rcode != dns.RcodeRefused || len(r.Answer) != 0 {
			t.Errorf("%s on a full pool: %s with %v, want REFUSED", typeString(qt), rcodeString(r.Rcode), r.Answer)
		}
	}
	again := e.answer(t, "udp", query("A.allowed.example.", dns.TypeA))
	if again.Rcode != dns.RcodeSuccess || again.Answer[0].(*dns.A).A.String() != first.Answer[0].(*dns.A).A.String() {
		t.Errorf("a name that had a slot lost it on a full pool: %v", again.Answer)
	}
	if st := e.srv.Stats(); st.Exhausted != 3 {
		t.Errorf("Exhausted = %d, want 3", st.Exhausted)
	}
	if l := e.u.Log(); len(l) != 0 {
		t.Errorf("exhaustion fell back to the upstream: %v", l)
	}
}

func TestAnswerTruncatesUDPRepliesToTheClientsSize(t *testing.T) {
	e := newTestEnv(t, nil)
	tests := []struct {
		name      string
		proto     string
		edns      uint16 // 0: no OPT record
		wantTC    bool
		wantLimit int
	}{
		{"UDP without EDNS is cut to 512 bytes with TC", "udp", 0, true, 512},
		{"a tiny EDNS size counts as 512", "udp", 100, true, 512},
		{"UDP with EDNS 1400 is cut to 1400 bytes with TC", "udp", 1400, true, 1400},
		{"UDP with EDNS 4096 fits whole", "udp", 4096, false, 4096},
		{"TCP is never truncated", "tcp", 0, false, dns.MaxMsgSize},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q := query("big.allowed.example.", dns.TypeTXT)
			if tt.edns != 0 {
				q.SetEdns0(tt.edns, false)
			}
			r := e.answer(t, tt.proto, q)
			wire, _ := r.Pack()
			if r.Truncated != tt.wantTC || len(wire) > tt.wantLimit {
				t.Errorf("TC = %v, %d bytes; want TC %v within %d", r.Truncated, len(wire), tt.wantTC, tt.wantLimit)
			}
			if !tt.wantTC && len(r.Answer) != 40 {
				t.Errorf("%d records, want all 40", len(r.Answer))
			}
			if (tt.edns != 0) != (r.IsEdns0() != nil) {
				t.Errorf("OPT in reply = %v, in query = %v", r.IsEdns0() != nil, tt.edns != 0)
			}
		})
	}
}

func TestAnswerEchoesEDNS(t *testing.T) {
	e := newTestEnv(t, nil)
	tests := []struct {
		name      string
		mod       func(*dns.Msg)
		wantOPT   bool
		wantDO    bool
		wantRcode int
	}{
		{"no OPT in, no OPT out", func(*dns.Msg) {}, false, false, dns.RcodeSuccess},
		{"an OPT record is echoed", func(q *dns.Msg) { q.SetEdns0(1232, false) }, true, false, dns.RcodeSuccess},
		{"the DO bit is echoed", func(q *dns.Msg) { q.SetEdns0(1232, true) }, true, true, dns.RcodeSuccess},
		{"EDNS version 1 gets BADVERS", func(q *dns.Msg) { q.SetEdns0(1232, false); q.IsEdns0().SetVersion(1) }, true, false, dns.RcodeBadVers},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q := query("allowed.example.", dns.TypeA)
			tt.mod(q)
			r := e.answer(t, "udp", q)
			// Round-trip through the wire: extended rcodes live in the OPT record.
			wire, _ := r.Pack()
			r = new(dns.Msg)
			if err := r.Unpack(wire); err != nil {
				t.Fatal(err)
			}
			opt := r.IsEdns0()
			if (opt != nil) != tt.wantOPT {
				t.Fatalf("OPT present = %v, want %v", opt != nil, tt.wantOPT)
			}
			if opt != nil && (opt.Do() != tt.wantDO || opt.Version() != 0 || opt.UDPSize() != ednsUDPSize) {
				t.Errorf("OPT = %v", opt)
			}
			if r.Rcode != tt.wantRcode {
				t.Errorf("rcode = %s, want %s", rcodeString(r.Rcode), rcodeString(tt.wantRcode))
			}
		})
	}
}

func TestAnswerRejectsQueriesItCannotAnswer(t *testing.T) {
	e := newTestEnv(t, nil)
	tests := []struct {
		name      string
		mod       func(*dns.Msg)
		wantRcode int
	}{
		{"no question is FORMERR", func(q *dns.Msg) { q.Question = nil }, dns.RcodeFormatError},
		{"two questions are FORMERR", func(q *dns.Msg) { q.Question = append(q.Question, q.Question[0]) }, dns.RcodeFormatError},
		{"a response is FORMERR", func(q *dns.Msg) { q.Response = true }, dns.RcodeFormatError},
		{"a name that is not fully qualified is FORMERR", func(q *dns.Msg) { q.Question[0].Name = "allowed.example" }, dns.RcodeFormatError},
		{"NOTIFY is NOTIMP", func(q *dns.Msg) { q.Opcode = dns.OpcodeNotify }, dns.RcodeNotImplemented},
		{"UPDATE is NOTIMP", func(q *dns.Msg) { q.Opcode = dns.OpcodeUpdate }, dns.RcodeNotImplemented},
		{"class CHAOS is REFUSED", func(q *dns.Msg) { q.Question[0].Qclass = dns.ClassCHAOS }, dns.RcodeRefused},
		{"class ANY is REFUSED", func(q *dns.Msg) { q.Question[0].Qclass = dns.ClassANY }, dns.RcodeRefused},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q := query("allowed.example.", dns.TypeTXT)
			tt.mod(q)
			r := e.answer(t, "udp", q)
			if r.Rcode != tt.wantRcode || len(r.Answer) != 0 || r.Id != q.Id || !r.Response {
				t.Errorf("reply = %v, want %s", r, rcodeString(tt.wantRcode))
			}
		})
	}
	if calls := e.FilterCalls(); len(calls) != 0 {
		t.Errorf("the Filter was consulted: %v", calls)
	}
	if l := e.u.Log(); len(l) != 0 {
		t.Errorf("the upstream was asked: %v", l)
	}
	if r := e.srv.Answer(context.Background(), testSrc, testDst, "udp", nil); r != nil {
		t.Errorf("Answer(nil) = %v, want nil", r)
	}
}

func TestAnswerWithoutUpstreamServfailsForwardedTypes(t *testing.T) {
	e := newTestEnv(t, func(c *Config) { c.Upstream = nil })
	if r := e.answer(t, "udp", query("allowed.example.", dns.TypeTXT)); r.Rcode != dns.RcodeServerFailure {
		t.Errorf("TXT without upstream: %s, want SERVFAIL", rcodeString(r.Rcode))
	}
	if r := e.answer(t, "udp", query("allowed.example.", dns.TypeA)); r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 {
		t.Errorf("A without upstream: %v", r)
	}
}

func TestAnswerReportsEachQueryOnce(t *testing.T) {
	e := newTestEnv(t, nil)
	e.answer(t, "udp", query("Allowed.Example.", dns.TypeA))
	e.answer(t, "tcp", query("allowed.example.", dns.TypeTXT))
	e.answer(t, "udp", query("denied.example.", dns.TypeTXT))
	e.answer(t, "udp", query("learn.example.", dns.TypeAAAA))
	evs := e.Events()
	if len(evs) != 4 {
		t.Fatalf("%d events, want 4: %+v", len(evs), evs)
	}
	v4, _, _ := e.pool.Assign("allowed.example")
	_, l6, _ := e.pool.Assign("learn.example")
	allow := flow.Decision{Verdict: flow.Allow, Rule: "allowed.example", Reason: "host rule"}
	want := []QueryEvent{
		{Src: testSrc, Dst: testDst, Proto: "udp", QName: "allowed.example", QType: "A", RCode: "NOERROR", Decision: allow, Answers: []netip.Addr{v4}},
		{Src: testSrc, Dst: testDst, Proto: "tcp", QName: "allowed.example", QType: "TXT", RCode: "NOERROR", Decision: allow, Forwarded: true},
		{Src: testSrc, Dst: testDst, Proto: "udp", QName: "denied.example", QType: "TXT", RCode: "NXDOMAIN", Decision: flow.Decision{Rule: "default-deny", Reason: "no rule matches"}},
		{Src: testSrc, Dst: testDst, Proto: "udp", QName: "learn.example", QType: "AAAA", RCode: "NOERROR",
			Decision: flow.Decision{Verdict: flow.Allow, Rule: "default-deny", Reason: "learn mode"}, Answers: []netip.Addr{l6}},
	}
	for i := range want {
		got := evs[i]
		if got.Src != want[i].Src || got.Dst != want[i].Dst || got.Proto != want[i].Proto || got.QName != want[i].QName ||
			got.QType != want[i].QType || got.RCode != want[i].RCode || got.Decision != want[i].Decision ||
			got.Forwarded != want[i].Forwarded || !slices.Equal(got.Answers, want[i].Answers) {
			t.Errorf("event %d = %+v\nwant %+v", i, got, want[i])
		}
	}
}

func TestNewServerValidatesItsConfig(t *testing.T) {
	pool, _ := NewPool(DefaultPrefix4, DefaultPrefix6)
	f := func(string) flow.Decision { return flow.Decision{} }
	tests := []struct {
		name    string
		cfg     Config
		wantErr bool
	}{
		{"a pool and a filter are enough", Config{Pool: pool, Filter: f}, false},
		{"a missing pool is an error", Config{Filter: f}, true},
		{"a missing filter is an error", Config{Pool: pool}, true},
		{"a negative idle timeout is an error", Config{Pool: pool, Filter: f, Limits: Limits{TCPIdle: -time.Second}}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := NewServer(tt.cfg); (err != nil) != tt.wantErr {
				t.Errorf("err = %v, wantErr %v", err, tt.wantErr)
			}
		})
	}
	s, _ := NewServer(Config{Pool: pool, Filter: func(string) flow.Decision { return flow.Decision{Verdict: flow.Allow} }})
	r := s.Answer(context.Background(), testSrc, testDst, "udp", query("x.example.", dns.TypeA))
	if r.Answer[0].Header().Ttl != 60 {
		t.Errorf("default TTL = %d, want 60", r.Answer[0].Header().Ttl)
	}
}

func BenchmarkAnswerA(b *testing.B) {
	pool, _ := NewPool(DefaultPrefix4, DefaultPrefix6)
	s, err := NewServer(Config{Pool: pool, Filter: func(string) flow.Decision { return flow.Decision{Verdict: flow.Allow} }})
	if err != nil {
		b.Fatal(err)
	}
	q := query("www.example.com.", dns.TypeA)
	b.ReportAllocs()
	for b.Loop() {
		if r := s.Answer(context.Background(), testSrc, testDst, "udp", q); len(r.Answer) != 1 {
			b.Fatal("no answer")
		}
	}
}

// TestAForwardedQueryTheUpstreamDidNotAnswerSaysWhyInItsEvent: a forwarded
// query for an allowed name carries the upstream's failure in its event
// (a timeout, SERVFAIL), so that it can be said and recorded; an answer,
// NXDOMAIN included, carries none.
func TestAForwardedQueryTheUpstreamDidNotAnswerSaysWhyInItsEvent(t *testing.T) {
	e := newTestEnv(t, nil)
	for _, c := range []struct {
		name  string
		rcode int
		want  func(error) bool
	}{
		{"silent.example.", dns.RcodeServerFailure, func(err error) bool { return errors.Is(err, ErrTimeout) }},
		{"fail.example.", dns.RcodeServerFailure, func(err error) bool {
			var rc *RcodeError
			return errors.As(err, &rc) && rc.Rcode == dns.RcodeServerFailure && rc.Name == "fail.example"
		}},
		{"allowed.example.", dns.RcodeSuccess, func(err error) bool { return err == nil }},
		{"nope.allowed.example.", dns.RcodeNameError, func(err error) bool { return err == nil }},
	} {
		r := e.answer(t, "udp", query(c.name, dns.TypeTXT))
		evs := e.Events()
		ev := evs[len(evs)-1]
		if r.Rcode != c.rcode || !ev.Forwarded || !c.want(ev.UpstreamErr) {
			t.Errorf("%s TXT: rcode %s, forwarded %v, UpstreamErr %v", c.name, dns.RcodeToString[r.Rcode], ev.Forwarded, ev.UpstreamErr)
		}
	}
}
