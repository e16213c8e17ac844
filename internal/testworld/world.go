// Package testworld builds the isolated network that tunwall's integration
// tests, benchmarks and demo run in (ARCHITECTURE.md, "The test world"): an
// agent network namespace, where tunwall runs and dials from, and a world
// namespace whose servers listen on 192.0.2.0/24 and 2001:db8::/32 addresses,
// joined by a veth pair, with no route anywhere else. No packet can leave the
// machine: neither namespace has an interface to the host's network.
//
// The servers run as goroutines of the calling process on sockets created
// inside the world (or agent) namespace; they log every arrival so a test
// can prove that a connection it expected to be stopped never arrived.
//
// It needs root (real, or in a user namespace of its own with a mount
// namespace, as `make demo` arranges).
package testworld

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Addresses of the test world. Everything a sandbox may be allowed to reach
// is in the documentation ranges; the rest exist to prove they are never
// reached.
var (
	Web4    = netip.MustParseAddr("192.0.2.10") // HTTP :80, HTTPS :443 for allowed names
	Web6    = netip.MustParseAddr("2001:db8::10")
	API4    = netip.MustParseAddr("192.0.2.11") // a second web host
	API6    = netip.MustParseAddr("2001:db8::11")
	Echo4   = netip.MustParseAddr("192.0.2.20") // TCP/UDP echo :7, TCP sink :9, TCP source :19, request/response :80
	Echo6   = netip.MustParseAddr("2001:db8::20")
	Refuse4 = netip.MustParseAddr("192.0.2.30") // routed, nothing listens: connections are refused
	Refuse6 = netip.MustParseAddr("2001:db8::30")
	// Blackhole4 and Blackhole6 drop every packet without an answer (a
	// vanished host): the agent routes them via a neighbour whose MAC no
	// interface has, so the world's veth discards the frames. Connects to
	// them hang until they time out.
	Blackhole4 = netip.MustParseAddr("192.0.2.77")
	Blackhole6 = netip.MustParseAddr("2001:db8::77")
	DNS4       = netip.MustParseAddr("192.0.2.53") // the world's resolver (UDP and TCP :53), with a query log
	DNS6       = netip.MustParseAddr("2001:db8::53")
	Evil4      = netip.MustParseAddr("192.0.2.66") // the collector: logs every arrival on any port we listen on
	Evil6      = netip.MustParseAddr("2001:db8::66")
	Metadata4  = netip.MustParseAddr("169.254.169.254") // served in the world; must never be dialled
	Private4   = netip.MustParseAddr("10.0.0.5")        // RFC 1918, served in the world; must never be dialled

	AgentVeth4 = netip.MustParseAddr("10.77.0.1") // the agent's own address (a logging server listens on it)
	WorldVeth4 = netip.MustParseAddr("10.77.0.2")
	AgentVeth6 = netip.MustParseAddr("fd00:77::1")
	WorldVeth6 = netip.MustParseAddr("fd00:77::2")

	agentMAC = "02:00:00:77:00:01"
	worldMAC = "02:00:00:77:00:02"
	// blackholeGW4/6 are the blackholes' gateway: a static neighbour with
	// blackholeMAC, which nothing has.
	blackholeGW4 = "10.77.1.1"
	blackholeGW6 = "fd00:77::99"
	blackholeMAC = "02:00:00:77:00:99"

	// AgentLocalPort is where the agent-side logging servers listen, on
	// 127.0.0.1, ::1 and AgentVeth4.
	AgentLocalPort = 8081
)

// Options configures New.
type Options struct {
	// Logf receives each command run (nil: silent).
	Logf func(format string, args ...any)
	// Names is extra DNS data for the world's resolver, name -> addresses.
	Names map[string][]netip.Addr
}

// World is a running test world.
type World struct {
	ID      string // random suffix shared by its namespace names
	AgentNS string // network namespace names (ip netns)
	WorldNS string

	logf     func(string, ...any)
	worldFD  int
	agentFD  int
	closers  []func()
	mu       sync.Mutex
	arrivals []Arrival

	DNS *DNSServer
	CA  *CA
}

// Arrival is one connection or datagram a logging server saw.
type Arrival struct {
	Server string // e.g. "evil", "metadata", "agent-lo"
	Proto  string
	Local  netip.AddrPort
	Remote netip.AddrPort
	Host   string // HTTP Host (proto "http", "https") or TLS SNI (proto "tls") if any
	Time   time.Time
}

