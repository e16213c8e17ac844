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
  bwrap  [flags] -- BWRAP_ARGS...        run bubblewrap with --unshare-net, served by tunwall
  attach [flags] (--pid PID | --netns PATH)
                                         serve an existing network namespace
  socks  [flags] --listen ADDR           a SOCKS5 proxy with the same policy and audit
  policy check FILE                      validate a policy file
  policy explain FILE (HOST[:PORT] | URL [--method M]) [--phase P] [--udp]
                                         say what the policy decides for a destination or request
  policy suggest AUDIT.jsonl [--phase P] write a policy allowing what a (learn-mode) run used
  audit  verify FILE [--expect HASH]    check an audit log's hash chain (and that it holds HASH)
  audit  summary FILE                    summarise an audit log per host
  version                                print the version

Run 'tunwall COMMAND -h' for a command's flags.
Exit status: run/bwrap exit with CMD's status; otherwise 0 ok, 1 a check
failed, 2 usage, 3 attach stopped because the namespace gained another way
out, 125 tunwall could not set up the sandbox.
`

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usageText)
		return exitUsage
	}
	cmd, rest := args[0], args[1:]
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
	case "version", "--version":
		fmt.Fprintf(stdout, "tunwall %s\n", version)
		return exitOK
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usageText)
		return exitOK
	}
	fmt.Fprintf(stderr, "tunwall: unknown command %q\n\n%s", cmd, usageText)
	return exitUsage
}

// parseFlags parses args with fs the way Go's flag package and bwrap do:
// flags stop at the first argument that is not one, and everything from
// there on is returned as pos, untouched (a command line, whose own "--" and
// flags are its own). A leading "--" ends the flags too; what follows it is
// returned as tail. So `tunwall run --policy p.yaml ./agent.sh --learn` runs
// ./agent.sh with the argument --learn, and learn mode stays off.
//
// A flag given twice is an error (see onceFlags), except the repeatable
// --allow. A bad flag prints usage and returns an error.
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
	set      bool
	repeated *bool
}

func (o *onceValue) Set(s string) error {
	if o.set {
		*o.repeated = true
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
// (usage output reads the flags' own values). A repeated flag is reported on
// one line, without the usage text.
//
// Every flag is single-valued unless its Value is marked repeatable (a Var
// that collects values: --allow, --expect), so a new flag is safe by
// default.
func onceFlags(fs *flag.FlagSet) (restore func()) {
	saved := map[*flag.Flag]flag.Value{}
	repeated := false
	fs.VisitAll(func(f *flag.Flag) {
		if _, ok := f.Value.(repeatable); ok {
			return
		}
		saved[f] = f.Value
		o := &onceValue{Value: f.Value, repeated: &repeated}
		if b, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() {
			f.Value = onceBool{o}
		} else {
			f.Value = o
		}
	})
	usage := fs.Usage
	restore = func() {
		for f, v := range saved {
			f.Value = v
		}
		fs.Usage = usage
	}
	fs.Usage = func() {
		restore()
		if !repeated {
			usage()
		}
	}
	return restore
}

func newFlagSet(name, synopsis string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: %s\n\nflags:\n", synopsis)
		fs.PrintDefaults()
	}
	return fs
}

// usageError prints msg and the flag set's usage, and returns exitUsage.
func usageError(fs *flag.FlagSet, stderr io.Writer, format string, args ...any) int {
	fmt.Fprintf(stderr, "tunwall %s: %s\n", fs.Name(), fmt.Sprintf(format, args...))
	fs.Usage()
	return exitUsage
}
