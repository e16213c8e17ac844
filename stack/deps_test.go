package stack

import (
	"testing"

	"github.com/tunwall/tunwall/internal/testenv"
)

// TestDeps proves stack decides nothing and knows nothing of who does
// (STYLE 2.1): gVisor and x/sys, never the policy, DNS, the TUN set-up, the
// engine or the audit log; no DNS library, no HTTP, no subprocesses.
func TestDeps(t *testing.T) {
	const mod = "github.com/tunwall/tunwall"
	testenv.CheckDeps(t, "stack",
		[]string{mod + "/policy", mod + "/dnsintercept", mod + "/tun", mod + "/internal", mod + "/cmd", "github.com/miekg/dns", "net/http", "os/exec"},
		[]string{
			mod + "/stack",
			mod + "/flow", // the protocols, shared with the policy
			"gvisor.dev/gvisor",
			"golang.org/x/sys",
			// gVisor's own dependencies
			"golang.org/x/time", "golang.org/x/exp", "github.com/google/btree",
		})
}
