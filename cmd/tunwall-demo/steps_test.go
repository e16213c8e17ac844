package main

import (
	"strings"
	"testing"
)

// feed runs a workload's output through a transcript, as the demo does:
// the command's lines and tunwall's on their own writers.
func feed(t *testing.T, steps []step, command, tunwall string) (shown string, results []result) {
	t.Helper()
	var out strings.Builder
	tr := newTranscript(&out, len(steps))
	cw, tw := &lineWriter{fn: tr.commandLine}, &lineWriter{fn: tr.tunwallLine}
	cw.Write([]byte(command))
	tw.Write([]byte(tunwall))
	cw.Flush()
	tw.Flush()
	return out.String(), tr.Results()
}

var twoSteps = []step{
	{title: "curl https://allowed.test/", allowed: true, want: "allowed.test /"},
	{title: "curl https://evil.test/", want: "curl exit"},
}

// What `make demo` printed as root before the fix: the allowed step failed
// on an unreadable CA file, and the demo still exited 0.
func TestAnAllowedStepThatFailsFailsTheDemo(t *testing.T) {
	_, res := feed(t, twoSteps,
		"curl: (77) error setting certificate file: /tmp/tunwall-demo-1/testworld-ca.pem\n"+markerPrefix+"0 exit 77\n"+
			"curl exit 6\n"+markerPrefix+"1 exit 6\n", "")
	bad := checkSteps(twoSteps, res)
	if len(bad) != 2 || !strings.Contains(bad[0], "is allowed but failed (exit 77)") || !strings.Contains(bad[1], `lacks "allowed.test /"`) {
		t.Fatalf("want the allowed step reported as failed, twice over; got %q", bad)
	}
}

func TestADenialThatSucceedsFailsTheDemo(t *testing.T) {
	_, res := feed(t, twoSteps, "web allowed.test /\n"+markerPrefix+"0 exit 0\ncurl exit 0\n"+markerPrefix+"1 exit 0\n", "")
	bad := checkSteps(twoSteps, res)
	if len(bad) != 1 || !strings.Contains(bad[0], "should have been denied but succeeded") {
		t.Fatalf("got %q", bad)
	}
}

func TestAStepThatNeverRanFailsTheDemo(t *testing.T) {
	_, res := feed(t, twoSteps, "web allowed.test /\n"+markerPrefix+"0 exit 0\n", "tunwall: the sandbox's TUN disappeared; stopping\n")
	bad := checkSteps(twoSteps, res)
	if len(bad) != 1 || !strings.Contains(bad[0], "never finished") {
		t.Fatalf("got %q", bad)
	}
}

func TestStepsThatTurnOutAsTheySayPass(t *testing.T) {
	shown, res := feed(t, twoSteps, "web allowed.test /\n"+markerPrefix+"0 exit 0\ncurl exit 6\n"+markerPrefix+"1 exit 6\n",
		"tunwall: denied DNS A evil.test: no rule allows it\n")
	if bad := checkSteps(twoSteps, res); len(bad) != 0 {
		t.Fatalf("got %q", bad)
	}
	if strings.Contains(shown, markerPrefix) {
		t.Errorf("a marker line was shown:\n%s", shown)
	}
	if res[1].output != "curl exit 6\n" || strings.Contains(res[1].output, "tunwall:") {
		t.Errorf("step 1's output is %q, want only the command's", res[1].output)
	}
}

// Lines are whole: a line tunwall prints while the command is half-way
// through one of its own comes out before or after it, never inside it.
func TestTunwallsLinesNeverCutTheCommandsLines(t *testing.T) {
	var out strings.Builder
	tr := newTranscript(&out, 1)
	cw, tw := &lineWriter{fn: tr.commandLine}, &lineWriter{fn: tr.tunwallLine}
	cw.Write([]byte("the body of an "))
	tw.Write([]byte("tunwall: denied allowed.test:80 tcp: fronting\n"))
	cw.Write([]byte("HTTP 403\n"))
	want := "tunwall: denied allowed.test:80 tcp: fronting\nthe body of an HTTP 403\n"
	if out.String() != want {
		t.Fatalf("shown %q, want %q", out.String(), want)
	}
}

// The workload script runs every step in a subshell and reports its status
// in a marker line that parseMarker reads back.
func TestWorkloadScriptMarksEveryStep(t *testing.T) {
	s := workloadScript("export HOME=/x\n", twoSteps)
	if !strings.HasPrefix(s, "exec 2>&1\nexport HOME=/x\n") {
		t.Errorf("script does not start with the redirect and the prelude:\n%s", s)
	}
	for i := range twoSteps {
		line := markerPrefix + string(rune('0'+i)) + ` exit $?"`
		if !strings.Contains(s, line) {
			t.Errorf("no marker for step %d in:\n%s", i, s)
		}
	}
	if n, code, ok := parseMarker(markerPrefix + "12 exit 127"); !ok || n != 12 || code != 127 {
		t.Errorf("parseMarker: %d %d %v", n, code, ok)
	}
	for _, l := range []string{"curl exit 7", markerPrefix + "x exit 1", markerPrefix + "1 exit"} {
		if _, _, ok := parseMarker(l); ok {
			t.Errorf("parseMarker(%q) accepted it", l)
		}
	}
}
