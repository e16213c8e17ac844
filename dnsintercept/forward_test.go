package dnsintercept

import (
	"context"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/tunwall/tunwall/flow"
)

// checkRebuilt fails the test unless m is a query tunwall built itself: the
// lower-case name, only RD, class IN, and tunwall's own OPT record.
func checkRebuilt(t *testing.T, m *dns.Msg, wantName string, wantType uint16) {
	t.Helper()
	if len(m.Question) != 1 {
		t.Fatalf("upstream query has %d questions", len(m.Question))
	}
	qq := m.Question[0]
	if qq.Name != wantName || qq.Qtype != wantType || qq.Qclass != dns.ClassINET {
		t.Errorf("upstream question = %v, want %s %s IN", qq, wantName, typeString(wantType))
	}
	if m.Response || m.Opcode != dns.OpcodeQuery || !m.RecursionDesired || m.CheckingDisabled || m.AuthenticatedData || m.Zero ||
		m.Authoritative || m.Truncated || m.RecursionAvailable {
		t.Errorf("upstream header = %+v, want only RD", m.MsgHdr)
	}
	if len(m.Answer)+len(m.Ns) != 0 || len(m.Extra) != 1 {
		t.Fatalf("upstream sections: %d answer, %d authority, %d additional; want only an OPT", len(m.Answer), len(m.Ns), len(m.Extra))
	}
	opt, ok := m.Extra[0].(*dns.OPT)
	if !ok || opt.Hdr.Name != "." || opt.UDPSize() != resolveUDPSize || opt.Hdr.Ttl != 0 || len(opt.Option) != 0 {
		t.Errorf("upstream OPT = %v, want size %d, no flags, no options", m.Extra[0], resolveUDPSize)
	}
}

func TestForwardedQueriesCarryOnlyTheNameAndType(t *testing.T) {
	e := newTestEnv(t, nil)
	subnet := &dns.EDNS0_SUBNET{Code: dns.EDNS0SUBNET, Family: 1, SourceNetmask: 32, Address: []byte{198, 51, 100, 7}}
	tests := []struct {
		name string
		mod  func(*dns.Msg)
	}{
		{"mixed case (0x20 bits)", func(q *dns.Msg) { q.Question[0].Name = "aLlOwEd.ExAmPlE." }},
		{"CD and AD", func(q *dns.Msg) { q.CheckingDisabled, q.AuthenticatedData = true, true }},
		{"the Z bit", func(q *dns.Msg) { q.Zero = true }},
		{"RD clear", func(q *dns.Msg) { q.RecursionDesired = false }},
		{"header bits only a response has", func(q *dns.Msg) { q.Authoritative, q.RecursionAvailable, q.Truncated = true, true, true }},
		{"DO", func(q *dns.Msg) { q.SetEdns0(4096, true) }},
		{"a small EDNS size", func(q *dns.Msg) { q.SetEdns0(512, false) }},
		{"EDNS flag bits", func(q *dns.Msg) { q.SetEdns0(1232, false); q.IsEdns0().Hdr.Ttl |= 0x7fff }},
		{"client subnet, cookie, padding, NSID and a private option", func(q *dns.Msg) {
			q.SetEdns0(1232, false)
			o := q.IsEdns0()
			o.Option = append(o.Option, subnet,
				&dns.EDNS0_COOKIE{Code: dns.EDNS0COOKIE, Cookie: "0102030405060708"},
				&dns.EDNS0_PADDING{Padding: make([]byte, 64)},
				&dns.EDNS0_NSID{Code: dns.EDNS0NSID},
				&dns.EDNS0_LOCAL{Code: 65001, Data: []byte("chosen bits")})
		}},
		{"extra answer and authority records", func(q *dns.Msg) {
			q.Answer = append(q.Answer, mustRR("x.example. 1 IN TXT \"smuggled\""))
			q.Ns = append(q.Ns, mustRR("y.example. 1 IN TXT \"smuggled\""))
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := len(e.u.Log())
			q := query("allowed.example.", dns.TypeTXT)
			q.Id = 0x2020
			tt.mod(q)
			r := e.answer(t, "udp", q)
			if r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 || r.Id != 0x2020 {
				t.Fatalf("reply = %v", r)
			}
			if r.AuthenticatedData {
				t.Error("reply sets AD, but tunwall validates nothing")
			}
			l := e.u.Log()
			if len(l) != before+1 {
				t.Fatalf("upstream saw %d queries, want 1", len(l)-before)
			}
			checkRebuilt(t, l[before].Msg, "allowed.example.", dns.TypeTXT)
			if l[before].Msg.Id == 0x2020 {
				t.Error("the client's message ID reached the upstream")
			}
		})
	}
}

