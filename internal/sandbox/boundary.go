package sandbox

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// What keeps the sandbox inside its boundary (README, "Security"):
//
//   - Every process in the sandbox's user namespace is in its TUN-only
//     network namespace: the namespaces are made together, in one clone, by
//     the process that becomes the sandbox's init (run) or bwrap (bwrap).
//     tunwall's own process stays in the host's user namespace, so nothing
//     in the sandbox may ptrace it or write its memory (the kernel requires
//     CAP_SYS_PTRACE in the target's user namespace for that).
//   - The sandbox is never host uid 0: run as root, tunwall maps it to an
//     unprivileged id and clears the supplementary groups.
//   - The command holds no capability over its mount namespace, so it cannot
//     unmount its /proc to find the host's; /proc/sys is read-only.
//   - The terminal filter (seccomp.go) stops it typing into the terminal.
//   - It starts with stdin, stdout and stderr and nothing else of tunwall's.

// nobodyID is the host id a sandbox run as root gets when SUDO_UID does not
// name the invoking user: the conventional "nobody".
const nobodyID = 65534

// hostIDs returns the host uid and gid the sandbox gets when tunwall runs as
// root: the invoking user's (SUDO_UID, SUDO_GID) when sudo started tunwall,
// else nobody's. Never 0.
func hostIDs() (uid, gid int) {
	u, uerr := strconv.Atoi(os.Getenv("SUDO_UID"))
	g, gerr := strconv.Atoi(os.Getenv("SUDO_GID"))
	if uerr != nil || gerr != nil || u <= 0 || g <= 0 || u >= math.MaxInt32 || g >= math.MaxInt32 {
		return nobodyID, nobodyID
	}
	return u, g
}

// HostUser is the host uid and gid a sandbox runs as when tunwall runs as
// root (rootless, it runs as tunwall's user). Never 0.
type HostUser struct {
	UID, GID int
	// From says how it was chosen, for the line that names it:
	// "SUDO_UID", "--user", or "" for nobody (the default).
	From string
}

// DefaultHostUser is the user a sandbox run as root gets unless told
// otherwise: the invoking user (SUDO_UID, SUDO_GID) when sudo started
// tunwall, else nobody.
func DefaultHostUser() HostUser {
	uid, gid := hostIDs()
	if os.Getenv("SUDO_UID") == strconv.Itoa(uid) {
		return HostUser{UID: uid, GID: gid, From: "SUDO_UID"}
	}
	return HostUser{UID: uid, GID: gid}
}

// orDefault is u, or DefaultHostUser() when u is nil.
func orDefault(u *HostUser) HostUser {
	if u == nil || u.UID <= 0 || u.GID <= 0 {
		return DefaultHostUser()
	}
	return *u
}

// userNSAttr returns the clone attributes that put a child in a new user
// namespace (plus extra clone flags) in which it has ids inside, mapped to:
// the caller's own ids when rootless, or as's when root. A root
// caller's child would otherwise keep host uid 0 and root's supplementary
// groups for every file access, whatever the mapping says: Credential makes
// it setgroups([]), setgid and setuid inside the new namespace before it
// executes anything.
func userNSAttr(inside HostUser, extra uintptr, as HostUser) *syscall.SysProcAttr {
	attr := &syscall.SysProcAttr{
		Cloneflags: unix.CLONE_NEWUSER | extra,
		// If tunwall dies, so does the sandbox (and with the TUN gone it
		// has no network in the meantime).
		Pdeathsig: unix.SIGKILL,
	}
	uid, gid := os.Getuid(), os.Getgid()
	if os.Geteuid() == 0 {
		uid, gid = as.UID, as.GID
		attr.GidMappingsEnableSetgroups = true
		attr.Credential = &syscall.Credential{Uid: uint32(inside.UID), Gid: uint32(inside.GID), Groups: []uint32{}}
	}
	attr.UidMappings = []syscall.SysProcIDMap{{ContainerID: inside.UID, HostID: uid, Size: 1}}
	attr.GidMappings = []syscall.SysProcIDMap{{ContainerID: inside.GID, HostID: gid, Size: 1}}
	return attr
}

// keepUIDAttr is userNSAttr for RunConfig.KeepUID: the sandbox's init is the
// caller's own uid and gid inside too (the invoking user's, or nobody's, as
// root: as), mapped to the same ids outside. Not root there, it keeps the
// capabilities it needs to build the sandbox (mounts, the TUN) as ambient
// capabilities over its own namespaces; the command gets none (init.go).
func keepUIDAttr(extra uintptr, as HostUser) *syscall.SysProcAttr {
	uid, gid := os.Getuid(), os.Getgid()
	if os.Geteuid() == 0 {
		uid, gid = as.UID, as.GID
	}
	attr := &syscall.SysProcAttr{
		Cloneflags: unix.CLONE_NEWUSER | extra,
		Pdeathsig:  unix.SIGKILL,
		// As for the root caller's child in userNSAttr: setgroups([]),
		// setgid, setuid inside the new namespace before exec.
		Credential:  &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}},
		UidMappings: []syscall.SysProcIDMap{{ContainerID: uid, HostID: uid, Size: 1}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: gid, HostID: gid, Size: 1}},
	}
	if os.Geteuid() == 0 {
		attr.GidMappingsEnableSetgroups = true
	}
	for c := 0; c <= unix.CAP_LAST_CAP; c++ {
		attr.AmbientCaps = append(attr.AmbientCaps, uintptr(c))
	}
	return attr
}

