package engine

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/tunwall/tunwall/internal/audit"
	"github.com/tunwall/tunwall/internal/socks5"
)

// serveSOCKS runs the engine's SOCKS5 front end on a loopback listener and
// returns a client for it; the server is stopped at cleanup.
func (r *rig) serveSOCKS(t *testing.T) *socks5.Dialer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.e.ServeSOCKS(ctx, ln, time.Millisecond)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(waitFor):
			t.Error("ServeSOCKS did not return")
		}
	})
	return &socks5.Dialer{Addr: ln.Addr().String(), Timeout: waitFor}
}

func TestSocksConnectIsDecidedByNameAndDialledByTheCheckedAddress(t *testing.T) {
	r := newRig(t, allowTLS, nil)
	r.resolves("allowed.test", "192.0.2.10")
	r.resolves("denied.test", "192.0.2.11")
	d := r.serveSOCKS(t)

	_, err := d.DialContext(context.Background(), "tcp", "denied.test:443")
	var re *socks5.ReplyError
	if !errors.As(err, &re) || re.Code != socks5.ReplyNotAllowed {
		t.Fatalf("a denied name: err %v, want the refusal \"not allowed by ruleset\"", err)
	}
	if len(r.res.asked) != 0 || len(r.dial.dialled()) != 0 {
		t.Fatalf("a denied name was resolved (%q) or dialled (%q)", r.res.asked, r.dial.dialled())
	}
	if rec := r.rec.wait(t, audit.KindFlow); rec.Verdict != audit.VerdictDeny || rec.Host != "denied.test" || rec.HostFrom != HostFromSOCKS {
		t.Fatalf("record: %+v", rec)
	}

	c, err := d.DialContext(context.Background(), "tcp", "allowed.test:443")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	srv := r.dial.server(t)
	if got := r.dial.dialled(); len(got) != 1 || got[0] != "tcp 192.0.2.10:443" {
		t.Fatalf("dials = %q", got)
	}
	hello := helloFor(t, "allowed.test")
	go c.Write(hello)
	if got := readUpTo(t, srv, len(hello)); len(got) != len(hello) {
		t.Fatalf("the upstream got %d bytes of %d", len(got), len(hello))
	}
	c.Close()
	srv.Close()
	deadline := time.After(waitFor)
	for r.rec.count(audit.KindFlow) < 2 {
		select {
		case <-deadline:
			t.Fatal("no record of the allowed flow")
		case <-time.After(time.Millisecond):
		}
	}
	recs := r.rec.all()
	rec := recs[len(recs)-1]
	if rec.Verdict != audit.VerdictAllow || rec.Host != "allowed.test" || rec.SNI != "allowed.test" || rec.BytesOut != int64(len(hello)) {
		t.Fatalf("record: %+v", rec)
	}
}

func TestSocksUDPIsDecidedPerDestination(t *testing.T) {
	r := newRig(t, `      - host: game.test
        ports: [5000]
        proto: udp
`, nil)
	r.resolves("game.test", "192.0.2.30")
	r.resolves("denied.test", "192.0.2.31")
	d := r.serveSOCKS(t)

	denied, err := d.DialUDP(context.Background(), "denied.test:5000")
	if err != nil {
		t.Fatal(err)
	}
	defer denied.Close()
	denied.Write([]byte("leak"))
	if rec := r.rec.wait(t, audit.KindFlow); rec.Verdict != audit.VerdictDeny || rec.Host != "denied.test" || rec.Proto != "udp" {
		t.Fatalf("record: %+v", rec)
	}

	c, err := d.DialUDP(context.Background(), "game.test:5000")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write([]byte("ping"))
	srv := r.dial.server(t)
	if got := readUpTo(t, srv, 4); string(got) != "ping" {
		t.Fatalf("upstream got %q", got)
	}
	go srv.Write([]byte("pong"))
	buf := make([]byte, 64)
	c.SetReadDeadline(time.Now().Add(waitFor))
	n, err := c.Read(buf)
	if err != nil || string(buf[:n]) != "pong" {
		t.Fatalf("client got %q, %v", buf[:n], err)
	}
	for _, dl := range r.dial.dialled() {
		if strings.Contains(dl, "192.0.2.31") {
			t.Fatalf("dialled a denied destination: %q", r.dial.dialled())
		}
	}
}
