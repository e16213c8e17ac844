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
	"regexp"
	"sort"
	"time"
)

// Retention of the default audit directory ($XDG_STATE_HOME/tunwall), where
// each run without --audit FILE writes its own log: when a run starts, logs
// beyond the newest --audit-keep (default 100) and logs older than
// --audit-keep-days (default 30) are removed, so the directory does not
// grow without bound. Only files named as tunwall names them (RUN.jsonl,
// RUN = tw- and 16 hex digits), regular files, are ever removed; the
// starting run's own log never is.
const (
	defaultAuditKeep     = 100
	defaultAuditKeepDays = 30
)

var runLogName = regexp.MustCompile(`^tw-[0-9a-f]{16}\.jsonl$`)

// runLog is one run's log in the state directory.
type runLog struct {
	path string
	info os.FileInfo
}

// runLogs lists dir's run logs, newest first.
func runLogs(dir string) ([]runLog, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []runLog
	for _, e := range ents {
		if !runLogName.MatchString(e.Name()) || !e.Type().IsRegular() {
			continue
		}
		info, err := e.Info()
		if err != nil {
			continue
		}
		out = append(out, runLog{filepath.Join(dir, e.Name()), info})
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].info.ModTime().After(out[j].info.ModTime()) })
	return out, nil
}

// pruneAuditDir removes dir's run logs beyond the newest keep and older
// than keepDays days (0: no such limit), sparing current.
func pruneAuditDir(dir, current string, keep, keepDays int, now time.Time, stderr io.Writer) {
	logs, err := runLogs(dir)
	if err != nil {
		return
	}
	removed := 0
	kept := 0
	for _, l := range logs {
		if l.path == current {
			kept++ // the starting run's own log is one of the kept
		}
	}
	for _, l := range logs {
		if l.path == current {
			continue
		}
		old := keepDays > 0 && now.Sub(l.info.ModTime()) > time.Duration(keepDays)*24*time.Hour
		if old || (keep > 0 && kept >= keep) {
			if err := os.Remove(l.path); err == nil {
				removed++
			}
			continue
		}
		kept++
	}
	if removed > 0 {
		fmt.Fprintf(stderr, "tunwall: removed %d old run logs from %s (keeping the last %d runs and %d days: --audit-keep, --audit-keep-days)\n", removed, dir, keep, keepDays)
	}
}

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
		p, err := defaultAuditPath("x")
		if err != nil {
			fmt.Fprintf(stderr, "tunwall: %v\n", err)
			return exitFail
		}
		dir = filepath.Dir(p)
	}
	logs, err := runLogs(dir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		fmt.Fprintf(stderr, "tunwall: %v\n", err)
		return exitFail
	}
	fmt.Fprintf(stdout, "%-19s  %-20s  %-20s  %9s  %s\n", "RUN", "STARTED", "LAST WRITE", "SIZE", "PHASE")
	var total int64
	for _, l := range logs {
		started, phase := runHeader(l.path)
		total += l.info.Size()
		fmt.Fprintf(stdout, "%-19s  %-20s  %-20s  %9s  %s\n", l.info.Name()[:19], started,
			l.info.ModTime().UTC().Format(time.RFC3339), humanBytes(l.info.Size()), truncateMiddle(phase, 20))
	}
	fmt.Fprintf(stdout, "%d runs, %s, in %s\n", len(logs), humanBytes(total), dir)
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
