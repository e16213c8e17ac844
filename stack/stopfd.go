package stack

import (
	"os"
	"reflect"
	"strconv"

	"golang.org/x/sys/unix"
	gstack "gvisor.dev/gvisor/pkg/tcpip/stack"
)

// linkStopFDs returns the eventfds gVisor's fdbased endpoint ep opened to
// stop its readers (link/stopfd, one per inbound dispatcher), which it
// never closes: fdbased's Close is a no-op and its dispatchers' release
// frees their buffers only. A process that serves many sandboxes one after
// another (the node agent) would leak one descriptor per sandbox, so the
// Stack closes them itself once the readers have stopped (closeStopFDs).
//
// The fields are unexported, so they are read by reflection (reading is
// allowed; nothing is written). If a gVisor bump renames them, the list is
// empty, and TestCloseReleasesEveryDescriptor fails.
func linkStopFDs(ep gstack.LinkEndpoint) []int {
	v := reflect.ValueOf(ep)
	if v.Kind() != reflect.Pointer || v.IsNil() {
		return nil
	}
	ds := v.Elem().FieldByName("inboundDispatchers")
	if !ds.IsValid() || ds.Kind() != reflect.Slice {
		return nil
	}
	var fds []int
	for i := range ds.Len() {
		d := ds.Index(i)
		for d.IsValid() && (d.Kind() == reflect.Interface || d.Kind() == reflect.Pointer) && !d.IsNil() {
			d = d.Elem()
		}
		if !d.IsValid() || d.Kind() != reflect.Struct {
			continue
		}
		sf := d.FieldByName("StopFD")
		if !sf.IsValid() || sf.Kind() != reflect.Struct {
			continue
		}
		efd := sf.FieldByName("EFD")
		if efd.IsValid() && efd.CanInt() && efd.Int() >= 0 {
			fds = append(fds, int(efd.Int()))
		}
	}
	return fds
}

// closeStopFDs closes the descriptors linkStopFDs found, each only if it
// is an eventfd still (never another descriptor that took its number).
// Call it once the link's readers have stopped.
func closeStopFDs(fds []int) {
	for _, fd := range fds {
		if target, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(fd)); err == nil && target == "anon_inode:[eventfd]" {
			unix.Close(fd)
		}
	}
}
