package engine

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/tunwall/tunwall/dnsintercept"
	"github.com/tunwall/tunwall/policy"
	"github.com/tunwall/tunwall/stack"
)

// guardError is a dial the rebinding guard refused.
type guardError struct{ v verdict }

func (e *guardError) Error() string { return e.v.Reason }

func network(p stack.Proto) string {
	if p == stack.UDP {
		return "udp"
	}
	return "tcp"
}

// dialName connects to an allowed name's real address: resolved now, each
// address checked by the rebinding guard (an address it refuses is never
// tried), then the addresses tried Happy Eyeballs style (raceDial), the
// sandbox's address family first. Through an upstream proxy too, tunwall resolves and checks,
// and the proxy is sent the checked address, never the name: a proxy that
// resolved the name again could be handed another answer (DNS rebinding).
func (e *Engine) dialName(ctx context.Context, fr *flowRecord, host string, port uint16) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, e.cfg.DialTimeout)
	defer cancel()
	addrs, err := e.cfg.Resolver.Resolve(ctx, host)
	if err != nil {
		return nil, &resolveError{host: host, err: err}
	}
	var ok []netip.Addr
	var refused []string
	var first *verdict
	for _, a := range addrs {
		g := e.rules().CheckDial(a, port, fr.f.Proto)
		if !g.Allowed() {
			refused = append(refused, g.Reason)
			if first == nil {
				v := g
				first = &v
			}
			continue
		}
		ok = append(ok, a)
	}
	if len(refused) > 0 && fr.v.Rule == policy.RuleDefaultPublic {
		// The open default allows public destinations: a name with any
		// address that is not one is not.
		v := *first
		v.Reason = fmt.Sprintf("%s resolves to addresses that are never dialled (%s); default: public allows only names that resolve only to public addresses", host, strings.Join(refused, "; "))
		return nil, &guardError{v: v}
	}
	if len(ok) == 0 {
		if first == nil {
			return nil, &resolveError{host: host, err: dnsintercept.ErrNoAddresses}
		}
		v := *first
		v.Reason = fmt.Sprintf("%s resolves only to addresses that are never dialled: %s", host, strings.Join(refused, "; "))
		return nil, &guardError{v: v}
	}
	ordered := eyeballsOrder(ok, fr.f.Dst.Addr().Is4())
	if len(ordered) > maxAttempts {
		ordered = ordered[:maxAttempts]
	}
	if fr.f.Proto == stack.UDP {
		// A UDP "dial" sends nothing and cannot hang: the first address
		// the guard passed, in the same order.
		var errs []error
		for _, a := range ordered {
			ap := netip.AddrPortFrom(a, port)
			c, err := e.dialChecked(ctx, fr, ap)
			if err == nil {
				fr.Dial, fr.dialAt = ap, time.Now()
				e.open.dialled(fr, ap)
				return c, nil
			}
			errs = append(errs, err)
			fr.DialFailed = joinFailed(fr.DialFailed, ap.String()+": "+err.Error())
			if ctx.Err() != nil {
				break
			}
		}
		return nil, errors.Join(errs...)
	}
	return e.raceDial(ctx, fr, ordered, port)
}

// Happy Eyeballs (RFC 8305) for the addresses of one name.
const (
	// attemptDelay is the Connection Attempt Delay (RFC 8305 §5): the next
	// address is tried when the one before has not connected by then (or
	// at once when it has failed).
	attemptDelay = 250 * time.Millisecond
	// maxAttempts bounds the addresses of one name tried in one dial.
	maxAttempts = 16
)

// eyeballsOrder orders addresses as RFC 8305 §4 does: the preferred family
// (the sandbox's: the fake address it connected to was an A or an AAAA)
// first, then the other, alternating, each family in the resolver's order.
func eyeballsOrder(addrs []netip.Addr, prefer4 bool) []netip.Addr {
	var pref, alt []netip.Addr
	for _, a := range addrs {
		if a.Is4() == prefer4 {
			pref = append(pref, a)
		} else {
			alt = append(alt, a)
		}
	}
	out := make([]netip.Addr, 0, len(addrs))
	for i := 0; i < len(pref) || i < len(alt); i++ {
		if i < len(pref) {
			out = append(out, pref[i])
		}
		if i < len(alt) {
			out = append(out, alt[i])
		}
	}
	return out
}

