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
	d, err := startDecider("echo $$; exec sleep 30", io.Discard)
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

func TestAskFlagsThatCannotGoTogetherAreRefused(t *testing.T) {
	for _, c := range []struct {
		name string
		f    commonFlags
	}{
		{"--decider without --ask", commonFlags{decider: "true"}},
		{"--ask with --learn", commonFlags{ask: true, learn: true, askTimeout: 1}},
		{"--ask-timeout 0", commonFlags{ask: true}},
	} {
		if _, err := c.f.askOptions(io.Discard); err == nil {
			t.Errorf("%s: accepted", c.name)
		}
	}
	c := commonFlags{ask: true, askTimeout: 5e9, policyFile: "/etc/agent.yaml", quiet: true}
	o, err := c.askOptions(io.Discard)
	if err != nil || !o.On || o.Overlay != "/etc/agent.approved.yaml" || o.Decider != nil {
		t.Errorf("--ask --policy /etc/agent.yaml: %+v %v", o, err)
	}
}
