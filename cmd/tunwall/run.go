package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/tunwall/tunwall/internal/audit"
	"github.com/tunwall/tunwall/internal/control"
	"github.com/tunwall/tunwall/internal/sandbox"
	"github.com/tunwall/tunwall/internal/session"
)

func cmdRun(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("run", "tunwall run [flags] -- CMD [ARGS...]", stderr)
	var c commonFlags
	c.register(fs)
	keepUID := fs.Bool("keep-uid", false, "run the command as your own uid (as bwrap does), with no capability, instead of as root of its user namespace; for tools that refuse to run as root")
	var as userFlag
	fs.Var(&as, "user", "run as root: the host `USER|UID[:GID]` the command runs as (default: SUDO_UID, else nobody; never 0), e.g. the owner of a CI workspace")
	pos, tail, err := parseFlags(fs, args)
	if err != nil {
		return flagExit(fs, err, stdout, stderr)
	}
	argv := append(pos, tail...)
	if len(argv) == 0 {
		return usageError(fs, stderr, "no command given")
	}
	if err := c.check(); err != nil {
		return usageError(fs, stderr, "%v", err)
	}
	if err := as.check(); err != nil {
		return usageError(fs, stderr, "%v", err)
	}
	c.what = filepath.Base(argv[0])
	return serveSandbox(ctx, &c, append([]string{"tunwall", "run"}, args...), stderr, func() (*sandbox.Sandbox, error) {
		return sandbox.Start(ctx, sandbox.RunConfig{Argv: argv, Net: c.netConfig(), Creds: c.creds.sandboxCreds(), KeepUID: *keepUID, User: as.u, Cover: c.cover})
	})
}

func cmdBwrap(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("bwrap", "tunwall bwrap [flags] -- BWRAP_ARGS... [--] CMD [ARGS...]", stderr)
	var c commonFlags
	c.register(fs)
	var as userFlag
	fs.Var(&as, "user", "run as root: the host `USER|UID[:GID]` bwrap and the command run as (default: SUDO_UID, else nobody; never 0)")
	pos, tail, err := parseFlags(fs, args)
	if err != nil {
		return flagExit(fs, err, stdout, stderr)
	}
	if len(pos) > 0 {
		return usageError(fs, stderr, "put bwrap's arguments after --")
	}
	if len(tail) == 0 {
		return usageError(fs, stderr, "no bwrap arguments given")
	}
	if len(tail) == 1 && (tail[0] == "--version" || tail[0] == "--help") {
		// bwrap's own answer; no sandbox is made.
		return bwrapItself(ctx, tail[0], stdout, stderr)
	}
	if err := sandbox.CheckBwrapArgs(tail); err != nil {
		return usageError(fs, stderr, "%v", err)
	}
	if err := c.check(); err != nil {
		return usageError(fs, stderr, "%v", err)
	}
	if err := as.check(); err != nil {
		return usageError(fs, stderr, "%v", err)
	}
	c.what = "bwrap"
	return serveSandbox(ctx, &c, append([]string{"tunwall", "bwrap"}, args...), stderr, func() (*sandbox.Sandbox, error) {
		return sandbox.StartBwrap(ctx, sandbox.BwrapConfig{Args: tail, Net: c.netConfig(), Creds: c.creds.sandboxCreds(), User: as.u, Cover: c.cover})
	})
}

func (c *commonFlags) check() error {
	if c.mtu < 1280 || c.mtu > 65535 {
		return fmt.Errorf("--mtu %d out of range 1280-65535", c.mtu)
	}
	if c.upstream != "" {
		if err := session.CheckUpstream(c.upstream); err != nil {
			return fmt.Errorf("--upstream: %w", err)
		}
	}
	if c.dnsUpstream != "" {
		if _, _, err := dnsUpstream(c, nil); err != nil {
			return err
		}
	}
	if err := c.limits.check(); err != nil {
		return err
	}
	if _, err := audit.NewLabels(c.labels); err != nil {
		return fmt.Errorf("--label: %w", err)
	}
	return c.checkDNS()
}

