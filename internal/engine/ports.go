package engine

import (
	"context"
	"net"
	"net/netip"

	"github.com/tunwall/tunwall/dnsintercept"
	"github.com/tunwall/tunwall/internal/audit"
	"github.com/tunwall/tunwall/internal/procattr"
	"github.com/tunwall/tunwall/internal/socks5"
)

// The engine's view of what it calls. The concrete types cmd/tunwall wires
// in satisfy them (checked below); unit tests pass fakes. Each is declared
// here, where it is used, with only the methods the engine calls.

// Resolver resolves allowed names to real addresses at dial time and
// answers the DNS record types that are not answered locally (through the
// DNS server, dnsintercept.Forwarder). It must be safe for concurrent use.
type Resolver interface {
	// Resolve returns name's addresses, or an error saying why there are
	// none (a *dnsintercept.RcodeError, dnsintercept.ErrNoAddresses, a
	// timeout). The engine checks every address with the rebinding guard
	// before it dials it.
	Resolve(ctx context.Context, name string) ([]netip.Addr, error)
	// Search returns the host's search list, under which a name the
	// client writes short is the connection's name; the caller must not
	// modify it.
	Search() []string
	dnsintercept.Forwarder
}

// Upstream carries allowed flows through a proxy (an --upstream SOCKS5
// proxy). It is sent the address the engine resolved and checked, never a
// name. It must be safe for concurrent use.
type Upstream interface {
	// DialContext connects to addr ("ip:port") through the proxy; a
	// refusal by the proxy is a *socks5.ReplyError.
	DialContext(ctx context.Context, network, addr string) (net.Conn, error)
	// DialUDP associates with addr ("ip:port") through the proxy.
	DialUDP(ctx context.Context, addr string) (net.Conn, error)
}

// Recorder is the audit log (an *audit.Writer). Its methods must be safe for
// concurrent use.
type Recorder interface {
	// Admit reports whether new work may start: nil, or why not (the log
	// cannot be written, a size or rate bound). The engine denies new
	// flows and DNS queries while it is not nil (fail closed).
	Admit() error
	// Write queues a record; it never fails (Admit reports failures).
	Write(audit.Record)
	// Commit queues a record and returns a channel that receives nil once
	// it is in the file, or why it never will be. The engine dials an
	// allowed flow only after its start record is committed.
	Commit(audit.Record) <-chan error
}

// Attributor finds the process behind a flow (a *procattr.Resolver). Start
// must not block: it queues the lookup and returns at once.
type Attributor interface {
	Start(proto string, local, remote netip.AddrPort) *procattr.Pending
	// StartWaited is Start for a lookup the caller waits for within
	// moments (a TCP flow's handshake does): it need not wake a worker of
	// its own for it.
	StartWaited(proto string, local, remote netip.AddrPort) *procattr.Pending
	// TCPSocketGone reports whether the sandbox's TCP socket local->remote
	// no longer exists; ok is false when it cannot tell.
	TCPSocketGone(local, remote netip.AddrPort) (gone, ok bool)
}

var (
	_ Resolver   = (*dnsintercept.Resolver)(nil)
	_ Recorder   = (*audit.Writer)(nil)
	_ Attributor = (*procattr.Resolver)(nil)
	_ Upstream   = (*socks5.Dialer)(nil)
)
