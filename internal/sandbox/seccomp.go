package sandbox

import (
	"encoding/binary"
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// The terminal filter: a seccomp filter that makes ioctl(fd, TIOCSTI) and
// ioctl(fd, TIOCLINUX) fail with EPERM, as Flatpak does. TIOCSTI pushes bytes
// into a terminal's input queue, so a sandboxed command that shares the
// user's controlling terminal could type commands into the user's shell, to
// run on the host's network after tunwall exits; TIOCLINUX's selection paste
// does the same on a virtual console. Everything else about the terminal
// keeps working: the command stays in the terminal's session and foreground
// process group, so ^C, ^Z and /dev/tty behave as without tunwall (which
// setsid, bwrap's --new-session, would lose).

// Terminal ioctls the filter refuses. The kernel reads an ioctl's command as
// an unsigned int, so the filter compares the low 32 bits of the argument
// only: setting high bits must not get past it.
const (
	ioctlTIOCSTI   = 0x5412
	ioctlTIOCLINUX = 0x541c
)

// x32SyscallBit marks a system call made through the x32 ABI on amd64
// (seccomp_data.arch is AUDIT_ARCH_X86_64 for it).
const x32SyscallBit = 0x40000000

// abi is one system-call ABI a process of this architecture can use: its
// AUDIT_ARCH value and the numbers ioctl has in it.
type abi struct {
	arch  uint32
	ioctl []uint32
}

// abis returns the ABIs of goarch: the native one and those a native process
// can still enter (i386 via int 0x80 and x32 on amd64, AArch32 on arm64).
// Missing one would leave a way around the filter; an ABI the filter does
// not know kills the process instead.
func abis(goarch string) ([]abi, error) {
	switch goarch {
	case "amd64":
		return []abi{
			{unix.AUDIT_ARCH_X86_64, []uint32{16, x32SyscallBit | 514, x32SyscallBit | 16}},
			{unix.AUDIT_ARCH_I386, []uint32{54}},
		}, nil
	case "386":
		return []abi{{unix.AUDIT_ARCH_I386, []uint32{54}}}, nil
	case "arm64":
		return []abi{{unix.AUDIT_ARCH_AARCH64, []uint32{29}}, {unix.AUDIT_ARCH_ARM, []uint32{54}}}, nil
	case "arm":
		return []abi{{unix.AUDIT_ARCH_ARM, []uint32{54}}}, nil
	case "riscv64":
		return []abi{{unix.AUDIT_ARCH_RISCV64, []uint32{29}}}, nil
	case "loong64":
		return []abi{{unix.AUDIT_ARCH_LOONGARCH64, []uint32{29}}}, nil
	case "ppc64le":
		return []abi{{unix.AUDIT_ARCH_PPC64LE, []uint32{54}}}, nil
	case "ppc64":
		return []abi{{unix.AUDIT_ARCH_PPC64, []uint32{54}}, {unix.AUDIT_ARCH_PPC, []uint32{54}}}, nil
	case "s390x":
		return []abi{{unix.AUDIT_ARCH_S390X, []uint32{54}}, {unix.AUDIT_ARCH_S390, []uint32{54}}}, nil
	}
	return nil, fmt.Errorf("sandbox: no terminal filter for GOARCH %s", goarch)
}

// Offsets in struct seccomp_data: int nr; __u32 arch; __u64
// instruction_pointer; __u64 args[6].
const (
	seccompNr   = 0
	seccompArch = 4
	seccompArgs = 16
)

// arg1Low is the offset of the low 32 bits of args[1].
func arg1Low(littleEndian bool) uint32 {
	if littleEndian {
		return seccompArgs + 8
	}
	return seccompArgs + 8 + 4
}

func nativeLittleEndian() bool {
	var b [2]byte
	binary.NativeEndian.PutUint16(b[:], 1)
	return b[0] == 1
}

// terminalFilter builds the filter's program for the given ABIs.
func terminalFilter(abis []abi, littleEndian bool) []bpf.Instruction {
	// Layout, with jumps resolved at the end:
	//   load arch; one test per ABI -> its block; kill (unknown ABI)
	//   per ABI: load nr; one test per ioctl number -> check; allow
	//   check: load arg1 low; TIOCSTI -> deny; TIOCLINUX -> deny; allow
	//   deny
	type jump struct{ at, target int }
	var (
		prog   []bpf.Instruction
		jumps  []jump // JumpIf at "at" goes to "target" when true
		blocks = make([]int, len(abis))
	)
	const check, deny = -1, -2 // symbolic targets
	prog = append(prog, bpf.LoadAbsolute{Off: seccompArch, Size: 4})
	for i, a := range abis {
		jumps = append(jumps, jump{len(prog), i})
		prog = append(prog, bpf.JumpIf{Cond: bpf.JumpEqual, Val: a.arch})
	}
	prog = append(prog, bpf.RetConstant{Val: unix.SECCOMP_RET_KILL_PROCESS})
	for i, a := range abis {
		blocks[i] = len(prog)
		prog = append(prog, bpf.LoadAbsolute{Off: seccompNr, Size: 4})
		for _, nr := range a.ioctl {
			jumps = append(jumps, jump{len(prog), check})
			prog = append(prog, bpf.JumpIf{Cond: bpf.JumpEqual, Val: nr})
		}
		prog = append(prog, bpf.RetConstant{Val: unix.SECCOMP_RET_ALLOW})
	}
	checkAt := len(prog)
	prog = append(prog, bpf.LoadAbsolute{Off: arg1Low(littleEndian), Size: 4})
	for _, cmd := range []uint32{ioctlTIOCSTI, ioctlTIOCLINUX} {
		jumps = append(jumps, jump{len(prog), deny})
		prog = append(prog, bpf.JumpIf{Cond: bpf.JumpEqual, Val: cmd})
	}
	prog = append(prog, bpf.RetConstant{Val: unix.SECCOMP_RET_ALLOW})
	denyAt := len(prog)
	prog = append(prog, bpf.RetConstant{Val: unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)})

	for _, j := range jumps {
		target := j.target
		switch target {
		case check:
			target = checkAt
		case deny:
			target = denyAt
		default:
			target = blocks[target]
		}
		ji := prog[j.at].(bpf.JumpIf)
		ji.SkipTrue = uint8(target - j.at - 1) // programs are far shorter than 255
		prog[j.at] = ji
	}
	return prog
}

// installTerminalFilter sets no_new_privs and installs the terminal filter on
// every thread of the calling process (SECCOMP_FILTER_FLAG_TSYNC); children
// inherit both.
func installTerminalFilter() error {
	as, err := abis(runtime.GOARCH)
	if err != nil {
		return err
	}
	raw, err := bpf.Assemble(terminalFilter(as, nativeLittleEndian()))
	if err != nil {
		return fmt.Errorf("sandbox: assemble terminal filter: %w", err)
	}
	filter := make([]unix.SockFilter, len(raw))
	for i, r := range raw {
		filter[i] = unix.SockFilter{Code: r.Op, Jt: r.Jt, Jf: r.Jf, K: r.K}
	}
	prog := unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("sandbox: no_new_privs: %w", err)
	}
	r, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, unix.SECCOMP_FILTER_FLAG_TSYNC, uintptr(unsafe.Pointer(&prog)))
	runtime.KeepAlive(filter)
	if errno != 0 {
		return fmt.Errorf("sandbox: install terminal filter: %w", errno)
	}
	if r != 0 {
		return fmt.Errorf("sandbox: install terminal filter: thread %d could not be synchronised", r)
	}
	return nil
}