// preflight loads what a session needs from files and the environment
// (policy, --allow rules, secrets) before anything is built: a policy that
// does not load is a usage error (exit 2), said on one line.
func (c *commonFlags) preflight(stderr io.Writer) int {
	_, rs, _, err := c.loadRules()
	if err != nil {
		printErrors(stderr, "tunwall: ", err)
		return exitUsage
	}
	warnRules(rs, stderr)
	// Secrets are read and the CA made before the sandbox exists: its
	// environment and files depend on them.
	if _, err := c.credentials(stderr); err != nil {
		fmt.Fprintf(stderr, "tunwall: %v\n", err)
		return exitUsage
	}
	return exitOK
}

// serveSandbox starts a sandbox with start, serves its TUN until its command
// exits, and returns the command's exit status.
func serveSandbox(ctx context.Context, c *commonFlags, argv []string, stderr io.Writer, start func() (*sandbox.Sandbox, error)) int {
	// A policy that does not load is a usage error, found before any
	// namespace is made.
	if code := c.preflight(stderr); code != exitOK {
		return code
	}
	defer c.creds.close()
	// The control socket exists before the sandbox, which must not see it.
	c.runID = audit.NewRunID()
	var err error
	if c.ctl, c.metrics, c.cover, err = c.controlListeners(c.runID); err != nil {
		fmt.Fprintf(stderr, "tunwall: %v\n", err)
		return exitSetup
	}
	// Signals are forwarded to the sandbox from the moment it exists.
	sigs := catchSignals(forwardedSignals)
	defer sigs.release()

	sb, err := start()
	if err != nil {
		closeListeners(c.ctl, c.metrics)
		fmt.Fprintf(stderr, "tunwall: %v\n", err)
		var ee *sandbox.ExecError
		if errors.As(err, &ee) {
			return ee.ExitCode()
		}
		return exitSetup
	}
	defer sb.Close()
	if os.Geteuid() == 0 && !c.quiet {
		// Said first: run as root, the command is not root on the host.
		fmt.Fprintln(stderr, whoLine(c.what, sb))
	}
	// The sandbox exists, and tunwall starts no more children in new user
	// namespaces (whose id maps it would have to write): from here on no
	// process of this user may read or write tunwall's memory, a sandbox
	// that found a way out of its user namespace included.
	unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0)

	if ns, err := control.NamespacesOf(sb.Pid); err == nil {
		c.sandboxPidNS = ns.Pid
	}
	s, err := newSession(c, argv, sb.Diag, sb.NetNS, stderr)
	if err != nil {
		closeFD(sb.TUN)
		fmt.Fprintf(stderr, "tunwall: %v\n", err)
		return exitSetup
	}
	if s.CanChange() {
		hctx, hcancel := context.WithCancel(context.Background())
		defer hcancel()
		sigs.reloadOnHUP(hctx, s, stderr)
	}
	stop, err := startSession(s, c, sb.TUN, stderr)
	if err != nil {
		s.Close()
		fmt.Fprintf(stderr, "tunwall: %v\n", err)
		return exitSetup
	}
	if err := sb.Go(); err != nil {
		stop()
		s.Close()
		fmt.Fprintf(stderr, "tunwall: start command: %v\n", err)
		return exitSetup
	}

	for done := false; !done; {
		select {
		case sig := <-sigs.C:
			sigs.forward(sig, sb)
		case <-s.PeerGone():
			// The TUN went away under us; nothing can be served. Fail
			// closed: end the sandbox.
			fmt.Fprintln(stderr, "tunwall: the sandbox's TUN disappeared; stopping")
			sb.Kill()
			done = true
		case <-sb.Exited():
			done = true
		}
	}
	code := sb.ExitCode()
	stop()
	return exitStatus(s.Close(), code, "the command exited", stderr)
}

// bwrapItself runs the installed bwrap with --version or --help.
func bwrapItself(ctx context.Context, arg string, stdout, stderr io.Writer) int {
	p, err := exec.LookPath("bwrap")
	if err != nil {
		fmt.Fprintf(stderr, "tunwall: %v\n", sandbox.ErrNoBwrap)
		return exitSetup
	}
	cmd := exec.CommandContext(ctx, p, arg)
	cmd.Stdout, cmd.Stderr = stdout, stderr
	if err := cmd.Run(); err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return ee.ExitCode()
		}
		fmt.Fprintf(stderr, "tunwall: %v\n", err)
		return exitSetup
	}
	return exitOK
}
