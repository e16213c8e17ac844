package main

import (
	"strings"
	"testing"

	"github.com/tunwall/tunwall/internal/sandbox"
)

func TestUserFlagNeverNamesRoot(t *testing.T) {
	for in, want := range map[string][2]int{
		"4321":       {4321, 4321}, // no entry in the user database: the same number as group
		"4321:77":    {4321, 77},
		"nobody":     {65534, 65534},
		"nobody:500": {65534, 500},
	} {
		u, err := parseUser(in)
		if err != nil || u.UID != want[0] || u.GID != want[1] || u.From != "--user" {
			t.Errorf("parseUser(%q) = %+v, %v; want %d:%d", in, u, err, want[0], want[1])
		}
	}
	for in, why := range map[string]string{
		"0": "never runs as root", "root": "never runs as root", "0:5": "never runs as root",
		"5:0": "group 0", "x-no-such-user": "no user", "5:g": "not a number", "-1": "no user",
		"4294967295": "out of range", "": "no user",
	} {
		if _, err := parseUser(in); err == nil || !strings.Contains(err.Error(), why) {
			t.Errorf("parseUser(%q): %v, want an error saying %q", in, err, why)
		}
	}
}

func TestWhoLineNamesTheUserAndHome(t *testing.T) {
	t.Setenv("HOME", "/root")
	for _, c := range []struct {
		u    sandbox.HostUser
		home string
		want string
	}{
		{sandbox.HostUser{UID: 65534, GID: 65534}, "/tmp/tunwall-home-1",
			"tunwall: running npm as nobody (uid 65534, gid 65534; no SUDO_UID, so nobody: --user USER|UID[:GID] picks the user), HOME=/tmp/tunwall-home-1 (made for it, removed at exit: /root is not its to write)"},
		{sandbox.HostUser{UID: 4321, GID: 4322, From: "--user"}, "",
			"tunwall: running npm as uid 4321 (gid 4322, from --user), HOME=/root"},
	} {
		sb := &sandbox.Sandbox{User: c.u, Home: c.home}
		if got := whoLine("npm", sb); got != c.want {
			t.Errorf("got  %q\nwant %q", got, c.want)
		}
	}
}
