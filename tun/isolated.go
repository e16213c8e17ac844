package tun

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// loopbackIndex is lo's interface index in every network namespace.
const loopbackIndex = 1

// Isolated reports whether the calling thread's network namespace has no
// way out other than loopback: no interface but lo exists, in any state (a
// down veth is a way out as soon as someone inside brings it up), and no
// address or route uses anything but lo. It returns a description of what it
// found otherwise.
func Isolated() (ok bool, why string, err error) {
	h, err := netlink.NewHandle()
	if err != nil {
		return false, "", fmt.Errorf("tun: netlink: %w", err)
	}
	defer h.Close()
	links, err := h.LinkList()
	if err != nil {
		return false, "", fmt.Errorf("tun: list links: %w", err)
	}
	var found []string
	for _, l := range links {
		a := l.Attrs()
		if a.Index == loopbackIndex {
			continue
		}
		state := "down"
		if a.Flags&net.FlagUp != 0 {
			state = "up"
		}
		found = append(found, fmt.Sprintf("interface %s (%s, %s)", a.Name, l.Type(), state))
	}
	addrs, err := h.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return false, "", fmt.Errorf("tun: list addresses: %w", err)
	}
	for _, a := range addrs {
		if a.LinkIndex != loopbackIndex {
			found = append(found, fmt.Sprintf("address %s on interface index %d", a.IPNet, a.LinkIndex))
		}
	}
	routes, err := h.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return false, "", fmt.Errorf("tun: list routes: %w", err)
	}
	for _, r := range routes {
		idx := []int{r.LinkIndex}
		for _, nh := range r.MultiPath {
			idx = append(idx, nh.LinkIndex)
		}
		for _, i := range idx {
			if i != 0 && i != loopbackIndex {
				dst := "default"
				if r.Dst != nil {
					dst = r.Dst.String()
				}
				found = append(found, fmt.Sprintf("route %s via interface index %d", dst, i))
				break
			}
		}
	}
	if len(found) > 0 {
		return false, strings.Join(found, "; "), nil
	}
	return true, "", nil
}

// OpenWatch opens a NETLINK_ROUTE socket in the calling thread's network
// namespace, subscribed to link, address and route changes of both families,
// for a Watcher. Open it before checking Isolated, so that nothing that
// appears after the check goes unseen. The caller owns the descriptor
// (close-on-exec).
func OpenWatch() (int, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		return -1, fmt.Errorf("tun: netlink socket: %w", err)
	}
	groups := uint32(unix.RTMGRP_LINK | unix.RTMGRP_IPV4_IFADDR | unix.RTMGRP_IPV6_IFADDR | unix.RTMGRP_IPV4_ROUTE | unix.RTMGRP_IPV6_ROUTE)
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK, Groups: groups}); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("tun: netlink subscribe: %w", err)
	}
	// Room for bursts; the kernel caps it at net.core.rmem_max. An
	// overflow is reported by the Watcher (fail closed), never ignored.
	_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 4<<20)
	return fd, nil
}

// EscapeError describes a way out that appeared in a watched namespace.
type EscapeError struct {
	What string // e.g. "interface sneak0 (veth) appeared"
}

func (e *EscapeError) Error() string { return e.What }

// ErrWatchClosed is returned by Watcher.Wait after Close.
var ErrWatchClosed = errors.New("tun: watch closed")

// Watcher follows a namespace's links, addresses and routes through a
// socket from OpenWatch and reports the first that is not loopback's or the
// TUN's (or, with AcceptExisting, a link's that was there when it started).
type Watcher struct {
	f       *os.File
	rc      syscall.RawConn
	allowed map[int32]bool
	tunName string
	tunIdx  int32
	closed  sync.Once
}

// WatchConfig configures NewWatcher.
type WatchConfig struct {
	// FD is the socket from OpenWatch. The Watcher owns it from then on,
	// also when NewWatcher fails.
	FD int
	// TUN is the TUN descriptor whose device is allowed (its name is read
	// from it); the caller keeps it.
	TUN int
	// AcceptExisting allows every link present when the Watcher starts, and
	// the addresses and routes on them (tunwall attach --force).
	AcceptExisting bool
}

// NewWatcher lists the namespace's links over the socket and returns a
// Watcher, or an *EscapeError if a link other than lo and the TUN is there
// already (unless cfg.AcceptExisting).
func NewWatcher(cfg WatchConfig) (*Watcher, error) {
	name, err := tunName(cfg.TUN)
	if err != nil {
		unix.Close(cfg.FD)
		return nil, err
	}
	if err := unix.SetNonblock(cfg.FD, true); err != nil {
		unix.Close(cfg.FD)
		return nil, fmt.Errorf("tun: watch: %w", err)
	}
	f := os.NewFile(uintptr(cfg.FD), "netlink-watch")
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("tun: watch: %w", err)
	}
	w := &Watcher{f: f, rc: rc, allowed: map[int32]bool{loopbackIndex: true}, tunName: name, tunIdx: -1}
	if err := w.start(cfg.AcceptExisting); err != nil {
		w.Close()
		return nil, err
	}
	return w, nil
}

