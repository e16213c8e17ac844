package session

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
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

// prunedMarker, in the state directory, records that pruning it was said
// once; it is never said again there.
const prunedMarker = ".pruning-said"

// PruneAuditDir removes dir's run logs beyond the newest keep and older
// than keepDays days (0: no such limit), sparing current. The first time
// it removes any it says so on w (nil: say nothing, as under --quiet),
// once per directory: a directory at its limit loses a log on every run.
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
	if removed == 0 || w == nil {
		return
	}
	marker := filepath.Join(dir, prunedMarker)
	if _, err := os.Lstat(marker); err == nil {
		return
	}
	if err := os.WriteFile(marker, []byte("tunwall said it prunes this folder (--audit-keep, --audit-keep-days)\n"), 0o600); err != nil {
		return // said on every run rather than never
	}
	var limits []string
	if keep > 0 {
		limits = append(limits, fmt.Sprintf("the last %d runs (--audit-keep)", keep))
	}
	if keepDays > 0 {
		limits = append(limits, fmt.Sprintf("%d days (--audit-keep-days)", keepDays))
	}
	fmt.Fprintf(w, "tunwall: removed %d old run logs from %s: it keeps %s, and says so only this once ('tunwall audit ls' lists what is kept)\n",
		removed, dir, strings.Join(limits, " and "))
}
