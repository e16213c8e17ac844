package tun

import (
	"fmt"
	"runtime"

	"golang.org/x/sys/unix"
)

// InNetNS runs fn on a fresh OS thread that has joined the network namespace
// nsFD (an open /proc/PID/ns/net or bind-mounted netns file). The thread is
// never unlocked: when fn returns, the goroutine exits still locked and the Go
// runtime retires the thread, so no other goroutine ever runs in the sandbox's
// namespace by accident.
//
// Joining a network namespace needs CAP_SYS_ADMIN over the user namespace that
// owns it. A multithreaded Go process cannot join a different user namespace;
// callers that need one start a helper process already inside it.
func InNetNS(nsFD int, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		// Deliberately no UnlockOSThread.
		if err := unix.Unshare(unix.CLONE_FS); err != nil {
			errc <- fmt.Errorf("tun: unshare CLONE_FS: %w", err)
			return
		}
		if err := unix.Setns(nsFD, unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("tun: join network namespace: %w", err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}
