package stack

import (
	"testing"

	"golang.org/x/sys/unix"
)

// The TUN link reads a duplicate of the Stack's descriptor through Go's
// netpoller; Close must release it (and stop its reader), or every sandbox
// tunwall serves would leave a descriptor behind.
func TestCloseReleasesTheLinksDescriptors(t *testing.T) {
	goroutineLeakCheck(t)
	before := openFDs(t)
	for range 3 {
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		s, err := New(Config{FD: fds[0], MTU: testMTU, Handler: newFakeHandler()})
		if err != nil {
			t.Fatal(err)
		}
		closeWithin(t, s, waitFor) // closes fds[0]
		unix.Close(fds[1])
	}
	if after := openFDs(t); after != before {
		t.Errorf("open descriptors: %d before, %d after three Stacks were closed", before, after)
	}
}
