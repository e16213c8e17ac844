package sandbox

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// Files tunwall shows inside the sandbox (its resolv.conf) exist only as
// descriptors and mounts, never as files on the host: nothing is left to
// clean up however tunwall ends (SIGKILL included).

// dataFile returns a sealed memfd holding b, at offset 0, for a child that
// reads it (bwrap's --ro-bind-data). Nobody can change it once sealed.
func dataFile(name string, b []byte) (*os.File, error) {
	fd, err := unix.MemfdCreate("tunwall-"+name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("memfd for %s: %w", name, err)
	}
	f := os.NewFile(uintptr(fd), name)
	if _, err := f.Write(b); err != nil {
		f.Close()
		return nil, fmt.Errorf("memfd for %s: %w", name, err)
	}
	if _, err := f.Seek(0, 0); err != nil {
		f.Close()
		return nil, fmt.Errorf("memfd for %s: %w", name, err)
	}
	unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SEAL|unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_WRITE)
	return f, nil
}

// bindData shows b as a read-only file at target, in the current (private)
// mount namespace: the file lives on a tmpfs of its own that is mounted
// nowhere but at target, and goes away with the last mount of it. Used by
// the sandbox's init, before it runs the command.
func bindData(b []byte, target string) error {
	err := bindDataDetached(b, target)
	if errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.EPERM) {
		// Kernels before 6.15 cannot clone part of a detached mount
		// (open_tree); older ones have no fsopen. Mount the tmpfs on /tmp
		// of this mount namespace only until the file is bound.
		err = bindDataViaTmp(b, target)
	}
	return err
}

// bindDataDetached makes the tmpfs with fsopen/fsmount, never attached,
// and moves a clone of the file onto target.
func bindDataDetached(b []byte, target string) error {
	fsfd, err := unix.Fsopen("tmpfs", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return fmt.Errorf("fsopen tmpfs: %w", err)
	}
	defer unix.Close(fsfd)
	if err := unix.FsconfigSetString(fsfd, "size", "64k"); err != nil {
		return fmt.Errorf("tmpfs size: %w", err)
	}
	if err := unix.FsconfigCreate(fsfd); err != nil {
		return fmt.Errorf("create tmpfs: %w", err)
	}
	mfd, err := unix.Fsmount(fsfd, unix.FSMOUNT_CLOEXEC, unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV|unix.MOUNT_ATTR_NOEXEC)
	if err != nil {
		return fmt.Errorf("fsmount tmpfs: %w", err)
	}
	defer unix.Close(mfd)
	if err := writeAt(mfd, "data", b); err != nil {
		return err
	}
	tfd, err := unix.OpenTree(mfd, "data", unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return fmt.Errorf("open_tree: %w", err)
	}
	defer unix.Close(tfd)
	if err := unix.MoveMount(tfd, "", unix.AT_FDCWD, target, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("move_mount over %s: %w", target, err)
	}
	return nil
}

// bindDataViaTmp mounts a tmpfs on /tmp (of this mount namespace), binds
// the file from it over target, and unmounts it again.
func bindDataViaTmp(b []byte, target string) error {
	const dir = "/tmp"
	if err := unix.Mount("tunwall", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "size=64k,mode=0700"); err != nil {
		return fmt.Errorf("mount a tmpfs on %s: %w", dir, err)
	}
	defer unix.Unmount(dir, unix.MNT_DETACH)
	dfd, err := unix.Open(dir, unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	err = writeAt(dfd, "data", b)
	unix.Close(dfd)
	if err != nil {
		return err
	}
	if err := unix.Mount(dir+"/data", target, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind over %s: %w", target, err)
	}
	return nil
}

// writeAt creates name (0444) under the directory dirfd and writes b.
func writeAt(dirfd int, name string, b []byte) error {
	fd, err := unix.Openat(dirfd, name, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0o444)
	if err != nil {
		return fmt.Errorf("create %s: %w", name, err)
	}
	f := os.NewFile(uintptr(fd), name)
	_, err = f.Write(b)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", name, err)
	}
	return nil
}
