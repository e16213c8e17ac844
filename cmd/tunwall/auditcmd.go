package main

import (
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"

	"github.com/tunwall/tunwall/internal/audit"
)

// hashFlags collects repeatable --expect values: SHA-256 hashes in hex.
type hashFlags []string

func (h *hashFlags) String() string { return strings.Join(*h, ",") }

func (h *hashFlags) Set(s string) error {
	if b, err := hex.DecodeString(s); err != nil || len(b) != 32 {
		return fmt.Errorf("want a SHA-256 as 64 hex digits (the last hash a run printed), got %q", s)
	}
	*h = append(*h, strings.ToLower(s))
	return nil
}

const auditUsage = `usage: tunwall audit SUBCOMMAND FILE [flags]

Subcommands:
  verify FILE [--expect HASH]...   check an audit log's hash chain (and that it holds HASH)
  summary FILE [--by KEY]          summarise an audit log per host (by run, or by a label's value), and check its chain
  ls [DIR]                         list the runs' logs of the state directory, newest first

FILE may also be a capture of tunwall node --audit-stdout, many runs interleaved:
each run's chain is then checked apart, and verify says per run what it found.

Run 'tunwall audit SUBCOMMAND --help' for its flags.
`

var auditSubcommands = []string{"verify", "summary", "ls"}

func cmdAudit(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, auditUsage)
		return exitUsage
	}
	sub := args[0]
	switch sub {
	case "ls":
		return auditLs(args[1:], stdout, stderr)
	case "verify", "summary":
	case "-h", "--help", "-help", "help":
		if sub == "help" && len(args) > 1 {
			return cmdAudit([]string{args[1], "--help"}, stdout, stderr)
		}
		fmt.Fprint(stdout, auditUsage)
		return exitOK
	default:
		return unknownSubcommand("audit", sub, auditSubcommands, stderr)
	}
	synopsis := "tunwall audit " + sub + " FILE"
	if sub == "verify" {
		synopsis += " [--expect HASH]..."
	} else {
		synopsis += " [--by KEY]"
	}
	fs := newFlagSet("audit "+sub, synopsis, stderr)
	var expect hashFlags
	var by string
	if sub == "verify" {
		fs.Var(&expect, "expect", "a `HASH` the log must hold: the last sha256 a run printed, kept elsewhere; it pins every line up to it (repeatable; a log file's, not a capture's of many runs)")
	} else {
		fs.StringVar(&by, "by", "", "group by the value of the label `KEY` (--label KEY=VALUE of the runs) instead of by run")
	}
	pos, _, err := parseFlagsInterspersed(fs, args[1:])
	if err != nil {
		return flagExit(fs, err, stdout, stderr)
	}
	if len(pos) != 1 {
		return usageError(fs, stderr, "want exactly one FILE")
	}
	if by != "" {
		if err := audit.CheckLabelKey(by); err != nil {
			return usageError(fs, stderr, "--by: %v", err)
		}
	}
	name := pos[0]
	f, err := os.Open(name)
	if err != nil {
		fmt.Fprintf(stderr, "tunwall: %v\n", err)
		return exitFail
	}
	defer f.Close()
	stream, err := audit.IsStream(f)
	if err == nil {
		_, err = f.Seek(0, io.SeekStart)
	}
	if err != nil {
		fmt.Fprintf(stderr, "tunwall: %s: %v\n", name, err)
		return exitFail
	}
	if sub == "summary" {
		return auditSummary(f, name, by, stream, stdout, stderr)
	}
	if stream {
		if len(expect) > 0 {
			return usageError(fs, stderr, "--expect: %s is a capture of many runs (--audit-stdout), each its own chain; "+
				"verify it without --expect, then check a run's last sha256 against the one kept", name)
		}
		return auditVerifyStream(f, name, stdout, stderr)
	}
	return auditVerify(f, name, expect, stdout, stderr)
}

// auditSummary prints the summary of the audit log f (named name) and
// then checks its integrity: the exit status says how that went, as
// verify's would.
func auditSummary(f *os.File, name, by string, stream bool, stdout, stderr io.Writer) int {
	summarize := audit.SummarizeBy
	if stream {
		summarize = audit.SummarizeStreamBy
	}
	if err := summarize(f, stdout, by); err != nil {
		fmt.Fprintf(stderr, "tunwall: %s: %v\n", name, err)
		return exitFail
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		fmt.Fprintf(stderr, "tunwall: %s: %v\n", name, err)
		return exitFail
	}
	var err error
	if stream {
		_, err = audit.VerifyStream(f)
	} else {
		_, err = audit.VerifyWith(f, audit.VerifyOptions{})
	}
	if err != nil {
		fmt.Fprintf(stderr, "%s: integrity check failed: %s\n", name, strings.TrimPrefix(err.Error(), "audit: "))
		return exitFail
	}
	return exitOK
}

