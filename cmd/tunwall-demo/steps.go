package main

import (
	"bytes"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
)

// A step is one command of a demo workload and the outcome it must have:
// an allowed step must succeed, a denied one must fail. The demo exits
// non-zero when a step does not turn out as it says.
type step struct {
	title   string // what the demo shows after "$ "
	script  string // the shell run for it in the sandbox (a subshell)
	allowed bool   // true: must exit 0; false: must exit non-zero
	want    string // text its output must contain ("" for none)
}

// markerPrefix starts the line the workload prints after each step, with
// the step's number and exit status; the demo reads it and does not show it.
const markerPrefix = "@@tunwall-demo step "

// workloadScript is the shell that runs steps in order inside the sandbox,
// all its output on stdout (tunwall's own lines keep stderr to themselves),
// each step followed by its marker line.
func workloadScript(prelude string, steps []step) string {
	var b strings.Builder
	b.WriteString("exec 2>&1\n")
	b.WriteString(prelude)
	for i, s := range steps {
		fmt.Fprintf(&b, "printf '\\n%s$ %%s%s\\n' %s\n", bold, reset, shellQuote(s.title))
		fmt.Fprintf(&b, "(\n%s\n) </dev/null\necho \"%s%d exit $?\"\n", strings.TrimSpace(s.script), markerPrefix, i)
	}
	return b.String()
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// parseMarker reads a marker line: the step's number and exit status.
func parseMarker(line string) (n, exit int, ok bool) {
	rest, ok := strings.CutPrefix(line, markerPrefix)
	if !ok {
		return 0, 0, false
	}
	num, code, ok := strings.Cut(rest, " exit ")
	if !ok {
		return 0, 0, false
	}
	n, err1 := strconv.Atoi(num)
	exit, err2 := strconv.Atoi(code)
	return n, exit, err1 == nil && err2 == nil
}

// result is what one step did.
type result struct {
	done   bool // its marker was seen
	exit   int
	output string // what the command printed (tunwall's lines not included)
}

// checkSteps says, for each step that did not turn out as it must, what
// went wrong; nothing when every step did.
func checkSteps(steps []step, results []result) []string {
	var bad []string
	for i, s := range steps {
		var r result
		if i < len(results) {
			r = results[i]
		}
		switch {
		case !r.done:
			bad = append(bad, fmt.Sprintf("%q never finished (the workload stopped before it)", s.title))
			continue
		case s.allowed && r.exit != 0:
			bad = append(bad, fmt.Sprintf("%q is allowed but failed (exit %d)", s.title, r.exit))
		case !s.allowed && r.exit == 0:
			bad = append(bad, fmt.Sprintf("%q should have been denied but succeeded", s.title))
		}
		if s.want != "" && !strings.Contains(r.output, s.want) {
			bad = append(bad, fmt.Sprintf("%q: its output lacks %q", s.title, s.want))
		}
	}
	return bad
}

// transcript prints a sandbox's output and tunwall's lines as whole lines,
// in the order they arrive (a partial line of one is never cut by a line of
// the other), and records each step's outcome from the marker lines.
type transcript struct {
	mu      sync.Mutex
	out     io.Writer
	n       int // steps expected
	cur     strings.Builder
	results []result
}

func newTranscript(out io.Writer, steps int) *transcript {
	return &transcript{out: out, n: steps, results: make([]result, steps)}
}

// commandLine handles a line of the sandbox's output.
func (t *transcript) commandLine(line string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if n, exit, ok := parseMarker(line); ok && n >= 0 && n < t.n {
		t.results[n] = result{done: true, exit: exit, output: t.cur.String()}
		t.cur.Reset()
		return
	}
	t.cur.WriteString(line + "\n")
	io.WriteString(t.out, line+"\n")
}

// tunwallLine handles a line tunwall printed.
func (t *transcript) tunwallLine(line string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	io.WriteString(t.out, line+"\n")
}

// Results returns each step's outcome.
func (t *transcript) Results() []result {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]result(nil), t.results...)
}

// lineWriter calls fn with each complete line written to it; Flush passes
// on a last line that has no newline.
type lineWriter struct {
	fn  func(string)
	buf []byte
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			break
		}
		w.fn(string(w.buf[:i]))
		w.buf = w.buf[i+1:]
	}
	return len(p), nil
}

func (w *lineWriter) Flush() {
	if len(w.buf) > 0 {
		w.fn(string(w.buf))
		w.buf = nil
	}
}
