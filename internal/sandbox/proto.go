package sandbox

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/tunwall/tunwall/tun"
)

// Control messages between tunwall and the process inside the sandbox
// (SOCK_SEQPACKET, JSON, descriptors as SCM_RIGHTS).
type msg struct {
	Type string `json:"type"` // "config", "ready", "go", "error"

	// config (parent -> init)
	Config *initConfig `json:"config,omitempty"`

	// error (child -> parent)
	Error string `json:"error,omitempty"`
	// WorkDir is set on an error entering the working directory.
	WorkDir string `json:"work_dir,omitempty"`
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
	// Search and Options are the host's resolver settings the sandbox's
	// resolver library applies itself (search list; ndots, timeout,
	// attempts, ...), carried into its resolv.conf so that short names
	// resolve as on the host: the client asks tunwall for the fully
	// qualified name. Each must be one word (no space or newline); others
	// are dropped. nil: none.
	Search, Options []string
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
	if search := oneWords(n.Search); len(search) > 0 {
		s += "search " + strings.Join(search, " ") + "\n"
	}
	opts := oneWords(n.Options)
	for _, o := range []string{"edns0", "trust-ad"} {
		if !slices.Contains(opts, o) {
			opts = append(opts, o)
		}
	}
	s += "options " + strings.Join(opts, " ") + "\n"
	return s
}

// oneWords keeps the entries that are a single word of printable ASCII, so
// nothing can add a line to the file.
func oneWords(in []string) []string {
	var out []string
	for _, w := range in {
		ok := w != ""
		for i := 0; i < len(w); i++ {
			if w[i] <= ' ' || w[i] > '~' || w[i] == '#' || w[i] == ';' {
				ok = false
			}
		}
		if ok {
			out = append(out, w)
		}
	}
	return out
}

type initConfig struct {
	Net NetConfig `json:"net"`
	// MakeTUN: the process inside creates the TUN and the sock_diag socket
	// and sends them back (rootless). Otherwise tunwall, as root, makes them
	// from outside, since the sandbox's unprivileged id may not open
	// /dev/net/tun.
	MakeTUN bool `json:"make_tun"`
	// Exec replaces the process inside with the command (bwrap, which then
	// builds its own mount and pid namespaces) instead of running it under
	// a pid 1 in fresh mount and pid namespaces (run).
	Exec       bool     `json:"exec"`
	ResolvConf string   `json:"resolv_conf"` // run: the text shown at /etc/resolv.conf; "" to leave it
	Path       string   `json:"path"`        // resolved command path
	Argv       []string `json:"argv"`
	Dir        string   `json:"dir"`      // run: working directory
	KeepFDs    []int    `json:"keep_fds"` // descriptors besides 0-2 the command gets (bwrap options name them)
	// Binds are files bound read-only over paths (run): the CA bundle
	// over the distribution's, an empty file over secret files.
	Binds []fileBind `json:"binds,omitempty"`
	// KeepUID: the command runs as the init's own (the caller's) uid,
	// with every capability dropped (RunConfig.KeepUID).
	KeepUID bool `json:"keep_uid,omitempty"`
	// Cover are paths hidden from the sandbox (RunConfig.Cover).
	Cover []string `json:"cover,omitempty"`
}
