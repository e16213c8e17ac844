package dnsintercept

import (
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/tunwall/tunwall/internal/leaktest"
)

// loggedQuery is one question the fake upstream received.
type loggedQuery struct {
	Proto string // "udp" or "tcp"
	Name  string // lower-case FQDN
	Type  uint16
	Msg   *dns.Msg // the query as it arrived
}

// fakeUpstream is a real miekg/dns server on 127.0.0.1 (UDP and TCP on one
// port) that logs every question it receives and answers from a small zone.
//
// Special names: silent.example never gets a reply; tconly.example is
// truncated (TC, no answers) over UDP and answered over TCP; nx.example is
// NXDOMAIN and fail.example SERVFAIL. CNAMEs are followed within the zone and
// the whole chain returned, MX answers carry their targets' A records as
// glue, and UDP replies are truncated to the client's payload size.
type fakeUpstream struct {
	Addr netip.AddrPort

	mu  sync.Mutex
	log []loggedQuery

	zone map[string][]dns.RR // lower-case FQDN -> records
	// drop holds the questions (lower-case FQDN and type) that get no
	// reply for now: an upstream that loses one family of a name.
	drop map[dns.Question]bool
}

// setDrop makes the upstream ignore (or, with on false, answer again) the
// questions for name and qtype.
func (u *fakeUpstream) setDrop(name string, qtype uint16, on bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.drop == nil {
		u.drop = map[dns.Question]bool{}
	}
	u.drop[dns.Question{Name: dns.Fqdn(strings.ToLower(name)), Qtype: qtype, Qclass: dns.ClassINET}] = on
}

var testZone = []string{
	"dual.example. 300 IN A 192.0.2.1",
	"dual.example. 300 IN AAAA 2001:db8::1",
	"alias.example. 120 IN CNAME alias2.example.",
	"alias2.example. 300 IN CNAME target.example.",
	"target.example. 300 IN A 192.0.2.10",
	"target.example. 300 IN AAAA 2001:db8::10",
	"short.example. 0 IN A 192.0.2.20",
	"v4only.example. 300 IN A 192.0.2.30",
	"nodata.example. 300 IN TXT \"no addresses here\"",
	"allowed.example. 300 IN TXT \"hello from upstream\"",
	"allowed.example. 300 IN MX 10 mx.allowed.example.",
	"allowed.example. 300 IN A 192.0.2.99", // must never reach the sandbox
	"mx.allowed.example. 300 IN A 192.0.2.25",
	"www.allowed.example. 300 IN CNAME edge.allowed.example.",
	"edge.allowed.example. 300 IN A 192.0.2.26",
}

func startUpstream(t testing.TB) *fakeUpstream {
	t.Helper()
	u := &fakeUpstream{zone: make(map[string][]dns.RR)}
	for _, s := range testZone {
		rr, err := dns.NewRR(s)
		if err != nil {
			t.Fatalf("bad test record %q: %v", s, err)
		}
		k := strings.ToLower(rr.Header().Name)
		u.zone[k] = append(u.zone[k], rr)
	}
	for i := 0; i < 40; i++ { // about 2.4 KB of TXT: needs TCP without a big EDNS size
		rr, _ := dns.NewRR(`big.allowed.example. 300 IN TXT "` + strings.Repeat("x", 50) + `"`)
		rr.(*dns.TXT).Txt[0] += string(rune('a' + i%26))
		u.zone["big.allowed.example."] = append(u.zone["big.allowed.example."], rr)
	}

	// UDP first on an ephemeral port, then TCP on the same port; retry a
	// few times in case the TCP port is taken.
	var pc net.PacketConn
	var ln net.Listener
	for attempt := 0; ; attempt++ {
		var err error
		pc, err = net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("listen udp: %v", err)
		}
		ln, err = net.Listen("tcp", pc.LocalAddr().String())
		if err == nil {
			break
		}
		pc.Close()
		if attempt == 10 {
			t.Fatalf("listen tcp next to udp: %v", err)
		}
	}
	u.Addr = pc.LocalAddr().(*net.UDPAddr).AddrPort()

	h := dns.HandlerFunc(u.serve)
	for _, srv := range []*dns.Server{
		{PacketConn: pc, Handler: h},
		{Listener: ln, Handler: h},
	} {
		started := make(chan struct{})
		srv.NotifyStartedFunc = func() { close(started) }
		errc := make(chan error, 1)
		go func() { errc <- srv.ActivateAndServe() }()
		select {
		case <-started:
		case err := <-errc:
			t.Fatalf("upstream server: %v", err)
		case <-time.After(5 * time.Second):
			t.Fatal("upstream server did not start within 5s")
		}
		t.Cleanup(func() {
			srv.Shutdown()
			<-errc
		})
	}
	return u
}

