package engine

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tunwall/tunwall/dnsintercept"
	"github.com/tunwall/tunwall/internal/audit"
	"github.com/tunwall/tunwall/internal/socks5"
)

func TestOutcomeNamesHowADialFailed(t *testing.T) {
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	unreach := &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.EHOSTUNREACH)}
	tests := []struct {
		name     string
		err      error
		upstream bool
		want     string
	}{
		{"no error is ok", nil, false, audit.OutcomeOK},
		{"a refused connection", refused, false, audit.OutcomeRefused},
		{"one of several addresses refused", errors.Join(unreach, refused), false, audit.OutcomeRefused},
		{"a dial that ran out of time", fmt.Errorf("dial: %w", context.DeadlineExceeded), false, audit.OutcomeTimeout},
		{"a name that does not exist", fmt.Errorf("resolve x.test: %w", &dnsintercept.RcodeError{Name: "x.test", Rcode: 3}), false, audit.OutcomeDNSFailed},
		{"a name with no addresses", fmt.Errorf("resolve x.test: %w", dnsintercept.ErrNoAddresses), false, audit.OutcomeDNSFailed},
		{"no route", unreach, false, audit.OutcomeUnreachable},
		{"the proxy says the target refused", fmt.Errorf("socks5: CONNECT: %w", &socks5.ReplyError{Code: socks5.ReplyConnectionRefused}), true, audit.OutcomeRefused},
		{"the proxy says no", &socks5.ReplyError{Code: socks5.ReplyNotAllowed}, true, audit.OutcomeUpstreamProxyFailed},
		{"the proxy cannot be reached", refused, true, audit.OutcomeUpstreamProxyFailed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := outcome(tt.err, tt.upstream); got != tt.want {
				t.Fatalf("outcome(%v, %v) = %q, want %q", tt.err, tt.upstream, got, tt.want)
			}
		})
	}
}

func TestBoundVerdictsNameTheBound(t *testing.T) {
	for _, tt := range []struct {
		err        error
		rule, want string
	}{
		{fmt.Errorf("%w: x", audit.ErrSizeCap), audit.RuleMaxSize, "rest of the run"},
		{fmt.Errorf("%w: x", audit.ErrRateLimited), audit.RuleMaxRate, "until the rate falls"},
		{audit.ErrClosed, "audit", "cannot be written"},
	} {
		v := boundVerdict(tt.err)
		if v.Allowed() || v.Rule != tt.rule || !strings.Contains(v.Reason, tt.want) {
			t.Errorf("boundVerdict(%v) = %+v, want a denial by %s saying %q", tt.err, v, tt.rule, tt.want)
		}
	}
}

func TestDenialLinesOfAFloodAreBoundedAndCounted(t *testing.T) {
	var out bytes.Buffer
	// A clock that stands still while the flood is printed: on a loaded
	// machine 1000 lines can take long enough to earn more tokens.
	clock := time.Now()
	p := denyPrinter{w: &out, now: func() time.Time { return clock }}
	for i := range 1000 {
		p.printf("tunwall: denied DNS A r%d.evil.test: no rule allows it", i)
	}
	if n := strings.Count(out.String(), "\n"); n != denyBurst {
		t.Fatalf("%d lines printed for 1000 denials, want the burst of %d", n, denyBurst)
	}
	p.tokAt = p.tokAt.Add(-time.Second) // a second passes
	p.printf("tunwall: denied DNS A late.evil.test: no rule allows it")
	if !strings.Contains(out.String(), "tunwall: (950 more denials not shown; the audit log has them)\ntunwall: denied DNS A late.evil.test") {
		t.Fatalf("the hidden denials are not counted before the next line:\n%s", out.String()[max(0, out.Len()-300):])
	}
	// The same line repeated within a second is printed once.
	out.Reset()
	p.tokAt = p.tokAt.Add(-10 * time.Second)
	for range 5 {
		p.printf("tunwall: denied evil.test:443 tcp: no rule allows it")
	}
	if n := strings.Count(out.String(), "\n"); n != 1 {
		t.Fatalf("a repeated denial printed %d times:\n%s", n, out.String())
	}
}
