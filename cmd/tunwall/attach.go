package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/tunwall/tunwall/internal/audit"
	"github.com/tunwall/tunwall/internal/control"
	"github.com/tunwall/tunwall/internal/sandbox"
	"github.com/tunwall/tunwall/internal/session"
	"github.com/tunwall/tunwall/tun"
)

func cmdAttach(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("attach", "tunwall attach [flags] (--pid PID | --netns PATH)", stderr)
	var c commonFlags
	c.register(fs)
	pid := fs.Int("pid", 0, "serve the network namespace of process `PID`, until its last process exits")
	netns := fs.String("netns", "", "serve the network namespace file `PATH` (e.g. /run/netns/NAME), until SIGTERM")
	force := fs.Bool("force", false, "attach even if the namespace has an interface other than lo, in any state (tunwall is then not its only exit); interfaces that appear later still stop tunwall")
	pos, tail, err := parseFlags(fs, args)
	if err != nil {
		return flagExit(fs, err, stdout, stderr)
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
	if code := c.preflight(stderr); code != exitOK {
		return code
	}
	defer c.creds.close()
	sigs := catchSignals(stopSignals)
	defer sigs.release()

	a, err := sandbox.Attach(ctx, sandbox.AttachConfig{Pid: *pid, NetNS: *netns, Force: *force, Net: c.netConfig(),
		NotIsolatedHint: "use --force to attach anyway"})
	if err != nil {
		fmt.Fprintf(stderr, "tunwall: attach: %v\n", err)
		return exitSetup
	}
	c.runID = audit.NewRunID()
	if c.ctl, c.metrics, _, err = c.controlListeners(c.runID); err != nil {
		closeFD(a.TUN)
		closeFD(a.Watch)
		closeDiag(a.Diag)
		fmt.Fprintf(stderr, "tunwall: %v\n", err)
		return exitSetup
	}
	if *pid != 0 {
		if ns, err := control.NamespacesOf(*pid); err == nil {
			c.sandboxPidNS = ns.Pid
		}
	}
	s, err := newSession(&c, append([]string{"tunwall", "attach"}, args...), a.Diag, a.NetNS, stderr)
	if err != nil {
		closeFD(a.TUN)
		closeFD(a.Watch)
		fmt.Fprintf(stderr, "tunwall: %v\n", err)
		return exitSetup
	}
	if s.CanChange() && c.sandboxPidNS != 0 && c.sandboxPidNS != ownPidNS() {
		// Only when the namespace's processes cannot signal tunwall (a pid
		// namespace of their own, named by --pid): the control socket
		// refuses them, and SIGHUP must not be a way around it.
		hctx, hcancel := context.WithCancel(context.Background())
		defer hcancel()
		sigs.reloadOnHUP(hctx, s, stderr)
	}
	// Serve only while tunwall is the namespace's only way out: any
	// interface, address or route that appears, other than lo's and the
	// TUN's (and, with --force, those there now), stops serving.
	watch, err := tun.NewWatcher(tun.WatchConfig{FD: a.Watch, TUN: a.TUN, AcceptExisting: *force})
	if err != nil {
		closeFD(a.TUN)
		var esc *tun.EscapeError
		if errors.As(err, &esc) {
			code := escaped(stderr, err)
			s.Close()
			return code
		}
		s.Close()
		fmt.Fprintf(stderr, "tunwall: attach: %v\n", err)
		return exitSetup
	}
	defer watch.Close()
	escape := make(chan error, 1)
	go func() { escape <- watch.Wait() }()
	stop, err := startSession(s, &c, a.TUN, stderr)
	if err != nil {
		s.Close()
		fmt.Fprintf(stderr, "tunwall: %v\n", err)
		return exitSetup
	}
	c.creds.announceCA(stderr)
	if !c.quiet {
		fmt.Fprintf(stderr, "tunwall: serving the namespace through tun0; its DNS queries to any address on port 53 are answered by tunwall (point its resolv.conf at %s if it names a loopback resolver)\n", session.DefaultPlan.Resolver4)
	}
	code := waitDetach(ctx, s, c.quiet, *pid != 0, a.NetNS, sigs.C, escape, stderr)
	stop()
	return exitStatus(s.Close(), code, "tunwall's own status was", stderr)
}

// waitDetach blocks until attach should stop serving: a signal, the
// namespace's last process exiting (watched only when byPid, as --pid
// serves), the namespace gone, or an escape from the namespace. It
// returns the exit code that ending means.
func waitDetach(ctx context.Context, s *servedSession, quiet, byPid bool, netns uint64, sigc <-chan os.Signal, escape <-chan error, stderr io.Writer) int {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var empty <-chan struct{}
	if byPid {
		empty = sandbox.WatchEmpty(wctx, netns, 250*time.Millisecond)
	}
	select {
	case sig := <-sigc:
		if !quiet {
			fmt.Fprintf(stderr, "tunwall: %v: detaching; the namespace has no network now\n", sig)
		}
	case <-empty:
		if !quiet {
			fmt.Fprintln(stderr, "tunwall: the namespace's last process exited")
		}
	case <-s.PeerGone():
		if !quiet {
			fmt.Fprintln(stderr, "tunwall: the namespace is gone")
		}
	case err := <-escape:
		// Fail closed: the TUN goes with the session, so the namespace
		// keeps no network through tunwall, and tunwall no longer records
		// traffic that may be leaving another way.
		return escaped(stderr, err)
	}
	return exitOK
}

// escaped reports why attach stopped serving and returns exitEscaped.
func escaped(stderr io.Writer, err error) int {
	var esc *tun.EscapeError
	if errors.As(err, &esc) {
		fmt.Fprintf(stderr, "tunwall: attach: stopped serving: %v in the namespace, so tunwall is not its only way out; removing its TUN (exit %d)\n", esc, exitEscaped)
	} else {
		fmt.Fprintf(stderr, "tunwall: attach: stopped serving: cannot follow the namespace's interfaces (%v); removing its TUN (exit %d)\n", err, exitEscaped)
	}
	return exitEscaped
}

// ownPidNS is the inode of tunwall's pid namespace (0 unknown).
func ownPidNS() uint64 {
	ns, err := control.OwnNamespaces()
	if err != nil {
		return 0
	}
	return ns.Pid
}
