package main

import (
	"errors"
	"fmt"
	"math"
	"os"
	"os/user"
	"strconv"
	"strings"

	"github.com/tunwall/tunwall/internal/sandbox"
)

// userFlag is --user USER|UID[:GID]: who the sandbox runs as when tunwall
// runs as root (a CI container running the job as the owner of its
// workspace). Never uid or gid 0.
type userFlag struct {
	raw string
	u   *sandbox.HostUser
}

func (f *userFlag) String() string { return f.raw }

func (f *userFlag) Set(s string) error {
	u, err := parseUser(s)
	if err != nil {
		return err
	}
	f.raw, f.u = s, &u
	return nil
}

// check refuses --user when tunwall is not root: rootless, the command
// runs as the user who started tunwall, and no other.
func (f *userFlag) check() error {
	if f.u != nil && os.Geteuid() != 0 {
		return errors.New("--user needs tunwall to run as root (rootless, the command runs as you)")
	}
	return nil
}

// parseUser reads USER|UID[:GID]. A UID with no GID takes the user's
// primary group from the user database, or the same number if it has no
// entry there.
func parseUser(s string) (sandbox.HostUser, error) {
	name, g, hasGID := strings.Cut(s, ":")
	u := sandbox.HostUser{UID: -1, GID: -1, From: "--user"}
	if n, err := strconv.ParseUint(name, 10, 32); err == nil {
		u.UID = int(n)
		if e, err := user.LookupId(name); err == nil {
			u.GID, _ = strconv.Atoi(e.Gid)
		} else {
			u.GID = u.UID
		}
	} else if e, err := user.Lookup(name); err == nil {
		u.UID, _ = strconv.Atoi(e.Uid)
		u.GID, _ = strconv.Atoi(e.Gid)
	} else {
		return u, fmt.Errorf("no user %q (give a user name or a UID, e.g. --user 1000 or --user 1000:1000)", name)
	}
	if hasGID {
		n, err := strconv.ParseUint(g, 10, 32)
		if err != nil {
			return u, fmt.Errorf("GID %q is not a number (USER|UID[:GID], e.g. --user 1000:1000)", g)
		}
		u.GID = int(n)
	}
	switch {
	case u.UID == 0:
		return u, errors.New("the command never runs as root (uid 0): name the owner of the workspace instead, e.g. --user $(stat -c %u .)")
	case u.GID == 0:
		return u, errors.New("the command never runs with group 0 (root): give a GID, e.g. --user UID:UID")
	case u.UID >= math.MaxInt32 || u.GID >= math.MaxInt32:
		return u, fmt.Errorf("%q is out of range", s)
	}
	return u, nil
}

// whoLine is the line tunwall run as root prints first: who the command
// runs as, and its HOME.
func whoLine(what string, sb *sandbox.Sandbox) string {
	u := sb.User
	who := fmt.Sprintf("uid %d (gid %d", u.UID, u.GID)
	if e, err := user.LookupId(strconv.Itoa(u.UID)); err == nil {
		who = fmt.Sprintf("%s (uid %d, gid %d", e.Username, u.UID, u.GID)
	}
	switch u.From {
	case "":
		who += "; no SUDO_UID, so nobody: --user USER|UID[:GID] picks the user)"
	default:
		who += ", from " + u.From + ")"
	}
	home := os.Getenv("HOME")
	switch {
	case sb.Home != "" && home != "":
		home = fmt.Sprintf("%s (made for it, removed at exit: %s is not its to write)", sb.Home, home)
	case sb.Home != "":
		home = sb.Home + " (made for it, removed at exit)"
	}
	return fmt.Sprintf("tunwall: running %s as %s, HOME=%s", what, who, home)
}
