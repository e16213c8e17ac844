// Package decider runs tunwall's external decider (--decider CMD): a
// process that is sent one JSON request a line on its stdin and answers
// one JSON object a line on its stdout, for an approve.Queue.
package decider

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/tunwall/tunwall/internal/approve"
)

// Answer is a decider's line: the request's id, "allow" or "deny", a
// scope (once, run or always; "" is once) and a reason for the record.
type Answer struct {
	ID      string `json:"id"`
	Verdict string `json:"verdict"`
	Scope   string `json:"scope,omitempty"`
	Reason  string `json:"reason,omitempty"`
}

// maxAnswer bounds one line a decider writes.
const maxAnswer = 4 << 10

// Process is the external decider's process. Its stdin and stdout are
// unix sockets, not pipes: a descriptor of a socket cannot be opened
// again through /proc/PID/fd, so even a process that could see the
// decider's /proc (none of the sandbox's can: run and bwrap give it its
// own pid namespace) could not read its requests or write it answers.
type Process struct {
	cmd  *exec.Cmd
	in   *os.File // tunwall's end of the decider's stdin
	out  *os.File // tunwall's end of the decider's stdout
	reqs chan approve.Request
	q    *approve.Queue

	served   atomic.Bool
	stopOnce sync.Once
	done     chan struct{} // closed when the process has been waited for
	wg       sync.WaitGroup
}

// Start starts command with /bin/sh -c, outside the sandbox (in tunwall's
// own namespaces, as tunwall's user), with its stderr on stderr. Serve
// (the Queue's New calls it) starts the conversation; queue is how many
// requests can wait to be written (the Queue's MaxPending).
func Start(command string, stderr io.Writer, queue int) (*Process, error) {
	in, inChild, err := socketPair()
	if err != nil {
		return nil, err
	}
	out, outChild, err := socketPair()
	if err != nil {
		in.Close()
		inChild.Close()
		return nil, err
	}
	cmd := exec.Command("/bin/sh", "-c", command)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = inChild, outChild, stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	err = cmd.Start()
	inChild.Close()
	outChild.Close()
	if err != nil {
		in.Close()
		out.Close()
		return nil, fmt.Errorf("--decider: %w", err)
	}
	if queue <= 0 {
		queue = approve.DefaultMaxPending
	}
	return &Process{cmd: cmd, in: in, out: out, reqs: make(chan approve.Request, queue), done: make(chan struct{})}, nil
}

// Serve starts writing requests to the process and reading its answers
// into q. It is called once, by approve.New.
func (d *Process) Serve(q *approve.Queue) {
	d.served.Store(true)
	d.q = q
	d.wg.Add(3)
	go d.runWriter()
	go d.runReader()
	go func() {
		defer d.wg.Done()
		err := d.cmd.Wait()
		close(d.done)
		q.DeciderDied(fmt.Sprintf("exited (%v)", err))
	}()
}

// socketPair returns both ends of a SOCK_STREAM unix socket pair,
// close-on-exec (the child gets its end as stdin or stdout).
func socketPair() (*os.File, *os.File, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("--decider: socketpair: %w", err)
	}
	return os.NewFile(uintptr(fds[0]), "decider"), os.NewFile(uintptr(fds[1]), "decider-child"), nil
}

// Send queues r for the decider; the queue holds MaxPending requests, as
// many as can be pending, so it never blocks. It runs under q.mu.
func (d *Process) Send(r approve.Request) {
	select {
	case d.reqs <- r:
	default:
		go d.q.DeciderDied("does not read its requests")
	}
}

// runWriter writes each request as one JSON line.
func (d *Process) runWriter() {
	defer d.wg.Done()
	for {
		select {
		case <-d.done:
			return
		case r := <-d.reqs:
			b, _ := json.Marshal(r)
			if _, err := d.in.Write(append(b, '\n')); err != nil {
				d.q.DeciderDied(fmt.Sprintf("does not read its requests (%v)", err))
				return
			}
		}
	}
}

// runReader reads answers. A line that is not an answer (not JSON, an
// unknown verdict or scope, longer than maxAnswer) ends the decider: its
// answers can no longer be trusted to be about what it was asked.
func (d *Process) runReader() {
	defer d.wg.Done()
	br := bufio.NewReaderSize(d.out, maxAnswer)
	for {
		line, err := br.ReadSlice('\n')
		if err != nil {
			if err == bufio.ErrBufferFull {
				d.q.DeciderDied(fmt.Sprintf("wrote a line longer than %d bytes", maxAnswer))
				d.kill()
			}
			return // EOF: the Wait goroutine says it exited
		}
		line = bytes.TrimSpace(line)
		if len(line) == 0 {
			continue
		}
		var a Answer
		dec := json.NewDecoder(bytes.NewReader(line))
		dec.DisallowUnknownFields()
		var scope approve.Scope
		serr := dec.Decode(&a)
		if serr == nil {
			scope, serr = approve.ParseScope(a.Scope)
		}
		if serr == nil && a.Verdict != "allow" && a.Verdict != "deny" {
			serr = fmt.Errorf("verdict %q: want allow or deny", a.Verdict)
		}
		if serr != nil || a.ID == "" {
			if serr == nil {
				serr = fmt.Errorf("no id")
			}
			d.q.DeciderDied(fmt.Sprintf("wrote %q, which is not an answer: %v", clip(line), serr))
			d.kill()
			return
		}
		err = d.q.Decide(a.ID, a.Verdict == "allow", scope, "decider", clipString(a.Reason), "")
		if err != nil {
			// Late (timed out) or unknown: nothing to decide.
			_ = err
		}
	}
}

// kill ends the process (its group: what its shell started).
func (d *Process) kill() {
	if d.cmd.Process != nil {
		syscall.Kill(-d.cmd.Process.Pid, syscall.SIGKILL)
	}
}

// Stop ends the decider and waits for its goroutines.
func (d *Process) Stop() {
	d.stopOnce.Do(func() {
		d.in.Close() // EOF on its stdin: a well-behaved decider exits
		d.kill()
		if !d.served.Load() {
			d.cmd.Wait()
			d.out.Close()
			return
		}
		<-d.done
		d.out.Close()
		d.wg.Wait()
	})
}

func clip(b []byte) string { return clipString(string(b)) }

func clipString(s string) string {
	if len(s) > 200 {
		return s[:200] + "..."
	}
	return s
}
