package tun

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/tunwall/tunwall/internal/netplan"
)

// Defaults for the sandbox side of the TUN: the address plan's (package
// netplan declares it, with the fake-IP pools and the virtual resolver).
var (
	DefaultAddr4 = netplan.Default.Addr4
	DefaultAddr6 = netplan.Default.Addr6
)

// DefaultMTU is the TUN MTU. A large MTU is the cheapest throughput lever on a
// TUN without offloads: every packet costs a read/write syscall and a trip
// through gVisor, so fewer, larger packets cost far less CPU per byte.
const DefaultMTU = 65520

// Config describes the TUN to create. The zero value of each field means its
// default.
type Config struct {
	Name     string       // interface name; "" means "tun0"
	MTU      int          // 0 means DefaultMTU
	Addr4    netip.Prefix // sandbox IPv4 address; zero means DefaultAddr4
	Addr6    netip.Prefix // sandbox IPv6 address; zero means DefaultAddr6
	TxQueue  int          // device transmit queue length; 0 means 1000
	NoRoutes bool         // do not add default routes (tests only)
}

func (c *Config) setDefaults() {
	if c.Name == "" {
		c.Name = "tun0"
	}
	if c.MTU == 0 {
		c.MTU = DefaultMTU
	}
	if !c.Addr4.IsValid() {
		c.Addr4 = DefaultAddr4
	}
	if !c.Addr6.IsValid() {
		c.Addr6 = DefaultAddr6
	}
	if c.TxQueue == 0 {
		c.TxQueue = 1000
	}
}

// ErrNoTUN is returned when /dev/net/tun cannot be opened.
var ErrNoTUN = errors.New("cannot open /dev/net/tun")

// Setup creates the TUN device in the network namespace of the calling OS
// thread, brings lo and the TUN up, gives the TUN cfg's addresses and makes it
// the default route for IPv4 and IPv6. It returns the TUN's file descriptor
// (close-on-exec, blocking); the caller owns it. The device disappears when
// the last descriptor for it is closed: that is what makes tunwall fail
// closed.
//
// The caller must have locked the OS thread (runtime.LockOSThread) if the
// thread's network namespace differs from the process's.
func Setup(cfg Config) (fd int, err error) {
	cfg.setDefaults()
	if !cfg.Addr4.Addr().Is4() || !cfg.Addr6.Addr().Is6() || cfg.Addr6.Addr().Is4In6() {
		return -1, fmt.Errorf("tun: Addr4 must be IPv4 and Addr6 IPv6 (got %v, %v)", cfg.Addr4, cfg.Addr6)
	}
	if cfg.MTU < 1280 || cfg.MTU > 65535 {
		return -1, fmt.Errorf("tun: MTU %d out of range 1280-65535", cfg.MTU)
	}

	h, err := netlink.NewHandle()
	if err != nil {
		return -1, fmt.Errorf("tun: netlink: %w", err)
	}
	defer h.Close()

	lo, err := h.LinkByName("lo")
	if err != nil {
		return -1, fmt.Errorf("tun: find lo: %w", err)
	}
	if err := h.LinkSetUp(lo); err != nil {
		return -1, fmt.Errorf("tun: bring lo up: %w", err)
	}

	fd, name, err := open(cfg.Name)
	if err != nil {
		return -1, err
	}
	defer func() {
		if err != nil {
			unix.Close(fd)
			fd = -1
		}
	}()
	link, err := h.LinkByName(name)
	if err != nil {
		return -1, fmt.Errorf("tun: find %s: %w", name, err)
	}
	if err := configure(h, link, cfg); err != nil {
		return -1, err
	}
	if cfg.NoRoutes {
		return fd, nil
	}
	if err := addDefaultRoutes(h, link, cfg); err != nil {
		return -1, err
	}
	return fd, nil
}

// VnetHdrSize is the size of the virtio-net header (struct virtio_net_hdr,
// linux/virtio_net.h) that precedes every packet read from or written to a
// TUN opened by Setup.
const VnetHdrSize = 10

// Offloads the TUN lets the sandbox's kernel leave to tunwall (TUNSETOFFLOAD,
// linux/if_tun.h): partial checksums and TCP segments larger than the MTU
// (TSO), both described by the virtio-net header. Without them the sandbox's
// kernel copies every large TCP segment into one linear buffer and checksums
// it in software before handing it to the TUN.
const (
	tunFCsum = 0x01 // TUN_F_CSUM
	tunFTSO4 = 0x02 // TUN_F_TSO4
	tunFTSO6 = 0x04 // TUN_F_TSO6

	offloads = tunFCsum | tunFTSO4 | tunFTSO6
)