// New builds a world. Call Close (or use NewT) to remove it.
func New(opts Options) (_ *World, err error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("testworld: needs root (real, or in a user namespace with a mount namespace)")
	}
	idb := make([]byte, 4)
	rand.Read(idb)
	id := hex.EncodeToString(idb)
	w := &World{
		ID:      id,
		AgentNS: "twa-" + id,
		WorldNS: "tww-" + id,
		logf:    opts.Logf,
		worldFD: -1,
		agentFD: -1,
	}
	if w.logf == nil {
		w.logf = func(string, ...any) {}
	}
	defer func() {
		if err != nil {
			w.Close()
		}
	}()
	vethA, vethW := "twa"+id, "tww"+id
	steps := [][]string{
		{"ip", "netns", "add", w.AgentNS},
		{"ip", "netns", "add", w.WorldNS},
	}
	if err := w.runAll(steps); err != nil {
		return nil, err
	}
	w.closers = append(w.closers, func() {
		exec.Command("ip", "netns", "del", w.AgentNS).Run()
		exec.Command("ip", "netns", "del", w.WorldNS).Run()
	})
	steps = w.networkSteps(vethA, vethW)
	if err := w.runAll(steps); err != nil {
		return nil, err
	}
	if w.worldFD, err = unix.Open("/run/netns/"+w.WorldNS, unix.O_RDONLY|unix.O_CLOEXEC, 0); err != nil {
		return nil, fmt.Errorf("testworld: open world netns: %w", err)
	}
	if w.agentFD, err = unix.Open("/run/netns/"+w.AgentNS, unix.O_RDONLY|unix.O_CLOEXEC, 0); err != nil {
		return nil, fmt.Errorf("testworld: open agent netns: %w", err)
	}
	if w.CA, err = NewCA(); err != nil {
		return nil, err
	}
	if err := w.startServers(opts); err != nil {
		return nil, err
	}
	return w, nil
}

// networkSteps are the ip commands that join the agent and world
// namespaces by the veth pair vethA-vethW, give the world its servers'
// addresses, and route the agent to the test world only (plus the
// single forbidden and blackholed addresses tests aim at).
func (w *World) networkSteps(vethA, vethW string) [][]string {
	a := func(args ...string) []string { return append([]string{"ip", "-n", w.AgentNS}, args...) }
	wo := func(args ...string) []string { return append([]string{"ip", "-n", w.WorldNS}, args...) }
	steps := [][]string{
		a("link", "add", vethA, "address", agentMAC, "type", "veth", "peer", "name", vethW, "address", worldMAC, "netns", w.WorldNS),
		a("link", "set", "lo", "up"),
		wo("link", "set", "lo", "up"),
		a("addr", "add", AgentVeth4.String()+"/30", "dev", vethA),
		a("addr", "add", AgentVeth6.String()+"/64", "dev", vethA, "nodad"),
		wo("addr", "add", WorldVeth4.String()+"/30", "dev", vethW),
		wo("addr", "add", WorldVeth6.String()+"/64", "dev", vethW, "nodad"),
		a("link", "set", vethA, "up", "mtu", "65520"),
		wo("link", "set", vethW, "up", "mtu", "65520"),
		// Static neighbours: no ARP/NDP round trip, and no SYN lost while a
		// freshly made link's addresses are still tentative.
		a("neigh", "replace", WorldVeth4.String(), "lladdr", worldMAC, "dev", vethA, "nud", "permanent"),
		a("neigh", "replace", WorldVeth6.String(), "lladdr", worldMAC, "dev", vethA, "nud", "permanent"),
		wo("neigh", "replace", AgentVeth4.String(), "lladdr", agentMAC, "dev", vethW, "nud", "permanent"),
		wo("neigh", "replace", AgentVeth6.String(), "lladdr", agentMAC, "dev", vethW, "nud", "permanent"),
	}
	for _, ip := range []netip.Addr{Web4, API4, Echo4, Refuse4, DNS4, Evil4, Metadata4, Private4} {
		steps = append(steps, wo("addr", "add", ip.String()+"/32", "dev", "lo"))
	}
	for _, ip := range []netip.Addr{Web6, API6, Echo6, Refuse6, DNS6, Evil6} {
		steps = append(steps, wo("addr", "add", ip.String()+"/128", "dev", "lo", "nodad"))
	}
	// The agent reaches only the test world, plus single forbidden
	// addresses that a test proves are never dialled.
	steps = append(steps,
		a("route", "add", "192.0.2.0/24", "via", WorldVeth4.String()),
		a("route", "add", Metadata4.String()+"/32", "via", WorldVeth4.String()),
		a("route", "add", Private4.String()+"/32", "via", WorldVeth4.String()),
		a("-6", "route", "add", "2001:db8::/32", "via", WorldVeth6.String()),
		a("neigh", "replace", blackholeGW4, "lladdr", blackholeMAC, "dev", vethA, "nud", "permanent"),
		a("route", "add", Blackhole4.String()+"/32", "via", blackholeGW4, "dev", vethA, "onlink"),
		a("neigh", "replace", blackholeGW6, "lladdr", blackholeMAC, "dev", vethA, "nud", "permanent"),
		a("-6", "route", "add", Blackhole6.String()+"/128", "via", blackholeGW6, "dev", vethA),
	)
	return steps
}

