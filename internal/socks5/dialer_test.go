package socks5

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	gosocks "github.com/things-go/go-socks5"
	"github.com/things-go/go-socks5/statute"
)

func TestParseURL(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    Dialer
		wantErr string // substring; "" means success
	}{
		{name: "a plain socks5 URL gives host and port", in: "socks5://127.0.0.1:1080", want: Dialer{Addr: "127.0.0.1:1080"}},
		{name: "an IPv6 proxy keeps its brackets", in: "socks5://[2001:db8::1]:1080", want: Dialer{Addr: "[2001:db8::1]:1080"}},
		{name: "user and password are percent-decoded", in: "socks5://al%40ice:p%3Ass@192.0.2.1:1080", want: Dialer{Addr: "192.0.2.1:1080", User: "al@ice", Pass: "p:ss"}},
		{name: "a user without a password is allowed", in: "socks5://bob@192.0.2.1:1080", want: Dialer{Addr: "192.0.2.1:1080", User: "bob"}},
		{name: "a trailing slash is tolerated", in: "socks5://192.0.2.1:1080/", want: Dialer{Addr: "192.0.2.1:1080"}},
		{name: "an http scheme is rejected by name", in: "http://192.0.2.1:1080", wantErr: `unsupported upstream scheme "http"`},
		{name: "socks4 is rejected", in: "socks4://192.0.2.1:1080", wantErr: `unsupported upstream scheme "socks4"`},
		{name: "socks5h (the proxy resolves names) is refused", in: "socks5h://proxy.test:9050", wantErr: "socks5h:// (the proxy resolves names) is not offered"},
		{name: "a missing port is reported", in: "socks5://192.0.2.1", wantErr: "has no port"},
		{name: "a bare host:port without scheme is rejected", in: "192.0.2.1:1080", wantErr: "want socks5://"},
		{name: "an empty string is rejected", in: "", wantErr: "no scheme"},
		{name: "a missing host is reported", in: "socks5://:1080", wantErr: "no host"},
		{name: "port zero is rejected", in: "socks5://192.0.2.1:0", wantErr: "bad port"},
		{name: "a port above 65535 is rejected", in: "socks5://192.0.2.1:70000", wantErr: "bad port"},
		{name: "a path is rejected", in: "socks5://192.0.2.1:1080/x", wantErr: "path"},
		{name: "a query is rejected", in: "socks5://192.0.2.1:1080?x=1", wantErr: "query"},
		{name: "a password without a user is rejected", in: "socks5://:pw@192.0.2.1:1080", wantErr: "no user name"},
		{name: "a user name over 255 bytes is rejected", in: "socks5://" + strings.Repeat("u", 256) + ":p@192.0.2.1:1080", wantErr: "255 bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, err := ParseURL(tt.in)
			if tt.wantErr != "" {
				if err == nil {
					t.Fatalf("ParseURL(%q) = %+v, want error containing %q", tt.in, d, tt.wantErr)
				}
				if !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("ParseURL(%q) error = %q, want it to contain %q", tt.in, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseURL(%q): %v", tt.in, err)
			}
			if d.Addr != tt.want.Addr || d.User != tt.want.User || d.Pass != tt.want.Pass || d.Timeout != 0 || d.Forward != nil {
				t.Fatalf("ParseURL(%q) = %+v, want %+v", tt.in, *d, tt.want)
			}
		})
	}
}

func TestParseURLErrorDoesNotLeakPassword(t *testing.T) {
	_, err := ParseURL("socks5://user:s3cret@192.0.2.1:bad port")
	if err == nil {
		t.Fatal("ParseURL accepted a malformed URL")
	}
	if strings.Contains(err.Error(), "s3cret") {
		t.Fatalf("error %q contains the password", err)
	}
}