func (u *fakeUpstream) serve(w dns.ResponseWriter, req *dns.Msg) {
	proto := "udp"
	if _, ok := w.RemoteAddr().(*net.TCPAddr); ok {
		proto = "tcp"
	}
	if len(req.Question) != 1 {
		return
	}
	q := req.Question[0]
	name := strings.ToLower(q.Name)
	u.mu.Lock()
	u.log = append(u.log, loggedQuery{Proto: proto, Name: name, Type: q.Qtype, Msg: req.Copy()})
	dropped := u.drop[dns.Question{Name: name, Qtype: q.Qtype, Qclass: q.Qclass}]
	u.mu.Unlock()
	if dropped {
		return
	}

	m := new(dns.Msg)
	m.SetReply(req)
	m.RecursionAvailable = true
	switch name {
	case "silent.example.":
		return
	case "nx.example.":
		m.Rcode = dns.RcodeNameError
	case "fail.example.":
		m.Rcode = dns.RcodeServerFailure
	case "tconly.example.":
		if proto == "udp" {
			m.Truncated = true
		} else if q.Qtype == dns.TypeA {
			m.Answer = append(m.Answer, mustRR("tconly.example. 300 IN A 192.0.2.77"))
		} else if q.Qtype == dns.TypeAAAA {
			m.Answer = append(m.Answer, mustRR("tconly.example. 300 IN AAAA 2001:db8::77"))
		}
	default:
		owner := name
		for hop := 0; hop < 8; hop++ {
			var next string
			for _, rr := range u.zone[owner] {
				if c, ok := rr.(*dns.CNAME); ok && q.Qtype != dns.TypeCNAME {
					m.Answer = append(m.Answer, rr)
					next = strings.ToLower(c.Target)
				} else if rr.Header().Rrtype == q.Qtype {
					m.Answer = append(m.Answer, rr)
					if mx, ok := rr.(*dns.MX); ok {
						for _, g := range u.zone[strings.ToLower(mx.Mx)] {
							if g.Header().Rrtype == dns.TypeA {
								m.Extra = append(m.Extra, g)
							}
						}
					}
				}
			}
			if next == "" {
				break
			}
			owner = next
		}
		if len(m.Answer) == 0 && !u.known(name) {
			m.Rcode = dns.RcodeNameError
		}
	}
	if opt := req.IsEdns0(); opt != nil {
		m.SetEdns0(opt.UDPSize(), false)
	}
	if proto == "udp" {
		size := dns.MinMsgSize
		if opt := req.IsEdns0(); opt != nil {
			size = int(opt.UDPSize())
		}
		m.Truncate(size)
	}
	w.WriteMsg(m)
}

// known reports whether name owns records in the zone or has names below it.
func (u *fakeUpstream) known(name string) bool {
	for k := range u.zone {
		if k == name || strings.HasSuffix(k, "."+name) {
			return true
		}
	}
	return false
}

func mustRR(s string) dns.RR {
	rr, err := dns.NewRR(s)
	if err != nil {
		panic(err)
	}
	return rr
}

// Log returns a copy of the questions received so far.
func (u *fakeUpstream) Log() []loggedQuery {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]loggedQuery(nil), u.log...)
}

// Count returns how many questions for name (any case, with or without the
// trailing dot) and qtype arrived; qtype 0 counts every type.
func (u *fakeUpstream) Count(name string, qtype uint16) int {
	name = dns.Fqdn(strings.ToLower(name))
	n := 0
	for _, l := range u.Log() {
		if l.Name == name && (qtype == 0 || l.Type == qtype) {
			n++
		}
	}
	return n
}

func (u *fakeUpstream) resolver(t testing.TB, cfg ResolverConfig) *Resolver {
	t.Helper()
	cfg.Server = u.Addr
	r, err := NewResolver(cfg)
	if err != nil {
		t.Fatalf("NewResolver: %v", err)
	}
	return r
}

// checkGoroutines fails the test if goroutines it started still run at
// cleanup (leaktest.Check).
func checkGoroutines(t *testing.T) {
	t.Helper()
	leaktest.Check(t)
}
