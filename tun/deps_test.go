package tun

import (
	"testing"

	"github.com/tunwall/tunwall/internal/testenv"
)

// TestDeps proves tun knows no netstack and no policy (STYLE 2.1): it opens
// and configures the device with x/sys and netlink, and nothing else.
func TestDeps(t *testing.T) {
	const mod = "github.com/tunwall/tunwall"
	testenv.CheckDeps(t, "tun",
		[]string{"gvisor.dev/", mod + "/stack", mod + "/policy", mod + "/dnsintercept", mod + "/cmd", "github.com/miekg/dns", "net/http", "os/exec"},
		[]string{mod + "/tun", mod + "/internal/netplan", "golang.org/x/sys", "github.com/vishvananda/netlink", "github.com/vishvananda/netns"})
	// Of tunwall's internal packages, only the address plan (standard
	// library only, its own deps test says so).
	for _, d := range testenv.Deps(t) {
		if testenv.Under(d.Path, mod+"/internal") && d.Path != mod+"/internal/netplan" {
			t.Errorf("tun depends on %s (forbidden: %s/internal, but for internal/netplan)", d.Path, mod)
		}
	}
}
