package sandbox

import (
	"fmt"
	"net/netip"

	"github.com/tunwall/tunwall/tun"
)

// Control messages between tunwall and the process inside the sandbox
// (SOCK_SEQPACKET, JSON, descriptors as SCM_RIGHTS).
type msg struct {
	Type string `json:"type"` // "config", "ready", "go", "error", "netns"

	// config (parent -> init)
	Config *initConfig `json:"config,omitempty"`

	// error (child -> parent)
	Error string `json:"error,omitempty"`
}

// NetConfig is the sandbox side of the TUN.
type NetConfig struct {
	Name  string
	MTU   int
	Addr4 netip.Prefix
	Addr6 netip.Prefix
	// Resolver is the address written to the sandbox's /etc/resolv.conf.
	// Queries to any address on port 53 are answered by tunwall anyway; this
	// is just where well-behaved resolvers look first.
	Resolver4, Resolver6 netip.Addr
}

func (n NetConfig) tunConfig() tun.Config {
	return tun.Config{Name: n.Name, MTU: n.MTU, Addr4: n.Addr4, Addr6: n.Addr6}
}

// ResolvConf is the text of the sandbox's /etc/resolv.conf.
func (n NetConfig) ResolvConf() string {
	s := "# written by tunwall: every DNS query from this sandbox is answered by tunwall\n"
	if n.Resolver4.IsValid() {
		s += fmt.Sprintf("nameserver %s\n", n.Resolver4)
	}
	if n.Resolver6.IsValid() {
		s += fmt.Sprintf("nameserver %s\n", n.Resolver6)
	}
	s += "options edns0 trust-ad\n"
	return s
}

type initConfig struct {
	Net        NetConfig `json:"net"`
	ResolvConf string    `json:"resolv_conf"` // path of a file to bind-mount over /etc/resolv.conf; "" to leave it
	Path       string    `json:"path"`        // resolved command path
	Argv       []string  `json:"argv"`
	Dir        string    `json:"dir"`
}
