package main

import (
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/tunwall/tunwall/internal/audit"
)

func cmdAudit(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, "usage: tunwall audit (verify FILE | summary FILE)\n")
		return exitUsage
	}
	sub := args[0]
	fs := newFlagSet("audit "+sub, "tunwall audit "+sub+" FILE", stderr)
	pos, _, err := parseFlags(fs, args[1:])
	if err != nil {
		return exitUsage
	}
	if sub != "verify" && sub != "summary" {
		fmt.Fprintf(stderr, "tunwall audit: unknown subcommand %q (verify, summary)\n", sub)
		return exitUsage
	}
	if len(pos) != 1 {
		return usageError(fs, stderr, "want exactly one FILE")
	}
	f, err := os.Open(pos[0])
	if err != nil {
		fmt.Fprintf(stderr, "tunwall: %v\n", err)
		return exitFail
	}
	defer f.Close()
	if sub == "summary" {
		if err := audit.Summarize(f, stdout); err != nil {
			fmt.Fprintf(stderr, "tunwall: %s: %v\n", pos[0], err)
			return exitFail
		}
		return exitOK
	}
	res, err := audit.Verify(f)
	if err != nil {
		var ve *audit.VerifyError
		if errors.As(err, &ve) {
			fmt.Fprintf(stderr, "%s:%d: %s\n", pos[0], ve.Line, ve.Msg)
		} else {
			fmt.Fprintf(stderr, "tunwall: %s: %v\n", pos[0], err)
		}
		fmt.Fprintf(stdout, "%s: FAILED (%d records verified before the bad line)\n", pos[0], res.Records)
		return exitFail
	}
	fmt.Fprintf(stdout, "%s: ok: run %s, %d records, chain intact, last sha256 %s\n", pos[0], res.Run, res.Records, res.Last)
	return exitOK
}
