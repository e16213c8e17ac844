package approve

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
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

// DeciderIO is an external decider's process as its starter (the front
// end: nothing below cmd starts processes) hands it over: its stdin and
// stdout, and how to kill it and wait for it.
//
// Its stdin and stdout should be unix sockets, not pipes: a descriptor of
// a socket cannot be opened again through /proc/PID/fd, so even a process
// that could see the decider's /proc (none of the sandbox's can: run and
// bwrap give it its own pid namespace) could neither read its requests
// nor write it answers.
type DeciderIO struct {
	In   io.WriteCloser // the decider's stdin
	Out  io.ReadCloser  // the decider's stdout
	Kill func()         // kills it (and what it started)
	Wait func() error   // waits for it to exit
}

// Process speaks the decider protocol over a DeciderIO: one JSON Request
// a line to its stdin, one Answer a line from its stdout. It is a
// Decider (Config.Decider).
type Process struct {
	io   DeciderIO
	reqs chan Request
	q    *Queue

	served   atomic.Bool
	stopOnce sync.Once
	done     chan struct{} // closed when the process has been waited for
	wg       sync.WaitGroup
}

// NewProcess wraps d; queue is how many requests may wait to be written
// (0: DefaultMaxPending, as many as can be pending).
func NewProcess(d DeciderIO, queue int) *Process {
	if queue <= 0 {
		queue = DefaultMaxPending
	}
	return &Process{io: d, reqs: make(chan Request, queue), done: make(chan struct{})}
}

// Serve starts writing requests to the process and reading its answers
// into q. New calls it once.
func (d *Process) Serve(q *Queue) {
	d.served.Store(true)
	d.q = q
	d.wg.Add(3)
	go d.runWriter()
	go d.runReader()
	go func() {
		defer d.wg.Done()
		err := d.io.Wait()
		close(d.done)
		q.DeciderDied(fmt.Sprintf("exited (%v)", err))
	}()
}

// Send queues r for the decider; the queue holds as many requests as can
// be pending, so it never blocks. It runs under the Queue's lock.
func (d *Process) Send(r Request) {
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
			if _, err := d.io.In.Write(append(b, '\n')); err != nil {
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
	br := bufio.NewReaderSize(d.io.Out, maxAnswer)
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
		var scope Scope
		serr := dec.Decode(&a)
		if serr == nil {
			scope, serr = ParseScope(a.Scope)
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

func (d *Process) kill() { d.io.Kill() }

// Stop ends the decider and waits for its goroutines.
func (d *Process) Stop() {
	d.stopOnce.Do(func() {
		d.io.In.Close() // EOF on its stdin: a well-behaved decider exits
		d.kill()
		if !d.served.Load() {
			d.io.Wait()
			d.io.Out.Close()
			return
		}
		<-d.done
		d.io.Out.Close()
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
