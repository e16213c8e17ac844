package socks5

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"time"

	"github.com/things-go/go-socks5/statute"
)

// defaultTimeout bounds dialling the proxy plus the handshake when
// Dialer.Timeout is zero.
const defaultTimeout = 10 * time.Second

// ErrUDPNotSupported is wrapped by DialUDP's error when the proxy answers
// UDP ASSOCIATE with reply code 7 ("command not supported"). The error also
// wraps the *ReplyError.
var ErrUDPNotSupported = errors.New("socks5: proxy does not support UDP ASSOCIATE")

// ErrAuthFailed is wrapped when the proxy rejects the RFC 1929 username and
// password, or accepts none of the authentication methods offered.
var ErrAuthFailed = errors.New("socks5: proxy authentication failed")

// ErrProxyResolves is ParseURL's error for socks5:// URLs that ask the proxy
// to resolve names (socks5h://), which tunwall never does.
var ErrProxyResolves = errors.New("socks5: socks5h:// (the proxy resolves names) is not offered: a proxy resolving a name again could reach an address tunwall's rebinding guard refused; use socks5://, and tunwall sends the proxy the address it checked")

// Dialer reaches destinations through a SOCKS5 proxy. Its fields are read on
// every dial and must not change while dials are in flight; a Dialer is
// otherwise safe for concurrent use.
type Dialer struct {
	// Addr is the proxy's host:port. Required. The host may be a name; it is
	// resolved by Forward (the proxy itself must be reachable somehow).
	Addr string
	// User and Pass are sent with RFC 1929 username/password authentication
	// when User != "" (each at most 255 bytes). When User is empty only the
	// "no authentication" method is offered.
	User, Pass string
	// Timeout bounds dialling the proxy plus the SOCKS handshake (and, for
	// DialUDP, setting up the relay socket). 0 or less means 10s. The ctx passed to
	// DialContext/DialUDP may shorten it further.
	Timeout time.Duration
	// Forward opens the connections to the proxy: network "tcp" for the
	// control/CONNECT stream and "udp" for the UDP relay (which must return a
	// datagram-preserving, connected net.Conn). It must honour ctx. nil means
	// a zero net.Dialer.
	Forward func(ctx context.Context, network, addr string) (net.Conn, error)
}

// ParseURL parses an upstream URL of the form socks5://[user:pass@]host:port.
// User and password are percent-decoded. socks5h:// (the proxy resolves
// names) is refused with ErrProxyResolves: tunwall resolves every name and
// checks the address with its rebinding guard before a proxy sees it.
func ParseURL(s string) (*Dialer, error) {
	u, err := url.Parse(s)
	if err != nil {
		// url.Error repeats the whole URL, password included; keep only
		// the reason.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, fmt.Errorf("socks5: bad upstream URL (want socks5://[user:pass@]host:port): %w", err)
	}
	switch u.Scheme {
	case "socks5":
	case "socks5h":
		return nil, ErrProxyResolves
	case "":
		return nil, errors.New("socks5: upstream URL has no scheme (want socks5://[user:pass@]host:port)")
	default:
		return nil, fmt.Errorf("socks5: unsupported upstream scheme %q (want socks5://)", u.Scheme)
	}
	if u.Opaque != "" {
		return nil, errors.New("socks5: bad upstream URL (want socks5://[user:pass@]host:port)")
	}
	if (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" {
		return nil, errors.New("socks5: upstream URL must not have a path, query or fragment (want socks5://[user:pass@]host:port)")
	}
	host, port := u.Hostname(), u.Port()
	if host == "" {
		return nil, errors.New("socks5: upstream URL has no host (want socks5://[user:pass@]host:port)")
	}
	if port == "" {
		return nil, fmt.Errorf("socks5: upstream URL %s://%s has no port (want socks5://[user:pass@]host:port)", u.Scheme, u.Host)
	}
	if p, err := strconv.ParseUint(port, 10, 16); err != nil || p == 0 {
		return nil, fmt.Errorf("socks5: upstream URL has a bad port %q", port)
	}
	d := &Dialer{Addr: net.JoinHostPort(host, port)}
	if u.User != nil {
		d.User = u.User.Username()
		d.Pass, _ = u.User.Password()
		if d.User == "" {
			return nil, errors.New("socks5: upstream URL has a password but no user name")
		}
		if len(d.User) > 255 || len(d.Pass) > 255 {
			return nil, errors.New("socks5: upstream user name and password must be at most 255 bytes each")
		}
	}
	return d, nil
}