func TestOnlyOrdinaryTypesAreForwarded(t *testing.T) {
	e := newTestEnv(t, nil)
	forwarded := []uint16{dns.TypeNS, dns.TypeCNAME, dns.TypeSOA, dns.TypePTR, dns.TypeMX, dns.TypeTXT,
		dns.TypeSRV, dns.TypeNAPTR, dns.TypeCAA, dns.TypeTLSA, dns.TypeSSHFP}
	empty := []uint16{65280, 65535, 65399, dns.TypeNULL, dns.TypeHINFO, dns.TypeDNSKEY, dns.TypeDS, dns.TypeRRSIG,
		dns.TypeNSEC, dns.TypeNSEC3, dns.TypeKEY, dns.TypeSIG, dns.TypeLOC, dns.TypeURI, dns.TypeRP, dns.TypeAPL, 0xFF00}
	for _, qt := range forwarded {
		before := len(e.u.Log())
		r := e.answer(t, "udp", query("allowed.example.", qt))
		l := e.u.Log()
		if len(l) != before+1 {
			t.Errorf("%s was not forwarded (reply %s)", typeString(qt), rcodeString(r.Rcode))
			continue
		}
		checkRebuilt(t, l[before].Msg, "allowed.example.", qt)
	}
	for _, qt := range empty {
		before := len(e.u.Log())
		r := e.answer(t, "udp", query("allowed.example.", qt))
		if len(e.u.Log()) != before {
			t.Errorf("%s was forwarded", typeString(qt))
		}
		if r.Rcode != dns.RcodeSuccess || len(r.Answer)+len(r.Ns) != 0 {
			t.Errorf("%s: reply %s with %d answers, want NOERROR with none", typeString(qt), rcodeString(r.Rcode), len(r.Answer))
		}
	}
	for _, qt := range []uint16{dns.TypeAXFR, dns.TypeIXFR, dns.TypeMAILA, dns.TypeMAILB, dns.TypeTKEY, dns.TypeTSIG, dns.TypeOPT} {
		if r := e.answer(t, "tcp", query("allowed.example.", qt)); r.Rcode != dns.RcodeRefused {
			t.Errorf("%s: %s, want REFUSED", typeString(qt), rcodeString(r.Rcode))
		}
	}
	if l := e.u.Log(); len(l) != len(forwarded) {
		t.Errorf("upstream saw %d queries, want %d", len(l), len(forwarded))
	}
}

func TestResolverQueryRejectsWhatIsNotAHostname(t *testing.T) {
	u := startUpstream(t)
	r := u.resolver(t, ResolverConfig{Timeout: time.Second})
	for _, name := range []string{"", ".", "a..example", "a\\.b.example", "x y.example", "é.example"} {
		if _, err := r.Query(context.Background(), name, dns.TypeTXT); err == nil {
			t.Errorf("Query(%q) succeeded", name)
		}
	}
	if l := u.Log(); len(l) != 0 {
		t.Errorf("upstream saw %v", l)
	}
	m, err := r.Query(context.Background(), "Allowed.Example.", dns.TypeMX)
	if err != nil || len(m.Answer) != 1 {
		t.Fatalf("Query = %v, %v", m, err)
	}
	checkRebuilt(t, u.Log()[0].Msg, "allowed.example.", dns.TypeMX)
}

func TestForwardingBeyondMaxForwardingIsServfailAtOnce(t *testing.T) {
	checkGoroutines(t)
	e := newTestEnv(t, func(c *Config) { c.Limits.MaxForwarding = 1 })
	done := make(chan *dns.Msg)
	go func() { // waits for the upstream, which never answers
		done <- e.srv.Answer(context.Background(), testSrc, testDst, "udp", query("silent.example.", dns.TypeTXT))
	}()
	deadline := time.Now().Add(5 * time.Second)
	for e.u.Count("silent.example", dns.TypeTXT) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the first query never reached the upstream")
		}
		time.Sleep(5 * time.Millisecond)
	}
	start := time.Now()
	r := e.answer(t, "udp", query("allowed.example.", dns.TypeTXT))
	if r.Rcode != dns.RcodeServerFailure || time.Since(start) > time.Second {
		t.Errorf("second forwarded query: %s after %v, want SERVFAIL at once", rcodeString(r.Rcode), time.Since(start))
	}
	if st := e.srv.Stats(); st.UpstreamBusy != 1 {
		t.Errorf("UpstreamBusy = %d, want 1", st.UpstreamBusy)
	}
	if r := <-done; r.Rcode != dns.RcodeServerFailure {
		t.Errorf("silent upstream: %s, want SERVFAIL", rcodeString(r.Rcode))
	}
	if r := e.answer(t, "udp", query("allowed.example.", dns.TypeTXT)); r.Rcode != dns.RcodeSuccess {
		t.Errorf("after the slot is free: %s, want NOERROR", rcodeString(r.Rcode))
	}
}

func TestFakeTTLStaysBelowThePoolsReuseTime(t *testing.T) {
	for _, tt := range []struct {
		reuse   time.Duration
		ttl     uint32
		wantTTL uint32
	}{
		{0, 0, 60},                  // defaults: 10m reuse, 60s TTL
		{time.Minute, 0, 30},        // half the reuse time
		{3 * time.Second, 0, 1},     // never below 1s
		{time.Hour, 600, 600},       // a chosen TTL below the bound stays
		{-1, 0, 60},                 // never reused: no bound
		{10 * time.Second, 300, 5},  // a chosen TTL above the bound is cut
		{90 * time.Second, 100, 45}, // likewise
	} {
		pool, err := NewPoolWith(DefaultPrefix4, DefaultPrefix6, DefaultReserved, PoolOptions{ReuseAfter: tt.reuse})
		if err != nil {
			t.Fatal(err)
		}
		srv, err := NewServer(Config{Pool: pool, Filter: func(string) flow.Decision { return flow.Decision{Verdict: flow.Allow} }, TTL: tt.ttl})
		if err != nil {
			t.Fatal(err)
		}
		r := srv.Answer(context.Background(), testSrc, testDst, "udp", query("a.example.", dns.TypeA))
		if len(r.Answer) != 1 || r.Answer[0].Header().Ttl != tt.wantTTL {
			t.Errorf("reuse %v, TTL %d: answer %v, want TTL %d", tt.reuse, tt.ttl, r.Answer, tt.wantTTL)
		}
	}
}