// auditVerifyStream checks a capture of many runs' interleaved chains
// (--audit-stdout), each run apart, and says per run what it found.
func auditVerifyStream(f io.Reader, name string, stdout, stderr io.Writer) int {
	res, err := audit.VerifyStream(f)
	var ve *audit.VerifyError
	if err != nil && !errors.As(err, &ve) {
		fmt.Fprintf(stderr, "tunwall: %s: %v\n", name, err)
		return exitFail
	}
	records := 0
	for _, r := range res.Runs {
		records += r.Records
		who := ""
		if m := r.Labels.Map(); len(m) > 0 {
			var kv []string
			for _, k := range slices.Sorted(maps.Keys(m)) {
				kv = append(kv, k+"="+m[k])
			}
			who = " (" + strings.Join(kv, " ") + ")"
		}
		switch {
		case r.Err == nil:
			fmt.Fprintf(stdout, "%s: run %s%s: ok, %d records, chain intact, last sha256 %s\n", name, r.Run, who, r.Records, r.Last)
		case r.Err.Incomplete:
			fmt.Fprintf(stderr, "%s:%d: run %s: %s\n", name, r.Err.Line, r.Run, r.Err.Msg)
			fmt.Fprintf(stdout, "%s: run %s%s: INCOMPLETE: %d records chain intact, but no trailer (still going, its agent killed, or its tail cut); last sha256 %s\n",
				name, r.Run, who, r.Records, r.Last)
		default:
			fmt.Fprintf(stderr, "%s:%d: run %s: %s\n", name, r.Err.Line, r.Run, r.Err.Msg)
			fmt.Fprintf(stdout, "%s: run %s%s: FAILED at line %d (%d records verified before it)\n", name, r.Run, who, r.Err.Line, r.Records)
		}
	}
	for _, p := range res.Problems {
		fmt.Fprintf(stderr, "%s:%d: %s\n", name, p.Line, p.Msg)
	}
	failed, incomplete := res.Bad()
	switch {
	case err == nil:
		fmt.Fprintf(stdout, "%s: ok: %d runs interleaved from %d stream(s), %d records, each run's chain intact and complete\n",
			name, len(res.Runs), len(res.Streams), records)
		return exitOK
	case ve.Incomplete:
		fmt.Fprintf(stdout, "%s: FAILED: incomplete: %d of %d runs have no trailer\n", name, incomplete, len(res.Runs))
	default:
		fmt.Fprintf(stdout, "%s: FAILED: %d of %d runs broken, %d without a trailer, %d problem(s) beyond one run (first at line %d)\n",
			name, failed, len(res.Runs), incomplete, len(res.Problems), ve.Line)
	}
	return exitFail
}

// auditVerify checks the hash chain of the audit log f (named name), and
// that it holds each expected hash, and says the verdict.
func auditVerify(f io.Reader, name string, expect hashFlags, stdout, stderr io.Writer) int {
	res, err := audit.VerifyWith(f, audit.VerifyOptions{Expect: expect})
	for _, u := range res.Unfinished {
		fmt.Fprintf(stdout, "%s: note: %s\n", name, u)
	}
	var ve *audit.VerifyError
	var ae *audit.AnchorError
	switch {
	case errors.As(err, &ve) && ve.Incomplete:
		fmt.Fprintf(stderr, "%s:%d: %s\n", name, ve.Line, ve.Msg)
		fmt.Fprintf(stdout, "%s: FAILED: incomplete: lines 1..%d chain intact (%d records), but run %s has no trailer; last sha256 %s\n",
			name, res.Lines, res.Records, res.Run, res.Last)
		return exitFail
	case errors.As(err, &ve):
		fmt.Fprintf(stderr, "%s:%d: %s\n", name, ve.Line, ve.Msg)
		fmt.Fprintf(stdout, "%s: FAILED (%d records verified before the bad line)\n", name, res.Records)
		return exitFail
	case errors.As(err, &ae):
		fmt.Fprintf(stderr, "%s: %s\n", name, strings.TrimPrefix(ae.Error(), "audit: "))
		fmt.Fprintf(stdout, "%s: FAILED: the chain is intact but is not the one the expected hash pinned\n", name)
		return exitFail
	case err != nil:
		fmt.Fprintf(stderr, "tunwall: %s: %v\n", name, err)
		return exitFail
	}
	fmt.Fprintf(stdout, "%s: ok: run %s, %d records, chain intact, last sha256 %s\n", name, res.Run, res.Records, res.Last)
	for i, line := range res.Anchors {
		after := ""
		if n := res.Lines - line; n > 0 {
			after = fmt.Sprintf(" (%d lines after it are not pinned by it)", n)
		}
		fmt.Fprintf(stdout, "%s: anchor %s is line %d: lines 1..%d are as they were when it was taken%s\n", name, expect[i], line, line, after)
	}
	return exitOK
}
