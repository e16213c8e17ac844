package socks5

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	gosocks "github.com/things-go/go-socks5"
	"github.com/things-go/go-socks5/statute"
)

// readWithin reads one datagram with a deadline.
func readWithin(t *testing.T, c net.Conn, d time.Duration) ([]byte, error) {
	t.Helper()
	if err := c.SetReadDeadline(time.Now().Add(d)); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 65535)
	n, err := c.Read(buf)
	return buf[:n], err
}

func TestDialUDPThroughGoSocks5(t *testing.T) {
	goroutineLeakCheck(t)
	echo := startUDPEcho(t, "udp4")
	port := strconv.Itoa(echo.Port)
	hosts := map[string]netip.Addr{"echo.test": netip.MustParseAddr("127.0.0.1")}

	tests := []struct {
		name       string
		proxyNet   string
		target     string
		wantRemote string
		wantNames  []string // hostnames the proxy dialled for datagrams
	}{
		{name: "a datagram to a hostname carries the name to the proxy", proxyNet: "tcp4", target: "echo.test:" + port, wantRemote: "echo.test:" + port, wantNames: []string{"echo.test"}},
		{name: "a datagram to an IPv4 literal round-trips", proxyNet: "tcp4", target: "127.0.0.1:" + port, wantRemote: "127.0.0.1:" + port},
		{name: "an IPv6 proxy announcing relay :: is reached on its own address", proxyNet: "tcp6", target: "echo.test:" + port, wantRemote: "echo.test:" + port, wantNames: []string{"echo.test"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.proxyNet == "tcp6" {
				requireIPv6(t)
			}
			srv := startSOCKS(t, tt.proxyNet, hosts)
			d := &Dialer{Addr: srv.addr}
			c, err := d.DialUDP(context.Background(), tt.target)
			if err != nil {
				t.Fatalf("DialUDP(%s): %v", tt.target, err)
			}
			defer c.Close()
			if got := c.RemoteAddr().String(); got != tt.wantRemote {
				t.Errorf("RemoteAddr = %q, want %q", got, tt.wantRemote)
			}
			for i := range 3 {
				msg := "datagram " + strconv.Itoa(i)
				if _, err := c.Write([]byte(msg)); err != nil {
					t.Fatalf("Write: %v", err)
				}
				got, err := readWithin(t, c, 5*time.Second)
				if err != nil {
					t.Fatalf("Read: %v", err)
				}
				if string(got) != "echo:"+msg {
					t.Fatalf("Read = %q, want %q", got, "echo:"+msg)
				}
			}
			if got := srv.names.udpNames(); !slices.Equal(got, tt.wantNames) {
				t.Errorf("proxy dialled names %q for datagrams, want %q", got, tt.wantNames)
			}
			if err := c.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
			if _, err := c.Read(make([]byte, 10)); !errors.Is(err, net.ErrClosed) {
				t.Errorf("Read after Close = %v, want net.ErrClosed", err)
			}
			if err := c.Close(); err != nil {
				t.Errorf("second Close: %v", err)
			}
		})
	}
}

func TestDialUDPNotSupported(t *testing.T) {
	goroutineLeakCheck(t)
	refuse := func(_ context.Context, w io.Writer, _ *gosocks.Request) error {
		return gosocks.SendReply(w, statute.RepCommandNotSupported, nil)
	}
	srv := startSOCKS(t, "tcp4", nil, gosocks.WithAssociateHandle(refuse))
	d := &Dialer{Addr: srv.addr}
	c, err := d.DialUDP(context.Background(), "192.0.2.1:53")
	if err == nil {
		c.Close()
		t.Fatal("DialUDP succeeded against a proxy without UDP")
	}
	if !errors.Is(err, ErrUDPNotSupported) {
		t.Fatalf("error = %v, want errors.Is ErrUDPNotSupported", err)
	}
	var re *ReplyError
	if !errors.As(err, &re) || re.Code != ReplyCommandNotSupported {
		t.Fatalf("error = %v, want it to wrap ReplyError code 7", err)
	}

	// A different refusal is not reported as "UDP not supported".
	deny := startSOCKS(t, "tcp4", nil, gosocks.WithRule(&gosocks.PermitCommand{EnableConnect: true}))
	d = &Dialer{Addr: deny.addr}
	c, err = d.DialUDP(context.Background(), "192.0.2.1:53")
	if err == nil {
		c.Close()
		t.Fatal("DialUDP succeeded against a proxy whose ruleset forbids it")
	}
	if errors.Is(err, ErrUDPNotSupported) || !errors.As(err, &re) || re.Code != ReplyNotAllowed {
		t.Fatalf("error = %v, want ReplyError code 2 and not ErrUDPNotSupported", err)
	}
}

