// Command tunwall gives a sandbox a network that obeys a hostname allowlist.
// See README.md; `tunwall help` lists the subcommands.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strings"

	"github.com/tunwall/tunwall/internal/sandbox"
)

// Exit statuses of tunwall itself. `run` and `bwrap` otherwise exit with the
// command's own status (128+N when a signal N killed it).
const (
	exitOK      = 0
	exitFail    = 1   // a check failed: policy check, audit verify, a denied explain
	exitUsage   = 2   // bad flags or arguments
	exitEscaped = 3   // attach: the namespace gained a way out other than tunwall, which stopped serving it
	exitLost    = 122 // the audit log is incomplete: records were lost (a full disk, a write error)
	exitSetup   = 125 // tunwall could not build or serve the sandbox
	exitNoExec  = 126 // the command cannot be executed
	exitNoFound = 127 // the command was not found
)

// version is set at build time (-ldflags "-X main.version=...").
var version = "dev"

func main() {
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case sandbox.InitArg:
			os.Exit(sandbox.InitMain())
		case sandbox.HelperArg:
			os.Exit(sandbox.HelperMain())
		}
	}
	os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

const usageText = `usage: tunwall COMMAND [flags] [args]

Give a sandbox a network that obeys a hostname allowlist.

Commands:
  run    [flags] -- CMD [ARGS...]        run CMD with a TUN-only network served by tunwall
  bwrap  [flags] -- BWRAP_ARGS...        run bubblewrap in a TUN-only network served by
                                         tunwall (it drops --unshare-net: the TUN is the network)
  attach [flags] (--pid PID | --netns PATH)
                                         serve an existing network namespace
  socks  [flags] --listen ADDR           a SOCKS5 proxy with the same policy and audit
  policy check FILE                      validate a policy file
  policy explain FILE (HOST[:PORT] | URL [--method M]) [--phase P] [--udp]
                                         say what the policy decides for a destination or request
  policy suggest AUDIT.jsonl [--phase P] write a policy allowing what a (learn-mode) run used
  audit  verify FILE [--expect HASH]    check an audit log's hash chain (and that it holds HASH)
  audit  summary FILE                    summarise an audit log per host
  audit  ls [DIR]                        list the runs' audit logs (default: $XDG_STATE_HOME/tunwall)
  ctl    ls | status | flows | metrics [--run ID]
                                         ask a live run through its control socket
  node   --policy-dir DIR (--audit-dir DIR | --audit-stdout) [flags]
                                         the node agent: serve many pods' namespaces for
                                         the CNI plugin tunwall-cni (as root)
  version                                print the version

  help COMMAND [SUBCOMMAND]               print a command's usage and flags

Run 'tunwall COMMAND --help' (or 'tunwall help COMMAND') for a command's flags.
Exit status: run/bwrap exit with CMD's status (126 not executable, 127 not
found); otherwise 0 ok, 1 a check failed (policy check, audit verify/summary,
a denied explain), 2 usage (also a policy that does not load), 3 attach
stopped because the namespace gained another way out, 122 the audit log is
incomplete (records lost), 125 tunwall could not set up or serve the sandbox.
`

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usageText)
		return exitUsage
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "run", "bwrap", "attach", "socks":
		if jsonLogRequested(rest) {
			// --json-log: every line tunwall writes to stderr is JSON.
			jl := newJSONLines(stderr)
			defer jl.Flush()
			stderr = jl
		}
	}
	switch cmd {
	case "run":
		return cmdRun(ctx, rest, stdout, stderr)
	case "bwrap":
		return cmdBwrap(ctx, rest, stdout, stderr)
	case "attach":
		return cmdAttach(ctx, rest, stdout, stderr)
	case "socks":
		return cmdSocks(ctx, rest, stdout, stderr)
	case "policy":
		return cmdPolicy(rest, stdout, stderr)
	case "audit":
		return cmdAudit(rest, stdout, stderr)
	case "ctl":
		return cmdCtl(rest, stdout, stderr)
	case "node":
		return cmdNode(ctx, rest, stdout, stderr)
	case "version", "--version":
		fmt.Fprintf(stdout, "tunwall %s\n", version)
		return exitOK
	case "help", "-h", "--help", "-help":
		if cmd == "help" && len(rest) > 0 {
			// tunwall help COMMAND [SUBCOMMAND] is COMMAND [SUBCOMMAND] --help.
			if rest[0] == "help" || rest[0] == "version" {
				fmt.Fprint(stdout, usageText)
				return exitOK
			}
			return run(ctx, append(append([]string(nil), rest...), "--help"), stdout, stderr)
		}
		fmt.Fprint(stdout, usageText)
		return exitOK
	}
	fmt.Fprintf(stderr, "tunwall: unknown command %q\n", cmd)
	switch {
	case strings.HasPrefix(cmd, "-"):
		fmt.Fprintf(stderr, "(the command comes first, then its flags: tunwall run %s ...; 'tunwall help' lists the commands)\n", cmd)
	case didYouMean(cmd, commands) != "":
		fmt.Fprintf(stderr, "(did you mean 'tunwall %s'? 'tunwall help' lists the commands)\n", didYouMean(cmd, commands))
	default:
		fmt.Fprintln(stderr, "('tunwall help' lists the commands)")
	}
	return exitUsage
}

