package main

import (
	"github.com/tunwall/tunwall/internal/testenv"
	"os"
	"strings"
	"testing"
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
	for _, s := range []string{workload, credsWorkload} {
		if strings.Contains(script(s), `\033`) || strings.Contains(script(s), "\x1b") {
			t.Errorf("a workload keeps its escape sequences when piped")
		}
	}
}
