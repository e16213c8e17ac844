package socksserver

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/tunwall/tunwall/internal/engine"
	"github.com/tunwall/tunwall/internal/engine/enginetest"
	"github.com/tunwall/tunwall/internal/leaktest"
	"github.com/tunwall/tunwall/internal/socks5"
)

// The front end's tests run a real engine (policy, guard, relay, records)
// behind Serve on a loopback listener, with enginetest's fakes for what the
// engine calls: names resolve from a map, dials connect to net.Pipes whose
// other end the test takes, records are kept in memory. Clients are
// tunwall's own SOCKS5 client (internal/socks5).

// waitFor bounds every wait in these tests.
const waitFor = enginetest.Wait

const allowTLS = `      - host: allowed.test
        ports: [443]
`

// rig is an engine with fakes around it, served by Serve.
type rig struct {
	e    *engine.Engine
	res  *enginetest.Resolver
	dial *enginetest.Dialer
	rec  *enginetest.Recorder
	d    *socks5.Dialer // a client of the proxy
}

// newRig serves a one-phase policy whose allow list is allowYAML.
func newRig(t *testing.T, allowYAML string) *rig {
	t.Helper()
	return newRigWith(t, allowYAML, nil)
}

// refusingUpstream is an --upstream proxy that answers every CONNECT with
// "connection refused".
type refusingUpstream struct{}

func (refusingUpstream) DialContext(context.Context, string, string) (net.Conn, error) {
	return nil, fmt.Errorf("socks5: CONNECT via proxy: %w", &socks5.ReplyError{Code: socks5.ReplyConnectionRefused})
}

func (refusingUpstream) DialUDP(context.Context, string) (net.Conn, error) {
	return nil, &socks5.ReplyError{Code: socks5.ReplyCommandNotSupported}
}

// newRigWith is newRig with an --upstream proxy (nil: none).
func newRigWith(t *testing.T, allowYAML string, up engine.Upstream) *rig {
	t.Helper()
	leaktest.Check(t)
	rs, pool := enginetest.Policy(t, allowYAML)
	r := &rig{
		res:  enginetest.NewResolver(),
		dial: enginetest.NewDialer(),
		rec:  enginetest.NewRecorder(),
	}
	var err error
	r.e, err = engine.New(engine.Config{
		Rules:       rs,
		Pool:        pool,
		Resolver:    r.res,
		Dial:        r.dial.Dial,
		Audit:       r.rec,
		Upstream:    up,
		DialTimeout: 2 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		Serve(ctx, r.e, ln, Options{Drain: time.Millisecond})
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(waitFor):
			t.Error("Serve did not return")
		}
	})
	r.d = &socks5.Dialer{Addr: ln.Addr().String(), Timeout: waitFor}
	return r
}

// resolves makes name resolve to addrs.
func (r *rig) resolves(name string, addrs ...string) { r.res.Add(name, addrs...) }