func (w *World) runAll(steps [][]string) error {
	for _, s := range steps {
		w.logf("+ %s", strings.Join(s, " "))
		out, err := exec.Command(s[0], s[1:]...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("testworld: %s: %v: %s", strings.Join(s, " "), err, bytes.TrimSpace(out))
		}
	}
	return nil
}

// Close stops every server and removes both namespaces.
func (w *World) Close() {
	for i := len(w.closers) - 1; i >= 0; i-- {
		w.closers[i]()
	}
	w.closers = nil
	if w.worldFD >= 0 {
		unix.Close(w.worldFD)
		w.worldFD = -1
	}
	if w.agentFD >= 0 {
		unix.Close(w.agentFD)
		w.agentFD = -1
	}
}

// inNS runs fn on a thread that has joined netns fd. The thread is never
// unlocked, so it is retired when fn returns and no other goroutine ever runs
// in the namespace by accident. Sockets fn creates stay in the namespace.
func inNS(fd int, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("testworld: setns: %w", err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// InWorld runs fn inside the world namespace (to create sockets there).
func (w *World) InWorld(fn func() error) error { return inNS(w.worldFD, fn) }

// InAgent runs fn inside the agent namespace.
func (w *World) InAgent(fn func() error) error { return inNS(w.agentFD, fn) }

// Listen creates a listener in the world namespace.
func (w *World) Listen(network, addr string) (l net.Listener, err error) {
	err = w.InWorld(func() error {
		l, err = net.Listen(network, addr)
		return err
	})
	return l, err
}

// ListenPacket creates a packet listener in the world namespace.
func (w *World) ListenPacket(network, addr string) (c net.PacketConn, err error) {
	err = w.InWorld(func() error {
		c, err = net.ListenPacket(network, addr)
		return err
	})
	return c, err
}

// AgentCommand returns a command that runs in the agent namespace.
func (w *World) AgentCommand(ctx context.Context, name string, args ...string) *exec.Cmd {
	full := append([]string{"netns", "exec", w.AgentNS, name}, args...)
	w.logf("+ ip netns exec %s %s %s", w.AgentNS, name, strings.Join(args, " "))
	return exec.CommandContext(ctx, "ip", full...)
}

// WorldCommand returns a command that runs in the world namespace.
func (w *World) WorldCommand(ctx context.Context, name string, args ...string) *exec.Cmd {
	full := append([]string{"netns", "exec", w.WorldNS, name}, args...)
	w.logf("+ ip netns exec %s %s %s", w.WorldNS, name, strings.Join(args, " "))
	return exec.CommandContext(ctx, "ip", full...)
}

func (w *World) record(a Arrival) {
	a.Time = time.Now()
	w.mu.Lock()
	w.arrivals = append(w.arrivals, a)
	w.mu.Unlock()
}

// Arrivals returns what the logging servers named server saw ("" for all).
func (w *World) Arrivals(server string) []Arrival {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []Arrival
	for _, a := range w.arrivals {
		if server == "" || a.Server == server {
			out = append(out, a)
		}
	}
	return out
}

// ResetArrivals forgets every arrival seen so far.
func (w *World) ResetArrivals() {
	w.mu.Lock()
	w.arrivals = nil
	w.mu.Unlock()
}
