package main

import (
	"bytes"
	"context"
	"regexp"
	"strings"
	"testing"
)

// tunwall --help says what bwrap does: tunwall runs bwrap inside the
// TUN-only network it made and drops the user's --unshare-net (adding it
// would leave the sandbox only lo), as README and bwrap.go say.
func TestHelpDescribesBwrapAsItWorks(t *testing.T) {
	var out bytes.Buffer
	run(context.Background(), []string{"--help"}, &out, &out)
	// The bwrap line and the lines continuing it.
	var line string
	for l := range strings.SplitSeq(out.String(), "\n") {
		switch {
		case strings.HasPrefix(strings.TrimSpace(l), "bwrap "):
			line = l
		case line != "" && !strings.Contains(line, "\x00") && strings.HasPrefix(l, strings.Repeat(" ", 20)):
			line += " " + strings.TrimSpace(l)
		case line != "":
			line += "\x00" // ended
		}
	}
	line = strings.TrimRight(line, "\x00")
	if strings.Contains(line, "with --unshare-net") || !strings.Contains(line, "drops --unshare-net") {
		t.Errorf("tunwall --help describes bwrap as %q; want it to say --unshare-net is dropped (bwrap runs in tunwall's TUN-only network)", line)
	}
}

var flagLine = regexp.MustCompile(`(?m)^  (--?[a-z0-9-]+)`)

// run --help and bwrap --help list the flags a user reaches for first, in
// that order, before the tuning ones.
func TestRunHelpListsTheCommonFlagsFirst(t *testing.T) {
	for _, cmd := range []string{"run", "bwrap"} {
		var out bytes.Buffer
		if code := run(context.Background(), []string{cmd, "--help"}, &out, &out); code != 0 {
			t.Fatalf("%s --help: exit %d", cmd, code)
		}
		var got []string
		for _, m := range flagLine.FindAllStringSubmatch(out.String(), -1) {
			got = append(got, m[1])
		}
		want := []string{"--policy", "--allow", "--phase", "--learn", "--audit", "--quiet"}
		if len(got) < len(want) || strings.Join(got[:len(want)], " ") != strings.Join(want, " ") {
			t.Errorf("%s --help lists %v first, want %v", cmd, got[:min(len(got), len(want))], want)
		}
		// Every flag is still listed, once.
		seen := map[string]int{}
		for _, f := range got {
			seen[f]++
		}
		for _, f := range []string{"--dns-pool-size", "--secret", "--user", "--mtu", "-v"} {
			if seen[f] != 1 {
				t.Errorf("%s --help lists %s %d times, want once", cmd, f, seen[f])
			}
		}
		if !strings.Contains(out.String(), "\nmore flags:\n") {
			t.Errorf("%s --help does not set the other flags apart under \"more flags:\"\n%s", cmd, out.String())
		}
	}
}
