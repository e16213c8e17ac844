package integration

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A SOCKS client that resolves names itself (socks5://, curl --socks5)
// sends tunwall an address, which no host rule can allow: the denial says
// to send the name (socks5h://, --socks5-hostname), not merely that no
// rule allows the address, and the record's reason says it too. A client
// that sends the name gets through.
func TestSocksClientThatSendsAnAddressIsToldToSendTheName(t *testing.T) {
	requireTools(t, "curl")
	w := newWorld(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	proxy, proxyAudit, log := w.startBackground(ctx, "socks", runOpts{
		flags: []string{"--listen", "127.0.0.1:1080", "--allow", "allowed.test:80"},
	}, "SOCKS5 proxy on")
	script := `curl -sS --max-time 10 --socks5 127.0.0.1:1080 --resolve allowed.test:80:192.0.2.10 http://allowed.test/addr 2>/dev/null; echo "address: $?"
curl -sS --max-time 10 --socks5-hostname 127.0.0.1:1080 http://allowed.test/name`
	out, err := w.AgentCommand(ctx, "sh", "-c", script).Output()
	if err != nil {
		t.Fatal(err)
	}
	if want := "address: 97\nweb allowed.test /name"; !strings.Contains(string(out), want) {
		t.Errorf("through tunwall socks: got %q, want %q", out, want)
	}
	proxy.Process.Signal(syscall.SIGTERM)
	proxy.Wait()
	var line string
	for l := range strings.SplitSeq(log.String(), "\n") {
		if strings.HasPrefix(l, "tunwall: denied 192.0.2.10:80") {
			line = l
		}
	}
	if !strings.Contains(line, "socks5h://") || !strings.Contains(line, "--socks5-hostname") {
		t.Errorf("the denial of an address a SOCKS client sent does not say to send the name (socks5h://, --socks5-hostname): %q\n%s", line, log.String())
	}
	found := false
	for _, r := range records(t, proxyAudit) {
		if r.Kind == "flow" && r.Dst.Addr().String() == "192.0.2.10" {
			found = true
			if !strings.Contains(r.Reason, "socks5h://") {
				t.Errorf("the record of the address's denial does not say to send the name: %+v", r)
			}
		}
	}
	if !found {
		t.Error("no record of the denied address")
	}
}