// insideIDs are the ids a bwrap sandbox's first process has in tunwall's
// user namespace: the same numbers as on the host, so bwrap, which is not
// root there, maps the command to them as an unprivileged bwrap does.
func insideIDs(as HostUser) HostUser {
	if os.Geteuid() == 0 {
		return HostUser{UID: as.UID, GID: as.GID}
	}
	return HostUser{UID: os.Getuid(), GID: os.Getgid()}
}

// commandCaps are the capabilities a run command keeps in its bounding set,
// over the sandbox's own user namespace only: Docker's default set. Left out
// above all: CAP_SYS_ADMIN (unmounting /proc to uncover the host's, other
// mounts, setns), CAP_SYS_PTRACE (the sandbox's init holds tunwall's control
// socket) and CAP_NET_ADMIN (the TUN's addresses and routes are tunwall's).
// CAP_NET_RAW stays, for ping and raw sockets, which the TUN carries to
// tunwall like everything else.
var commandCaps = map[int]bool{
	unix.CAP_CHOWN: true, unix.CAP_DAC_OVERRIDE: true, unix.CAP_FOWNER: true, unix.CAP_FSETID: true,
	unix.CAP_KILL: true, unix.CAP_SETGID: true, unix.CAP_SETUID: true, unix.CAP_SETPCAP: true,
	unix.CAP_NET_BIND_SERVICE: true, unix.CAP_NET_RAW: true, unix.CAP_SYS_CHROOT: true,
	unix.CAP_MKNOD: true, unix.CAP_AUDIT_WRITE: true, unix.CAP_SETFCAP: true,
}

// limitBoundingSet drops every capability not in keep from the calling
// thread's bounding set. Bounding sets are per thread: the caller must have
// locked its OS thread and must start the command from it.
func limitBoundingSet(keep map[int]bool) error {
	for c := 0; c <= 63; c++ {
		if keep[c] {
			continue
		}
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil {
			if errors.Is(err, unix.EINVAL) {
				break // past the kernel's last capability
			}
			return fmt.Errorf("drop capability %d from the bounding set: %w", c, err)
		}
	}
	return nil
}

// dropAllCaps clears the calling thread's ambient, inheritable, permitted
// and effective capabilities.
func dropAllCaps() error {
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("clear ambient capabilities: %w", err)
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("drop capabilities: %w", err)
	}
	return nil
}

// closeExtraFDsOnExec marks every descriptor from 3 up close-on-exec, except
// keep: whatever tunwall inherited by accident (a shell's, a harness's
// sockets) must not reach the sandbox.
func closeExtraFDsOnExec(keep ...int) error {
	if err := unix.CloseRange(3, math.MaxUint32, unix.CLOSE_RANGE_CLOEXEC); err != nil {
		// Before Linux 5.11: one by one.
		ents, rerr := os.ReadDir("/proc/self/fd")
		if rerr != nil {
			return fmt.Errorf("mark descriptors close-on-exec: %w", err)
		}
		for _, e := range ents {
			if fd, err := strconv.Atoi(e.Name()); err == nil && fd >= 3 {
				unix.CloseOnExec(fd)
			}
		}
	}
	for _, fd := range keep {
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETFD, 0); err != nil {
			return fmt.Errorf("descriptor %d: %w", fd, err)
		}
	}
	return nil
}

// procSubdirs are the parts of /proc made read-only in the sandbox, as bwrap
// does: sysctls, and a few old files that act on the whole machine.
var procSubdirs = []string{"sys", "sysrq-trigger", "irq", "bus"}

// mountProc mounts a procfs of the sandbox's pid namespace over /proc (the
// host's, whose processes the sandbox must not see), makes its machine-wide
// parts read-only, and covers any other procfs mount in the mount namespace
// with an empty read-only tmpfs. The command cannot undo any of it: it has no
// CAP_SYS_ADMIN, and a user namespace it makes itself locks these mounts.
func mountProc() error {
	if err := unix.Mount("proc", "/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mount a procfs for the sandbox on /proc: %w", err)
	}
	for _, d := range procSubdirs {
		p := "/proc/" + d
		if _, err := os.Lstat(p); err != nil {
			continue
		}
		if err := unix.Mount(p, p, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind %s: %w", p, err)
		}
		if err := unix.Mount("", p, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
			return fmt.Errorf("make %s read-only: %w", p, err)
		}
	}
	others, err := foreignProcMounts("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	for _, mp := range others {
		if err := unix.Mount("tunwall-cover", mp, "tmpfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=0555,size=4k,nr_inodes=1"); err != nil {
			return fmt.Errorf("cover the host's procfs at %s: %w", mp, err)
		}
	}
	return nil
}

// foreignProcMounts lists the mount points of procfs mounts other than those
// at /proc and below it (ours, on top of the host's there).
func foreignProcMounts(mountinfo string) ([]string, error) {
	f, err := os.Open(mountinfo)
	if err != nil {
		return nil, fmt.Errorf("read mounts: %w", err)
	}
	defer f.Close()
	return parseForeignProcMounts(f)
}

func parseForeignProcMounts(f io.Reader) ([]string, error) {
	var out []string
	seen := map[string]bool{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		// ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		pf, qf := strings.Fields(pre), strings.Fields(post)
		if len(pf) < 5 || len(qf) < 1 || qf[0] != "proc" {
			continue
		}
		mp := unescapeMountinfo(pf[4])
		if mp == "/proc" || strings.HasPrefix(mp, "/proc/") || seen[mp] {
			continue
		}
		seen[mp] = true
		out = append(out, filepath.Clean(mp))
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read mounts: %w", err)
	}
	return out, nil
}

// unescapeMountinfo undoes the kernel's octal escapes (\040 for a space, ...).
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
