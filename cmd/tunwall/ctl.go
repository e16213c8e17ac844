package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tunwall/tunwall/internal/control"
	"github.com/tunwall/tunwall/internal/engine"
	"github.com/tunwall/tunwall/internal/session"
)

const ctlUsage = `usage: tunwall ctl SUBCOMMAND [flags]

Ask a live run through its control socket ($XDG_RUNTIME_DIR/tunwall/RUN.sock,
or /run/tunwall as root). Only its own user (or root) may, and never a
process of the sandbox.

Subcommands:
  ls                     list this user's live runs (id, pid, phase, age, command)
  status [--json]        the run's id, phase, policy, counts and uptime
  flows [--json] [--watch]  the flows open now (proto, source, destination, process,
                         bytes each way, age); --watch: again every second
  metrics                the run's counters in the Prometheus text format
  phase NAME             switch to phase NAME of the policy file: from then on every
                         decision uses it, and the open flows it denies are cut
  reload                 re-read the policy file (as SIGHUP does); a file that does
                         not parse is refused, and the policy in effect stays
  pending [--json]       the requests --ask holds for a decision (id, name, process, age)
  allow ID [--once | --for-run | --always | --scope S]
                         allow a pending request: this once (default), for the rest of the
                         run, or always (also appended to the overlay next to the policy)
  deny ID [--for-run]    deny a pending request (and, --for-run, the name's later requests)

Run 'tunwall ctl SUBCOMMAND --help' for its flags.
`

var ctlSubcommands = []string{"ls", "status", "flows", "metrics", "phase", "reload", "pending", "allow", "deny"}

