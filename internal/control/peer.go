package control

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"syscall"
)

// Namespaces are the inodes of a process's network and pid namespaces; 0
// is unknown.
type Namespaces struct {
	Net, Pid uint64
}

// OwnNamespaces are tunwall's own namespaces.
func OwnNamespaces() (Namespaces, error) {
	return namespacesOf("self")
}

// namespacesOf reads the namespaces of /proc/PID.
func namespacesOf(pid string) (Namespaces, error) {
	var ns Namespaces
	for _, x := range []struct {
		name string
		v    *uint64
	}{{"net", &ns.Net}, {"pid", &ns.Pid}} {
		fi, err := os.Stat("/proc/" + pid + "/ns/" + x.name)
		if err != nil {
			return ns, fmt.Errorf("namespaces of process %s: %w", pid, err)
		}
		*x.v = fi.Sys().(*syscall.Stat_t).Ino
	}
	return ns, nil
}

// checkConn says why the peer of c may not use the socket, or nil.
func (l *Listener) checkConn(c *net.UnixConn, cfg ServeConfig) error {
	return nil
}

// NamespacesOf are the namespaces of process pid.
func NamespacesOf(pid int) (Namespaces, error) {
	return namespacesOf(strconv.Itoa(pid))
}
