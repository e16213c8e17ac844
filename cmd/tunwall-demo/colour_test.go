package main

import (
	"os"
	"strings"
	"testing"

	"github.com/tunwall/tunwall/internal/testenv"
)

// Under go test stdout is not a terminal: the demo must print no escape
// sequence, in its own lines or in the workloads it runs.
func TestNoColourWhenPiped(t *testing.T) {
	if isTerminal(os.Stdout) {
		testenv.Skip(t, "stdout is a terminal")
	}
	if colour || bold != "" || blue != "" || reset != "" {
		t.Errorf("colour %v with stdout not a terminal", colour)
	}
	for _, s := range [][]step{workload, credsWorkload} {
		if script := workloadScript("", s); strings.Contains(script, `\033`) || strings.Contains(script, "\x1b") {
			t.Errorf("a workload keeps its escape sequences when piped")
		}
	}
}