// DialContext connects to addr ("host:port" or "ip:port") through the proxy
// with a CONNECT request. A hostname is sent as a hostname (ATYP 0x03) and is
// never resolved locally; an IP literal is sent as IPv4 or IPv6. network must
// be "tcp", "tcp4" or "tcp6" (the family of the proxied leg is the proxy's
// business). ctx bounds the dial and handshake only.
//
// The returned conn is the stream Forward returned (a *net.TCPConn with the
// default Forward), positioned right after the proxy's reply, so CloseWrite
// half-closes towards the destination. A refusal by the proxy is a
// *ReplyError.
func (d *Dialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	switch network {
	case "tcp", "tcp4", "tcp6":
	default:
		return nil, fmt.Errorf("socks5: network %q not supported by DialContext (want tcp; use DialUDP for udp)", network)
	}
	dst, err := parseTarget(addr)
	if err != nil {
		return nil, err
	}
	hctx, cancel := d.handshakeContext(ctx)
	defer cancel()
	c, _, err := d.connect(ctx, hctx, statute.CommandConnect, dst)
	if err != nil {
		return nil, fmt.Errorf("socks5: CONNECT %s via %s: %w", dst, d.Addr, err)
	}
	return c, nil
}

func (d *Dialer) timeout() time.Duration {
	if d.Timeout > 0 {
		return d.Timeout
	}
	return defaultTimeout
}

func (d *Dialer) handshakeContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, d.timeout())
}

func (d *Dialer) forward(ctx context.Context, network, addr string) (net.Conn, error) {
	if d.Forward != nil {
		return d.Forward(ctx, network, addr)
	}
	var nd net.Dialer
	return nd.DialContext(ctx, network, addr)
}

// connect dials the proxy and runs the handshake for one request. hctx is
// ctx bounded by the handshake timeout. On success the conn has no deadline.
func (d *Dialer) connect(ctx, hctx context.Context, cmd byte, dst sockAddr) (net.Conn, sockAddr, error) {
	if d.Addr == "" {
		return nil, sockAddr{}, errors.New("socks5: Dialer.Addr is empty")
	}
	if len(d.User) > 255 || len(d.Pass) > 255 {
		return nil, sockAddr{}, errors.New("socks5: user name and password must be at most 255 bytes each")
	}
	c, err := d.forward(hctx, "tcp", d.Addr)
	if err != nil {
		return nil, sockAddr{}, d.contextErr(ctx, hctx, fmt.Errorf("dialling proxy: %w", err))
	}
	if dl, ok := hctx.Deadline(); ok {
		if err := c.SetDeadline(dl); err != nil {
			c.Close()
			return nil, sockAddr{}, fmt.Errorf("setting handshake deadline: %w", err)
		}
	}
	// A deadline covers the timeout; this covers cancellation without one.
	stop := context.AfterFunc(hctx, func() { _ = c.SetDeadline(time.Unix(1, 0)) })
	bnd, err := d.handshake(c, cmd, dst)
	if !stop() && err == nil {
		// The AfterFunc ran or is running: c's deadline may now be in the
		// past, so the conn is unusable even though the reply arrived.
		err = fmt.Errorf("handshake interrupted: %w", context.Cause(hctx))
	}
	if err == nil {
		if err = c.SetDeadline(time.Time{}); err != nil {
			err = fmt.Errorf("clearing handshake deadline: %w", err)
		}
	}
	if err != nil {
		c.Close()
		return nil, sockAddr{}, d.contextErr(ctx, hctx, err)
	}
	return c, bnd, nil
}

