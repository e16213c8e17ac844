package session

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"time"
)

// Retention of the default audit directory ($XDG_STATE_HOME/tunwall), where
// each run without an audit path of its own writes its log: when a run
// starts, logs beyond the newest Keep (cmd/tunwall's default 100) and logs
// older than KeepDays (default 30) are removed, so the directory does not
// grow without bound. Only files named as tunwall names them (RUN.jsonl,
// RUN = tw- and 16 hex digits), regular files, are ever removed; the
// starting run's own log never is.

var runLogName = regexp.MustCompile(`^tw-[0-9a-f]{16}\.jsonl$`)

// DefaultAuditPath is where the log of run goes without an audit path:
// $XDG_STATE_HOME/tunwall/RUN.jsonl, or ~/.local/state/tunwall/RUN.jsonl.
func DefaultAuditPath(run string) (string, error) {
	dir := os.Getenv("XDG_STATE_HOME")
	if dir == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", fmt.Errorf("no audit path: give --audit FILE (%w)", err)
		}
		dir = filepath.Join(home, ".local", "state")
	}
	return filepath.Join(dir, "tunwall", run+".jsonl"), nil
}

// RunLog is one run's log in the state directory.
type RunLog struct {
	Path string
	Info os.FileInfo
}

// RunLogs lists dir's run logs, newest first.
func RunLogs(dir string) ([]RunLog, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []RunLog
	for _, e := range ents {
		if !runLogName.MatchString(e.Name()) || !e.Type().IsRegular() {
			continue
		}
		info, err := e.Info()
		if err != nil {
			continue
		}
		out = append(out, RunLog{filepath.Join(dir, e.Name()), info})
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Info.ModTime().After(out[j].Info.ModTime()) })
	return out, nil
}

// PruneAuditDir removes dir's run logs beyond the newest keep and older
// than keepDays days (0: no such limit), sparing current, and says on w
// how many it removed.
func PruneAuditDir(dir, current string, keep, keepDays int, now time.Time, w io.Writer) {
	logs, err := RunLogs(dir)
	if err != nil {
		return
	}
	removed := 0
	kept := 0
	for _, l := range logs {
		if l.Path == current {
			kept++ // the starting run's own log is one of the kept
		}
	}
	for _, l := range logs {
		if l.Path == current {
			continue
		}
		old := keepDays > 0 && now.Sub(l.Info.ModTime()) > time.Duration(keepDays)*24*time.Hour
		if old || (keep > 0 && kept >= keep) {
			if err := os.Remove(l.Path); err == nil {
				removed++
			}
			continue
		}
		kept++
	}
	if removed > 0 {
		fmt.Fprintf(w, "tunwall: removed %d old run logs from %s (keeping the last %d runs and %d days: --audit-keep, --audit-keep-days)\n", removed, dir, keep, keepDays)
	}
}
