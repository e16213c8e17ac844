package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/tunwall/tunwall/internal/session"
)

// Retention of the default audit directory: see package session
// (PruneAuditDir). These are the flags' defaults.
const (
	defaultAuditKeep     = 100
	defaultAuditKeepDays = 30
)

// auditLs lists the run logs of the state directory (or dir), newest
// first, in a table that fits 100 columns.
func auditLs(args []string, stdout, stderr io.Writer) int {
	flags := newFlagSet("audit ls", "tunwall audit ls [DIR]", stderr)
	pos, _, err := parseFlagsInterspersed(flags, args)
	if err != nil {
		return flagExit(flags, err, stdout, stderr)
	}
	if len(pos) > 1 {
		return usageError(flags, stderr, "want at most one DIR")
	}
	dir := ""
	if len(pos) == 1 {
		dir = pos[0]
	} else {
		p, err := session.DefaultAuditPath("x")
		if err != nil {
			fmt.Fprintf(stderr, "tunwall: %v\n", err)
			return exitFail
		}
		dir = filepath.Dir(p)
	}
	logs, err := session.RunLogs(dir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		fmt.Fprintf(stderr, "tunwall: %v\n", err)
		return exitFail
	}
	fmt.Fprintf(stdout, "%-19s  %-20s  %-20s  %9s  %s\n", "RUN", "STARTED", "LAST WRITE", "SIZE", "PHASE")
	var total int64
	for _, l := range logs {
		started, phase := runHeader(l.Path)
		total += l.Info.Size()
		fmt.Fprintf(stdout, "%-19s  %-20s  %-20s  %9s  %s\n", l.Info.Name()[:19], started,
			l.Info.ModTime().UTC().Format(time.RFC3339), session.HumanBytes(l.Info.Size()), session.TruncateMiddle(phase, 20))
	}
	fmt.Fprintf(stdout, "%d runs, %s, in %s\n", len(logs), session.HumanBytes(total), dir)
	return exitOK
}

// runHeader reads the start time and phase from a log's header line.
func runHeader(path string) (started, phase string) {
	f, err := os.Open(path)
	if err != nil {
		return "-", "-"
	}
	defer f.Close()
	line, _ := bufio.NewReaderSize(io.LimitReader(f, 64<<10), 64<<10).ReadSlice('\n')
	var h struct {
		TS    time.Time `json:"ts"`
		Phase string    `json:"phase"`
	}
	if json.Unmarshal(line, &h) != nil || h.TS.IsZero() {
		return "-", "-"
	}
	return h.TS.UTC().Format(time.RFC3339), h.Phase
}