// echoRoundTrip writes msg, half-closes, and expects exactly msg back
// followed by EOF: it proves the stream and CloseWrite both work.
func echoRoundTrip(t *testing.T, c net.Conn, msg string) {
	t.Helper()
	if err := c.SetDeadline(time.Now().Add(5 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(c, msg); err != nil {
		t.Fatalf("write: %v", err)
	}
	cw, ok := c.(interface{ CloseWrite() error })
	if !ok {
		t.Fatalf("conn %T has no CloseWrite", c)
	}
	if err := cw.CloseWrite(); err != nil {
		t.Fatalf("CloseWrite: %v", err)
	}
	got, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	if string(got) != msg {
		t.Fatalf("echo = %q, want %q", got, msg)
	}
}

func TestDialContextThroughGoSocks5(t *testing.T) {
	goroutineLeakCheck(t)
	echo4 := startTCPEcho(t, "tcp4")
	hosts := map[string]netip.Addr{"echo.test": netip.MustParseAddr("127.0.0.1")}
	srv := startSOCKS(t, "tcp4", hosts)
	port := strconv.Itoa(echo4.Port)

	tests := []struct {
		name      string
		target    string
		wantATYP  byte
		wantAsked []string // names the proxy had to resolve
		needIPv6  bool
	}{
		{name: "a hostname is sent as a name and resolved by the proxy", target: "echo.test:" + port, wantATYP: statute.ATYPDomain, wantAsked: []string{"echo.test"}},
		{name: "an IPv4 literal is sent as IPv4 and nothing is resolved", target: "127.0.0.1:" + port, wantATYP: statute.ATYPIPv4},
		{name: "an IPv4-mapped IPv6 literal is sent as IPv4", target: "[::ffff:127.0.0.1]:" + port, wantATYP: statute.ATYPIPv4},
		{name: "an IPv6 literal is sent as IPv6", target: "", wantATYP: statute.ATYPIPv6, needIPv6: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			target := tt.target
			if tt.needIPv6 {
				requireIPv6(t)
				target = "[::1]:" + strconv.Itoa(startTCPEcho(t, "tcp6").Port)
			}
			before := len(srv.names.askedNames())
			beforeATYP := len(srv.connectATYPs())
			d := &Dialer{Addr: srv.addr}
			c, err := d.DialContext(context.Background(), "tcp", target)
			if err != nil {
				t.Fatalf("DialContext(%s): %v", target, err)
			}
			defer c.Close()
			echoRoundTrip(t, c, "hello through "+target)

			asked := srv.names.askedNames()[before:]
			if !slices.Equal(asked, tt.wantAsked) {
				t.Errorf("proxy resolved %q, want %q", asked, tt.wantAsked)
			}
			atyps := srv.connectATYPs()[beforeATYP:]
			if len(atyps) != 1 || atyps[0] != tt.wantATYP {
				t.Errorf("proxy saw ATYP %v, want [%d]", atyps, tt.wantATYP)
			}
		})
	}
}

func TestDialContextThroughIPv6Proxy(t *testing.T) {
	requireIPv6(t)
	goroutineLeakCheck(t)
	echo := startTCPEcho(t, "tcp4")
	srv := startSOCKS(t, "tcp6", map[string]netip.Addr{"echo.test": netip.MustParseAddr("127.0.0.1")})
	d, err := ParseURL("socks5://" + srv.addr)
	if err != nil {
		t.Fatal(err)
	}
	c, err := d.DialContext(context.Background(), "tcp", "echo.test:"+strconv.Itoa(echo.Port))
	if err != nil {
		t.Fatalf("DialContext via [::1] proxy: %v", err)
	}
	defer c.Close()
	echoRoundTrip(t, c, "v6 proxy")
	if got := srv.names.askedNames(); !slices.Equal(got, []string{"echo.test"}) {
		t.Fatalf("proxy resolved %q, want [echo.test]", got)
	}
}

func TestDialContextAuthentication(t *testing.T) {
	goroutineLeakCheck(t)
	echo := startTCPEcho(t, "tcp4")
	hosts := map[string]netip.Addr{"echo.test": netip.MustParseAddr("127.0.0.1")}
	srv := startSOCKS(t, "tcp4", hosts, gosocks.WithCredential(gosocks.StaticCredentials{"alice": "correct horse"}))
	target := "echo.test:" + strconv.Itoa(echo.Port)

	tests := []struct {
		name       string
		user, pass string
		wantErr    error
	}{
		{name: "the right password is accepted", user: "alice", pass: "correct horse"},
		{name: "a wrong password fails with ErrAuthFailed", user: "alice", pass: "battery staple", wantErr: ErrAuthFailed},
		{name: "an unknown user fails with ErrAuthFailed", user: "mallory", pass: "correct horse", wantErr: ErrAuthFailed},
		{name: "no credentials against an auth-only proxy fails with ErrAuthFailed", wantErr: ErrAuthFailed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := &Dialer{Addr: srv.addr, User: tt.user, Pass: tt.pass}
			c, err := d.DialContext(context.Background(), "tcp", target)
			if tt.wantErr == nil {
				if err != nil {
					t.Fatalf("DialContext: %v", err)
				}
				defer c.Close()
				echoRoundTrip(t, c, "authenticated")
				return
			}
			if err == nil {
				c.Close()
				t.Fatal("DialContext succeeded, want an error")
			}
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("error = %v, want errors.Is %v", err, tt.wantErr)
			}
			if tt.pass != "" && strings.Contains(err.Error(), tt.pass) {
				t.Fatalf("error %q contains the password", err)
			}
		})
	}
}

