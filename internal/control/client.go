package control

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// Ask sends req to the control socket at path and returns the answer; an
// answer with Error set is returned as an error.
func Ask(path string, req Request) (*Response, error) {
	c, err := net.DialTimeout("unix", path, ioTimeout)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * ioTimeout))
	b, _ := json.Marshal(req)
	// A refused client is answered before its request is read, and the
	// socket closed: the answer is read even when the write failed.
	_, werr := c.Write(append(b, '\n'))
	var r Response
	if err := json.NewDecoder(io.LimitReader(c, maxResponse)).Decode(&r); err != nil {
		if werr != nil {
			err = werr
		}
		return nil, fmt.Errorf("control socket %s: %w", path, err)
	}
	if r.Error != "" {
		return nil, fmt.Errorf("control socket %s: %s", path, r.Error)
	}
	return &r, nil
}

// maxRuns bounds how many sockets List asks.
const maxRuns = 256

// List asks every control socket in dir for its status and returns those
// of the live runs, oldest first. Sockets nobody listens on (a tunwall
// that was killed) are skipped.
func List(dir string) ([]Status, error) {
	names, err := filepath.Glob(filepath.Join(dir, "*.sock"))
	if err != nil {
		return nil, err
	}
	if len(names) > maxRuns {
		names = names[:maxRuns]
	}
	var out []Status
	for _, p := range names {
		r, err := Ask(p, Request{Cmd: CmdStatus})
		if err != nil || r.Status == nil {
			continue
		}
		out = append(out, *r.Status)
	}
	slices.SortFunc(out, func(a, b Status) int { return a.Started.Compare(b.Started) })
	return out, nil
}

// ErrNoRun and ErrManyRuns are Find's errors when dir has no live run, or
// more than one and none was named.
var (
	ErrNoRun    = errors.New("no live tunwall run of this user")
	ErrManyRuns = errors.New("more than one live tunwall run: name one with --run ID ('tunwall ctl ls' lists them)")
)

// Find returns the socket of run in dir, or, with run "", of the only
// live run there.
func Find(dir, run string) (string, error) {
	if run != "" {
		if strings.ContainsAny(run, "/\x00") || run == "." || run == ".." {
			return "", fmt.Errorf("--run %q is not a run id", run)
		}
		p := SocketPath(dir, run)
		if _, err := os.Lstat(p); err != nil {
			return "", fmt.Errorf("run %s: no control socket in %s", run, dir)
		}
		return p, nil
	}
	runs, err := List(dir)
	if err != nil {
		return "", err
	}
	switch len(runs) {
	case 0:
		return "", fmt.Errorf("%w (looked in %s)", ErrNoRun, dir)
	case 1:
		return SocketPath(dir, runs[0].Run), nil
	}
	return "", ErrManyRuns
}