func cmdCtl(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, ctlUsage)
		return exitUsage
	}
	sub := args[0]
	switch sub {
	case "ls", "status", "flows", "metrics", "phase", "reload", "pending", "allow", "deny":
	case "-h", "--help", "-help", "help":
		if sub == "help" && len(args) > 1 {
			return cmdCtl([]string{args[1], "--help"}, stdout, stderr)
		}
		fmt.Fprint(stdout, ctlUsage)
		return exitOK
	default:
		return unknownSubcommand("ctl", sub, ctlSubcommands, stderr)
	}
	synopsis := "tunwall ctl " + sub
	switch sub {
	case "phase":
		synopsis += " NAME"
	case "allow":
		synopsis += " ID [--once | --for-run | --always | --scope S]"
	case "deny":
		synopsis += " ID [--for-run]"
	}
	if sub != "ls" {
		synopsis += " [--run ID | --control PATH]"
	}
	fs := newFlagSet("ctl "+sub, synopsis, stderr)
	var run, path string
	var asJSON bool
	if sub != "ls" {
		fs.StringVar(&run, "run", "", "the run `ID` to ask (default: the only live run of this user)")
		fs.StringVar(&path, "control", "", "the control socket `PATH` to ask (a run started with --control PATH)")
	}
	var once, forRun, always bool
	var scope string
	switch sub {
	case "metrics":
	case "allow", "deny":
		fs.BoolVar(&forRun, "for-run", false, "for the rest of the run (scope run)")
		if sub == "allow" {
			fs.BoolVar(&once, "once", false, "this request only (the default; a name: its answer, and its connections on 443/tcp for 60 s)")
			fs.BoolVar(&always, "always", false, "for the rest of the run, and appended to the overlay next to the policy file for the runs after it")
			fs.StringVar(&scope, "scope", "", "the scope `S`: once, run or always")
		}
	default:
		fs.BoolVar(&asJSON, "json", false, "print JSON")
	}
	var watch bool
	if sub == "flows" {
		fs.BoolVar(&watch, "watch", false, "list the open flows again every second until interrupted or the run ends (with --json: one array a line)")
	}
	pos, tail, err := parseFlagsInterspersed(fs, args[1:])
	if err != nil {
		return flagExit(fs, err, stdout, stderr)
	}
	var phase string
	if sub == "phase" {
		if len(pos) == 0 {
			return usageError(fs, stderr, "which phase? give its name: tunwall ctl phase NAME")
		}
		phase, pos = pos[0], pos[1:]
	}
	var id string
	if sub == "allow" || sub == "deny" {
		if len(pos) == 0 {
			return usageError(fs, stderr, "want the request's ID (tunwall ctl pending lists them)")
		}
		id, pos = pos[0], pos[1:]
		n := 0
		for v, s := range map[string]bool{"once": once, "run": forRun, "always": always} {
			if s {
				n++
				if scope != "" && scope != v {
					n++
				}
				scope = v
			}
		}
		if n > 1 {
			return usageError(fs, stderr, "give one scope")
		}
	}
	if len(pos)+len(tail) > 0 {
		return usageError(fs, stderr, "unexpected arguments %q", append(pos, tail...))
	}
	if run != "" && path != "" {
		return usageError(fs, stderr, "give --run ID or --control PATH, not both")
	}
	dir := control.Dir()
	if sub == "ls" {
		runs, err := control.List(dir)
		if err != nil {
			fmt.Fprintf(stderr, "tunwall: ctl ls: %v\n", err)
			return exitFail
		}
		printRuns(stdout, runs, asJSON)
		return exitOK
	}
	if path == "" {
		if path, err = control.Find(dir, run); err != nil {
			fmt.Fprintf(stderr, "tunwall: ctl %s: %v\n", sub, err)
			return exitFail
		}
	}
	if watch {
		return watchFlows(path, asJSON, stdout, stderr)
	}
	cmd := map[string]string{"status": control.CmdStatus, "flows": control.CmdFlows, "metrics": control.CmdMetrics,
		"phase": control.CmdPhase, "reload": control.CmdReload,
		"pending": control.CmdPending, "allow": control.CmdAllow, "deny": control.CmdDeny}[sub]
	r, err := control.Ask(path, control.Request{Cmd: cmd, Phase: phase, ID: id, Scope: scope})
	if err != nil {
		fmt.Fprintf(stderr, "tunwall: ctl %s: %v\n", sub, err)
		return exitFail
	}
	switch {
	case sub == "phase" || sub == "reload":
		if r.Change == nil {
			fmt.Fprintf(stderr, "tunwall: ctl %s: the run sent no answer\n", sub)
			return exitFail
		}
		printChange(stdout, *r.Change, asJSON)
	case sub == "pending":
		printPending(stdout, r.Pending, asJSON)
	case sub == "allow" || sub == "deny":
		fmt.Fprintf(stdout, "%s\n", r.Done)
	case sub == "metrics":
		io.WriteString(stdout, r.Metrics)
	case sub == "flows":
		printFlows(stdout, r.Flows, asJSON)
	case r.Status == nil:
		fmt.Fprintf(stderr, "tunwall: ctl %s: the run sent no status\n", sub)
		return exitFail
	case asJSON:
		b, _ := json.MarshalIndent(r.Status, "", "  ")
		fmt.Fprintf(stdout, "%s\n", b)
	default:
		printStatus(stdout, *r.Status)
	}
	return exitOK
}

// printChange says what a phase switch or a reload did.
func printChange(w io.Writer, ch control.Change, asJSON bool) {
	if asJSON {
		b, _ := json.MarshalIndent(ch, "", "  ")
		fmt.Fprintf(w, "%s\n", b)
		return
	}
	if ch.From == ch.To {
		fmt.Fprintf(w, "phase %s (policy reloaded", ch.To)
	} else {
		fmt.Fprintf(w, "phase %s -> %s (", ch.From, ch.To)
	}
	if ch.PolicySHA256 != "" {
		if ch.From == ch.To {
			fmt.Fprint(w, ", ")
		}
		fmt.Fprintf(w, "policy sha256 %s", ch.PolicySHA256)
	}
	fmt.Fprintf(w, "): %d rules added, %d removed, %d open flows revoked\n", len(ch.Added), len(ch.Removed), len(ch.Revoked))
	for _, r := range ch.Added {
		fmt.Fprintf(w, "  + %s\n", r)
	}
	for _, r := range ch.Removed {
		fmt.Fprintf(w, "  - %s\n", r)
	}
	for _, r := range ch.Revoked {
		proc := "-"
		if r.PID != 0 {
			proc = fmt.Sprintf("%d/%s", r.PID, r.Comm)
		}
		fmt.Fprintf(w, "  revoked %s %s -> %s (%s), process %s: %s\n", r.Proto, r.Src, dash(r.Host), r.Dst, proc, r.Reason)
	}
}

