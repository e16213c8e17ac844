package main

import (
	"flag"
	"fmt"
	"net/netip"
	"runtime/debug"
	"strconv"
	"time"

	"github.com/tunwall/tunwall/stack"
)

// limitFlags are the resource limits of a served sandbox (README: "Limits
// on what a sandbox can make tunwall hold").
type limitFlags struct {
	maxTCP        int
	maxUDP        int
	maxHandshakes int
	handshake     time.Duration
	maxMemory     byteSize
}

const (
	defaultMaxFlows  = 16384
	defaultMaxMemory = 256 << 20
)

const defaultHandshakeTimeout = 5 * time.Second

func (l *limitFlags) register(fs *flag.FlagSet) {
	fs.IntVar(&l.maxTCP, "max-tcp-flows", defaultMaxFlows, "most concurrent TCP connections from the sandbox (DNS over TCP included); beyond, a SYN is reset")
	fs.IntVar(&l.maxUDP, "max-udp-sessions", defaultMaxFlows, "most concurrent UDP sessions from the sandbox (DNS included); beyond, ICMP port unreachable")
	fs.IntVar(&l.maxHandshakes, "max-tcp-handshakes", defaultMaxFlows, "most TCP connections being dialled or in their handshake at once; beyond, a SYN is reset")
	fs.DurationVar(&l.handshake, "tcp-handshake-timeout", defaultHandshakeTimeout, "how long the sandbox has to complete a TCP handshake tunwall answered")
	l.maxMemory = defaultMaxMemory
	fs.Var(&l.maxMemory, "max-memory", "tunwall's memory target `SIZE` (bytes, KiB, MiB, GiB; e.g. 256MiB): flow buffers share a sixteenth of it and shrink as flows grow; the name checks hold at most a sixteenth of it; new flows are refused while live memory is above 3/4 of it; the Go runtime's soft limit is 7/8 of it")
}

func (l *limitFlags) check() error {
	switch {
	case l.maxTCP < 1:
		return fmt.Errorf("--max-tcp-flows %d: want at least 1", l.maxTCP)
	case l.maxUDP < 1:
		return fmt.Errorf("--max-udp-sessions %d: want at least 1", l.maxUDP)
	case l.maxHandshakes < 1:
		return fmt.Errorf("--max-tcp-handshakes %d: want at least 1", l.maxHandshakes)
	case l.handshake < 100*time.Millisecond:
		return fmt.Errorf("--tcp-handshake-timeout %v: want at least 100ms", l.handshake)
	case l.maxMemory < 32<<20:
		return fmt.Errorf("--max-memory %v: want at least 32MiB", &l.maxMemory)
	}
	return nil
}

// stackConfig fills the stack's limits; sources are the sandbox's own
// addresses, the only ones its packets may come from.
func (l *limitFlags) stackConfig(cfg *stack.Config, sources ...netip.Prefix) {
	cfg.Sources = sources
	cfg.MaxTCPFlows = l.maxTCP
	cfg.MaxUDPSessions = l.maxUDP
	cfg.MaxInFlightTCP = l.maxHandshakes
	cfg.HandshakeTimeout = l.handshake
	cfg.BufferBudget = int(l.maxMemory / 16)
	cfg.MemoryLimit = int64(l.maxMemory)
}

// applyMemoryLimit sets the Go runtime's soft memory limit: as tunwall
// nears it, garbage is collected harder. A backstop; the bounds themselves
// are the flow limits and the buffer budget.
func (l *limitFlags) applyMemoryLimit() {
	debug.SetMemoryLimit(int64(l.maxMemory - l.maxMemory/8))
}

func (l *limitFlags) knobs(k map[string]string) {
	k["max_tcp_flows"] = strconv.Itoa(l.maxTCP)
	k["max_udp_sessions"] = strconv.Itoa(l.maxUDP)
	k["max_tcp_handshakes"] = strconv.Itoa(l.maxHandshakes)
	k["tcp_handshake_timeout"] = l.handshake.String()
	k["max_memory"] = strconv.FormatInt(int64(l.maxMemory), 10)
}

// limitSummary is what the end-of-run summary says about packets and flows
// the stack dropped or refused.
func limitSummary(st stack.Stats, refusedUnrecorded uint64) []string {
	var out []string
	if st.ForeignSource > 0 {
		out = append(out, fmt.Sprintf("dropped %d packets whose source address is not the sandbox's", st.ForeignSource))
	}
	if st.TCPLimitReset > 0 {
		out = append(out, fmt.Sprintf("reset %d SYNs: too many concurrent TCP flows (--max-tcp-flows)", st.TCPLimitReset))
	}
	if st.TCPInFlightReset > 0 {
		out = append(out, fmt.Sprintf("reset %d SYNs: too many TCP handshakes already in progress (--max-tcp-handshakes)", st.TCPInFlightReset))
	}
	if st.UDPLimitRefused > 0 {
		out = append(out, fmt.Sprintf("refused %d UDP sessions: too many concurrent sessions (--max-udp-sessions)", st.UDPLimitRefused))
	}
	if st.MemoryRefused > 0 {
		out = append(out, fmt.Sprintf("refused %d flows: tunwall's memory was near --max-memory", st.MemoryRefused))
	}
	if st.HandshakeTimeouts > 0 {
		out = append(out, fmt.Sprintf("%d TCP handshakes were not completed by the sandbox within --tcp-handshake-timeout", st.HandshakeTimeouts))
	}
	if refusedUnrecorded > 0 {
		out = append(out, fmt.Sprintf("%d refused flows were counted but not recorded one by one (too many at once)", refusedUnrecorded))
	}
	return out
}
