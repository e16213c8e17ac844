package socksserver

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tunwall/tunwall/internal/audit"
	"github.com/tunwall/tunwall/internal/engine/enginetest"
	"github.com/tunwall/tunwall/internal/socks5"
)

func TestConnectIsDecidedByNameAndDialledByTheCheckedAddress(t *testing.T) {
	r := newRig(t, allowTLS)
	r.resolves("allowed.test", "192.0.2.10")
	r.resolves("denied.test", "192.0.2.11")

	_, err := r.d.DialContext(context.Background(), "tcp", "denied.test:443")
	var re *socks5.ReplyError
	if !errors.As(err, &re) || re.Code != socks5.ReplyNotAllowed {
		t.Fatalf("a denied name: err %v, want the refusal \"not allowed by ruleset\"", err)
	}
	if asked := r.res.Asked(); len(asked) != 0 || len(r.dial.Dialled()) != 0 {
		t.Fatalf("a denied name was resolved (%q) or dialled (%q)", asked, r.dial.Dialled())
	}
	if rec := r.rec.WaitN(t, audit.KindFlow, 1); rec.Verdict != audit.VerdictDeny || rec.Host != "denied.test" || rec.HostFrom != audit.HostFromSOCKS {
		t.Fatalf("record: %+v", rec)
	}

	c, err := r.d.DialContext(context.Background(), "tcp", "allowed.test:443")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	srv := r.dial.Server(t)
	if got := r.dial.Dialled(); len(got) != 1 || got[0] != "tcp 192.0.2.10:443" {
		t.Fatalf("dials = %q", got)
	}
	hello := enginetest.ClientHello(t, "allowed.test")
	go c.Write(hello)
	if got := enginetest.ReadUpTo(t, srv, len(hello)); len(got) != len(hello) {
		t.Fatalf("the upstream got %d bytes of %d", len(got), len(hello))
	}
	c.Close()
	srv.Close()
	rec := r.rec.WaitN(t, audit.KindFlow, 2)
	if rec.Verdict != audit.VerdictAllow || rec.Host != "allowed.test" || rec.HostFrom != audit.HostFromSOCKS || rec.SNI != "allowed.test" || rec.BytesOut != int64(len(hello)) {
		t.Fatalf("record: %+v", rec)
	}
}

func TestTheReplySaysWhyARequestWasNotOpened(t *testing.T) {
	r := newRig(t, allowTLS+`      - host: "*.guarded.test"
        ports: [443]
      - host: nx.test
        ports: [443]
`)
	r.resolves("allowed.test", "192.0.2.10")
	r.resolves("a.guarded.test", "127.0.0.1") // the rebinding guard never dials loopback
	cases := []struct {
		name, target string
		refuse       bool
		want         byte
	}{
		{"a name the policy denies", "denied.test:443", false, socks5.ReplyNotAllowed},
		{"an address the policy denies", "192.0.2.99:443", false, socks5.ReplyNotAllowed},
		{"an allowed name that resolves where the guard never dials", "a.guarded.test:443", false, socks5.ReplyNotAllowed},
		{"an allowed name whose server refuses", "allowed.test:443", true, socks5.ReplyConnectionRefused},
		{"an allowed name that does not resolve", "nx.test:443", false, socks5.ReplyHostUnreachable},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r.dial.SetRefuse(tc.refuse)
			_, err := r.d.DialContext(context.Background(), "tcp", tc.target)
			var re *socks5.ReplyError
			if !errors.As(err, &re) || re.Code != tc.want {
				t.Fatalf("%s: err %v, want reply code %d", tc.target, err, tc.want)
			}
		})
	}
}

func TestUDPIsDecidedPerDestination(t *testing.T) {
	r := newRig(t, `      - host: game.test
        ports: [5000]
        proto: udp
`)
	r.resolves("game.test", "192.0.2.30")
	r.resolves("denied.test", "192.0.2.31")

	denied, err := r.d.DialUDP(context.Background(), "denied.test:5000")
	if err != nil {
		t.Fatal(err)
	}
	defer denied.Close()
	denied.Write([]byte("leak"))
	if rec := r.rec.WaitN(t, audit.KindFlow, 1); rec.Verdict != audit.VerdictDeny || rec.Host != "denied.test" || rec.Proto != "udp" {
		t.Fatalf("record: %+v", rec)
	}

	c, err := r.d.DialUDP(context.Background(), "game.test:5000")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write([]byte("ping"))
	srv := r.dial.Server(t)
	if got := enginetest.ReadUpTo(t, srv, 4); string(got) != "ping" {
		t.Fatalf("upstream got %q", got)
	}
	go srv.Write([]byte("pong"))
	buf := make([]byte, 64)
	c.SetReadDeadline(time.Now().Add(waitFor))
	n, err := c.Read(buf)
	if err != nil || string(buf[:n]) != "pong" {
		t.Fatalf("client got %q, %v", buf[:n], err)
	}
	for _, dl := range r.dial.Dialled() {
		if strings.Contains(dl, "192.0.2.31") {
			t.Fatalf("dialled a denied destination: %q", r.dial.Dialled())
		}
	}
	// Ending the association ends the session and writes its record,
	// with the bytes counted both ways.
	c.Close()
	rec := r.rec.WaitN(t, audit.KindFlow, 2)
	if rec.Verdict != audit.VerdictAllow || rec.Host != "game.test" || rec.BytesOut != 4 || rec.BytesIn != 4 {
		t.Fatalf("record: %+v", rec)
	}
}

func TestARefusalByTheUpstreamProxysTargetIsARefusal(t *testing.T) {
	r := newRigWith(t, allowTLS, refusingUpstream{})
	r.resolves("allowed.test", "192.0.2.10")
	_, err := r.d.DialContext(context.Background(), "tcp", "allowed.test:443")
	var re *socks5.ReplyError
	if !errors.As(err, &re) || re.Code != socks5.ReplyConnectionRefused {
		t.Fatalf("err %v, want reply code %d (connection refused)", err, socks5.ReplyConnectionRefused)
	}
	if rec := r.rec.WaitN(t, audit.KindFlow, 1); rec.Verdict != audit.VerdictAllow || rec.Outcome != audit.OutcomeRefused {
		t.Fatalf("record: %+v", rec)
	}
}
