package procattr

import (
	"net"
	"net/netip"
	"testing"
)

func TestTCPSocketGone(t *testing.T) {
	r := newTestResolver(t, Config{})
	ln := mustListen(t, "tcp4", "127.0.0.1:0")
	c, err := net.Dial("tcp4", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	local := netip.MustParseAddrPort(c.LocalAddr().String())
	remote := netip.MustParseAddrPort(c.RemoteAddr().String())
	if gone, ok := r.TCPSocketGone(local, remote); gone || !ok {
		t.Fatalf("a connected socket: gone=%v ok=%v, want false true", gone, ok)
	}
	// A 4-tuple no socket has (a raw SYN's, or a client that gave up).
	none := netip.AddrPortFrom(local.Addr(), 1)
	if gone, ok := r.TCPSocketGone(none, netip.MustParseAddrPort("127.0.0.1:9")); !gone || !ok {
		t.Fatalf("no socket: gone=%v ok=%v, want true true", gone, ok)
	}
	r.Close()
	if _, ok := r.TCPSocketGone(local, remote); ok {
		t.Fatal("a closed Resolver claims to know")
	}
}
