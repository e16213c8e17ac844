package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/tunwall/tunwall/internal/sandbox"
)

func cmdAttach(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("attach", "tunwall attach [flags] (--pid PID | --netns PATH)", stderr)
	var c commonFlags
	c.register(fs)
	pid := fs.Int("pid", 0, "serve the network namespace of process `PID`, until its last process exits")
	netns := fs.String("netns", "", "serve the network namespace file `PATH` (e.g. /run/netns/NAME), until SIGTERM")
	force := fs.Bool("force", false, "attach even if the namespace already has a route out (tunwall is then not its only exit)")
	pos, tail, err := parseFlags(fs, args)
	if err != nil {
		return exitUsage
	}
	if len(pos)+len(tail) > 0 {
		return usageError(fs, stderr, "unexpected arguments %q", append(pos, tail...))
	}
	if (*pid == 0) == (*netns == "") {
		return usageError(fs, stderr, "give exactly one of --pid PID or --netns PATH")
	}
	if err := c.check(); err != nil {
		return usageError(fs, stderr, "%v", err)
	}
	sigc := make(chan os.Signal, 4)
	signal.Notify(sigc, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigc)

	a, err := sandbox.Attach(ctx, sandbox.AttachConfig{Pid: *pid, NetNS: *netns, Force: *force, Net: c.netConfig()})
	if err != nil {
		fmt.Fprintf(stderr, "tunwall: attach: %v\n", err)
		return exitSetup
	}
	s, err := newSession(&c, append([]string{"tunwall", "attach"}, args...), a.Diag, a.NetNS, stderr)
	if err != nil {
		closeFD(a.TUN)
		fmt.Fprintf(stderr, "tunwall: %v\n", err)
		return exitSetup
	}
	if err := s.serve(a.TUN); err != nil {
		s.close()
		fmt.Fprintf(stderr, "tunwall: %v\n", err)
		return exitSetup
	}
	if !c.quiet {
		fmt.Fprintf(stderr, "tunwall: serving the namespace through tun0; its DNS queries to any address on port 53 are answered by tunwall (point its resolv.conf at %s if it names a loopback resolver)\n", resolver4)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var empty <-chan struct{}
	if *pid != 0 {
		empty = sandbox.WatchEmpty(wctx, a.NetNS, 250*time.Millisecond)
	}
	code := exitOK
	select {
	case sig := <-sigc:
		if !c.quiet {
			fmt.Fprintf(stderr, "tunwall: %v: detaching; the namespace has no network now\n", sig)
		}
	case <-empty:
		if !c.quiet {
			fmt.Fprintln(stderr, "tunwall: the namespace's last process exited")
		}
	case <-s.stack.PeerGone():
		if !c.quiet {
			fmt.Fprintln(stderr, "tunwall: the namespace is gone")
		}
	}
	s.close()
	return code
}
