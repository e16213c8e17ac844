package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/tunwall/tunwall/internal/control"
	"github.com/tunwall/tunwall/internal/node"
	"github.com/tunwall/tunwall/internal/session"
)

// cmdNode is tunwall node: the node agent serving many pods' namespaces
// at the CNI plugin's request (internal/node).
func cmdNode(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("node", "tunwall node --policy-dir DIR (--audit-dir DIR | --audit-stdout) [flags]", stderr)
	var c commonFlags
	policyDir := fs.String("policy-dir", "", "the policies, one file `DIR/NAME.yaml` each (a ConfigMap mounted there); a file changed on disk takes effect for the pods using it within a second; one that does not parse keeps the version in effect (said on stderr, counted in the metrics)")
	socket := fs.String("socket", node.DefaultSocket, "the unix socket `PATH` the CNI plugin (tunwall-cni) calls; mode 0600, root only")
	auditDir := fs.String("audit-dir", "", "write each pod's audit log to `DIR`/NAMESPACE_POD_CONTAINERID.jsonl")
	auditStdout := fs.Bool("audit-stdout", false, "write every pod's audit records to stdout, whole lines interleaved (each carries its run id and the pod's labels), for the node's log shipper")
	maxNS := fs.Int("max-namespaces", node.DefaultMaxNamespaces, "most pods (network namespaces) served at once; past it a pod's ADD fails (try again later)")
	ctlDir := fs.String("control-dir", "", "give each pod a control socket in `DIR` (default: where tunwall ctl looks, /run/tunwall as root), so that 'tunwall ctl ls' lists the pods and ctl status, flows, metrics and reload ask one; \"off\" for none")
	nodeName := fs.String("node-name", "", "the node's name on every record (label node; default: $NODE_NAME, else the host name)")
	fs.StringVar(&c.metricsListen, "metrics-listen", "", "serve the node's metrics (Prometheus text format, per pod) over HTTP on `ADDR` (host:port)")
	fs.StringVar(&c.dnsUpstream, "dns-upstream", "", "resolver `IP:PORT` for allowed names of pods whose policy names no dns.upstream (default: the host's resolv.conf)")
	fs.StringVar(&c.resolvConf, "resolv-conf", "/etc/resolv.conf", "the host's resolver configuration `FILE`, when --dns-upstream is not given")
	fs.StringVar(&c.hostsFile, "hosts-file", "", "hosts `FILE` allowed names are resolved through before DNS (\"\" for none)")
	fs.IntVar(&c.mtu, "mtu", 1500, "MTU of each pod's TUN")
	c.auditSize, c.auditRate = defaultNodeAuditSize, 1000
	fs.Var(&c.auditSize, "audit-max-size", "cap on each pod's audit log `SIZE` (bytes, KiB, MiB, GiB); reaching it denies the pod's new flows")
	fs.Var(&c.auditRate, "audit-max-rate", "audit `LINES` a second per pod, sustained; beyond, its new flows and queries are denied")
	c.limits.register(fs)
	fs.BoolVar(&c.verbose, "v", false, "verbose diagnostics")
	pos, tail, err := parseFlags(fs, args)
	if err != nil {
		return flagExit(fs, err, stdout, stderr)
	}
	switch {
	case len(pos)+len(tail) > 0:
		return usageError(fs, stderr, "unexpected arguments %q", append(pos, tail...))
	case *policyDir == "":
		return usageError(fs, stderr, "--policy-dir is required")
	case (*auditDir == "") == !*auditStdout:
		return usageError(fs, stderr, "give exactly one of --audit-dir DIR or --audit-stdout")
	case *maxNS < 1:
		return usageError(fs, stderr, "--max-namespaces %d: want at least 1", *maxNS)
	case c.mtu < 1280 || c.mtu > 65535:
		return usageError(fs, stderr, "--mtu %d: want 1280 to 65535", c.mtu)
	}
	if err := c.limits.check(); err != nil {
		return usageError(fs, stderr, "%v", err)
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(stderr, "tunwall node: must run as root (it enters pods' network namespaces and makes their TUNs)")
		return exitSetup
	}
	name := *nodeName
	if name == "" {
		name = os.Getenv("NODE_NAME")
	}
	if name == "" {
		name, _ = os.Hostname()
	}
	c.dnsPoolSize, c.dnsMaxTCP, c.dnsMaxUDP = 0, 0, 0
	dns, err := c.dnsOptions(nil)
	if err != nil {
		// Pods whose policy names its dns.upstream are still served.
		fmt.Fprintf(stderr, "tunwall node: warning: %v; only pods whose policy names dns.upstream can be served\n", err)
		dns = session.DNSOptions{HostsFile: c.hostsFile}
	}
	dns.PoolIdle = 0
	logger := newLogger(&c, stderr)
	switch *ctlDir {
	case "":
		*ctlDir = control.Dir()
	case "off":
		*ctlDir = ""
	}
	cfg := node.Config{
		ControlDir:    *ctlDir,
		PolicyDir:     *policyDir,
		AuditDir:      *auditDir,
		MaxNamespaces: *maxNS,
		Node:          name,
		Net:           c.netConfig(),
		Stderr:        stderr,
		Logger:        logger,
		Session: session.Options{
			DNS: dns,
			Limits: session.Limits{
				MaxTCPFlows:      c.limits.maxTCP,
				MaxUDPSessions:   c.limits.maxUDP,
				MaxTCPHandshakes: c.limits.maxHandshakes,
				HandshakeTimeout: c.limits.handshake,
				MaxMemory:        int64(c.limits.maxMemory),
			},
			MTU:     c.mtu,
			Audit:   session.AuditOptions{MaxSize: int64(c.auditSize), MaxRate: int(c.auditRate)},
			Argv:    append([]string{"tunwall", "node"}, args...),
			Version: version,
		},
	}
	if *auditStdout {
		cfg.AuditStdout = stdout
	}
	sigs := catchSignals(stopSignals)
	defer sigs.release()
	c.limits.applyMemoryLimit()
	a, err := node.New(cfg)
	if err != nil {
		fmt.Fprintf(stderr, "tunwall %v\n", err)
		return exitSetup
	}
	defer a.Close()
	var metrics *http.Server
	if c.metricsListen != "" {
		ln, err := net.Listen("tcp", c.metricsListen)
		if err != nil {
			fmt.Fprintf(stderr, "tunwall node: --metrics-listen: %v\n", err)
			return exitSetup
		}
		metrics = &http.Server{
			Handler:           a.MetricsHandler(),
			ReadHeaderTimeout: 5 * time.Second,
			ReadTimeout:       10 * time.Second,
			WriteTimeout:      10 * time.Second,
			IdleTimeout:       30 * time.Second,
			MaxHeaderBytes:    8 << 10,
		}
		go func() {
			if err := metrics.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				logger.Warn("metrics listener", "err", err)
			}
		}()
		defer metrics.Close()
	}
	ln, err := node.Listen(*socket)
	if err != nil {
		fmt.Fprintf(stderr, "tunwall %v\n", err)
		return exitSetup
	}
	srv := node.Serve(a, ln)
	fmt.Fprintf(stderr, "tunwall node: node %s serving pods on %s (policies in %s, at most %d at once)\n", name, *socket, *policyDir, *maxNS)
	select {
	case sig := <-sigs.C:
		fmt.Fprintf(stderr, "tunwall node: %v: stopping; the pods served have no network now\n", sig)
	case <-ctx.Done():
	}
	srv.Close()
	a.Close()
	return exitOK
}

// defaultNodeAuditSize caps one pod's audit log by default.
const defaultNodeAuditSize = 256 << 20
