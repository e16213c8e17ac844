// Package sandbox starts and tears down the sandboxes tunwall serves: a
// command in fresh user, network, mount and pid namespaces (tunwall run), a
// bubblewrap sandbox started inside fresh user and network namespaces
// (tunwall bwrap), or a namespace someone else made (tunwall attach).
//
// For run and bwrap, one process is born in the sandbox's user and network
// namespaces together and becomes the sandbox's init (run) or bwrap itself
// (bwrap), so every process that shares the sandbox's user namespace lives
// in its TUN-only network namespace (boundary.go lists what else keeps the
// sandbox in). Rootless, that process creates the TUN and hands its
// descriptor back over a unix socket, because a multithreaded Go process
// cannot join another user namespace; as root, tunwall creates it from a
// thread that joins the sandbox's network namespace, since the sandbox's
// unprivileged id may not open /dev/net/tun.
//
// Package sandbox knows nothing about policy or the userspace stack: it
// delivers a TUN descriptor, a sock_diag descriptor for process attribution,
// and the sandboxed command's exit status.
package sandbox
