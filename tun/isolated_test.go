package tun

import (
	"errors"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

func TestIsolatedRefusesALinkInAnyState(t *testing.T) {
	inFreshNetNS(t, func() error {
		if ok, why, err := Isolated(); err != nil || !ok {
			t.Errorf("a fresh namespace should be isolated: %q, %v", why, err)
		}
		// Down, with no address and no route: still a way out, as soon as
		// anyone inside brings it up.
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "down0"}, PeerName: "down1"}); err != nil {
			return err
		}
		ok, why, err := Isolated()
		if err != nil || ok || !strings.Contains(why, "interface down0 (veth, down)") {
			t.Errorf("Isolated() with a down veth = %v, %q, %v; want false naming down0", ok, why, err)
		}
		return nil
	})
}

// watchFixture opens a watch, then makes the TUN, in a fresh namespace.
func watchFixture(t *testing.T, accept bool, before func() error) (w *Watcher, tunFD int, err error) {
	fd, err := OpenWatch()
	if err != nil {
		return nil, -1, err
	}
	if before != nil {
		if err := before(); err != nil {
			unix.Close(fd)
			return nil, -1, err
		}
	}
	if tunFD, err = Setup(Config{Name: "twwatch0"}); err != nil {
		unix.Close(fd)
		return nil, -1, err
	}
	w, err = NewWatcher(WatchConfig{FD: fd, TUN: tunFD, AcceptExisting: accept})
	if err != nil {
		unix.Close(tunFD)
		return nil, -1, err
	}
	return w, tunFD, nil
}

// waitEscape waits (bounded) for w to report something.
func waitEscape(w *Watcher) error {
	errc := make(chan error, 1)
	go func() { errc <- w.Wait() }()
	select {
	case err := <-errc:
		return err
	case <-time.After(5 * time.Second):
		w.Close()
		<-errc
		return errors.New("nothing reported within 5s")
	}
}

func TestWatcherReportsALinkThatAppears(t *testing.T) {
	inFreshNetNS(t, func() error {
		w, tunFD, err := watchFixture(t, false, nil)
		if err != nil {
			return err
		}
		defer unix.Close(tunFD)
		defer w.Close()
		// Our own TUN and lo changing are not ways out.
		lo, _ := netlink.LinkByName("lo")
		netlink.LinkSetDown(lo)
		netlink.LinkSetUp(lo)
		tl, _ := netlink.LinkByName("twwatch0")
		netlink.LinkSetMTU(tl, 9000)
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "sneak0"}, PeerName: "sneak1"}); err != nil {
			return err
		}
		var esc *EscapeError
		if err := waitEscape(w); !errors.As(err, &esc) || !strings.Contains(esc.What, "interface sneak") {
			t.Errorf("Wait() = %v; want an EscapeError naming the new veth", err)
		}
		return nil
	})
}

func TestWatcherRefusesALinkThatIsThereUnlessAccepted(t *testing.T) {
	inFreshNetNS(t, func() error {
		addVeth := func() error {
			return netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "old0"}, PeerName: "old1"})
		}
		var esc *EscapeError
		if _, _, err := watchFixture(t, false, addVeth); !errors.As(err, &esc) || !strings.Contains(esc.What, "old") {
			t.Errorf("NewWatcher with a veth present = %v; want an EscapeError naming it", err)
		}
		return nil
	})
	inFreshNetNS(t, func() error {
		w, tunFD, err := watchFixture(t, true, func() error {
			return netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "old0"}, PeerName: "old1"})
		})
		if err != nil {
			return err
		}
		defer unix.Close(tunFD)
		defer w.Close()
		// Accepted: it may change, and get addresses and routes.
		old, _ := netlink.LinkByName("old0")
		netlink.LinkSetUp(old)
		// A new one is still reported.
		if err := netlink.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "br7"}}); err != nil {
			return err
		}
		var esc *EscapeError
		if err := waitEscape(w); !errors.As(err, &esc) || !strings.Contains(esc.What, "interface br7 (bridge)") {
			t.Errorf("Wait() = %v; want an EscapeError naming br7", err)
		}
		return nil
	})
}

