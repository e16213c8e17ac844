package procattr

import (
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// DefaultTimeout bounds all netlink exchanges of one Lookup when
// Config.Timeout is zero.
const DefaultTimeout = 50 * time.Millisecond

// Config configures a Resolver. New copies it; later changes have no effect.
type Config struct {
	// DiagFD is a NETLINK_SOCK_DIAG socket created inside the sandbox's network
	// namespace (see OpenDiag); a netlink socket keeps the namespace it was
	// created in. Required. The Resolver owns it once New returns a nil error;
	// on error the caller still owns it.
	DiagFD int
	// NetNS is the inode of the sandbox's network namespace (the st_ino of
	// /proc/PID/ns/net, or N in its "net:[N]" link). Only processes in that
	// namespace are considered owners. 0 means consider every process, which
	// is slower and lets a host process holding a dup of the socket make the
	// answer ambiguous; set it in production.
	NetNS uint64
	// Proc is the procfs root. "" means "/proc". PIDs in Owner are as this
	// procfs shows them (host PIDs when it is the host's /proc).
	Proc string
	// Timeout bounds how long one Lookup waits for netlink replies, across
	// all its queries. 0 means DefaultTimeout (50ms); negative is an error.
	Timeout time.Duration
	// Queue bounds the lookups waiting for the worker; Start answers
	// "unknown: overloaded" at once when it is full. 0 means DefaultQueue
	// (4096); negative is an error.
	Queue int
	// MaxWait bounds how long a lookup may wait for the worker (in the
	// queue, or for the budget of expensive steps) before it is answered
	// "unknown: overloaded" without being run. 0 means DefaultMaxWait (1s);
	// negative is an error.
	MaxWait time.Duration
}

// Owner describes the process that owns a flow's socket. Fields that could not
// be determined are zero; Note says why.
type Owner struct {
	PID   int    // PID as Config.Proc shows it (host pid); 0 if unknown or ambiguous
	NSPID int    // PID inside the process's own pid namespace (last NSpid field); 0 if unknown
	Comm  string // /proc/PID/comm without the newline
	Exe   string // target of /proc/PID/exe; "" if unreadable
	UID   uint32 // socket owner uid from sock_diag, as the diag socket's user namespace sees it
	Inode uint64 // socket inode; 0 if the socket was not found
	// Note is "" when the answer is exact. Otherwise one of:
	//   "gone"                    the socket, or every process holding it, no longer exists
	//                             (or no process in Config.NetNS holds it)
	//   "ambiguous: pids 12,14"   several processes hold the socket; PID is 0
	//   "unknown: <why>"          the lookup failed (timeout, bad input, permissions...)
	Note string
}

// Note values and prefixes that callers may compare against.
const (
	NoteGone            = "gone"
	NoteAmbiguousPrefix = "ambiguous: pids "
	NoteUnknownPrefix   = "unknown: "
)

const (
	maxDeniedPIDsInNote  = 5
	defaultProcFSRoot    = "/proc"
	resolverClosedReason = "resolver closed"
)

// Resolver maps flows to owning processes. It is safe for concurrent use.
// Lookups run one batch at a time (see pool.go), so attribution takes at
// most one CPU however many flows arrive, and its expensive steps at most a
// share of that (see index.go); netlink replies are matched by sequence
// number.
type Resolver struct {
	timeout time.Duration
	maxWait time.Duration

	mu     sync.Mutex // guards fd, closed, buf and every netlink exchange
	fd     int
	closed bool
	buf    []byte // receive buffer for netlink replies
	seq    uint32
	stale  bool // an exchange may have left datagrams for drainLocked

	// The queue. qmu guards stopped, queue and Pending.queued.
	qmu      sync.Mutex
	stopped  bool
	queue    []*Pending // oldest first
	queueCap int
	// token is held (a value sent into it) by whoever runs a batch: the
	// worker or a waiting caller (see pool.go). It guards deferred, ix,
	// and the work state of every Pending.
	token      chan struct{}
	deferred   []*Pending // lookups waiting for hints or the budget
	wake       chan struct{}
	hints      chan hint
	workerHook atomic.Pointer[func()] // tests: runs each time the worker wakes, before a batch
	workerTID  atomic.Int32           // the worker's thread while it runs, else 0
	quit       chan struct{}
	workerDone chan struct{}
	pending    atomic.Int64
	gate       costGate // the worker's budget of expensive steps
	ix         *fdIndex // the worker's

	stats stats
}

// stats are the Resolver's counters. exact and dump count which lookup
// strategy found a socket; tests use them to verify the kernel's
// address-order quirks empirically.
type stats struct {
	exact [2]atomic.Uint64 // hits of the first and second exact-lookup order
	dump  atomic.Uint64    // hits of the dump fallback

	started, found, overloaded           atomic.Uint64
	discoveries, rescans, fdReads, dumps atomic.Uint64
	batches, deferred, cpu               atomic.Uint64
	newestLooks                          atomic.Uint64
}

// OpenDiag opens a NETLINK_SOCK_DIAG socket in the calling thread's current
// network namespace. Call it inside the sandbox's namespace and pass the fd
// to the host side (for example over SCM_RIGHTS) for Config.DiagFD.
func OpenDiag() (int, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.NETLINK_SOCK_DIAG)
	if err != nil {
		return -1, fmt.Errorf("procattr: open sock_diag socket: %w", err)
	}
	return fd, nil
}