func TestDialContextReplyErrors(t *testing.T) {
	goroutineLeakCheck(t)
	// A port with nothing listening: bind, note it, close.
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedPort := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	ln.Close()
	hosts := map[string]netip.Addr{"closed.test": netip.MustParseAddr("127.0.0.1")}
	open := startSOCKS(t, "tcp4", hosts)
	denyAll := startSOCKS(t, "tcp4", hosts, gosocks.WithRule(&gosocks.PermitCommand{EnableAssociate: true}))

	tests := []struct {
		name     string
		proxy    string
		target   string
		wantCode byte
		wantText string
	}{
		{name: "a request the ruleset forbids is code 2", proxy: denyAll.addr, target: "closed.test:" + closedPort, wantCode: ReplyNotAllowed, wantText: "connection not allowed by ruleset"},
		{name: "a closed port behind the proxy is code 5", proxy: open.addr, target: "127.0.0.1:" + closedPort, wantCode: ReplyConnectionRefused, wantText: "connection refused"},
		{name: "a closed port reached by name is code 5", proxy: open.addr, target: "closed.test:" + closedPort, wantCode: ReplyConnectionRefused, wantText: "connection refused"},
		{name: "a name the proxy cannot resolve is code 4", proxy: open.addr, target: "nowhere.test:80", wantCode: ReplyHostUnreachable, wantText: "host unreachable"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := &Dialer{Addr: tt.proxy}
			c, err := d.DialContext(context.Background(), "tcp", tt.target)
			if err == nil {
				c.Close()
				t.Fatal("DialContext succeeded, want a reply error")
			}
			var re *ReplyError
			if !errors.As(err, &re) {
				t.Fatalf("error %v (%T) is not a *ReplyError", err, err)
			}
			if re.Code != tt.wantCode {
				t.Fatalf("reply code = %d, want %d (%v)", re.Code, tt.wantCode, err)
			}
			if !strings.Contains(err.Error(), tt.wantText) {
				t.Fatalf("error %q does not say %q", err, tt.wantText)
			}
		})
	}
}

func TestReplyErrorMessages(t *testing.T) {
	tests := []struct {
		name string
		code byte
		want string
	}{
		{name: "code 1 is a general failure", code: 1, want: "general SOCKS server failure"},
		{name: "code 2 is a ruleset denial", code: 2, want: "connection not allowed by ruleset"},
		{name: "code 3 is network unreachable", code: 3, want: "network unreachable"},
		{name: "code 4 is host unreachable", code: 4, want: "host unreachable"},
		{name: "code 5 is connection refused", code: 5, want: "connection refused"},
		{name: "code 6 is TTL expired", code: 6, want: "TTL expired"},
		{name: "code 7 is command not supported", code: 7, want: "command not supported"},
		{name: "code 8 is address type not supported", code: 8, want: "address type not supported"},
		{name: "an unassigned code is shown in hex", code: 0x42, want: "unassigned reply code 0x42"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := (&ReplyError{Code: tt.code}).Error()
			if !strings.Contains(got, tt.want) {
				t.Fatalf("ReplyError{%d}.Error() = %q, want it to contain %q", tt.code, got, tt.want)
			}
		})
	}
}

