package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"

	"github.com/tunwall/tunwall/internal/audit"
	"github.com/tunwall/tunwall/internal/session"
)

func cmdSocks(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("socks", "tunwall socks [flags] --listen ADDR", stderr)
	var c commonFlags
	c.register(fs)
	listen := fs.String("listen", "", "listen on `ADDR` (host:port, e.g. 127.0.0.1:1080)")
	drain := fs.Duration("drain", session.DefaultDrain, "on SIGTERM, SIGINT or SIGHUP, how long open flows may run on before they are ended (every flow is recorded, then the audit log is closed)")
	pos, tail, err := parseFlags(fs, args)
	if err != nil {
		return flagExit(fs, err, stdout, stderr)
	}
	if len(pos)+len(tail) > 0 {
		return usageError(fs, stderr, "unexpected arguments %q", append(pos, tail...))
	}
	if *listen == "" {
		return usageError(fs, stderr, "--listen ADDR is required")
	}
	if err := checkListen(*listen); err != nil {
		return usageError(fs, stderr, "%v", err)
	}
	if err := c.check(); err != nil {
		return usageError(fs, stderr, "%v", err)
	}
	if code := c.preflight(stderr); code != exitOK {
		return code
	}
	defer c.creds.close()
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintf(stderr, "tunwall: %v\n", err)
		return exitSetup
	}
	defer ln.Close()
	if a, ok := ln.Addr().(*net.TCPAddr); ok && !a.IP.IsLoopback() {
		// Said even with --quiet: it changes who may use the policy.
		fmt.Fprintf(stderr, "tunwall: warning: --listen %s is not a loopback address, and the SOCKS5 proxy asks for no credentials (tunwall has none to configure): anyone who can reach %s may use it, with this policy and its secrets\n", *listen, ln.Addr())
	}
	// Attribute local clients: a sock_diag socket in our own namespace,
	// whose inode tells them from tunwall's own sockets.
	diag, netns, err := session.LocalNamespace()
	if err != nil {
		fmt.Fprintf(stderr, "tunwall: %v\n", err)
		return exitSetup
	}
	c.runID = audit.NewRunID()
	if c.ctl, c.metrics, _, err = c.controlListeners(c.runID); err != nil {
		closeDiag(diag)
		fmt.Fprintf(stderr, "tunwall: %v\n", err)
		return exitSetup
	}
	s, err := newSession(&c, append([]string{"tunwall", "socks"}, args...), diag, netns, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "tunwall: %v\n", err)
		return exitSetup
	}
	c.creds.announceCA(stderr)
	if !c.quiet {
		fmt.Fprintf(stderr, "tunwall: SOCKS5 proxy on %s\n", ln.Addr())
	}
	// SIGHUP too: the terminal going away must not kill tunwall before the
	// audit log is closed (a log without its trailer does not verify).
	sigs := catchSignals(stopSignals)
	defer sigs.release()
	if s.CanChange() {
		hctx, hcancel := context.WithCancel(context.Background())
		defer hcancel()
		sigs.reloadOnHUP(hctx, s, stderr)
	}
	sctx, cancel := sigs.stopContext(ctx, func(sig os.Signal) {
		if !c.quiet {
			fmt.Fprintf(stderr, "tunwall: %v: stopping; open flows may run for up to %v, then the audit log is closed\n", sig, *drain)
		}
	})
	defer cancel()
	err = s.ServeSOCKS(sctx, ln, *drain)
	closeErr := s.Close()
	if err != nil {
		fmt.Fprintf(stderr, "tunwall: socks: %v\n", err)
		return exitStatus(closeErr, exitSetup, "tunwall's own status was", stderr)
	}
	return exitStatus(closeErr, exitOK, "tunwall's own status was", stderr)
}

// checkListen refuses a --listen value that is not HOST:PORT with a port
// number (a usage error, exit 2); one that is well formed but cannot be
// bound (in use, not this host's) fails later, as a setup error (125).
func checkListen(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("--listen %q: want HOST:PORT, e.g. 127.0.0.1:1080 or [::1]:1080", addr)
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil {
		return fmt.Errorf("--listen %q: port %q is not a number from 0 to 65535", addr, port)
	} else if n == 0 && host == "" {
		return fmt.Errorf("--listen %q: give an address and a port", addr)
	}
	return nil
}
