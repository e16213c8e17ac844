package stack

import (
	"errors"
	"fmt"
	"sync"

	"golang.org/x/sys/unix"
)

// poller tells relays when their upstream sockets become readable or
// writable, from one goroutine blocked in epoll_wait, so that a flow waiting
// for bytes holds no goroutine and no buffer of its own. (Go's runtime
// poller would need a goroutine parked per waiting socket.) Sockets are
// registered edge-triggered; the relay reads and writes them without
// blocking until EAGAIN.
type poller struct {
	epfd int
	wake int // eventfd that stops the loop

	mu      sync.Mutex
	targets map[uint64]pollTarget
	next    uint64

	done chan struct{}
}

// pollTarget receives a socket's readiness events (EPOLLIN, EPOLLOUT, ...).
// It runs on the poller's goroutine and must not block.
type pollTarget interface {
	pollEvent(events uint32)
}

const wakeID = 0

func newPoller() (_ *poller, err error) {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("stack: epoll_create1: %w", err)
	}
	defer func() {
		if err != nil {
			unix.Close(epfd)
		}
	}()
	wake, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("stack: eventfd: %w", err)
	}
	ev := unix.EpollEvent{Events: unix.EPOLLIN}
	setEventID(&ev, wakeID)
	if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, wake, &ev); err != nil {
		unix.Close(wake)
		return nil, fmt.Errorf("stack: epoll_ctl: %w", err)
	}
	p := &poller{epfd: epfd, wake: wake, targets: map[uint64]pollTarget{}, next: wakeID + 1, done: make(chan struct{})}
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
// for it (watchOut), since a writable socket would otherwise wake the
// poller at every ACK.
const (
	pollIn  = unix.EPOLLIN | unix.EPOLLRDHUP | unix.EPOLLET
	pollOut = pollIn | unix.EPOLLOUT
)

// add watches fd for t until del. The caller must call del before closing
// fd.
func (p *poller) add(fd int, t pollTarget) (uint64, error) {
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

// watchOut turns the watch of fd's writability on or off. Turning it on
// reports at once a socket that is writable already.
func (p *poller) watchOut(fd int, id uint64, on bool) {
	ev := unix.EpollEvent{Events: pollIn}
	if on {
		ev.Events = pollOut
	}
	setEventID(&ev, id)
	unix.EpollCtl(p.epfd, unix.EPOLL_CTL_MOD, fd, &ev)
}

// del stops watching fd. Events already read for id are dropped.
func (p *poller) del(fd int, id uint64) {
	unix.EpollCtl(p.epfd, unix.EPOLL_CTL_DEL, fd, nil)
	p.mu.Lock()
	delete(p.targets, id)
	p.mu.Unlock()
}

func (p *poller) run() {
	defer close(p.done)
	events := make([]unix.EpollEvent, 128)
	for {
		n, err := unix.EpollWait(p.epfd, events, -1)
		if err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			return // EBADF after close; nothing else is expected
		}
		for i := range events[:n] {
			id := eventID(&events[i])
			if id == wakeID {
				return
			}
			p.mu.Lock()
			t := p.targets[id]
			p.mu.Unlock()
			if t != nil {
				t.pollEvent(events[i].Events)
			}
		}
	}
}

// close stops the loop and releases the descriptors. Every target must have
// been deleted.
func (p *poller) close() {
	var one = [8]byte{1}
	unix.Write(p.wake, one[:])
	<-p.done
	unix.Close(p.wake)
	unix.Close(p.epfd)
}
