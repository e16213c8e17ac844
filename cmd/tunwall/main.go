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
  policy explain FILE HOST[:PORT] [--phase P] [--udp]
                                         say what the policy decides for a destination
  policy suggest AUDIT.jsonl [--phase P] write a policy allowing what a (learn-mode) run used
  audit  verify FILE [--expect HASH]    check an audit log's hash chain (and that it holds HASH)
  audit  summary FILE                    summarise an audit log per host
  version                                print the version

Run 'tunwall COMMAND -h' for a command's flags.
Exit status: run/bwrap exit with CMD's status; otherwise 0 ok, 1 a check
failed, 2 usage, 125 tunwall could not set up the sandbox.
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

// parseFlags parses args with fs, allowing flags after positional arguments
// (tunwall policy explain FILE HOST --phase exec). It stops at "--"; what
// follows is returned as tail. A bad flag prints usage and returns an error.
func parseFlags(fs *flag.FlagSet, args []string) (pos, tail []string, err error) {
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

// errUsage marks an error that should be answered with the usage text.
var errUsage = errors.New("usage")

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
