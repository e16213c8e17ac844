package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// usernsEnv tells the demo re-run by reexecInUserNS who invoked it
// ("UID:GID"): it is root only of its own user namespace.
const usernsEnv = "TUNWALL_DEMO_INVOKER"

// reexecInUserNS runs the demo again as root of a new user and mount
// namespace of its own (the only ids it has there are the invoking user's),
// where it may make network namespaces and a veth, and returns its exit
// status.
func reexecInUserNS(tw string) int {
	uid, gid := os.Getuid(), os.Getgid()
	c := exec.Command("/proc/self/exe", tw)
	c.Stdin, c.Stdout, c.Stderr = os.Stdin, os.Stdout, os.Stderr
	c.Env = append(os.Environ(), fmt.Sprintf("%s=%d:%d", usernsEnv, uid, gid))
	c.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  unix.CLONE_NEWUSER | unix.CLONE_NEWNS | unix.CLONE_NEWNET,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: uid, Size: 1}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: gid, Size: 1}},
		Pdeathsig:   unix.SIGKILL,
	}
	err := c.Run()
	if c.ProcessState == nil {
		fmt.Fprintf(os.Stderr, "demo: cannot make a user namespace to build the test world in (%v): enable unprivileged user namespaces ('sudo sysctl kernel.unprivileged_userns_clone=1'), or run it as root: sudo make demo\n", err)
		return 1
	}
	return c.ProcessState.ExitCode()
}

// inUserNS reports whether this demo is the one reexecInUserNS started.
func inUserNS() bool {
	_, _, ok := invoker()
	return ok
}

// invoker returns the ids of the user who ran the demo rootless.
func invoker() (uid, gid int, ok bool) {
	u, g, found := strings.Cut(os.Getenv(usernsEnv), ":")
	if !found {
		return 0, 0, false
	}
	uid, err1 := strconv.Atoi(u)
	gid, err2 := strconv.Atoi(g)
	return uid, gid, err1 == nil && err2 == nil && uid > 0 && gid > 0
}

// asInvokingUser returns the clone attributes that run a command, from the
// demo's own user namespace, in one more below it as the invoking user
// (nil when the demo was not run rootless): tunwall then runs rootless as
// that user, with no capability, as the user would run it.
func asInvokingUser() *syscall.SysProcAttr {
	uid, gid, ok := invoker()
	if !ok {
		return nil
	}
	return &syscall.SysProcAttr{
		Cloneflags:  unix.CLONE_NEWUSER,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: uid, HostID: 0, Size: 1}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: gid, HostID: 0, Size: 1}},
		Credential:  &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), NoSetGroups: true},
	}
}

// privateNetnsDir gives `ip netns` a /run/netns of this mount namespace's
// own, writable by its root: a tmpfs over the host's /run/netns, or, when
// the host has none, over /run with the host's entries bound back.
func privateNetnsDir() error {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make mounts private: %w", err)
	}
	if st, err := os.Stat("/run/netns"); err == nil && st.IsDir() {
		if err := unix.Mount("tunwall-demo", "/run/netns", "tmpfs", 0, "mode=0755"); err != nil {
			return fmt.Errorf("mount a tmpfs on /run/netns: %w", err)
		}
		return nil
	}
	old, err := os.Open("/run")
	if err != nil {
		return err
	}
	defer old.Close()
	names, err := old.Readdirnames(-1)
	if err != nil {
		return err
	}
	if err := unix.Mount("tunwall-demo", "/run", "tmpfs", 0, "mode=0755"); err != nil {
		return fmt.Errorf("mount a tmpfs on /run: %w", err)
	}
	from := fmt.Sprintf("/proc/self/fd/%d", old.Fd())
	for _, n := range names {
		src, dst := filepath.Join(from, n), filepath.Join("/run", n)
		fi, err := os.Lstat(src)
		if err != nil {
			continue
		}
		switch {
		case fi.Mode()&os.ModeSymlink != 0:
			if t, err := os.Readlink(src); err == nil {
				os.Symlink(t, dst)
			}
			continue
		case fi.IsDir():
			err = os.Mkdir(dst, 0o755)
		default:
			var f *os.File
			if f, err = os.Create(dst); err == nil {
				f.Close()
			}
		}
		if err == nil {
			err = unix.Mount(src, dst, "", unix.MS_BIND|unix.MS_REC, "")
		}
		if err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("keep /run/%s: %w", n, err)
		}
	}
	return os.Mkdir("/run/netns", 0o755)
}