// startRelayProxy runs a scripted UDP ASSOCIATE server: it answers the
// request with bnd(relay address), hands the relay socket and the first
// client datagram to serve, and runs ctrl (or waits for EOF) on the control
// connection. It returns the proxy's TCP address.
func startRelayProxy(t *testing.T, ctrlNet, relayNet string, bnd func(relay netip.AddrPort) netip.AddrPort,
	serve func(relay *net.UDPConn, client net.Addr, first []byte), ctrl func(c net.Conn)) string {
	t.Helper()
	ip := net.IPv4(127, 0, 0, 1)
	if relayNet == "udp6" {
		ip = net.IPv6loopback
	}
	relay, err := net.ListenUDP(relayNet, &net.UDPAddr{IP: ip})
	if err != nil {
		t.Fatalf("relay listen: %v", err)
	}
	var g group
	t.Cleanup(func() {
		relay.Close()
		g.wg.Wait()
	})
	g.Go(func() {
		buf := make([]byte, 65535)
		n, from, err := relay.ReadFrom(buf)
		if err != nil {
			return
		}
		serve(relay, from, buf[:n])
	})
	p := startFakeProxy(t, ctrlNet, func(c net.Conn) {
		if _, err := srvGreet(c, 0); err != nil {
			return
		}
		req, err := srvRequest(c)
		if err != nil || req[1] != 3 {
			return
		}
		if err := srvReply(c, 0, bnd(relay.LocalAddr().(*net.UDPAddr).AddrPort())); err != nil {
			return
		}
		if ctrl != nil {
			ctrl(c)
			return
		}
		waitEOF(c)
	})
	return p.addr()
}

// udpHeader builds a SOCKS UDP header by hand (independently of the code
// under test).
func udpHeader(frag byte, atyp byte, addr []byte, port uint16) []byte {
	b := []byte{0, 0, frag, atyp}
	if atyp == 3 {
		b = append(b, byte(len(addr)))
	}
	b = append(b, addr...)
	return append(b, byte(port>>8), byte(port))
}

