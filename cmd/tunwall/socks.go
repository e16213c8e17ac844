package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/tunwall/tunwall/internal/engine"
	"github.com/tunwall/tunwall/internal/procattr"
)

func cmdSocks(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("socks", "tunwall socks [flags] --listen ADDR", stderr)
	var c commonFlags
	c.register(fs)
	listen := fs.String("listen", "", "listen on `ADDR` (host:port, e.g. 127.0.0.1:1080)")
	drain := fs.Duration("drain", engine.DefaultSOCKSDrain, "on SIGTERM, SIGINT or SIGHUP, how long open flows may run on before they are ended (every flow is recorded, then the audit log is closed)")
	pos, tail, err := parseFlags(fs, args)
	if err != nil {
		return exitUsage
	}
	if len(pos)+len(tail) > 0 {
		return usageError(fs, stderr, "unexpected arguments %q", append(pos, tail...))
	}
	if *listen == "" {
		return usageError(fs, stderr, "--listen ADDR is required")
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintf(stderr, "tunwall: %v\n", err)
		return exitSetup
	}
	defer ln.Close()
	// Attribute local clients: a sock_diag socket in our own namespace.
	diag, err := procattr.OpenDiag()
	if err != nil {
		diag = -1
	}
	var st unix.Stat_t
	unix.Stat("/proc/self/ns/net", &st)
	s, err := newSession(&c, append([]string{"tunwall", "socks"}, args...), diag, st.Ino, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "tunwall: %v\n", err)
		return exitSetup
	}
	s.creds.announceCA(stderr)
	if !c.quiet {
		fmt.Fprintf(stderr, "tunwall: SOCKS5 proxy on %s\n", ln.Addr())
	}
	// SIGHUP too: the terminal going away must not kill tunwall before the
	// audit log is closed (a log without its trailer does not verify).
	sigc := make(chan os.Signal, 1)
	signal.Notify(sigc, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigc)
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case sig := <-sigc:
			if !c.quiet {
				fmt.Fprintf(stderr, "tunwall: %v: stopping; open flows may run for up to %v, then the audit log is closed\n", sig, *drain)
			}
			cancel()
		case <-sctx.Done():
		}
	}()
	err = s.engine.ServeSOCKS(sctx, ln, *drain)
	s.close()
	if err != nil {
		fmt.Fprintf(stderr, "tunwall: socks: %v\n", err)
		return s.status(exitSetup, "tunwall's own status was")
	}
	return s.status(exitOK, "tunwall's own status was")
}