// commands are tunwall's commands, for "did you mean".
var commands = []string{"run", "bwrap", "attach", "socks", "policy", "audit", "ctl", "node", "version", "help"}

// didYouMean returns the candidate closest to s by edit distance, if it is
// close enough to be a typo (at most 2 edits, and fewer than s has
// letters), or "".
func didYouMean(s string, candidates []string) string {
	best, bestD := "", 3
	for _, c := range candidates {
		if d := editDistance(strings.ToLower(s), c); d < bestD && d < len(s) {
			best, bestD = c, d
		}
	}
	return best
}

// editDistance is the Damerau-Levenshtein (optimal string alignment)
// distance between a and b, in bytes.
func editDistance(a, b string) int {
	if len(a) > 64 || len(b) > 64 {
		return 64
	}
	d := make([][]int, len(a)+1)
	for i := range d {
		d[i] = make([]int, len(b)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(a); i++ {
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(a)][len(b)]
}

// parseFlags parses args with fs the way Go's flag package and bwrap do:
// flags stop at the first argument that is not one, and everything from
// there on is returned as pos, untouched (a command line, whose own "--" and
// flags are its own). A leading "--" ends the flags too; what follows it is
// returned as tail. So `tunwall run --policy p.yaml ./agent.sh --learn` runs
// ./agent.sh with the argument --learn, and learn mode stays off.
//
// A flag given twice is an error (see onceFlags), except the repeatable
// --allow. Nothing is printed: the caller passes an error to flagExit.
func parseFlags(fs *flag.FlagSet, args []string) (pos, tail []string, err error) {
	defer onceFlags(fs)()
	if err := fs.Parse(args); err != nil {
		return nil, nil, err
	}
	rest := fs.Args()
	if consumed := len(args) - len(rest); consumed > 0 && args[consumed-1] == "--" {
		return nil, rest, nil
	}
	return rest, nil, nil
}

// parseFlagsInterspersed is parseFlags allowing flags after positional
// arguments too (tunwall policy explain FILE HOST --phase exec), for the
// commands that take no command line. It stops at "--"; what follows is
// returned as tail.
func parseFlagsInterspersed(fs *flag.FlagSet, args []string) (pos, tail []string, err error) {
	defer onceFlags(fs)()
	for {
		if err := fs.Parse(args); err != nil {
			return nil, nil, err
		}
		rest := fs.Args()
		// flag stops at the first non-flag or after "--".
		consumed := len(args) - len(rest)
		if consumed > 0 && args[consumed-1] == "--" {
			return pos, rest, nil
		}
		if len(rest) == 0 {
			return pos, nil, nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

// repeatable marks a flag.Value that may be given more than once.
type repeatable interface{ repeatable() }

func (*allowFlags) repeatable() {}
func (*hashFlags) repeatable()  {}

// errRepeated is the error of a single-valued flag given twice: "last one
// wins" would let whoever appends to a command line (an agent shaping its
// own invocation) override what came first, e.g. --policy or --audit.
var errRepeated = errors.New("given more than once; give it once")

// onceValue wraps a single-valued flag so that a second Set fails.
type onceValue struct {
	flag.Value
	set bool
}

func (o *onceValue) Set(s string) error {
	if o.set {
		return errRepeated
	}
	o.set = true
	return o.Value.Set(s)
}

func (o *onceValue) String() string {
	if o.Value == nil {
		return ""
	}
	return o.Value.String()
}

type onceBool struct{ *onceValue }

func (onceBool) IsBoolFlag() bool { return true }

// onceFlags makes every single-valued flag of fs refuse a second value for
// the length of one parse, and returns the function that restores them
// (usage output reads the flags' own values).
//
// Every flag is single-valued unless its Value is marked repeatable (a Var
// that collects values: --allow, --expect), so a new flag is safe by
// default.
func onceFlags(fs *flag.FlagSet) (restore func()) {
	saved := map[*flag.Flag]flag.Value{}
	fs.VisitAll(func(f *flag.Flag) {
		if _, ok := f.Value.(repeatable); ok {
			return
		}
		saved[f] = f.Value
		o := &onceValue{Value: f.Value}
		if b, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() {
			f.Value = onceBool{o}
		} else {
			f.Value = o
		}
	})
	// The flag package prints an error and the usage itself; flagExit
	// prints one line and a hint instead, after the parse.
	usage, out := fs.Usage, fs.Output()
	fs.Usage = func() {}
	fs.SetOutput(io.Discard)
	return func() {
		for f, v := range saved {
			f.Value = v
		}
		fs.Usage = usage
		fs.SetOutput(out)
	}
}

func newFlagSet(name, synopsis string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { printUsage(fs, synopsis, fs.Output()) }
	return fs
}

// commonFlags are the flags a user reaches for first, in the order
// printUsage lists them before the others (limits, tuning), which follow
// in alphabetical order.
var firstFlags = []string{"policy", "allow", "phase", "learn", "audit", "quiet", "secret", "user", "keep-uid", "json-log", "dns-upstream", "upstream", "v"}

// printUsage writes a command's synopsis and every flag registered on fs
// (so a flag added with fs.IntVar and friends is listed without more ado),
// with two dashes as the README writes them: the common ones (firstFlags)
// first, then, when there are many, the others under "more flags:".
func printUsage(fs *flag.FlagSet, synopsis string, w io.Writer) {
	fmt.Fprintf(w, "usage: %s\n", synopsis)
	var first, rest []*flag.Flag
	for _, name := range firstFlags {
		if f := fs.Lookup(name); f != nil {
			first = append(first, f)
		}
	}
	fs.VisitAll(func(f *flag.Flag) {
		if !slices.Contains(firstFlags, f.Name) {
			rest = append(rest, f)
		}
	})
	if len(first)+len(rest) == 0 {
		return
	}
	fmt.Fprint(w, "\nflags:\n")
	if len(first)+len(rest) <= 10 {
		first, rest = append(first, rest...), nil
	}
	for _, f := range first {
		printFlag(w, f)
	}
	if len(rest) > 0 {
		fmt.Fprint(w, "\nmore flags:\n")
		for _, f := range rest {
			printFlag(w, f)
		}
	}
}

// printFlag writes one flag's line and usage.
func printFlag(w io.Writer, f *flag.Flag) {
	{
		arg, usage := flag.UnquoteUsage(f)
		line := "  " + dashes(f.Name)
		if arg != "" {
			line += " " + arg
		}
		fmt.Fprintf(w, "%s\n    \t%s", line, strings.ReplaceAll(usage, "\n", "\n    \t"))
		switch f.DefValue {
		case "", "0", "false", "0s":
		default:
			if _, ok := f.Value.(repeatable); !ok {
				fmt.Fprintf(w, " (default %s)", f.DefValue)
			}
		}
		fmt.Fprintln(w)
	}
}

// dashes writes a flag's name as the README does: --name, or -v for a
// one-letter flag.
func dashes(name string) string {
	if len(name) == 1 {
		return "-" + name
	}
	return "--" + name
}

// flagDash rewrites the flag package's "-name" in an error message as
// "--name".
var flagDash = regexp.MustCompile(`(flag(?: provided but not defined:| needs an argument:|)) -(-?)([A-Za-z0-9][-A-Za-z0-9]+)`)

// flagExit finishes a failed parse of fs: help (-h, --help) is printed to
// stdout and is exit 0; anything else is one line saying what is wrong and
// one with a hint, on stderr, and exit 2.
func flagExit(fs *flag.FlagSet, err error, stdout, stderr io.Writer) int {
	if errors.Is(err, flag.ErrHelp) {
		fs.SetOutput(stdout)
		fs.Usage()
		return exitOK
	}
	msg := flagDash.ReplaceAllString(err.Error(), "$1 --$3")
	fmt.Fprintf(stderr, "tunwall %s: %s\n", fs.Name(), msg)
	hint := fmt.Sprintf("'tunwall %s --help' lists its flags", fs.Name())
	if name, ok := strings.CutPrefix(err.Error(), "flag provided but not defined: -"); ok {
		var names []string
		fs.VisitAll(func(f *flag.Flag) { names = append(names, f.Name) })
		if m := didYouMean(strings.TrimPrefix(name, "-"), names); m != "" {
			hint = "did you mean " + dashes(m) + "? " + hint
		}
		switch fs.Name() {
		case "run":
			hint = "if it is the command's, put -- before the command: tunwall run [flags] -- CMD [ARGS...]; " + hint
		case "bwrap":
			hint = "bwrap's own options go after --: tunwall bwrap [flags] -- BWRAP_ARGS... [--] CMD; " + hint
		}
	}
	fmt.Fprintf(stderr, "(%s)\n", hint)
	return exitUsage
}

// usageError prints what is wrong and a hint where to find the usage, and
// returns exitUsage.
func usageError(fs *flag.FlagSet, stderr io.Writer, format string, args ...any) int {
	fmt.Fprintf(stderr, "tunwall %s: %s\n", fs.Name(), fmt.Sprintf(format, args...))
	fmt.Fprintf(stderr, "('tunwall %s --help' shows its usage)\n", fs.Name())
	return exitUsage
}