// TestHandshakeBytes checks the exact bytes the client puts on the wire,
// against a scripted proxy that parses them independently.
func TestHandshakeBytes(t *testing.T) {
	goroutineLeakCheck(t)
	type seen struct {
		greeting []byte
		auth     []byte
		request  []byte
	}
	got := make(chan seen, 1)
	proxy := startFakeProxy(t, "tcp4", func(c net.Conn) {
		var s seen
		var h [2]byte
		if _, err := io.ReadFull(c, h[:]); err != nil {
			return
		}
		methods := make([]byte, h[1])
		if _, err := io.ReadFull(c, methods); err != nil {
			return
		}
		s.greeting = append(h[:], methods...)
		if bytes.IndexByte(methods, 2) >= 0 {
			_, _ = c.Write([]byte{5, 2})
			var ah [2]byte
			if _, err := io.ReadFull(c, ah[:]); err != nil {
				return
			}
			user := make([]byte, ah[1]+1)
			if _, err := io.ReadFull(c, user); err != nil {
				return
			}
			pass := make([]byte, user[len(user)-1])
			if _, err := io.ReadFull(c, pass); err != nil {
				return
			}
			s.auth = append(append(ah[:], user...), pass...)
			_, _ = c.Write([]byte{1, 0})
		} else {
			_, _ = c.Write([]byte{5, 0})
		}
		req, err := srvRequest(c)
		if err != nil {
			return
		}
		s.request = req
		got <- s
		// Reply with a domain BND and stream bytes in the same write: the
		// client must not swallow them while reading the reply.
		_, _ = c.Write(append([]byte{5, 0, 0, 3, 10, 'p', 'r', 'o', 'x', 'y', '.', 't', 'e', 's', 't', 0x04, 0x38}, "after-reply"...))
		waitEOF(c)
	})

	tests := []struct {
		name         string
		user, pass   string
		target       string
		wantGreeting []byte
		wantAuth     []byte
		wantRequest  []byte
	}{
		{
			name: "a hostname CONNECT without credentials", target: "example.test:443",
			wantGreeting: []byte{5, 1, 0},
			wantRequest:  append(append([]byte{5, 1, 0, 3, 12}, "example.test"...), 0x01, 0xbb),
		},
		{
			name: "an IPv4 CONNECT", target: "192.0.2.10:80",
			wantGreeting: []byte{5, 1, 0},
			wantRequest:  []byte{5, 1, 0, 1, 192, 0, 2, 10, 0, 80},
		},
		{
			name: "an IPv6 CONNECT", target: "[2001:db8::7]:8443",
			wantGreeting: []byte{5, 1, 0},
			wantRequest:  []byte{5, 1, 0, 4, 0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7, 0x20, 0xfb},
		},
		{
			name: "credentials offer both methods and send RFC 1929 auth", user: "u1", pass: "pw", target: "192.0.2.10:80",
			wantGreeting: []byte{5, 2, 0, 2},
			wantAuth:     []byte{1, 2, 'u', '1', 2, 'p', 'w'},
			wantRequest:  []byte{5, 1, 0, 1, 192, 0, 2, 10, 0, 80},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := &Dialer{Addr: proxy.addr(), User: tt.user, Pass: tt.pass}
			c, err := d.DialContext(context.Background(), "tcp", tt.target)
			if err != nil {
				t.Fatalf("DialContext: %v", err)
			}
			defer c.Close()
			s := <-got
			if !bytes.Equal(s.greeting, tt.wantGreeting) {
				t.Errorf("greeting = % x, want % x", s.greeting, tt.wantGreeting)
			}
			if !bytes.Equal(s.auth, tt.wantAuth) {
				t.Errorf("auth = % x, want % x", s.auth, tt.wantAuth)
			}
			if !bytes.Equal(s.request, tt.wantRequest) {
				t.Errorf("request = % x, want % x", s.request, tt.wantRequest)
			}
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
			buf := make([]byte, len("after-reply"))
			if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "after-reply" {
				t.Fatalf("first stream bytes = %q, %v; want %q", buf, err, "after-reply")
			}
		})
	}
}

