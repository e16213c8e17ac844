package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"
)

func TestJSONLinesMakesEveryLineJSON(t *testing.T) {
	var out bytes.Buffer
	j := newJSONLines(&out)
	fmt.Fprintf(j, "tunwall: run tw-1, phase %q, audit log /x.jsonl\ntunwall: denied evil.test:443 tcp: no rule allows it\n", "exec")
	fmt.Fprint(j, "tunwall: WARNING: run tw-1 is not audited\nunprefixed text with \x1b[31m an escape and \"quotes\"\n")
	slog.New(slog.NewJSONHandler(j, jsonLogHandlerOptions(slog.LevelInfo))).Info("took", "dial", 1500*time.Microsecond, "err", fmt.Errorf("boom"))
	fmt.Fprint(j, "tunwall: a last line without a newline")
	j.Flush()
	lines := strings.Split(strings.TrimRight(out.String(), "\n"), "\n")
	if len(lines) != 6 {
		t.Fatalf("%d lines, want 6:\n%s", len(lines), out.String())
	}
	var objs []map[string]any
	for _, l := range lines {
		var o map[string]any
		if err := json.Unmarshal([]byte(l), &o); err != nil {
			t.Fatalf("not JSON (%v): %q", err, l)
		}
		objs = append(objs, o)
	}
	if objs[0]["event"] != "start" || objs[0]["phase"] != "exec" || objs[0]["audit"] != "/x.jsonl" {
		t.Errorf("banner: %v", objs[0])
	}
	if objs[1]["event"] != "denied" || objs[1]["reason"] != "no rule allows it" || objs[1]["level"] != "WARN" {
		t.Errorf("denial: %v", objs[1])
	}
	if objs[2]["level"] != "WARN" {
		t.Errorf("warning: %v", objs[2])
	}
	if objs[4]["dial_ms"] != 1.5 || objs[4]["err"] != "boom" {
		t.Errorf("duration in ms and error as a string: %v", objs[4])
	}
}

func TestJSONLogRequested(t *testing.T) {
	for _, c := range []struct {
		args []string
		want bool
	}{
		{[]string{"--json-log", "--", "x"}, true},
		{[]string{"--policy", "p.yaml", "--json-log", "./agent"}, true},
		{[]string{"--pid", "42", "-json-log=true"}, true},
		{[]string{"--learn", "--json-log=false", "x"}, false},
		{[]string{"./agent", "--json-log"}, false},
		{[]string{"--", "--json-log"}, false},
		{[]string{"--policy", "--json-log"}, false}, // the policy file's name
	} {
		if got := jsonLogRequested(c.args); got != c.want {
			t.Errorf("jsonLogRequested(%q) = %v, want %v", c.args, got, c.want)
		}
	}
}

// TestJSONLinesGiveFailuresTheirEvent: the lines of an allowed flow or
// query that failed and of a client that refused the run's certificate
// are events with what and reason, as a denial is.
func TestJSONLinesGiveFailuresTheirEvent(t *testing.T) {
	for _, c := range []struct{ line, event, what, reason string }{
		{"tunwall: failed api.test:443 tcp: upstream unreachable: the connection timed out (x)", "failed", "api.test:443 tcp", "upstream unreachable: the connection timed out (x)"},
		{"tunwall: failed DNS TXT api.test: the DNS upstream answered SERVFAIL", "failed", "DNS TXT api.test", "the DNS upstream answered SERVFAIL"},
		{"tunwall: cert-rejected api.test:443 tcp: the client hung up: point it at $SSL_CERT_FILE", "cert-rejected", "api.test:443 tcp", "the client hung up: point it at $SSL_CERT_FILE"},
	} {
		var out bytes.Buffer
		j := newJSONLines(&out)
		fmt.Fprintln(j, c.line)
		j.Flush()
		var o map[string]any
		if err := json.Unmarshal(out.Bytes(), &o); err != nil {
			t.Fatalf("not JSON (%v): %q", err, out.String())
		}
		if o["event"] != c.event || o["what"] != c.what || o["reason"] != c.reason {
			t.Errorf("%q: %v", c.line, o)
		}
	}
}
