package main

import (
	"flag"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/tunwall/tunwall/internal/session"
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
	defaultMaxFlows         = session.DefaultMaxFlows
	defaultMaxMemory        = session.DefaultMaxMemory
	defaultHandshakeTimeout = session.DefaultHandshakeTimeout
)

func (l *limitFlags) register(fs *flag.FlagSet) {
	fs.IntVar(&l.maxTCP, "max-tcp-flows", defaultMaxFlows, "most concurrent TCP connections from the sandbox (DNS over TCP included); beyond, a SYN is reset")
	fs.IntVar(&l.maxUDP, "max-udp-sessions", defaultMaxFlows, "most concurrent UDP sessions from the sandbox (DNS included); beyond, ICMP port unreachable")
	fs.IntVar(&l.maxHandshakes, "max-tcp-handshakes", defaultMaxFlows, "most TCP connections being dialled or in their handshake at once; beyond, a SYN is reset")
	fs.DurationVar(&l.handshake, "tcp-handshake-timeout", defaultHandshakeTimeout, "how long the sandbox has to complete a TCP handshake tunwall answered")
	l.maxMemory = defaultMaxMemory
	fs.Var(&l.maxMemory, "max-memory", "tunwall's memory target `SIZE` (bytes, KiB, MiB, GiB; e.g. 256MiB): flow buffers share a sixteenth of it and shrink as flows grow; the name checks hold at most a sixteenth of it; new flows are refused while live memory is above 5/8 of it; the Go runtime's soft limit is 3/4 of it")
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

// applyMemoryLimit sets the Go runtime's soft memory limit: as tunwall
// nears it, garbage is collected harder. A backstop; the bounds themselves
// are the flow limits and the buffer budget. Three quarters of the target:
// the rest is for what the runtime does not count (the binary's pages,
// about 14 MiB) and for its overshoot while a burst allocates faster than
// it collects (at 7/8, 16,000 flows sending endless request tokens peaked
// at 264 MiB RSS under a 256 MiB target).
func (l *limitFlags) applyMemoryLimit() {
	debug.SetMemoryLimit(int64(l.maxMemory / 4 * 3))
}