func TestDialContextRejectsBadInput(t *testing.T) {
	tests := []struct {
		name    string
		d       Dialer
		network string
		addr    string
		want    string
	}{
		{name: "udp is not a DialContext network", d: Dialer{Addr: "127.0.0.1:1"}, network: "udp", addr: "192.0.2.1:53", want: "not supported"},
		{name: "a target without a port is rejected", d: Dialer{Addr: "127.0.0.1:1"}, network: "tcp", addr: "example.test", want: "missing port"},
		{name: "a target with a non-numeric port is rejected", d: Dialer{Addr: "127.0.0.1:1"}, network: "tcp", addr: "example.test:https", want: "bad port"},
		{name: "a hostname over 255 bytes is rejected", d: Dialer{Addr: "127.0.0.1:1"}, network: "tcp", addr: strings.Repeat("a", 256) + ":80", want: "255 bytes"},
		{name: "an empty host is rejected", d: Dialer{Addr: "127.0.0.1:1"}, network: "tcp", addr: ":80", want: "empty host"},
		{name: "a zoned IPv6 target is rejected", d: Dialer{Addr: "127.0.0.1:1"}, network: "tcp", addr: "[fe80::1%lo]:80", want: "zoned"},
		{name: "an empty proxy address is rejected", d: Dialer{}, network: "tcp", addr: "192.0.2.1:80", want: "Addr is empty"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dialed := false
			tt.d.Forward = func(ctx context.Context, network, addr string) (net.Conn, error) {
				dialed = true
				return nil, errors.New("must not dial")
			}
			_, err := tt.d.DialContext(context.Background(), tt.network, tt.addr)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("DialContext error = %v, want it to contain %q", err, tt.want)
			}
			if dialed {
				t.Fatal("the proxy was dialled for invalid input")
			}
		})
	}
}

func TestDialContextUsesForward(t *testing.T) {
	goroutineLeakCheck(t)
	echo := startTCPEcho(t, "tcp4")
	srv := startSOCKS(t, "tcp4", map[string]netip.Addr{"echo.test": netip.MustParseAddr("127.0.0.1")})
	var calls []string
	d := &Dialer{
		Addr: "proxy.invalid:1080", // only Forward knows where this is
		Forward: func(ctx context.Context, network, addr string) (net.Conn, error) {
			calls = append(calls, network+" "+addr)
			var nd net.Dialer
			return nd.DialContext(ctx, network, srv.addr)
		},
	}
	c, err := d.DialContext(context.Background(), "tcp", "echo.test:"+strconv.Itoa(echo.Port))
	if err != nil {
		t.Fatalf("DialContext: %v", err)
	}
	defer c.Close()
	echoRoundTrip(t, c, "forwarded")
	if !slices.Equal(calls, []string{"tcp proxy.invalid:1080"}) {
		t.Fatalf("Forward calls = %q, want [tcp proxy.invalid:1080]", calls)
	}
}

