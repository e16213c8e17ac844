// Package tun creates and configures the sandbox's only network interface: a
// TUN device (with a virtio-net header and offloads), addressed and routed with
// netlink, inside whatever network namespace the calling OS thread is in. It
// also passes file descriptors between processes over unix sockets
// (SCM_RIGHTS), because the TUN must be created by a process already inside
// the sandbox's namespaces and then handed to tunwall on the host side.
//
// Package tun knows nothing about policy or the userspace stack.
package tun
