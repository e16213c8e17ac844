package main

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/tunwall/tunwall/internal/session"
)

// startDecider starts --decider CMD with /bin/sh -c, outside the sandbox
// (in tunwall's own namespaces, as tunwall's user, in a process group of
// its own), its stderr on tunwall's. Its stdin and stdout are unix socket
// pairs, not pipes: a socket cannot be reopened through /proc/PID/fd
// (session.DeciderIO says why that matters). The session speaks the
// protocol and kills it at the end.
func startDecider(command string, stderr io.Writer) (*session.DeciderIO, error) {
	pair := func() (*os.File, *os.File, error) {
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return nil, nil, fmt.Errorf("--decider: socketpair: %w", err)
		}
		return os.NewFile(uintptr(fds[0]), "decider"), os.NewFile(uintptr(fds[1]), "decider-child"), nil
	}
	in, inChild, err := pair()
	if err != nil {
		return nil, err
	}
	out, outChild, err := pair()
	if err != nil {
		in.Close()
		inChild.Close()
		return nil, err
	}
	cmd := exec.Command("/bin/sh", "-c", command)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = inChild, outChild, stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	err = cmd.Start()
	inChild.Close()
	outChild.Close()
	if err != nil {
		in.Close()
		out.Close()
		return nil, fmt.Errorf("--decider: %w", err)
	}
	pid := cmd.Process.Pid
	return &session.DeciderIO{
		In:   in,
		Out:  out,
		Kill: func() { syscall.Kill(-pid, syscall.SIGKILL) },
		Wait: cmd.Wait,
	}, nil
}