// TestHandshakeHonoursContext runs the handshake against proxies that stop
// answering, and checks that every way of bounding it ends it promptly with
// the right error and without leaking goroutines.
func TestHandshakeHonoursContext(t *testing.T) {
	goroutineLeakCheck(t)
	silent := startFakeProxy(t, "tcp4", func(c net.Conn) { waitEOF(c) })
	silentAfterMethod := startFakeProxy(t, "tcp4", func(c net.Conn) {
		if _, err := srvGreet(c, 0); err != nil {
			return
		}
		waitEOF(c)
	})
	tests := []struct {
		name    string
		proxy   string
		timeout time.Duration
		ctx     func() (context.Context, context.CancelFunc)
		want    error
	}{
		{
			name: "a ctx deadline ends a handshake the proxy never answers", proxy: silent.addr(),
			ctx: func() (context.Context, context.CancelFunc) {
				return context.WithTimeout(context.Background(), 200*time.Millisecond)
			},
			want: context.DeadlineExceeded,
		},
		{
			name: "Dialer.Timeout ends a handshake the proxy never answers", proxy: silent.addr(), timeout: 200 * time.Millisecond,
			ctx:  func() (context.Context, context.CancelFunc) { return context.Background(), func() {} },
			want: context.DeadlineExceeded,
		},
		{
			name: "cancelling ctx without a deadline ends the handshake", proxy: silent.addr(),
			ctx: func() (context.Context, context.CancelFunc) {
				ctx, cancel := context.WithCancel(context.Background())
				time.AfterFunc(150*time.Millisecond, cancel)
				return ctx, cancel
			},
			want: context.Canceled,
		},
		{
			name: "an already cancelled ctx fails before any handshake", proxy: silent.addr(),
			ctx: func() (context.Context, context.CancelFunc) {
				ctx, cancel := context.WithCancel(context.Background())
				cancel()
				return ctx, cancel
			},
			want: context.Canceled,
		},
		{
			name: "a proxy that goes silent after method selection times out", proxy: silentAfterMethod.addr(),
			ctx: func() (context.Context, context.CancelFunc) {
				return context.WithTimeout(context.Background(), 200*time.Millisecond)
			},
			want: context.DeadlineExceeded,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := tt.ctx()
			defer cancel()
			d := &Dialer{Addr: tt.proxy, Timeout: tt.timeout}
			start := time.Now()
			c, err := d.DialContext(ctx, "tcp", "example.test:443")
			if err == nil {
				c.Close()
				t.Fatal("DialContext succeeded against a silent proxy")
			}
			if !errors.Is(err, tt.want) {
				t.Fatalf("error = %v, want errors.Is %v", err, tt.want)
			}
			if el := time.Since(start); el > 3*time.Second {
				t.Fatalf("DialContext took %v to give up", el)
			}
			// UDP ASSOCIATE shares the handshake and must behave the same.
			ctx2, cancel2 := tt.ctx()
			defer cancel2()
			uc, err := d.DialUDP(ctx2, "example.test:53")
			if err == nil {
				uc.Close()
				t.Fatal("DialUDP succeeded against a silent proxy")
			}
			if !errors.Is(err, tt.want) {
				t.Fatalf("DialUDP error = %v, want errors.Is %v", err, tt.want)
			}
		})
	}
}

// TestDeadlineClearedAfterHandshake proves the handshake deadline does not
// outlive the handshake, and a ctx cancelled after a successful dial does not
// affect the connection.
func TestDeadlineClearedAfterHandshake(t *testing.T) {
	goroutineLeakCheck(t)
	echo := startTCPEcho(t, "tcp4")
	srv := startSOCKS(t, "tcp4", map[string]netip.Addr{"echo.test": netip.MustParseAddr("127.0.0.1")})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	d := &Dialer{Addr: srv.addr, Timeout: 100 * time.Millisecond}
	c, err := d.DialContext(ctx, "tcp", "echo.test:"+strconv.Itoa(echo.Port))
	cancel()
	if err != nil {
		t.Fatalf("DialContext: %v", err)
	}
	defer c.Close()
	time.Sleep(300 * time.Millisecond) // well past Dialer.Timeout
	if _, err := io.WriteString(c, "late"); err != nil {
		t.Fatalf("write after the handshake timeout: %v", err)
	}
	buf := make([]byte, 4)
	done := make(chan error, 1)
	go func() { _, err := io.ReadFull(c, buf); done <- err }()
	select {
	case err := <-done:
		if err != nil || string(buf) != "late" {
			t.Fatalf("read after the handshake timeout = %q, %v", buf, err)
		}
	case <-time.After(5 * time.Second):
		c.Close()
		<-done
		t.Fatal("read after the handshake timed out waiting for the echo")
	}
}
