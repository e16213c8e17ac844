package main

import (
	"context"
	"fmt"
	"io"
)

func cmdBwrap(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fmt.Fprintln(stderr, "tunwall bwrap: not yet")
	return exitUsage
}
func cmdAttach(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fmt.Fprintln(stderr, "tunwall attach: not yet")
	return exitUsage
}
func cmdSocks(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fmt.Fprintln(stderr, "tunwall socks: not yet")
	return exitUsage
}