// open creates the TUN device (name, or one the kernel names when empty)
// with a virtio-net header on every packet (IFF_VNET_HDR) and the offloads
// above, and returns a blocking, close-on-exec descriptor of it that the
// caller owns, and the device's name.
func open(name string) (fd int, ifname string, err error) {
	fd, err = unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, "", explainOpenError(err)
	}
	defer func() {
		if err != nil {
			unix.Close(fd)
			fd = -1
		}
	}()
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		return -1, "", fmt.Errorf("tun: interface name %q: %w", name, err)
	}
	ifr.SetUint16(unix.IFF_TUN | unix.IFF_NO_PI | unix.IFF_VNET_HDR)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		return -1, "", explainOpenError(err)
	}
	if err := unix.IoctlSetPointerInt(fd, unix.TUNSETVNETHDRSZ, VnetHdrSize); err != nil {
		return -1, "", fmt.Errorf("tun: TUNSETVNETHDRSZ: %w", err)
	}
	if err := unix.IoctlSetInt(fd, unix.TUNSETOFFLOAD, offloads); err != nil {
		return -1, "", fmt.Errorf("tun: TUNSETOFFLOAD: %w", err)
	}
	return fd, ifr.Name(), nil
}

// configure sets the TUN's MTU, queue length and addresses, and brings it
// up.
func configure(h *netlink.Handle, link netlink.Link, cfg Config) error {
	if err := h.LinkSetMTU(link, cfg.MTU); err != nil {
		return fmt.Errorf("tun: set MTU %d: %w", cfg.MTU, err)
	}
	if err := h.LinkSetTxQLen(link, cfg.TxQueue); err != nil {
		return fmt.Errorf("tun: set txqueuelen: %w", err)
	}
	for _, p := range []netip.Prefix{cfg.Addr4, cfg.Addr6} {
		a := &netlink.Addr{IPNet: prefixToIPNet(p)}
		if p.Addr().Is6() {
			// A TUN has no neighbours: skip duplicate address detection so
			// the address is usable at once, not after a second or two.
			a.Flags = unix.IFA_F_NODAD
		}
		if err := h.AddrAdd(link, a); err != nil {
			return fmt.Errorf("tun: add address %v: %w", p, err)
		}
	}
	if err := h.LinkSetUp(link); err != nil {
		return fmt.Errorf("tun: bring %s up: %w", cfg.Name, err)
	}
	return nil
}

// addDefaultRoutes makes the TUN the default route for IPv4 and IPv6, from
// its own addresses.
func addDefaultRoutes(h *netlink.Handle, link netlink.Link, cfg Config) error {
	for _, def := range []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")} {
		src := cfg.Addr4.Addr()
		if def.Addr().Is6() {
			src = cfg.Addr6.Addr()
		}
		r := &netlink.Route{
			LinkIndex: link.Attrs().Index,
			Dst:       prefixToIPNet(def),
			Src:       net.IP(src.AsSlice()),
			Scope:     netlink.SCOPE_UNIVERSE,
			MTU:       cfg.MTU,
		}
		if err := h.RouteAdd(r); err != nil {
			return fmt.Errorf("tun: add default route %v via %s: %w", def, cfg.Name, err)
		}
	}
	return nil
}

func explainOpenError(err error) error {
	switch {
	case errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENODEV):
		return fmt.Errorf("%w: %v (the tun kernel module is missing: run 'modprobe tun' as root)", ErrNoTUN, err)
	case errors.Is(err, unix.EACCES):
		return fmt.Errorf("%w: %v (make it usable by your user: 'sudo chmod 0666 /dev/net/tun', the default on most distributions)", ErrNoTUN, err)
	case errors.Is(err, unix.EPERM):
		return fmt.Errorf("%w: %v (creating a TUN needs CAP_NET_ADMIN in the sandbox's user namespace; if user namespaces are restricted, e.g. by AppArmor's kernel.apparmor_restrict_unprivileged_userns=1, allow them for tunwall)", ErrNoTUN, err)
	}
	return fmt.Errorf("%w: %v", ErrNoTUN, err)
}

func prefixToIPNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: net.IP(p.Addr().AsSlice()), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}