func TestWatcherJudgesRoutesAndAddressesByInterface(t *testing.T) {
	w := &Watcher{allowed: map[int32]bool{loopbackIndex: true, 5: true}}
	route := func(oif uint32, hops ...uint32) syscall.NetlinkMessage {
		msg := nl.NewRtMsg()
		msg.Family = unix.AF_INET
		msg.Dst_len = 24
		b := msg.Serialize()
		b = append(b, nl.NewRtAttr(unix.RTA_DST, []byte{203, 0, 113, 0}).Serialize()...)
		if oif != 0 {
			b = append(b, nl.NewRtAttr(unix.RTA_OIF, nl.Uint32Attr(oif)).Serialize()...)
		}
		if len(hops) > 0 {
			var mp []byte
			for _, h := range hops {
				nh := make([]byte, 8)
				nh[0] = 8
				copy(nh[4:], nl.Uint32Attr(h))
				mp = append(mp, nh...)
			}
			b = append(b, nl.NewRtAttr(unix.RTA_MULTIPATH, mp).Serialize()...)
		}
		return syscall.NetlinkMessage{Header: syscall.NlMsghdr{Type: unix.RTM_NEWROUTE}, Data: b}
	}
	addr := func(idx uint32) syscall.NetlinkMessage {
		msg := nl.NewIfAddrmsg(unix.AF_INET)
		msg.Index = idx
		return syscall.NetlinkMessage{Header: syscall.NlMsghdr{Type: unix.RTM_NEWADDR}, Data: msg.Serialize()}
	}
	for _, c := range []struct {
		name string
		m    syscall.NetlinkMessage
		want string // "" means allowed
	}{
		{"a route via lo", route(1), ""},
		{"a route via the TUN", route(5), ""},
		{"a route via another interface", route(7), "a route to 203.0.113.0/24 via interface index 7 appeared"},
		{"a multipath route with one hop elsewhere", route(0, 5, 9), "via interface index 9"},
		{"a multipath route via the TUN only", route(0, 5, 5), ""},
		{"a blackhole route (no interface)", route(0), ""},
		{"an address on the TUN", addr(5), ""},
		{"an address on another interface", addr(8), "an address appeared on interface index 8"},
	} {
		err := w.judge(c.m)
		var esc *EscapeError
		if c.want == "" && err != nil || c.want != "" && (!errors.As(err, &esc) || !strings.Contains(esc.What, c.want)) {
			t.Errorf("%s: judge = %v, want %q", c.name, err, c.want)
		}
	}
}

// A process in the namespace with CAP_NET_ADMIN can send netlink messages
// to the watch socket; only the kernel's count.
func TestWatcherIgnoresMessagesFromProcesses(t *testing.T) {
	inFreshNetNS(t, func() error {
		fd, err := OpenWatch()
		if err != nil {
			return err
		}
		sa, err := unix.Getsockname(fd)
		if err != nil {
			return err
		}
		portid := sa.(*unix.SockaddrNetlink).Pid
		tunFD, err := Setup(Config{Name: "twwatch0"})
		if err != nil {
			return err
		}
		defer unix.Close(tunFD)
		w, err := NewWatcher(WatchConfig{FD: fd, TUN: tunFD})
		if err != nil {
			return err
		}
		defer w.Close()
		// A forged RTM_NEWLINK for an interface "forged0".
		forger, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
		if err != nil {
			return err
		}
		defer unix.Close(forger)
		info := nl.NewIfInfomsg(unix.AF_UNSPEC)
		info.Index = 42
		body := append(info.Serialize(), nl.NewRtAttr(unix.IFLA_IFNAME, nl.ZeroTerminated("forged0")).Serialize()...)
		msg := make([]byte, unix.NLMSG_HDRLEN, unix.NLMSG_HDRLEN+len(body))
		msg = append(msg, body...)
		nl.NativeEndian().PutUint32(msg[0:4], uint32(len(msg)))
		nl.NativeEndian().PutUint16(msg[4:6], unix.RTM_NEWLINK)
		if err := unix.Sendto(forger, msg, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK, Pid: portid}); err != nil {
			return err
		}
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "real0"}, PeerName: "real1"}); err != nil {
			return err
		}
		var esc *EscapeError
		if err := waitEscape(w); !errors.As(err, &esc) || !strings.Contains(esc.What, "interface real") {
			t.Errorf("Wait() = %v; want the real veth, not the forged message", err)
		}
		return nil
	})
}