// attemptTimeout is how long one address of a name with several may take
// to connect: half the dial timeout, so that an address that hangs gives
// its socket back while others are tried; a name's only address has all of
// it. Every attempt ends with the dial's own timeout in any case.
func (e *Engine) attemptTimeout(n int) time.Duration {
	if n <= 1 {
		return e.cfg.DialTimeout
	}
	return e.cfg.DialTimeout / 2
}

// raceDial connects to the first of addrs (already checked by the guard)
// that answers, Happy Eyeballs style: one attempt every attemptDelay (the
// next at once when one fails), each with its own timeout, all within
// ctx's. The first connection wins; the attempts still running are
// cancelled and whatever they connect closed. fr gets the address dialled
// and, in dialFailed, each address that did not connect and why.
func (e *Engine) raceDial(ctx context.Context, fr *flowRecord, addrs []netip.Addr, port uint16) (net.Conn, error) {
	type result struct {
		i   int
		c   net.Conn
		err error
	}
	actx, cancel := context.WithCancel(ctx)
	defer cancel()
	results := make(chan result, len(addrs)) // every attempt can send without a reader
	started := make([]time.Time, 0, len(addrs))
	done := make([]bool, len(addrs))
	perAttempt := e.attemptTimeout(len(addrs))
	start := func() {
		i := len(started)
		started = append(started, time.Now())
		ap := netip.AddrPortFrom(addrs[i], port)
		go func() {
			c, cancel := context.WithTimeout(actx, perAttempt)
			defer cancel()
			conn, err := e.dialChecked(c, fr, ap)
			results <- result{i: i, c: conn, err: err}
		}()
	}
	start()
	timer := time.NewTimer(attemptDelay)
	defer timer.Stop()
	var errs []error
	running := 1
	for running > 0 {
		select {
		case r := <-results:
			running--
			done[r.i] = true
			ap := netip.AddrPortFrom(addrs[r.i], port)
			if r.err == nil {
				fr.Dial, fr.dialAt = ap, time.Now()
				e.open.dialled(fr, ap)
				for i, t := range started {
					if !done[i] {
						fr.DialFailed = joinFailed(fr.DialFailed, fmt.Sprintf("%s: no answer within %s, another address answered first",
							netip.AddrPortFrom(addrs[i], port), time.Since(t).Round(time.Millisecond)))
					}
				}
				cancel()
				// Close what the attempts still running connect anyway.
				if running > 0 {
					go func(n int) {
						for range n {
							if r := <-results; r.c != nil {
								r.c.Close()
							}
						}
					}(running)
				}
				return r.c, nil
			}
			errs = append(errs, r.err)
			fr.DialFailed = joinFailed(fr.DialFailed, ap.String()+": "+attemptError(r.err, time.Since(started[r.i])))
			if len(started) < len(addrs) && ctx.Err() == nil {
				start() // a failure starts the next at once
				running++
				timer.Reset(attemptDelay)
			}
		case <-timer.C:
			if len(started) < len(addrs) && ctx.Err() == nil {
				start()
				running++
				timer.Reset(attemptDelay)
			}
		}
	}
	return nil, errors.Join(errs...)
}

// attemptError says why an attempt failed, briefly.
func attemptError(err error, took time.Duration) string {
	if errors.Is(err, context.DeadlineExceeded) {
		return "no answer within " + took.Round(time.Millisecond).String()
	}
	return err.Error()
}

// joinFailed appends one failed attempt to a record's dial_failed.
func joinFailed(list, one string) string {
	if list == "" {
		return one
	}
	return list + "; " + one
}

// dialIP connects to a raw address a cidr rule allowed.
func (e *Engine) dialIP(ctx context.Context, fr *flowRecord, ap netip.AddrPort) (net.Conn, error) {
	if g := e.rules().CheckDial(ap.Addr(), ap.Port(), fr.f.Proto); !g.Allowed() {
		return nil, &guardError{v: g}
	}
	ctx, cancel := context.WithTimeout(ctx, e.cfg.DialTimeout)
	defer cancel()
	c, err := e.dialChecked(ctx, fr, ap)
	if err == nil {
		fr.Dial, fr.dialAt = ap, time.Now()
		e.open.dialled(fr, ap)
	}
	return c, err
}