func TestDialUDPRelayAddress(t *testing.T) {
	tests := []struct {
		name     string
		ctrlNet  string
		relayNet string
		bnd      func(relay netip.AddrPort) netip.AddrPort
	}{
		{name: "an explicit IPv4 relay address is used as given", ctrlNet: "tcp4", relayNet: "udp4",
			bnd: func(r netip.AddrPort) netip.AddrPort { return r }},
		{name: "relay 0.0.0.0 means the proxy's own address", ctrlNet: "tcp4", relayNet: "udp4",
			bnd: func(r netip.AddrPort) netip.AddrPort { return netip.AddrPortFrom(netip.IPv4Unspecified(), r.Port()) }},
		{name: "an IPv6 relay behind an IPv4 control connection is used", ctrlNet: "tcp4", relayNet: "udp6",
			bnd: func(r netip.AddrPort) netip.AddrPort { return r }},
		{name: "relay :: on an IPv6 proxy means the proxy's own address", ctrlNet: "tcp6", relayNet: "udp6",
			bnd: func(r netip.AddrPort) netip.AddrPort { return netip.AddrPortFrom(netip.IPv6Unspecified(), r.Port()) }},
		{name: "an IPv4 relay behind an IPv6 control connection is used", ctrlNet: "tcp6", relayNet: "udp4",
			bnd: func(r netip.AddrPort) netip.AddrPort { return r }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.ctrlNet == "tcp6" || tt.relayNet == "udp6" {
				requireIPv6(t)
			}
			goroutineLeakCheck(t)
			gotFirst := make(chan []byte, 1)
			proxy := startRelayProxy(t, tt.ctrlNet, tt.relayNet, tt.bnd, func(relay *net.UDPConn, client net.Addr, first []byte) {
				gotFirst <- append([]byte(nil), first...)
				reply := append(udpHeader(0, 1, []byte{192, 0, 2, 9}, 5353), "pong"...)
				_, _ = relay.WriteTo(reply, client)
			}, nil)
			d := &Dialer{Addr: proxy}
			c, err := d.DialUDP(context.Background(), "192.0.2.9:5353")
			if err != nil {
				t.Fatalf("DialUDP: %v", err)
			}
			defer c.Close()
			if _, err := c.Write([]byte("ping")); err != nil {
				t.Fatalf("Write: %v", err)
			}
			got, err := readWithin(t, c, 5*time.Second)
			if err != nil || string(got) != "pong" {
				t.Fatalf("Read = %q, %v; want pong", got, err)
			}
			want := append(udpHeader(0, 1, []byte{192, 0, 2, 9}, 5353), "ping"...)
			if first := <-gotFirst; !bytes.Equal(first, want) {
				t.Fatalf("relay received % x, want % x", first, want)
			}
		})
	}
}

func TestDialUDPDropsForeignAndFragmentedDatagrams(t *testing.T) {
	goroutineLeakCheck(t)
	name := []byte("dns.example.test")
	tests := []struct {
		name   string
		target string
		send   [][]byte // relay → client, in order; only the last "ok" ones count
		want   []string // payloads Read must return, in order
	}{
		{
			name:   "for an IP destination only datagrams labelled with that IP and port get through",
			target: "192.0.2.9:53",
			send: [][]byte{
				append(udpHeader(0, 1, []byte{192, 0, 2, 10}, 53), "other host"...),
				append(udpHeader(0, 1, []byte{192, 0, 2, 9}, 54), "other port"...),
				append(udpHeader(1, 1, []byte{192, 0, 2, 9}, 53), "fragment"...),
				append(udpHeader(0, 3, name, 53), "a name label for an IP destination"...),
				{0, 0, 0, 9, 1, 2, 3},
				{0, 0},
				append(udpHeader(0, 1, []byte{192, 0, 2, 9}, 53), "good 1"...),
				append(udpHeader(0, 4, netip.MustParseAddr("::ffff:192.0.2.9").AsSlice(), 53), "good mapped"...),
			},
			want: []string{"good 1", "good mapped"},
		},
		{
			name:   "for a hostname destination the name matches case-insensitively and the first IP is pinned",
			target: "dns.example.test:53",
			send: [][]byte{
				append(udpHeader(0, 3, []byte("evil.example.test"), 53), "other name"...),
				append(udpHeader(0, 3, name, 54), "other port"...),
				append(udpHeader(2, 3, name, 53), "fragment"...),
				append(udpHeader(0, 3, []byte("DNS.Example.Test."), 53), "good name"...),
				append(udpHeader(0, 1, []byte{203, 0, 113, 5}, 53), "good pinned"...),
				append(udpHeader(0, 1, []byte{203, 0, 113, 6}, 53), "second IP"...),
				append(udpHeader(0, 1, []byte{203, 0, 113, 5}, 53), "good pinned again"...),
			},
			want: []string{"good name", "good pinned", "good pinned again"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			proxy := startRelayProxy(t, "tcp4", "udp4",
				func(r netip.AddrPort) netip.AddrPort { return r },
				func(relay *net.UDPConn, client net.Addr, _ []byte) {
					for _, b := range tt.send {
						_, _ = relay.WriteTo(b, client)
					}
				}, nil)
			d := &Dialer{Addr: proxy}
			c, err := d.DialUDP(context.Background(), tt.target)
			if err != nil {
				t.Fatalf("DialUDP: %v", err)
			}
			defer c.Close()
			if _, err := c.Write([]byte("q")); err != nil {
				t.Fatalf("Write: %v", err)
			}
			for _, want := range tt.want {
				got, err := readWithin(t, c, 5*time.Second)
				if err != nil {
					t.Fatalf("Read: %v (want %q)", err, want)
				}
				if string(got) != want {
					t.Fatalf("Read = %q, want %q", got, want)
				}
			}
			got, err := readWithin(t, c, 200*time.Millisecond)
			if !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("extra Read = %q, %v; want a timeout", got, err)
			}
		})
	}
}

