package control

import (
	"errors"
	"os"
	"strings"
	"testing"
)

func TestPeerChecksRefuseTheSandboxAndOtherUsers(t *testing.T) {
	self := Self{UID: 1000, NS: Namespaces{Net: 10, Pid: 20}, UserNS: 30, Sandbox: Namespaces{Net: 11, Pid: 21}}
	host := Peer{Pid: 42, UID: 1000, NS: Namespaces{Net: 10, Pid: 20}, UserNS: 30}
	with := func(f func(*Peer)) Peer { p := host; f(&p); return p }
	for _, c := range []struct {
		name string
		p    Peer
		s    Self
		want string // "" allowed, else a word of the refusal
	}{
		{"the same user in tunwall's namespaces may", host, self, ""},
		{"root in tunwall's namespaces may", with(func(p *Peer) { p.UID = 0 }), self, ""},
		{"another user may not", with(func(p *Peer) { p.UID = 1001 }), self, "uid 1001"},
		{"a process in the sandbox's network namespace may not", with(func(p *Peer) { p.NS.Net = 11 }), self, "network namespace"},
		{"a process in the sandbox's pid namespace may not", with(func(p *Peer) { p.NS.Pid = 21 }), self, "pid namespace"},
		{"a sandbox process that made a network namespace of its own may not (its user namespace)", with(func(p *Peer) { p.NS = Namespaces{Net: 99, Pid: 98}; p.UserNS = 31 }), self, "user namespace"},
		{"a peer whose process is not visible may not", with(func(p *Peer) { p.Pid = 0 }), self, "not visible"},
		{"a peer whose namespaces cannot be read may not", with(func(p *Peer) { p.NSErr = errors.New("gone"); p.NS = Namespaces{} }), self, "cannot tell"},
		{"root's process a user's tunwall may not inspect may", with(func(p *Peer) { p.UID = 0; p.NSErr = os.ErrPermission; p.NS = Namespaces{}; p.UserNS = 0 }), self, ""},
		{"another user's process that cannot be inspected may not", with(func(p *Peer) { p.UID = 1001; p.NSErr = os.ErrPermission }), self, "uid 1001"},
		{"socks: a sandbox namespace equal to tunwall's is not checked", host, Self{UID: 1000, NS: Namespaces{10, 20}, UserNS: 30, Sandbox: Namespaces{10, 20}}, ""},
		{"unknown sandbox namespaces are not checked", host, Self{UID: 1000, NS: Namespaces{10, 20}, UserNS: 30}, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := checkPeer(c.p, c.s)
			switch {
			case c.want == "" && err != nil:
				t.Errorf("refused: %v", err)
			case c.want != "" && err == nil:
				t.Errorf("allowed, want a refusal saying %q", c.want)
			case c.want != "" && !strings.Contains(err.Error(), c.want):
				t.Errorf("refusal %q does not say %q", err, c.want)
			}
		})
	}
}
