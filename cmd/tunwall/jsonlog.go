package main

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"regexp"
	"strings"
	"sync"
	"time"
)

// With --json-log every line tunwall itself writes to stderr is one JSON
// object (log/slog's JSON handler: time, level, msg, and fields), so a
// supervisor can parse all of it: the banner, denials, warnings, failures,
// start-up errors and the end-of-run summary. Errors are strings; durations
// are milliseconds, in fields whose names end in _ms.
//
// Every message of tunwall goes through the same writer, whoever prints it
// (cmd, the engine's denial lines, slog diagnostics), so a line added later
// with fmt.Fprintf(stderr, ...) is JSON too. Lines already JSON pass as they
// are. The command's own stderr is not tunwall's and is left alone.

// jsonLogHandlerOptions are the slog options of --json-log: durations in
// milliseconds, errors as strings (slog's default for error values).
func jsonLogHandlerOptions(level slog.Leveler) *slog.HandlerOptions {
	return &slog.HandlerOptions{Level: level, ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
		if a.Value.Kind() == slog.KindDuration {
			return slog.Float64(a.Key+"_ms", float64(a.Value.Duration())/float64(time.Millisecond))
		}
		return a
	}}
}

// jsonLines turns each line written to it into a JSON object on w.
type jsonLines struct {
	mu  sync.Mutex
	buf []byte
	out io.Writer
	log *slog.Logger
}

func newJSONLines(w io.Writer) *jsonLines {
	return &jsonLines{out: w, log: slog.New(slog.NewJSONHandler(w, jsonLogHandlerOptions(slog.LevelDebug)))}
}

func (j *jsonLines) Write(p []byte) (int, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.buf = append(j.buf, p...)
	for {
		i := bytes.IndexByte(j.buf, '\n')
		if i < 0 {
			break
		}
		j.line(string(j.buf[:i]))
		j.buf = j.buf[i+1:]
	}
	// A line is bounded: a partial one past 64 KiB is written as it is.
	if len(j.buf) > 64<<10 {
		j.line(string(j.buf))
		j.buf = j.buf[:0]
	}
	return len(p), nil
}

// Flush writes a last line that has no newline.
func (j *jsonLines) Flush() {
	j.mu.Lock()
	defer j.mu.Unlock()
	if len(j.buf) > 0 {
		j.line(string(j.buf))
		j.buf = nil
	}
}

var (
	reDenied  = regexp.MustCompile(`^denied (DNS \S+ \S+|\S+ \S+ \S+|\S+ \S+): (.*)$`)
	reFailed  = regexp.MustCompile(`^failed (DNS \S+ \S+|\S+ \S+): (.*)$`)
	reCert    = regexp.MustCompile(`^cert-rejected (\S+ \S+): (.*)$`)
	reBanner  = regexp.MustCompile(`^run (\S+), phase "([^"]*)"(.*), audit log (.*)$`)
	reSummary = regexp.MustCompile(`^(\d+) flows allowed, (\d+) denied; (\d+) DNS queries answered, (\d+) denied; (.*) out, (.*) in$`)
	reHost    = regexp.MustCompile(`^  (\S+)\s+(\S+)\s+(\d+) flows, (\d+) DNS$`)
	reAudit   = regexp.MustCompile(`^audit log (\S+) \((\d+) records, last sha256 ([0-9a-f]+)\)`)
)

// line writes one line as a JSON object.
func (j *jsonLines) line(s string) {
	s = strings.TrimRight(s, "\r")
	if strings.HasPrefix(s, "{") && strings.HasSuffix(s, "}") {
		io.WriteString(j.out, s+"\n")
		return
	}
	if s == "" {
		return
	}
	msg, ok := strings.CutPrefix(s, "tunwall: ")
	if !ok {
		msg = strings.TrimPrefix(s, "tunwall ")
	}
	level := slog.LevelInfo
	lower := strings.ToLower(msg)
	switch {
	case strings.HasPrefix(lower, "warning:"):
		level = slog.LevelWarn
		msg = strings.TrimSpace(msg[len("warning:"):])
	case strings.HasPrefix(msg, "denied"):
		level = slog.LevelWarn
	case strings.HasPrefix(msg, "("):
		// a hint
	default:
		for _, w := range []string{"cannot", "error", "failed", "no such", "not ", "stopped serving", "bad ", "out of range",
			"want ", "unknown", "invalid", "must ", "no policy", "ambiguous", "refused", "disappeared"} {
			if strings.Contains(lower, w) {
				level = slog.LevelError
				break
			}
		}
	}
	var attrs []slog.Attr
	if m := reDenied.FindStringSubmatch(msg); m != nil {
		attrs = append(attrs, slog.String("event", "denied"), slog.String("what", m[1]), slog.String("reason", m[2]))
	} else if m := reFailed.FindStringSubmatch(msg); m != nil {
		attrs = append(attrs, slog.String("event", "failed"), slog.String("what", m[1]), slog.String("reason", m[2]))
	} else if m := reCert.FindStringSubmatch(msg); m != nil {
		attrs = append(attrs, slog.String("event", "cert-rejected"), slog.String("what", m[1]), slog.String("reason", m[2]))
	} else if m := reBanner.FindStringSubmatch(msg); m != nil {
		attrs = append(attrs, slog.String("event", "start"), slog.String("run", m[1]), slog.String("phase", m[2]),
			slog.Bool("learn", strings.Contains(m[3], "learn")), slog.String("audit", m[4]))
	} else if m := reSummary.FindStringSubmatch(msg); m != nil {
		attrs = append(attrs, slog.String("event", "summary"), slog.String("flows_allowed", m[1]), slog.String("flows_denied", m[2]),
			slog.String("dns_allowed", m[3]), slog.String("dns_denied", m[4]), slog.String("out", m[5]), slog.String("in", m[6]))
	} else if m := reHost.FindStringSubmatch(msg); m != nil {
		attrs = append(attrs, slog.String("event", "summary_host"), slog.String("host", m[1]), slog.String("verdicts", m[2]),
			slog.String("flows", m[3]), slog.String("dns", m[4]))
	} else if m := reAudit.FindStringSubmatch(msg); m != nil {
		attrs = append(attrs, slog.String("event", "audit_closed"), slog.String("audit", m[1]), slog.String("records", m[2]), slog.String("last_sha256", m[3]))
	}
	j.log.LogAttrs(context.Background(), level, strings.TrimSpace(msg), attrs...)
}

// jsonLogRequested reports whether the flags at the start of args (before
// "--" or the command line) include --json-log, so that even an error in
// the flags is written as JSON.
func jsonLogRequested(args []string) bool {
	fs := newFlagSet("", "", io.Discard)
	var c commonFlags
	c.register(fs)
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" || !strings.HasPrefix(a, "-") {
			return false
		}
		name, val, hasVal := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if name == "json-log" {
			return !hasVal || val == "true" || val == "1"
		}
		if hasVal {
			continue
		}
		if f := fs.Lookup(name); f != nil {
			if b, ok := f.Value.(interface{ IsBoolFlag() bool }); !ok || !b.IsBoolFlag() {
				i++ // its value
			}
		} else if name == "pid" || name == "netns" || name == "listen" || name == "drain" {
			i++ // attach's and socks' own flags with a value
		}
	}
	return false
}
