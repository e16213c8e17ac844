package tun

import (
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"os"
	"runtime"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// inFreshNetNS runs fn on a thread in a new, empty network namespace that
// disappears when fn returns (the thread is never unlocked, so it is
// retired). It needs root; outside CI the test is skipped loudly.
func inFreshNetNS(t *testing.T, fn func() error) {
	t.Helper()
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("needs root, and CI=true")
		}
		t.Skip("SKIPPING: needs root to create a network namespace")
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- err
			return
		}
		errc <- fn()
	}()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

func TestSetupMakesTheTUNTheOnlyRouteForBothFamilies(t *testing.T) {
	inFreshNetNS(t, func() error {
		if ok, why, err := Isolated(); err != nil || !ok {
			return errors.New("a fresh namespace should be isolated: " + why)
		}
		fd, err := Setup(Config{Name: "twtest0", MTU: 9000})
		if err != nil {
			return err
		}
		link, err := netlink.LinkByName("twtest0")
		if err != nil {
			return err
		}
		if link.Attrs().MTU != 9000 || link.Attrs().Flags&net.FlagUp == 0 {
			t.Errorf("link %+v: want MTU 9000 and up", link.Attrs())
		}
		lo, _ := netlink.LinkByName("lo")
		if lo.Attrs().Flags&net.FlagUp == 0 {
			t.Error("lo is not up")
		}
		addrs, _ := netlink.AddrList(link, netlink.FAMILY_ALL)
		var got []string
		for _, a := range addrs {
			if !a.IP.IsLinkLocalUnicast() {
				got = append(got, a.IPNet.String())
			}
		}
		if len(got) != 2 || got[0] != DefaultAddr4.String() || got[1] != DefaultAddr6.String() {
			t.Errorf("addresses %v, want %v and %v", got, DefaultAddr4, DefaultAddr6)
		}
		for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
			routes, _ := netlink.RouteList(nil, fam)
			found := false
			for _, r := range routes {
				if r.Dst == nil || r.Dst.String() == "0.0.0.0/0" || r.Dst.String() == "::/0" {
					found = r.LinkIndex == link.Attrs().Index
				}
			}
			if !found {
				t.Errorf("no default route via the TUN for family %d: %v", fam, routes)
			}
		}
		if ok, _, _ := Isolated(); ok {
			t.Error("with a TUN and default routes up, the namespace should not count as isolated")
		}
		// Fail closed: when the last descriptor goes, so does the device.
		unix.Close(fd)
		if _, err := netlink.LinkByName("twtest0"); err == nil {
			t.Error("the TUN outlived its descriptor")
		}
		return nil
	})
}

func TestSetupRejectsBadConfig(t *testing.T) {
	for _, c := range []Config{
		{MTU: 100},
		{MTU: 70000},
		{Addr4: netip.MustParsePrefix("fd00::1/128")},
		{Addr6: netip.MustParsePrefix("10.0.0.1/32")},
	} {
		if fd, err := Setup(c); err == nil {
			unix.Close(fd)
			t.Errorf("Setup(%+v) succeeded", c)
		}
	}
}

func TestSendAndRecvPassDescriptorsAndMessages(t *testing.T) {
	a, bf, err := SocketPair()
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := FileConn(bf)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	type msg struct{ Type, Text string }
	if err := Send(a, msg{"ready", "hello"}, int(w.Fd())); err != nil {
		t.Fatal(err)
	}
	w.Close()
	var m msg
	fds, err := Recv(b, &m)
	if err != nil {
		t.Fatal(err)
	}
	if m.Type != "ready" || m.Text != "hello" || len(fds) != 1 {
		t.Fatalf("got %+v with %d fds", m, len(fds))
	}
	if flags, err := unix.FcntlInt(uintptr(fds[0]), unix.F_GETFD, 0); err != nil || flags&unix.FD_CLOEXEC == 0 {
		t.Errorf("received descriptors must be close-on-exec (flags %#x, %v)", flags, err)
	}
	// The received descriptor is the pipe's write end.
	f := os.NewFile(uintptr(fds[0]), "w")
	f.Write([]byte("x"))
	f.Close()
	buf := make([]byte, 1)
	if n, _ := r.Read(buf); n != 1 || buf[0] != 'x' {
		t.Fatal("the passed descriptor does not reach the pipe")
	}
	// The peer going away is ErrPeerGone.
	a.Close()
	if _, err := Recv(b, &m); !errors.Is(err, ErrPeerGone) {
		t.Fatalf("after the peer closed: %v, want ErrPeerGone", err)
	}
	if err := Send(b, msg{}, 1, 2, 3, 4, 5); err == nil {
		t.Error("more than MaxFDs descriptors must be refused")
	}
}

func TestSetupGivesTheTUNAVirtioNetHeaderAndChecksumOffload(t *testing.T) {
	inFreshNetNS(t, func() error {
		fd, err := Setup(Config{Name: "twtest1"})
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		ifr, err := unix.NewIfreq("")
		if err != nil {
			return err
		}
		if err := unix.IoctlIfreq(fd, unix.TUNGETIFF, ifr); err != nil {
			return err
		}
		if want := uint16(unix.IFF_TUN | unix.IFF_NO_PI | unix.IFF_VNET_HDR); ifr.Uint16()&want != want {
			t.Errorf("TUN flags %#x, want %#x set", ifr.Uint16(), want)
		}
		if n, err := unix.IoctlGetInt(fd, unix.TUNGETVNETHDRSZ); err != nil || n != VnetHdrSize {
			t.Errorf("virtio-net header size %d (%v), want %d", n, err, VnetHdrSize)
		}
		// A SYN the kernel sends through the TUN arrives with its TCP
		// checksum left partial (VIRTIO_NET_HDR_F_NEEDS_CSUM, from the
		// end of the IPv4 header): the offload is on.
		s, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(s)
		_ = unix.Connect(s, &unix.SockaddrInet4{Addr: [4]byte{192, 0, 2, 1}, Port: 80})
		buf := make([]byte, 1<<16)
		for range 20 { // other packets (IPv6 router solicitations) may come first
			pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
			if n, err := unix.Poll(pfd, 2000); err != nil || n == 0 {
				return errors.New("no SYN read from the TUN within 2 s")
			}
			n, err := unix.Read(fd, buf)
			if err != nil {
				return err
			}
			p := buf[:n]
			if n < VnetHdrSize+40 || p[VnetHdrSize]>>4 != 4 || p[VnetHdrSize+9] != unix.IPPROTO_TCP {
				continue
			}
			flags, start, off := p[0], binary.LittleEndian.Uint16(p[6:]), binary.LittleEndian.Uint16(p[8:])
			if flags != 1 || start != 20 || off != 16 {
				t.Errorf("SYN's header: flags %d, csum_start %d, csum_offset %d; want 1, 20, 16", flags, start, off)
			}
			return nil
		}
		return errors.New("no SYN among 20 packets")
	})
}
