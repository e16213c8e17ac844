// Package procattr attributes a flow the sandbox started to the process inside
// the sandbox that owns the socket.
//
// It owns two lookups. First, the socket: an inet_diag query (sock_diag over
// NETLINK_SOCK_DIAG) on a netlink socket that was created inside the
// sandbox's network namespace, so it answers about that namespace even though
// the Resolver runs on the host side. Second, the process: which process in
// the sandbox's network namespace has "socket:[inode]" in its descriptor
// table, answered from an index of those tables kept up to date incrementally
// (index.go), so its cost per flow does not grow with the sockets held.
//
// Lookups run in batches, one batch at a time, from a bounded queue
// (pool.go): by a worker goroutine (on its own thread, at a raised priority
// where allowed), and by callers waiting for an answer, which run their own
// lookup when no batch is running rather than wait for the worker to be
// scheduled. Start never blocks and starts no goroutine, and work that
// cannot be kept up with is answered "unknown: overloaded" instead of
// piling up. It must not enter namespaces, create the sandbox, log, or block a
// flow: every netlink exchange is bounded by Config.Timeout, every lookup by
// Config.MaxWait, and a failure is reported in Owner.Note, never as an error
// that could stop a flow.
package procattr
