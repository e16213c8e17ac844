package engine

import (
	"context"
	"errors"
	"net"
	"strings"
	"syscall"
	"testing"

	"github.com/tunwall/tunwall/internal/audit"
	"github.com/tunwall/tunwall/internal/engine/enginetest"
)

// Connect and OpenUDP are the engine's decision API for proxy front ends
// (internal/socksserver has the end-to-end tests through a SOCKS5 server).

func TestConnectSaysWhyAFlowWasNotOpenedByTheErrorsType(t *testing.T) {
	r := newRig(t, allowTLS+`      - host: "*.guarded.test"
        ports: [443]
`, nil)
	r.resolves("allowed.test", "192.0.2.10")
	r.resolves("a.guarded.test", "127.0.0.1")
	client := ap("127.0.0.1", 50000)
	never := func(net.Addr) (net.Conn, error) {
		t.Error("accept was called for a flow that did not open")
		return nil, errors.New("no")
	}
	cases := []struct {
		name       string
		req        ProxyRequest
		refuse     bool
		denied     bool
		refusedErr bool
	}{
		{"a name the policy denies", ProxyRequest{Client: client, Host: "denied.test", Port: 443}, false, true, false},
		{"an address the policy denies", ProxyRequest{Client: client, IP: ap("192.0.2.99", 0).Addr(), Port: 443}, false, true, false},
		{"a name that resolves only where the guard never dials", ProxyRequest{Client: client, Host: "a.guarded.test", Port: 443}, false, true, false},
		{"an allowed name whose server refuses", ProxyRequest{Client: client, Host: "allowed.test", Port: 443}, true, false, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r.dial.SetRefuse(tc.refuse)
			err := r.e.Connect(context.Background(), tc.req, never)
			if err == nil || errors.Is(err, ErrDenied) != tc.denied || errors.Is(err, syscall.ECONNREFUSED) != tc.refusedErr {
				t.Fatalf("err = %v; want denied %v, refused %v", err, tc.denied, tc.refusedErr)
			}
		})
	}
}

func TestConnectRelaysAndRecordsAnAllowedName(t *testing.T) {
	r := newRig(t, allowTLS, nil)
	r.resolves("allowed.test", "192.0.2.10")
	client, proxySide := net.Pipe()
	defer client.Close()
	done := make(chan error, 1)
	go func() {
		done <- r.e.Connect(context.Background(), ProxyRequest{Client: ap("127.0.0.1", 50000), Host: "allowed.test", Port: 443},
			func(bound net.Addr) (net.Conn, error) {
				if bound == nil {
					t.Error("no bound address")
				}
				return proxySide, nil
			})
	}()
	srv := r.dial.Server(t)
	go client.Write([]byte("hello"))
	if got := enginetest.ReadUpTo(t, srv, 5); string(got) != "hello" {
		t.Fatalf("upstream got %q", got)
	}
	client.Close()
	srv.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	rec := r.rec.Wait(t, audit.KindFlow)
	if rec.Verdict != audit.VerdictAllow || rec.Host != "allowed.test" || rec.HostFrom != audit.HostFromSOCKS || rec.BytesOut != 5 {
		t.Fatalf("record: %+v", rec)
	}
}

func TestConnectRecordsAClientThatWentAway(t *testing.T) {
	r := newRig(t, allowTLS, nil)
	r.resolves("allowed.test", "192.0.2.10")
	gone := errors.New("the client went away")
	err := r.e.Connect(context.Background(), ProxyRequest{Client: ap("127.0.0.1", 50000), Host: "allowed.test", Port: 443},
		func(net.Addr) (net.Conn, error) { return nil, gone })
	if !errors.Is(err, gone) {
		t.Fatalf("err = %v, want accept's", err)
	}
	if rec := r.rec.Wait(t, audit.KindFlow); rec.Verdict != audit.VerdictAllow {
		t.Fatalf("record: %+v", rec)
	}
}

func TestOpenUDPCountsBothWaysAndRecordsOnClose(t *testing.T) {
	r := newRig(t, `      - host: game.test
        ports: [5000]
        proto: udp
`, nil)
	r.resolves("game.test", "192.0.2.30")
	if _, err := r.e.OpenUDP(context.Background(), ProxyRequest{Client: ap("127.0.0.1", 50000), Host: "denied.test", Port: 5000}); !errors.Is(err, ErrDenied) {
		t.Fatalf("a denied name: err = %v, want ErrDenied", err)
	}
	up, err := r.e.OpenUDP(context.Background(), ProxyRequest{Client: ap("127.0.0.1", 50000), Host: "game.test", Port: 5000})
	if err != nil {
		t.Fatal(err)
	}
	srv := r.dial.Server(t)
	wrote := make(chan struct{})
	go func() { up.Write([]byte("ping")); close(wrote) }()
	enginetest.ReadUpTo(t, srv, 4)
	<-wrote
	go srv.Write([]byte("pong!"))
	enginetest.ReadUpTo(t, up, 5)
	up.Close()
	up.Close() // a second Close writes no second record
	recs := r.rec.All()
	var flows []audit.Record
	for _, rec := range recs {
		if rec.Kind == audit.KindFlow {
			flows = append(flows, rec)
		}
	}
	if len(flows) != 2 || flows[1].Verdict != audit.VerdictAllow || flows[1].BytesOut != 4 || flows[1].BytesIn != 5 || flows[1].Proto != "udp" {
		t.Fatalf("flow records: %+v", flows)
	}
	if r.e.UDPIdle() <= 0 {
		t.Fatalf("UDPIdle = %v", r.e.UDPIdle())
	}
}

// A proxy's client that sent an address where host rules cover the port
// is told to send the name; one where none do is not (no name would help).
func TestConnectTellsAClientThatSentAnAddressToSendTheName(t *testing.T) {
	never := func(net.Addr) (net.Conn, error) { return nil, errors.New("no") }
	for _, tc := range []struct {
		port uint16
		hint bool
	}{{443, true}, {8443, false}} {
		r := newRig(t, allowTLS, nil)
		err := r.e.Connect(context.Background(), ProxyRequest{Client: ap("127.0.0.1", 50000), IP: ap("192.0.2.99", 0).Addr(), Port: tc.port}, never)
		if !errors.Is(err, ErrDenied) {
			t.Fatalf("port %d: err = %v, want denied", tc.port, err)
		}
		rec := r.rec.Wait(t, audit.KindFlow)
		if got := strings.Contains(rec.Reason, "socks5h://"); got != tc.hint {
			t.Errorf("port %d: reason %q; want the hint to send the name: %v", tc.port, rec.Reason, tc.hint)
		}
	}
}