// dialChecked connects to an address the guard has passed: through the
// upstream proxy, which is sent the address itself; by the stack's dial
// of the flow's request; or by Config.Dial.
func (e *Engine) dialChecked(ctx context.Context, fr *flowRecord, ap netip.AddrPort) (net.Conn, error) {
	p := fr.f.Proto
	if e.cfg.Upstream != nil {
		if p == stack.UDP {
			return e.cfg.Upstream.DialUDP(ctx, ap.String())
		}
		return e.cfg.Upstream.DialContext(ctx, "tcp", ap.String())
	}
	if fr.req != nil && p == stack.TCP {
		return fr.req.Dial(ctx, ap)
	}
	return e.cfg.Dial(ctx, network(p), ap.String())
}

// dialTarget dials host by name, or ap when there is no name.
func (e *Engine) dialTarget(ctx context.Context, fr *flowRecord, host string, ap netip.AddrPort) (net.Conn, error) {
	if host != "" {
		return e.dialName(ctx, fr, host, ap.Port())
	}
	return e.dialIP(ctx, fr, ap)
}

// sandboxCheck is how often a TCP dial in progress asks whether the
// sandbox's client still waits for it.
const sandboxCheck = time.Second

// errSandboxGone ends a dial whose client in the sandbox gave up on it.
var errSandboxGone = errors.New("the sandbox's client gave up on the connection while it was dialled")

// whileSandboxWaits returns the context for fr's dial: ctx, and cancelled
// once the sandbox has no socket for the connection any more (its client
// gave up, or it never had one: a raw SYN), so the upstream attempt ends
// then instead of at the dial timeout. It asks every sandboxCheck, through
// attribution's sock_diag socket in the sandbox's namespace; without
// attribution (--audit off) it cannot tell, and the dial runs its course.
// done must be called when the dial has returned, with its error, which
// it says more about when the sandbox's side was gone.
func (e *Engine) whileSandboxWaits(ctx context.Context, fr *flowRecord) (context.Context, func(error) error) {
	if e.cfg.Attr == nil || fr.f.Proto != stack.TCP {
		return ctx, func(err error) error { return err }
	}
	ctx, cancel := context.WithCancelCause(ctx)
	// No goroutine waits beside the dial: a timer asks every sandboxCheck
	// (its func runs on a goroutine of its own only when it fires, which a
	// dial that returns within sandboxCheck never sees).
	var mu sync.Mutex
	stopped := false
	var t *time.Timer
	check := func() {
		if ctx.Err() != nil {
			return
		}
		if gone, ok := e.cfg.Attr.TCPSocketGone(fr.f.Src, fr.f.Dst); ok && gone {
			cancel(errSandboxGone)
			return
		}
		mu.Lock()
		if !stopped {
			t.Reset(sandboxCheck)
		}
		mu.Unlock()
	}
	mu.Lock()
	t = time.AfterFunc(sandboxCheck, check)
	mu.Unlock()
	return ctx, func(err error) error {
		mu.Lock()
		stopped = true
		t.Stop()
		mu.Unlock()
		if err != nil && errors.Is(context.Cause(ctx), errSandboxGone) {
			err = fmt.Errorf("%w (%v)", errSandboxGone, err)
		}
		cancel(nil)
		return err
	}
}

// resolveError is a dial's failure to resolve the allowed name it was
// for: the flow's outcome is dns-failed, whatever the resolver's error
// (a timeout of the DNS upstream included).
type resolveError struct {
	host string
	err  error
}

func (e *resolveError) Error() string { return "its name did not resolve: " + e.why() }
func (e *resolveError) Unwrap() error { return e.err }

// why says in a few words why the name did not resolve.
func (e *resolveError) why() string {
	var rc *dnsintercept.RcodeError
	var ne net.Error
	switch {
	case errors.As(e.err, &rc):
		return "the DNS upstream answered " + strings.TrimPrefix(rc.Error(), "dnsintercept: resolve "+rc.Name+": upstream answered ")
	case errors.Is(e.err, dnsintercept.ErrNoAddresses):
		return "it has no A or AAAA records"
	case errors.Is(e.err, context.DeadlineExceeded), errors.Is(e.err, dnsintercept.ErrTimeout), errors.As(e.err, &ne) && ne.Timeout():
		return "the DNS upstream did not answer in time"
	}
	return strings.ReplaceAll(e.err.Error(), "\n", "; ")
}
