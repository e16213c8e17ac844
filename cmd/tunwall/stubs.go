package main

import (
	"context"
	"fmt"
	"io"
)

func cmdSocks(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fmt.Fprintln(stderr, "tunwall socks: not yet")
	return exitUsage
}
