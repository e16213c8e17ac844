package node

import (
	"errors"
	"os"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// nsInode is the inode of the namespace file f.
func nsInode(f *os.File) (uint64, error) {
	if f == nil {
		return 0, errors.New("no namespace")
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return 0, err
	}
	return st.Ino, nil
}

// tunPresent says whether the calling thread's network namespace has a
// TUN device named name.
func tunPresent(name string) (bool, error) {
	h, err := netlink.NewHandle()
	if err != nil {
		return false, err
	}
	defer h.Close()
	l, err := h.LinkByName(name)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return false, nil
		}
		return false, err
	}
	return l.Type() == "tuntap", nil
}
