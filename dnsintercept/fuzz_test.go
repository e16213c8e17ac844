package dnsintercept

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/tunwall/tunwall/flow"
)

// FuzzAnswer feeds random wire bytes through Unpack and Answer. Answer must
// never panic, must reply to every parseable message with something that
// packs, must never send anything upstream for a name the Filter did not
// allow, and what it sends upstream must be a query it built itself (the
// lower-case name, an ordinary type, only RD, its own OPT record), whatever
// the client's query held. The upstream is a Dial hook that checks what is
// written and fails the read, so the fuzzer touches no network.
func FuzzAnswer(f *testing.F) {
	for _, s := range []struct {
		name  string
		qtype uint16
		edns  bool
	}{
		{"denied.example.", dns.TypeTXT, false},
		{"denied.example.", dns.TypeANY, true},
		{"OK.example.", dns.TypeMX, false},
		{"ok.example.", dns.TypeA, true},
		{"ok.example.", dns.TypeAAAA, false},
		{"ok.example.", dns.TypeHTTPS, false},
		{"1.1.18.198.in-addr.arpa.", dns.TypePTR, false},
		{`ok\.example.`, dns.TypeTXT, false},
		{"oK.ExAmPlE.", dns.TypeTXT, true},
		{"ok.example.", 65280, true},
		{"ok.example.", dns.TypeDNSKEY, true},
	} {
		q := query(s.name, s.qtype)
		if s.edns {
			q.SetEdns0(4096, true)
			q.IsEdns0().Option = append(q.IsEdns0().Option, &dns.EDNS0_COOKIE{Code: dns.EDNS0COOKIE, Cookie: "0102030405060708"})
			q.CheckingDisabled = true
		}
		b, err := q.Pack()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}

	var dials atomic.Int64
	var badQuery atomic.Pointer[string]
	up, err := NewResolver(ResolverConfig{
		Server: netip.MustParseAddrPort("192.0.2.53:53"),
		Dial: func(_ context.Context, network, _ string) (net.Conn, error) {
			dials.Add(1)
			return &checkConn{tcp: network == "tcp", bad: &badQuery}, nil
		},
	})
	if err != nil {
		f.Fatal(err)
	}
	pool, err := NewPoolReserved(netip.MustParsePrefix("198.18.0.0/24"), netip.MustParsePrefix("fd74:756e:7761:6c6d::/120"), 250)
	if err != nil {
		f.Fatal(err)
	}
	var allowedAsked atomic.Bool
	s, err := NewServer(Config{
		Pool:     pool,
		Upstream: up,
		Filter: func(name string) flow.Decision {
			if name == "ok.example" {
				allowedAsked.Store(true)
				return flow.Decision{Verdict: flow.Allow}
			}
			return flow.Decision{}
		},
	})
	if err != nil {
		f.Fatal(err)
	}
	pool.Assign("ok.example") // so PTR lookups can hit
	// The dial counter must see forwards, or the check below proves nothing.
	if r := s.Answer(context.Background(), testSrc, testDst, "udp", query("ok.example.", dns.TypeMX)); r.Rcode != dns.RcodeServerFailure || dials.Load() == 0 {
		f.Fatalf("an allowed MX did not reach the dial hook (rcode %s, %d dials)", rcodeString(r.Rcode), dials.Load())
	}

	f.Fuzz(func(t *testing.T, b []byte) {
		q := new(dns.Msg)
		if q.Unpack(b) != nil {
			return
		}
		dials.Store(0)
		allowedAsked.Store(false)
		badQuery.Store(nil)
		for _, proto := range []string{"udp", "tcp"} {
			r := s.Answer(context.Background(), testSrc, testDst, proto, q)
			if r == nil {
				t.Fatal("nil reply to a parseable query")
			}
			wire, err := r.Pack()
			if err != nil {
				t.Fatalf("reply does not pack: %v\n%v", err, r)
			}
			if proto == "udp" && len(wire) > dns.MaxMsgSize {
				t.Fatalf("UDP reply of %d bytes", len(wire))
			}
			if r.Id != q.Id || !r.Response {
				t.Fatalf("reply header %v", r.MsgHdr)
			}
		}
		if dials.Load() != 0 && !allowedAsked.Load() {
			t.Fatalf("upstream dialled for a query the Filter never allowed: %v", q.Question)
		}
		if b := badQuery.Load(); b != nil {
			t.Fatalf("client query %v\nsent upstream: %s", q, *b)
		}
	})
}

// checkConn is a fake upstream conn: Write checks that the query is one
// Resolver.Query builds, Read fails at once.
type checkConn struct {
	net.Conn // nil: any other method panics
	tcp      bool
	bad      *atomic.Pointer[string]
}

func (c *checkConn) Write(b []byte) (int, error) {
	wire := b
	if c.tcp && len(b) >= 2 {
		wire = b[2:]
	}
	m := new(dns.Msg)
	why := ""
	switch {
	case m.Unpack(wire) != nil:
		why = "does not parse"
	case len(m.Question) != 1 || len(m.Answer)+len(m.Ns) != 0 || len(m.Extra) != 1:
		why = "wrong sections"
	case m.Question[0].Name != strings.ToLower(m.Question[0].Name) || m.Question[0].Qclass != dns.ClassINET:
		why = "name case or class"
	case !forwardedType(m.Question[0].Qtype) && m.Question[0].Qtype != dns.TypeA && m.Question[0].Qtype != dns.TypeAAAA:
		why = "type"
	case m.Response || m.Opcode != dns.OpcodeQuery || !m.RecursionDesired || m.CheckingDisabled || m.AuthenticatedData || m.Zero || m.Authoritative || m.Truncated || m.RecursionAvailable:
		why = "header flags"
	default:
		opt, ok := m.Extra[0].(*dns.OPT)
		if !ok || opt.Hdr.Ttl != 0 || len(opt.Option) != 0 || opt.UDPSize() != resolveUDPSize {
			why = "OPT record"
		}
	}
	if why != "" {
		s := why + ": " + m.String()
		c.bad.Store(&s)
	}
	return len(b), nil
}

func (c *checkConn) Read([]byte) (int, error)         { return 0, errors.New("fuzz: no network") }
func (c *checkConn) Close() error                     { return nil }
func (c *checkConn) SetDeadline(time.Time) error      { return nil }
func (c *checkConn) SetReadDeadline(time.Time) error  { return nil }
func (c *checkConn) SetWriteDeadline(time.Time) error { return nil }