// contextErr rewrites a timeout or cancellation caused by ctx or by the
// handshake timeout into an error that wraps context.Canceled or
// context.DeadlineExceeded. Protocol errors pass through unchanged.
func (d *Dialer) contextErr(ctx, hctx context.Context, err error) error {
	var ne net.Error
	isTimeout := errors.As(err, &ne) && ne.Timeout()
	if !isTimeout && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	// The conn deadline and hctx's timer expire at the same instant, so the
	// I/O error can arrive before hctx.Err() is set: look at the clock too.
	now := time.Now()
	expired := func(c context.Context) bool {
		dl, ok := c.Deadline()
		return ok && !now.Before(dl)
	}
	switch {
	case ctx.Err() != nil:
		return fmt.Errorf("handshake aborted: %w", ctx.Err())
	case expired(ctx):
		return fmt.Errorf("handshake aborted: %w", context.DeadlineExceeded)
	case hctx.Err() != nil || expired(hctx):
		return fmt.Errorf("dial and handshake did not finish within %v: %w", d.timeout(), context.DeadlineExceeded)
	}
	return err
}

// handshake runs method negotiation, authentication and one request on c,
// reading exactly the bytes the proxy sends in reply. The messages are
// go-socks5's statute codec.
func (d *Dialer) handshake(c net.Conn, cmd byte, dst sockAddr) (sockAddr, error) {
	methods := []byte{statute.MethodNoAuth}
	if d.User != "" {
		methods = append(methods, statute.MethodUserPassAuth)
	}
	if _, err := c.Write(statute.NewMethodRequest(statute.VersionSocks5, methods).Bytes()); err != nil {
		return sockAddr{}, fmt.Errorf("sending greeting: %w", err)
	}
	sel, err := statute.ParseMethodReply(c)
	if err != nil {
		return sockAddr{}, fmt.Errorf("reading method selection: %w", err)
	}
	if sel.Ver != statute.VersionSocks5 {
		return sockAddr{}, fmt.Errorf("%w: method selection version %d, want 5", errMalformed, sel.Ver)
	}
	switch sel.Method {
	case statute.MethodNoAuth:
	case statute.MethodUserPassAuth:
		if d.User == "" {
			return sockAddr{}, fmt.Errorf("%w: proxy chose username/password, which was not offered", errMalformed)
		}
		if err := d.authenticate(c); err != nil {
			return sockAddr{}, err
		}
	case statute.MethodNoAcceptable:
		if d.User == "" {
			return sockAddr{}, fmt.Errorf("%w: proxy requires authentication and no user name is configured", ErrAuthFailed)
		}
		return sockAddr{}, fmt.Errorf("%w: proxy accepts none of the offered methods", ErrAuthFailed)
	default:
		return sockAddr{}, fmt.Errorf("%w: proxy chose method 0x%02x, which was not offered", errMalformed, sel.Method)
	}
	if _, err := c.Write(request(cmd, dst)); err != nil {
		return sockAddr{}, fmt.Errorf("sending request: %w", err)
	}
	return readReply(c)
}

// authenticate runs the RFC 1929 sub-negotiation.
func (d *Dialer) authenticate(c net.Conn) error {
	req := statute.NewUserPassRequest(statute.UserPassAuthVersion, []byte(d.User), []byte(d.Pass))
	if _, err := c.Write(req.Bytes()); err != nil {
		return fmt.Errorf("sending credentials: %w", err)
	}
	st, err := statute.ParseUserPassReply(c)
	if err != nil {
		return fmt.Errorf("reading authentication status: %w", err)
	}
	if st.Status != statute.AuthSuccess {
		return fmt.Errorf("%w: proxy rejected user %q (status %d)", ErrAuthFailed, d.User, st.Status)
	}
	return nil
}
