// Package sandbox starts and tears down the sandboxes tunwall serves: a
// command in fresh user, network, mount and pid namespaces (tunwall run), a
// bubblewrap sandbox (tunwall bwrap), or a namespace someone else made
// (tunwall attach). In each case a process already inside the sandbox's
// namespaces creates the TUN (package tun) and hands its descriptor back over
// a unix socket, because a multithreaded Go process cannot join another user
// namespace.
//
// Package sandbox knows nothing about policy or the userspace stack: it
// delivers a TUN descriptor, a sock_diag descriptor for process attribution,
// and the sandboxed command's exit status.
package sandbox
