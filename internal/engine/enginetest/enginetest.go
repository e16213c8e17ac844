// Package enginetest holds the fakes of what the engine calls (ports.go:
// the Resolver, the Recorder, the Attributor and Config.Dial) and the
// helpers that build and drive an engine in unit tests, for the engine's
// own tests and for those of its callers (socksserver, cmd/tunwall). Names
// resolve from a map, dials connect to net.Pipes whose other end the test
// takes, and records are kept in memory: nothing touches the network.
//
// It does not import engine, so that engine's package-internal tests can
// import it (the types satisfy engine's interfaces by their methods; those
// tests assert it). It is imported only by tests.
package enginetest

import (
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/tunwall/tunwall/dnsintercept"
	"github.com/tunwall/tunwall/policy"
)

// Wait bounds every wait of the fakes and helpers.
const Wait = 5 * time.Second

// The fake-IP ranges of the pool Policy returns.
var (
	Pool4 = netip.MustParsePrefix("198.18.0.0/24")
	Pool6 = netip.MustParsePrefix("fd74:756e:7761:6c6d::/120")
)

// Policy returns the rule set of a one-phase policy whose allow list is
// allowYAML (rules indented as under "allow:"), with the rebinding guard
// covering Pool4 and Pool6, and a fake-IP pool of 16 names in them.
func Policy(t testing.TB, allowYAML string) (*policy.RuleSet, *dnsintercept.Pool) {
	t.Helper()
	p, err := policy.Parse("test.yaml", []byte("version: 1\nphases:\n  test:\n    allow:\n"+allowYAML))
	if err != nil {
		t.Fatal(err)
	}
	rs, err := policy.Select(p, "", nil, policy.Guard{Extra: []netip.Prefix{Pool4, Pool6}})
	if err != nil {
		t.Fatal(err)
	}
	pool, err := dnsintercept.NewPoolReserved(Pool4, Pool6, 16)
	if err != nil {
		t.Fatal(err)
	}
	return rs, pool
}

// ReadUpTo reads from c until n bytes, EOF or Wait.
func ReadUpTo(t testing.TB, c interface {
	Read([]byte) (int, error)
	SetReadDeadline(time.Time) error
}, n int) []byte {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(Wait))
	b := make([]byte, n)
	m, err := io.ReadFull(c, b)
	if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("read: %v (got %d bytes)", err, m)
	}
	return b[:m]
}

// ClientHello returns the first TLS record of a real ClientHello (crypto/tls's)
// for serverName.
func ClientHello(t testing.TB, serverName string) []byte {
	t.Helper()
	c, s := net.Pipe()
	go tls.Client(c, &tls.Config{ServerName: serverName}).Handshake()
	s.SetReadDeadline(time.Now().Add(Wait))
	hdr := make([]byte, 5)
	if _, err := io.ReadFull(s, hdr); err != nil {
		t.Fatal(err)
	}
	body := make([]byte, int(hdr[3])<<8|int(hdr[4]))
	if _, err := io.ReadFull(s, body); err != nil {
		t.Fatal(err)
	}
	c.Close()
	s.Close()
	return append(hdr, body...)
}
