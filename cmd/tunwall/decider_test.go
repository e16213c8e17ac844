package main

import (
	"fmt"
	"io"
	"os"
	"testing"
)

// TestTheDecidersStdinAndStdoutCannotBeReopenedThroughProc: even a process
// that sees the decider (this test, same uid, same pid namespace) cannot
// open its stdin or stdout again through /proc/PID/fd to read its requests
// or write it answers: they are sockets.
func TestTheDecidersStdinAndStdoutCannotBeReopenedThroughProc(t *testing.T) {
	d, err := startDecider("echo $$; exec cat >/dev/null", io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		d.In.Close()
		d.Kill()
		d.Wait()
		d.Out.Close()
	}()
	var pid int
	if _, err := fmt.Fscan(d.Out, &pid); err != nil || pid <= 0 {
		t.Fatalf("the decider's pid: %v", err)
	}
	for _, fd := range []int{0, 1} {
		for _, flag := range []int{os.O_RDONLY, os.O_WRONLY} {
			path := fmt.Sprintf("/proc/%d/fd/%d", pid, fd)
			if f, err := os.OpenFile(path, flag, 0); err == nil {
				f.Close()
				t.Errorf("opened %s (flag %d)", path, flag)
			}
		}
	}
}
