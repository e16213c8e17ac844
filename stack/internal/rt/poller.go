package rt

import (
	"fmt"
	"os"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// Poller tells relays when their upstream sockets become readable or
// writable, so that a flow waiting for bytes holds no goroutine and no
// buffer of its own. (Go's runtime poller would need a goroutine parked per
// waiting socket.) The sockets are in an epoll set of our own, registered
// edge-triggered; the relay reads and writes them without blocking until
// EAGAIN. The epoll descriptor itself is handed to Go's runtime poller, so
// the one goroutine that harvests it parks and wakes like any network
// goroutine, with no thread blocked in epoll_wait.
type Poller struct {
	epfd int
	file *os.File // epfd, as Go's runtime poller knows it
	rc   syscall.RawConn

	mu      sync.Mutex
	targets map[uint64]Target
	next    uint64

	done chan struct{}
}

// Target receives a socket's readiness events (EPOLLIN, EPOLLOUT, ...).
// It runs on the poller's goroutine and must not block.
type Target interface {
	PollEvent(events uint32)
}

// NewPoller starts a poller: its epoll set, and the goroutine that
// harvests it.
func NewPoller() (_ *Poller, err error) {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("stack: epoll_create1: %w", err)
	}
	if err := unix.SetNonblock(epfd, true); err != nil {
		unix.Close(epfd)
		return nil, fmt.Errorf("stack: epoll fd: %w", err)
	}
	// A non-blocking descriptor given to os.NewFile joins Go's poller.
	f := os.NewFile(uintptr(epfd), "epoll")
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("stack: epoll fd: %w", err)
	}
	p := &Poller{epfd: epfd, file: f, rc: rc, targets: map[uint64]Target{}, next: 1, done: make(chan struct{})}
	go p.run()
	return p, nil
}

// The 64-bit epoll data carries the target's id, split over Fd and Pad.
func setEventID(ev *unix.EpollEvent, id uint64) {
	ev.Fd = int32(uint32(id))
	ev.Pad = int32(uint32(id >> 32))
}

func eventID(ev *unix.EpollEvent) uint64 {
	return uint64(uint32(ev.Fd)) | uint64(uint32(ev.Pad))<<32
}

// Events watched: readability always, writability only while a relay waits
// for it (WatchOut), since a writable socket would otherwise wake the
// poller at every ACK.
const (
	pollIn  = unix.EPOLLIN | unix.EPOLLRDHUP | unix.EPOLLET
	pollOut = pollIn | unix.EPOLLOUT
)

// Add watches fd for t until Del. The caller must call Del before closing
// fd.
func (p *Poller) Add(fd int, t Target) (uint64, error) {
	p.mu.Lock()
	id := p.next
	p.next++
	p.targets[id] = t
	p.mu.Unlock()
	ev := unix.EpollEvent{Events: pollIn}
	setEventID(&ev, id)
	if err := unix.EpollCtl(p.epfd, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
		p.mu.Lock()
		delete(p.targets, id)
		p.mu.Unlock()
		return 0, fmt.Errorf("stack: epoll_ctl add: %w", err)
	}
	return id, nil
}

// WatchOut turns the watch of fd's writability on or off. Turning it on
// reports at once a socket that is writable already.
func (p *Poller) WatchOut(fd int, id uint64, on bool) {
	ev := unix.EpollEvent{Events: pollIn}
	if on {
		ev.Events = pollOut
	}
	setEventID(&ev, id)
	unix.EpollCtl(p.epfd, unix.EPOLL_CTL_MOD, fd, &ev)
}

// Del stops watching fd. Events already read for id are dropped.
func (p *Poller) Del(fd int, id uint64) {
	unix.EpollCtl(p.epfd, unix.EPOLL_CTL_DEL, fd, nil)
	p.mu.Lock()
	delete(p.targets, id)
	p.mu.Unlock()
}

// Len is the number of descriptors watched.
func (p *Poller) Len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.targets)
}

// run harvests the epoll set without blocking whenever Go's poller says it
// has events, until the set is closed.
func (p *Poller) run() {
	defer close(p.done)
	events := make([]unix.EpollEvent, 128)
	for {
		err := p.rc.Read(func(fd uintptr) bool {
			for {
				n, err := unix.EpollWait(int(fd), events, 0)
				if err == unix.EINTR {
					continue
				}
				if n <= 0 {
					return false // nothing ready: wait for the set's next edge
				}
				p.dispatch(events[:n])
				if n < len(events) {
					return false
				}
			}
		})
		if err != nil {
			return // closed
		}
	}
}

func (p *Poller) dispatch(events []unix.EpollEvent) {
	for i := range events {
		p.mu.Lock()
		t := p.targets[eventID(&events[i])]
		p.mu.Unlock()
		if t != nil {
			t.PollEvent(events[i].Events)
		}
	}
}

// Close stops the loop and releases the epoll set. Every target must have
// been deleted.
func (p *Poller) Close() {
	p.file.Close()
	<-p.done
}