func tunName(fd int) (string, error) {
	ifr, err := unix.NewIfreq("")
	if err != nil {
		return "", err
	}
	if err := unix.IoctlIfreq(fd, unix.TUNGETIFF, ifr); err != nil {
		return "", fmt.Errorf("tun: TUNGETIFF: %w", err)
	}
	return ifr.Name(), nil
}

const dumpSeq = 0x7475 // "tu": marks the replies to our link dump

// start dumps the links, finds the TUN among them, and judges every message
// that was queued before the dump ended.
func (w *Watcher) start(acceptExisting bool) error {
	req := make([]byte, unix.NLMSG_HDRLEN+unix.SizeofIfInfomsg)
	binary.NativeEndian.PutUint32(req[0:4], uint32(len(req)))
	binary.NativeEndian.PutUint16(req[4:6], unix.RTM_GETLINK)
	binary.NativeEndian.PutUint16(req[6:8], unix.NLM_F_REQUEST|unix.NLM_F_DUMP)
	binary.NativeEndian.PutUint32(req[8:12], dumpSeq)
	req[unix.NLMSG_HDRLEN] = unix.AF_UNSPEC
	var serr error
	if err := w.rc.Write(func(fd uintptr) bool {
		serr = unix.Sendto(int(fd), req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK})
		return serr != unix.EAGAIN
	}); err != nil {
		return fmt.Errorf("tun: watch: %w", err)
	}
	if serr != nil {
		return fmt.Errorf("tun: watch: link dump: %w", serr)
	}
	var queued []syscall.NetlinkMessage
	for done := false; !done; {
		msgs, err := w.read()
		if err != nil {
			return err
		}
		for _, m := range msgs {
			switch {
			case m.Header.Seq != dumpSeq:
				queued = append(queued, m)
			case m.Header.Type == unix.NLMSG_DONE:
				done = true
			case m.Header.Type == unix.NLMSG_ERROR:
				return fmt.Errorf("tun: watch: link dump failed")
			case m.Header.Type == unix.RTM_NEWLINK:
				l, err := parseLink(m)
				if err != nil {
					return err
				}
				if l.name == w.tunName && l.kind == "tun" && w.tunIdx < 0 {
					w.tunIdx = l.index
					w.allowed[l.index] = true
				} else if acceptExisting {
					w.allowed[l.index] = true
				}
				queued = append(queued, m)
			}
		}
	}
	if w.tunIdx < 0 {
		return fmt.Errorf("tun: watch: the TUN %s is not in the namespace", w.tunName)
	}
	for _, m := range queued {
		if err := w.judge(m); err != nil {
			return err
		}
	}
	return nil
}

// Wait blocks until a way out appears (an *EscapeError), the socket fails,
// or Close is called (ErrWatchClosed).
func (w *Watcher) Wait() error {
	for {
		msgs, err := w.read()
		if err != nil {
			return err
		}
		for _, m := range msgs {
			if err := w.judge(m); err != nil {
				return err
			}
		}
	}
}

// Close stops the Watcher; a Wait in progress returns ErrWatchClosed.
func (w *Watcher) Close() error {
	var err error
	w.closed.Do(func() { err = w.f.Close() })
	return err
}

func (w *Watcher) read() ([]syscall.NetlinkMessage, error) {
	buf := make([]byte, 64<<10)
	var (
		n    int
		from unix.Sockaddr
		rerr error
	)
	for {
		err := w.rc.Read(func(fd uintptr) bool {
			n, from, rerr = unix.Recvfrom(int(fd), buf, 0)
			return rerr != unix.EAGAIN
		})
		if err != nil || rerr != nil {
			return w.readError(err, rerr)
		}
		// Only the kernel speaks for the namespace. A process in it with
		// CAP_NET_ADMIN may send netlink messages to our socket, e.g. a
		// forged link dump naming its veth as the TUN: drop them.
		if sa, ok := from.(*unix.SockaddrNetlink); ok && sa.Pid == 0 {
			break
		}
	}
	msgs, err := syscall.ParseNetlinkMessage(buf[:n])
	if err != nil {
		return nil, fmt.Errorf("tun: watch: %w", err)
	}
	return msgs, nil
}

func (w *Watcher) readError(err, rerr error) ([]syscall.NetlinkMessage, error) {
	switch {
	case errors.Is(err, os.ErrClosed):
		return nil, ErrWatchClosed
	case err != nil:
		return nil, fmt.Errorf("tun: watch: %w", err)
	case errors.Is(rerr, unix.ENOBUFS):
		// Events were dropped: what appeared is unknown. Fail closed.
		return nil, &EscapeError{What: "too many link, address or route changes to follow (netlink overflow): cannot tell whether a way out appeared"}
	}
	return nil, fmt.Errorf("tun: watch: %w", rerr)
}

