package stack

import (
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/tcpip"
	gstack "gvisor.dev/gvisor/pkg/tcpip/stack"
)

// captureDispatcher records what a link delivers.
type captureDispatcher struct{ got chan []byte }

func (d *captureDispatcher) DeliverNetworkPacket(_ tcpip.NetworkProtocolNumber, pkt *gstack.PacketBuffer) {
	d.got <- pkt.ToView().ToSlice()
}

func (*captureDispatcher) DeliverLinkPacket(tcpip.NetworkProtocolNumber, *gstack.PacketBuffer) {}

// A TUN with IFF_VNET_HDR puts a virtio-net header before each packet. The
// link strips an acceptable one, and drops and counts a packet whose header
// asks for an offload the TUN never offered (segmentation), has unknown
// flags, or is cut short; the packets after it still arrive.
func TestVNetHeadersAreStrippedOrTheirPacketsDroppedAndCounted(t *testing.T) {
	goroutineLeakCheck(t)
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fds[0])
	defer unix.Close(fds[1])
	var bad int
	l, err := newTUNLink(fds[0], testMTU, func(tcpip.Error) {}, func() { bad++ })
	if err != nil {
		t.Fatal(err)
	}
	l.vnet = true // a socketpair is no TUN; the header handling is the same
	d := &captureDispatcher{got: make(chan []byte, 8)}
	l.Attach(d)
	defer l.Attach(nil)

	syn := synPacket(netip.AddrPortFrom(sandbox4, 42000), netip.AddrPortFrom(remote4, 80), 1)
	hdr := func(flags, gso byte) []byte { return []byte{flags, gso, 0, 0, 0, 0, 0, 0, 0, 0} }
	good := func(flags byte) []byte { return append(hdr(flags, 0), syn...) }
	for _, tc := range []struct {
		name string
		pkt  []byte
		ok   bool
	}{
		{"no flags", good(0), true},
		{"checksum left to the reader (NEEDS_CSUM)", good(vnetFlagNeedsCsum), true},
		{"checksum verified (DATA_VALID)", good(vnetFlagDataValid), true},
		{"TCPv4 segmentation offload", append(hdr(0, 1), syn...), false},
		{"TCPv6 segmentation offload", append(hdr(vnetFlagNeedsCsum, 4), syn...), false},
		{"an unknown flag", good(0x80), false},
		{"a header cut short", hdr(0, 0)[:9], false},
		{"a header and no packet", hdr(0, 0), false},
	} {
		before := bad
		if _, err := unix.Write(fds[1], tc.pkt); err != nil {
			t.Fatalf("%s: write: %v", tc.name, err)
		}
		// A valid packet after each one shows the link still reads, and
		// orders the check.
		if _, err := unix.Write(fds[1], good(0)); err != nil {
			t.Fatal(err)
		}
		want := 1
		if tc.ok {
			want = 2
		}
		for range want {
			select {
			case p := <-d.got:
				if string(p) != string(syn) {
					t.Errorf("%s: delivered %x, want the packet without its header", tc.name, p)
				}
			case <-time.After(waitFor):
				t.Fatalf("%s: nothing delivered", tc.name)
			}
		}
		if wantBad := before + 2 - want; bad != wantBad {
			t.Errorf("%s: %d packets counted as malformed, want %d", tc.name, bad-before, wantBad-before)
		}
	}
}

// FuzzVNetHdr: no header crashes the check, and what it accepts is a whole
// header asking for no segmentation.
func FuzzVNetHdr(f *testing.F) {
	f.Add([]byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x45})
	f.Add([]byte{1, 1, 0, 0, 0, 0, 0, 0, 0, 0})
	f.Add([]byte{3})
	f.Fuzz(func(t *testing.T, b []byte) {
		if vnetHdrOK(b) && (len(b) < vnetHdrLen || b[1] != vnetGSONone || b[0]&^3 != 0) {
			t.Fatalf("accepted %x", b)
		}
	})
}