// New validates cfg and returns a Resolver that owns cfg.DiagFD.
func New(cfg Config) (*Resolver, error) {
	if cfg.DiagFD < 0 {
		return nil, fmt.Errorf("procattr: DiagFD %d is not a file descriptor", cfg.DiagFD)
	}
	dom, err := unix.GetsockoptInt(cfg.DiagFD, unix.SOL_SOCKET, unix.SO_DOMAIN)
	if err != nil {
		return nil, fmt.Errorf("procattr: DiagFD %d: SO_DOMAIN: %w", cfg.DiagFD, err)
	}
	proto, err := unix.GetsockoptInt(cfg.DiagFD, unix.SOL_SOCKET, unix.SO_PROTOCOL)
	if err != nil {
		return nil, fmt.Errorf("procattr: DiagFD %d: SO_PROTOCOL: %w", cfg.DiagFD, err)
	}
	if dom != unix.AF_NETLINK || proto != unix.NETLINK_SOCK_DIAG {
		return nil, fmt.Errorf("procattr: DiagFD %d is not a NETLINK_SOCK_DIAG socket (domain %d, protocol %d)", cfg.DiagFD, dom, proto)
	}
	if cfg.Timeout < 0 {
		return nil, fmt.Errorf("procattr: negative Timeout %v", cfg.Timeout)
	}
	if cfg.Queue < 0 {
		return nil, fmt.Errorf("procattr: negative Queue %d", cfg.Queue)
	}
	if cfg.MaxWait < 0 {
		return nil, fmt.Errorf("procattr: negative MaxWait %v", cfg.MaxWait)
	}
	if cfg.Proc == "" {
		cfg.Proc = defaultProcFSRoot
	}
	fi, err := os.Stat(cfg.Proc)
	if err != nil {
		return nil, fmt.Errorf("procattr: procfs root: %w", err)
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("procattr: procfs root %s is not a directory", cfg.Proc)
	}
	return newResolver(cfg), nil
}

// newResolver builds a Resolver and starts its worker without validating
// the socket; New validates.
func newResolver(cfg Config) *Resolver {
	if cfg.Timeout == 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.Proc == "" {
		cfg.Proc = defaultProcFSRoot
	}
	if cfg.Queue == 0 {
		cfg.Queue = DefaultQueue
	}
	if cfg.MaxWait == 0 {
		cfg.MaxWait = DefaultMaxWait
	}
	r := &Resolver{
		timeout:    cfg.Timeout,
		maxWait:    cfg.MaxWait,
		fd:         cfg.DiagFD,
		buf:        make([]byte, recvBufSize),
		queueCap:   cfg.Queue,
		token:      make(chan struct{}, 1),
		wake:       make(chan struct{}, 1),
		hints:      make(chan hint, hintQueue),
		quit:       make(chan struct{}),
		workerDone: make(chan struct{}),
	}
	r.ix = newFDIndex(procTable{root: cfg.Proc, netns: cfg.NetNS, scope: newScopeCache()}, &r.gate, &r.stats)
	r.ix.quit = r.quit
	go r.runWorker()
	return r
}

// Close stops the worker (lookups still queued are answered "unknown:
// resolver closed") and closes the diag socket. It is idempotent; lookups
// after Close report "unknown: resolver closed".
func (r *Resolver) Close() error {
	r.qmu.Lock()
	if !r.stopped {
		r.stopped = true
		close(r.quit)
	}
	r.qmu.Unlock()
	<-r.workerDone

	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil
	}
	r.closed = true
	if err := unix.Close(r.fd); err != nil {
		return fmt.Errorf("procattr: close diag socket: %w", err)
	}
	return nil
}

// Lookup finds the owner of the sandbox's socket for a flow and waits for
// the answer. proto is "tcp" or "udp"; local is the sandbox side (the flow's
// source), remote the destination the sandbox asked for. IPv4-mapped IPv6
// addresses are treated as IPv4.
//
// Waiting for netlink replies is bounded by Config.Timeout (a reply already
// queued is read even after the deadline), and waiting for the worker by
// Config.MaxWait. The procfs work costs, per flow, about one readlink of the
// socket's descriptor (see index.go), whatever the number of descriptors the
// process holds. Lookup never fails: problems are reported in Owner.Note.
func (r *Resolver) Lookup(proto string, local, remote netip.AddrPort) Owner {
	p := r.Start(proto, local, remote)
	<-p.Done()
	o, _ := p.Owner()
	return o
}

func unknown(why string) Owner { return Owner{Note: NoteUnknownPrefix + why} }

func unmapAddrPort(ap netip.AddrPort) netip.AddrPort {
	if !ap.IsValid() {
		return ap
	}
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}

// ambiguousNote formats the Note for several holders, lowest pid first.
func ambiguousNote(pids []int) string {
	var b strings.Builder
	b.WriteString(NoteAmbiguousPrefix)
	for i, p := range pids {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(p))
	}
	return b.String()
}