// printRuns lists runs as a table (or JSON).
func printRuns(w io.Writer, runs []control.Status, asJSON bool) {
	if asJSON {
		printJSONList(w, runs)
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "RUN\tPID\tPHASE\tAGE\tCOMMAND")
	for _, s := range runs {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\n", s.Run, s.Pid, s.Phase, age(s.Uptime), strings.Join(s.Argv, " "))
	}
	tw.Flush()
}

// printFlows lists open flows as a table (or JSON), like ss.
func printFlows(w io.Writer, flows []control.Flow, asJSON bool) {
	if asJSON {
		printJSONList(w, flows)
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PROTO\tSOURCE\tDESTINATION\tHOST\tDIALLED\tPROCESS\tOUT\tIN\tAGE")
	for _, f := range flows {
		host, dial, proc := dash(f.Host), "-", "-"
		if f.Dial.IsValid() {
			dial = f.Dial.String()
		}
		if f.PID != 0 {
			proc = fmt.Sprintf("%d/%s", f.PID, f.Comm)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", f.Proto, f.Src, f.Dst, host, dial, proc,
			session.HumanBytes(f.BytesOut), session.HumanBytes(f.BytesIn), age(f.Age))
	}
	tw.Flush()
}

// watchInterval is how often ctl flows --watch asks again.
const watchInterval = time.Second

// watchFlows lists the open flows every watchInterval until interrupted
// or the run ends: on a terminal in place, else one listing after another
// (with asJSON, one array a line).
func watchFlows(path string, asJSON bool, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	clear := !asJSON && isTerminal(stdout)
	t := time.NewTicker(watchInterval)
	defer t.Stop()
	for {
		r, err := control.Ask(path, control.Request{Cmd: control.CmdFlows})
		if err != nil {
			if _, serr := os.Stat(path); errors.Is(serr, os.ErrNotExist) {
				fmt.Fprintln(stderr, "tunwall: ctl flows: the run ended")
				return exitOK
			}
			fmt.Fprintf(stderr, "tunwall: ctl flows: %v\n", err)
			return exitFail
		}
		switch {
		case asJSON:
			if r.Flows == nil {
				r.Flows = []control.Flow{}
			}
			b, _ := json.Marshal(r.Flows)
			fmt.Fprintf(stdout, "%s\n", b)
		case clear:
			fmt.Fprint(stdout, "\033[H\033[2J")
			fmt.Fprintf(stdout, "%s: %d open flows (every %v; Ctrl-C stops)\n", time.Now().Format("15:04:05"), len(r.Flows), watchInterval)
			printFlows(stdout, r.Flows, false)
		default:
			fmt.Fprintf(stdout, "%s: %d open flows\n", time.Now().Format(time.RFC3339), len(r.Flows))
			printFlows(stdout, r.Flows, false)
			fmt.Fprintln(stdout)
		}
		select {
		case <-ctx.Done():
			return exitOK
		case <-t.C:
		}
	}
}

// printPending lists the requests held for approval (or JSON).
func printPending(w io.Writer, ps []control.Pending, asJSON bool) {
	if asJSON {
		printJSONList(w, ps)
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tPHASE\tPROTO\tHOST\tPORT\tPROCESS\tAGE")
	for _, p := range ps {
		proc, port := "-", "-"
		if p.PID != 0 {
			proc = fmt.Sprintf("%d/%s", p.PID, p.Comm)
		}
		if p.Port != 0 {
			port = fmt.Sprint(p.Port)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", p.ID, dash(p.Phase), p.Proto, engine.Printable(p.Host), port, engine.Printable(proc), age(p.Age))
	}
	tw.Flush()
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// printStatus writes a run's status, one item a line.
func printStatus(w io.Writer, s control.Status) {
	t := s.Totals
	tw := tabwriter.NewWriter(w, 0, 4, 1, ' ', 0)
	fmt.Fprintf(tw, "run:\t%s (tunwall pid %d)\n", s.Run, s.Pid)
	fmt.Fprintf(tw, "command:\t%s\n", strings.Join(s.Argv, " "))
	phase := s.Phase
	if phase == "" {
		phase = "(none: no policy file)"
	}
	if s.Learn {
		phase += " (learn mode)"
	}
	fmt.Fprintf(tw, "phase:\t%s\n", phase)
	if len(s.Labels) > 0 {
		var kv []string
		for _, k := range slices.Sorted(maps.Keys(s.Labels)) {
			kv = append(kv, k+"="+s.Labels[k])
		}
		fmt.Fprintf(tw, "labels:\t%s\n", strings.Join(kv, " "))
	}
	switch {
	case s.PolicyFile != "" && s.PolicySHA256 != "":
		fmt.Fprintf(tw, "policy:\t%s (sha256 %s)\n", s.PolicyFile, s.PolicySHA256)
	case s.PolicyFile != "":
		fmt.Fprintf(tw, "policy:\t%s\n", s.PolicyFile)
	default:
		fmt.Fprintf(tw, "policy:\t(command-line rules only)\n")
	}
	if s.AuditPath != "" {
		fmt.Fprintf(tw, "audit log:\t%s (%d records lost)\n", s.AuditPath, s.AuditLost)
	} else {
		fmt.Fprintf(tw, "audit log:\tnone (--audit off: nothing is counted)\n")
	}
	fmt.Fprintf(tw, "flows:\t%d allowed, %d denied, %d TCP open\n", t.FlowsAllowed, t.FlowsDenied, s.OpenTCP)
	fmt.Fprintf(tw, "dns:\t%d allowed, %d denied\n", t.DNSAllowed, t.DNSDenied)
	fmt.Fprintf(tw, "bytes:\t%d out, %d in (of ended flows)\n", t.BytesOut, t.BytesIn)
	if s.Ask {
		fmt.Fprintf(tw, "approvals:\t%d pending (--ask: tunwall ctl pending lists them)\n", s.PendingApprovals)
	}
	fmt.Fprintf(tw, "uptime:\t%s\n", age(s.Uptime))
	tw.Flush()
}

// age formats seconds as a short duration (1h2m3s).
func age(sec float64) string {
	return (time.Duration(sec) * time.Second).Round(time.Second).String()
}

// controlListeners makes the run's control socket (--control PATH, else
// control.Dir()/RUN.sock; --control off for none) and metrics listener
// (--metrics-listen), before the sandbox exists. cover lists what the
// sandbox must not see: the socket's directory when it is tunwall's own,
// else the socket itself.
func (c *commonFlags) controlListeners(run string) (ln *control.Listener, metrics net.Listener, cover []string, err error) {
	if c.metricsListen != "" {
		if metrics, err = net.Listen("tcp", c.metricsListen); err != nil {
			return nil, nil, nil, fmt.Errorf("--metrics-listen: %w", err)
		}
	}
	defer func() {
		if err != nil && metrics != nil {
			metrics.Close()
			metrics = nil
		}
	}()
	switch c.control {
	case "off":
		return nil, metrics, nil, nil
	case "":
		dir := control.Dir()
		if err := control.EnsureDir(dir); err != nil {
			return nil, nil, nil, err
		}
		control.PruneDead(dir) // what killed runs left

		ln, err = control.Listen(control.SocketPath(dir, run))
		if err != nil {
			return nil, nil, nil, err
		}
		return ln, metrics, []string{dir}, nil
	}
	if ln, err = control.Listen(c.control); err != nil {
		return nil, nil, nil, fmt.Errorf("--control: %w", err)
	}
	return ln, metrics, []string{c.control}, nil
}

// closeListeners closes what controlListeners made, when no session took
// them.
func closeListeners(ln *control.Listener, metrics net.Listener) {
	if ln != nil {
		ln.Close()
	}
	if metrics != nil {
		metrics.Close()
	}
}

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// printJSONList prints list as an indented JSON array ([] when empty).
func printJSONList[T any](w io.Writer, list []T) {
	if list == nil {
		list = []T{}
	}
	b, _ := json.MarshalIndent(list, "", "  ")
	fmt.Fprintf(w, "%s\n", b)
}
