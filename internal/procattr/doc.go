// Package procattr attributes a flow the sandbox started to the process inside
// the sandbox that owns the socket.
//
// It owns two lookups. First, the socket: an inet_diag query (sock_diag over
// NETLINK_SOCK_DIAG) on a netlink socket that was created inside the
// sandbox's network namespace, so it answers about that namespace even though
// the Resolver runs on the host side. Second, the process: a scan of procfs
// for the processes in the sandbox's network namespace whose fd table holds
// "socket:[inode]".
//
// It must not enter namespaces, create the sandbox, log, or block a flow for
// long: every netlink exchange is bounded by Config.Timeout, and a failure is
// reported in Owner.Note, never as an error that could stop a flow.
package procattr
