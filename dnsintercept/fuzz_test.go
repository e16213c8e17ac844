package dnsintercept

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"sync/atomic"
	"testing"

	"github.com/miekg/dns"
)

// FuzzAnswer feeds random wire bytes through Unpack and Answer. Answer must
// never panic, must reply to every parseable message with something that
// packs, and must never send anything upstream for a name the Filter did not
// allow. The upstream is a Dial hook that counts and fails, so the fuzzer
// touches no network.
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
	} {
		q := query(s.name, s.qtype)
		if s.edns {
			q.SetEdns0(4096, true)
		}
		b, err := q.Pack()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}

	var dials atomic.Int64
	up, err := NewResolver(ResolverConfig{
		Server: netip.MustParseAddrPort("192.0.2.53:53"),
		Dial: func(context.Context, string, string) (net.Conn, error) {
			dials.Add(1)
			return nil, errors.New("fuzz: no network")
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
		Filter: func(name string) Verdict {
			if name == "ok.example" {
				allowedAsked.Store(true)
				return Verdict{Allow: true, WouldAllow: true}
			}
			return Verdict{}
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
	})
}