func TestDialUDPEndsWithControlConnection(t *testing.T) {
	goroutineLeakCheck(t)
	closeCtrl := make(chan struct{})
	proxy := startRelayProxy(t, "tcp4", "udp4",
		func(r netip.AddrPort) netip.AddrPort { return r },
		func(*net.UDPConn, net.Addr, []byte) {},
		func(c net.Conn) { <-closeCtrl })
	d := &Dialer{Addr: proxy}
	c, err := d.DialUDP(context.Background(), "192.0.2.9:53")
	if err != nil {
		t.Fatalf("DialUDP: %v", err)
	}
	defer c.Close()
	readErr := make(chan error, 1)
	go func() {
		_, err := c.Read(make([]byte, 100))
		readErr <- err
	}()
	close(closeCtrl) // the proxy drops the association
	select {
	case err := <-readErr:
		if !errors.Is(err, net.ErrClosed) || !bytes.Contains([]byte(err.Error()), []byte("association ended")) {
			t.Fatalf("Read after the proxy closed control = %v, want association ended (net.ErrClosed)", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Read still blocked 5s after the proxy closed the control connection")
	}
	if _, err := c.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Write after the association ended = %v, want net.ErrClosed", err)
	}
}

func TestDialUDPCloseEndsAssociation(t *testing.T) {
	goroutineLeakCheck(t)
	ctrlClosed := make(chan struct{})
	proxy := startRelayProxy(t, "tcp4", "udp4",
		func(r netip.AddrPort) netip.AddrPort { return r },
		func(*net.UDPConn, net.Addr, []byte) {},
		func(c net.Conn) { waitEOF(c); close(ctrlClosed) })
	d := &Dialer{Addr: proxy}
	c, err := d.DialUDP(context.Background(), "192.0.2.9:53")
	if err != nil {
		t.Fatalf("DialUDP: %v", err)
	}
	readErr := make(chan error, 1)
	go func() {
		_, err := c.Read(make([]byte, 100))
		readErr <- err
	}()
	if err := c.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	select {
	case <-ctrlClosed:
	case <-time.After(5 * time.Second):
		t.Fatal("the proxy did not see the control connection close")
	}
	select {
	case err := <-readErr:
		if !errors.Is(err, net.ErrClosed) {
			t.Fatalf("blocked Read after Close = %v, want net.ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Read still blocked after Close")
	}
}

func TestDialUDPRejectsRelayPortZero(t *testing.T) {
	goroutineLeakCheck(t)
	proxy := startFakeProxy(t, "tcp4", func(c net.Conn) {
		if _, err := srvGreet(c, 0); err != nil {
			return
		}
		if _, err := srvRequest(c); err != nil {
			return
		}
		_ = srvReply(c, 0, netip.MustParseAddrPort("127.0.0.1:0"))
		waitEOF(c)
	})
	d := &Dialer{Addr: proxy.addr()}
	c, err := d.DialUDP(context.Background(), "192.0.2.9:53")
	if err == nil {
		c.Close()
		t.Fatal("DialUDP accepted relay port 0")
	}
	if !errors.Is(err, errMalformed) {
		t.Fatalf("error = %v, want a malformed-reply error", err)
	}
}
