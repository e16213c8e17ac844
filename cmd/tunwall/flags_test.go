package main

import (
	"bytes"
	"io"
	"slices"
	"strings"
	"testing"
)

func TestParseFlagsStopsAtTheCommand(t *testing.T) {
	tests := []struct {
		name      string
		args      []string
		pos, tail []string
		learn     bool
		allow     []string
	}{
		{"flags then the command", []string{"--learn", "./agent.sh", "--allow", "x"}, []string{"./agent.sh", "--allow", "x"}, nil, true, nil},
		{"a flag after the command is the command's", []string{"--allow", "a", "./agent.sh", "--learn"}, []string{"./agent.sh", "--learn"}, nil, false, []string{"a"}},
		{"-- ends the flags", []string{"--allow", "a", "--", "sh", "-c", "x", "--learn"}, nil, []string{"sh", "-c", "x", "--learn"}, false, []string{"a"}},
		{"-- after the command is the command's", []string{"./agent.sh", "--", "--learn"}, []string{"./agent.sh", "--", "--learn"}, nil, false, nil},
		{"--allow repeats", []string{"--allow", "a", "--allow=b", "cmd"}, []string{"cmd"}, nil, false, []string{"a", "b"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stderr bytes.Buffer
			fs := newFlagSet("run", "test", &stderr)
			var c commonFlags
			c.register(fs)
			pos, tail, err := parseFlags(fs, tt.args)
			if err != nil {
				t.Fatalf("parseFlags(%q): %v\n%s", tt.args, err, stderr.String())
			}
			if !slices.Equal(pos, tt.pos) || !slices.Equal(tail, tt.tail) || c.learn != tt.learn || !slices.Equal(c.allow, tt.allow) {
				t.Errorf("parseFlags(%q) = pos %q tail %q learn %v allow %q; want %q %q %v %q", tt.args, pos, tail, c.learn, c.allow, tt.pos, tt.tail, tt.learn, tt.allow)
			}
		})
	}
}

func TestRepeatedFlagsAreOneLineErrors(t *testing.T) {
	for _, args := range [][]string{
		{"--policy", "a", "--policy", "b", "cmd"},
		{"--policy=a", "-policy", "b", "cmd"},
		{"--audit", "x", "--audit", "off", "cmd"},
		{"--learn", "--learn=false", "cmd"},
		{"--learn", "--learn", "cmd"},
		{"--mtu", "1500", "--mtu", "9000", "cmd"},
		{"--phase", "a", "--phase", "a", "cmd"},
	} {
		var stderr bytes.Buffer
		fs := newFlagSet("run", "test", &stderr)
		var c commonFlags
		c.register(fs)
		_, _, err := parseFlags(fs, args)
		if err == nil {
			t.Errorf("parseFlags(%q) accepted a repeated flag", args)
			continue
		}
		if stderr.Len() > 0 {
			t.Errorf("parseFlags(%q) printed %q itself", args, stderr.String())
		}
		if code := flagExit(fs, err, io.Discard, &stderr); code != exitUsage {
			t.Errorf("flagExit: %d", code)
		}
		if l := strings.Split(strings.TrimSpace(stderr.String()), "\n"); len(l) != 2 || !strings.Contains(l[0], "more than once") || !strings.Contains(l[1], "--help") {
			t.Errorf("parseFlags(%q) printed %q, want one line saying the flag was given more than once and a hint", args, stderr.String())
		}
		// The usage text still shows the flags' real defaults afterwards.
		stderr.Reset()
		fs.Usage()
		if !strings.Contains(stderr.String(), "(default 65520)") || strings.Contains(stderr.String(), "panic") {
			t.Errorf("usage after a repeated flag:\n%s", stderr.String())
		}
	}
}

func TestPolicyCommandsTakeFlagsAfterTheirFiles(t *testing.T) {
	var stderr bytes.Buffer
	fs := newFlagSet("policy explain", "test", &stderr)
	phase := fs.String("phase", "", "")
	pos, _, err := parseFlagsInterspersed(fs, []string{"p.yaml", "host:443", "--phase", "exec"})
	if err != nil || !slices.Equal(pos, []string{"p.yaml", "host:443"}) || *phase != "exec" {
		t.Errorf("got %q, %q, %v", pos, *phase, err)
	}
	fs = newFlagSet("policy explain", "test", &stderr)
	fs.String("phase", "", "")
	if _, _, err := parseFlagsInterspersed(fs, []string{"--phase", "a", "p.yaml", "--phase", "b"}); err == nil {
		t.Error("a repeated --phase after the files was accepted")
	}
}

func TestEveryRepeatableFlagIsMarked(t *testing.T) {
	// --allow and audit verify's --expect repeat; the rest refuse a second
	// value.
	var stderr bytes.Buffer
	fs := newFlagSet("run", "test", &stderr)
	var c commonFlags
	c.register(fs)
	if _, _, err := parseFlags(fs, []string{"--allow", "a", "--allow", "b", "--audit-max-size", "1MiB", "cmd"}); err != nil {
		t.Errorf("repeated --allow refused: %v\n%s", err, stderr.String())
	}
	for _, f := range []string{"--audit-max-size", "--audit-max-rate"} {
		stderr.Reset()
		fs := newFlagSet("run", "test", &stderr)
		var c commonFlags
		c.register(fs)
		v := map[string]string{"--audit-max-size": "1MiB", "--audit-max-rate": "100"}[f]
		if _, _, err := parseFlags(fs, []string{f, v, f, v, "cmd"}); err == nil {
			t.Errorf("a repeated %s was accepted", f)
		}
	}
	var expect hashFlags
	fs = newFlagSet("audit verify", "test", &stderr)
	fs.Var(&expect, "expect", "")
	h := strings.Repeat("ab", 32)
	pos, _, err := parseFlagsInterspersed(fs, []string{"run.jsonl", "--expect", h, "--expect", h})
	if err != nil || len(expect) != 2 || !slices.Equal(pos, []string{"run.jsonl"}) {
		t.Errorf("audit verify FILE --expect H --expect H: %q %d %v\n%s", pos, len(expect), err, stderr.String())
	}
}
