package sandbox

import (
	"encoding/binary"
	"errors"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"testing"
	"unsafe"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"

	"github.com/tunwall/tunwall/internal/testenv"
)

// seccompData lays out struct seccomp_data for bpf.VM, which loads words
// big-endian: each field is written so that the VM reads the value the
// kernel would for a machine of the given byte order.
func seccompData(arch, nr uint32, arg1 uint64, littleEndian bool) []byte {
	b := make([]byte, 64)
	binary.BigEndian.PutUint32(b[seccompNr:], nr)
	binary.BigEndian.PutUint32(b[seccompArch:], arch)
	lo, hi := uint32(arg1), uint32(arg1>>32)
	if littleEndian {
		binary.BigEndian.PutUint32(b[seccompArgs+8:], lo)
		binary.BigEndian.PutUint32(b[seccompArgs+12:], hi)
	} else {
		binary.BigEndian.PutUint32(b[seccompArgs+8:], hi)
		binary.BigEndian.PutUint32(b[seccompArgs+12:], lo)
	}
	return b
}

func TestTerminalFilterDecisions(t *testing.T) {
	const (
		allow = unix.SECCOMP_RET_ALLOW
		eperm = unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)
		kill  = unix.SECCOMP_RET_KILL_PROCESS
	)
	amd64, _ := abis("amd64")
	arm64, _ := abis("arm64")
	s390x, _ := abis("s390x")
	tests := []struct {
		name   string
		abis   []abi
		le     bool
		arch   uint32
		nr     uint32
		arg1   uint64
		want   uint32
		reason string
	}{
		{"amd64 TIOCSTI", amd64, true, unix.AUDIT_ARCH_X86_64, 16, ioctlTIOCSTI, eperm, ""},
		{"amd64 TIOCLINUX", amd64, true, unix.AUDIT_ARCH_X86_64, 16, ioctlTIOCLINUX, eperm, ""},
		{"amd64 TIOCSTI with high bits set", amd64, true, unix.AUDIT_ARCH_X86_64, 16, 1<<32 | ioctlTIOCSTI, eperm, "the kernel truncates the command to 32 bits"},
		{"amd64 TCGETS", amd64, true, unix.AUDIT_ARCH_X86_64, 16, unix.TCGETS, allow, "other ioctls are untouched"},
		{"amd64 TIOCSPGRP", amd64, true, unix.AUDIT_ARCH_X86_64, 16, unix.TIOCSPGRP, allow, "job control keeps working"},
		{"amd64 read with TIOCSTI's value", amd64, true, unix.AUDIT_ARCH_X86_64, 0, ioctlTIOCSTI, allow, "only ioctl is checked"},
		{"x32 ioctl TIOCSTI", amd64, true, unix.AUDIT_ARCH_X86_64, x32SyscallBit | 514, ioctlTIOCSTI, eperm, ""},
		{"x32 with the 64-bit ioctl number", amd64, true, unix.AUDIT_ARCH_X86_64, x32SyscallBit | 16, ioctlTIOCSTI, eperm, ""},
		{"i386 ioctl TIOCSTI (int 0x80)", amd64, true, unix.AUDIT_ARCH_I386, 54, ioctlTIOCSTI, eperm, ""},
		{"i386 syscall 16 is not ioctl", amd64, true, unix.AUDIT_ARCH_I386, 16, ioctlTIOCSTI, allow, "lchown16"},
		{"an ABI the filter does not know", amd64, true, unix.AUDIT_ARCH_AARCH64, 29, ioctlTIOCSTI, kill, ""},
		{"arm64 TIOCSTI", arm64, true, unix.AUDIT_ARCH_AARCH64, 29, ioctlTIOCSTI, eperm, ""},
		{"arm64 AArch32 TIOCSTI", arm64, true, unix.AUDIT_ARCH_ARM, 54, ioctlTIOCSTI, eperm, ""},
		{"s390x (big-endian) TIOCSTI with high bits", s390x, false, unix.AUDIT_ARCH_S390X, 54, 7<<32 | ioctlTIOCSTI, eperm, ""},
		{"s390x TCGETS", s390x, false, unix.AUDIT_ARCH_S390X, 54, unix.TCGETS, allow, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			vm, err := bpf.NewVM(terminalFilter(tt.abis, tt.le))
			if err != nil {
				t.Fatal(err)
			}
			got, err := vm.Run(seccompData(tt.arch, tt.nr, tt.arg1, tt.le))
			if err != nil {
				t.Fatal(err)
			}
			if uint32(got) != tt.want {
				t.Errorf("got %#x, want %#x %s", uint32(got), tt.want, tt.reason)
			}
		})
	}
}

func TestTerminalFilterKnowsThisArchitecture(t *testing.T) {
	if _, err := abis(runtime.GOARCH); err != nil {
		t.Fatal(err)
	}
	if _, err := abis("vax"); err == nil {
		t.Error("an unknown architecture must be an error, not an empty filter")
	}
}

// TestTerminalFilterInTheKernel installs the filter in a child process (it
// cannot be removed again) and tries TIOCSTI there on a pty. As root the
// child may push input into any terminal without the filter, so the test
// shows the filter, not a missing permission, is what refuses it.
func TestTerminalFilterInTheKernel(t *testing.T) {
	if os.Getenv("TUNWALL_FILTER_CHILD") == "1" {
		filterChild()
		return
	}
	if os.Geteuid() != 0 {
		testenv.Skip(t, "needs root (CAP_SYS_ADMIN makes TIOCSTI work on any tty, so a refusal proves the filter)")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestTerminalFilterInTheKernel$")
	cmd.Env = append(os.Environ(), "TUNWALL_FILTER_CHILD=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	want := "before: <nil>\nafter: operation not permitted\n"
	if got := string(out); len(got) < len(want) || got[:len(want)] != want {
		t.Fatalf("got\n%s\nwant\n%s", got, want)
	}
}

func filterChild() {
	m, err := unix.Open("/dev/ptmx", unix.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		os.Stdout.WriteString("ptmx: " + err.Error() + "\n")
		os.Exit(1)
	}
	unix.IoctlSetPointerInt(m, unix.TIOCSPTLCK, 0)
	n, _ := unix.IoctlGetInt(m, unix.TIOCGPTN)
	s, err := unix.Open("/dev/pts/"+strconv.Itoa(n), unix.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		os.Stdout.WriteString("pts: " + err.Error() + "\n")
		os.Exit(1)
	}
	sti := func() error {
		c := byte('x')
		_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(s), ioctlTIOCSTI, uintptr(unsafe.Pointer(&c)))
		if errno != 0 {
			return errno
		}
		return nil
	}
	os.Stdout.WriteString("before: " + errString(sti()) + "\n")
	if err := installTerminalFilter(); err != nil {
		os.Stdout.WriteString("install: " + err.Error() + "\n")
		os.Exit(1)
	}
	err = sti()
	os.Stdout.WriteString("after: " + errString(err) + "\n")
	if !errors.Is(err, unix.EPERM) {
		os.Exit(1)
	}
	os.Exit(0)
}

func errString(err error) string {
	if err == nil {
		return "<nil>"
	}
	return err.Error()
}