// judge reports an *EscapeError for a message about a link, address or
// route that is not allowed.
func (w *Watcher) judge(m syscall.NetlinkMessage) error {
	switch m.Header.Type {
	case unix.RTM_NEWLINK:
		l, err := parseLink(m)
		if err != nil {
			return err
		}
		if !w.allowed[l.index] {
			what := fmt.Sprintf("interface %s (%s) appeared", l.name, l.kind)
			if l.netnsID >= 0 {
				what += " with a peer in another namespace"
			}
			return &EscapeError{What: what}
		}
	case unix.RTM_DELLINK:
		l, err := parseLink(m)
		if err != nil {
			return err
		}
		// An index may be reused by a link moved in later: forget it.
		if l.index != loopbackIndex {
			delete(w.allowed, l.index)
		}
	case unix.RTM_NEWADDR:
		if len(m.Data) < unix.SizeofIfAddrmsg {
			return fmt.Errorf("tun: watch: short address message")
		}
		idx := int32(binary.NativeEndian.Uint32(m.Data[4:8]))
		if !w.allowed[idx] {
			return &EscapeError{What: fmt.Sprintf("an address appeared on interface index %d", idx)}
		}
	case unix.RTM_NEWROUTE:
		idx, dst, err := parseRoute(m)
		if err != nil {
			return err
		}
		for _, i := range idx {
			if !w.allowed[i] {
				return &EscapeError{What: fmt.Sprintf("a route to %s via interface index %d appeared", dst, i)}
			}
		}
	}
	return nil
}

type linkMsg struct {
	index   int32
	name    string
	kind    string // IFLA_INFO_KIND, "" when the driver has none
	netnsID int32  // IFLA_LINK_NETNSID, -1 when absent
}

func parseLink(m syscall.NetlinkMessage) (linkMsg, error) {
	l := linkMsg{netnsID: -1}
	if len(m.Data) < unix.SizeofIfInfomsg {
		return l, fmt.Errorf("tun: watch: short link message")
	}
	l.index = int32(binary.NativeEndian.Uint32(m.Data[4:8]))
	attrs, err := syscall.ParseNetlinkRouteAttr(&m)
	if err != nil {
		return l, fmt.Errorf("tun: watch: link attributes: %w", err)
	}
	for _, a := range attrs {
		switch a.Attr.Type {
		case unix.IFLA_IFNAME:
			l.name = strings.TrimRight(string(a.Value), "\x00")
		case unix.IFLA_LINK_NETNSID:
			if len(a.Value) >= 4 {
				l.netnsID = int32(binary.NativeEndian.Uint32(a.Value))
			}
		case unix.IFLA_LINKINFO:
			info, err := nl.ParseRouteAttr(a.Value)
			if err != nil {
				continue
			}
			for _, i := range info {
				if i.Attr.Type == unix.IFLA_INFO_KIND {
					l.kind = strings.TrimRight(string(i.Value), "\x00")
				}
			}
		}
	}
	return l, nil
}

// parseRoute returns the interfaces a route uses (its output interface and
// every multipath hop) and its destination, for messages.
func parseRoute(m syscall.NetlinkMessage) ([]int32, string, error) {
	if len(m.Data) < unix.SizeofRtMsg {
		return nil, "", fmt.Errorf("tun: watch: short route message")
	}
	family, dstLen := m.Data[0], m.Data[1]
	attrs, err := syscall.ParseNetlinkRouteAttr(&m)
	if err != nil {
		return nil, "", fmt.Errorf("tun: watch: route attributes: %w", err)
	}
	var idx []int32
	dst := "default"
	for _, a := range attrs {
		switch a.Attr.Type {
		case unix.RTA_OIF:
			if len(a.Value) >= 4 {
				idx = append(idx, int32(binary.NativeEndian.Uint32(a.Value)))
			}
		case unix.RTA_DST:
			if (family == unix.AF_INET && len(a.Value) == 4) || (family == unix.AF_INET6 && len(a.Value) == 16) {
				dst = fmt.Sprintf("%s/%d", net.IP(a.Value), dstLen)
			}
		case unix.RTA_MULTIPATH:
			// struct rtnexthop { u16 len; u8 flags; u8 hops; s32 ifindex; } + attributes
			b := a.Value
			for len(b) >= 8 {
				n := int(binary.NativeEndian.Uint16(b[0:2]))
				idx = append(idx, int32(binary.NativeEndian.Uint32(b[4:8])))
				step := (n + 3) &^ 3
				if n < 8 || step > len(b) {
					break
				}
				b = b[step:]
			}
		}
	}
	return idx, dst, nil
}
