package control

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"syscall"
	"time"
)

// Listener is a control socket: a unix socket of mode 0600, listening
// before the sandbox exists (so that its path can be hidden from it), and
// serving once Serve is called. The descriptor is close-on-exec: no child
// inherits it.
type Listener struct {
	path string
	ln   *net.UnixListener

	mu      sync.Mutex
	serving bool
	closed  bool
	conns   map[net.Conn]struct{}
	wg      sync.WaitGroup
	slots   chan struct{}
}

// Listen creates the control socket at path. A socket left there by a
// tunwall that died (nobody listens) is replaced; anything else is an
// error.
func Listen(path string) (*Listener, error) {
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("control socket %s: exists and is not a socket", path)
		}
		if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
			c.Close()
			return nil, fmt.Errorf("control socket %s: another tunwall listens there", path)
		}
		os.Remove(path)
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("control socket: %w", err)
	}
	ln.SetUnlinkOnClose(true)
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("control socket: %w", err)
	}
	return &Listener{path: path, ln: ln, conns: map[net.Conn]struct{}{}, slots: make(chan struct{}, maxClients)}, nil
}

// Path is the socket's path.
func (l *Listener) Path() string { return l.path }

// ServeConfig is what Serve answers from and whom it refuses.
type ServeConfig struct {
	Source Source // required
	// Sandbox names the namespaces of the sandbox whose processes must
	// never use the socket.
	Sandbox Namespaces
	Logger  *slog.Logger // nil discards
	// Approvals answers ctl pending, allow and deny; nil without --ask.
	Approvals Approvals
}

// Serve answers clients on its own goroutines until Close. It may be
// called once.
func (l *Listener) Serve(cfg ServeConfig) error {
	if cfg.Source == nil {
		return errors.New("control: Serve needs a Source")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed || l.serving {
		return errors.New("control: Serve after Close, or twice")
	}
	l.serving = true
	l.wg.Add(1)
	go l.runAccept(cfg)
	return nil
}

// runAccept accepts clients; one beyond maxClients at once is told it is
// refused, within a short deadline, and closed.
func (l *Listener) runAccept(cfg ServeConfig) {
	defer l.wg.Done()
	cfg.Logger.Debug("control socket serving", "path", l.path)
	defer cfg.Logger.Debug("control socket stopped", "path", l.path)
	for {
		c, err := l.ln.AcceptUnix()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			cfg.Logger.Warn("control socket accept", "err", err)
			time.Sleep(50 * time.Millisecond)
			continue
		}
		select {
		case l.slots <- struct{}{}:
		default:
			c.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
			writeResponse(c, Response{Error: "busy: too many control clients at once"})
			c.Close()
			continue
		}
		if !l.track(c) {
			c.Close()
			<-l.slots
			return
		}
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			defer func() { <-l.slots }()
			defer l.untrack(c)
			l.serveConn(c, cfg)
		}()
	}
}

func (l *Listener) track(c net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false
	}
	l.conns[c] = struct{}{}
	return true
}

func (l *Listener) untrack(c net.Conn) {
	l.mu.Lock()
	delete(l.conns, c)
	l.mu.Unlock()
	c.Close()
}

// serveConn checks the peer, reads one request and answers it.
func (l *Listener) serveConn(c *net.UnixConn, cfg ServeConfig) {
	c.SetDeadline(time.Now().Add(ioTimeout))
	peer, err := l.checkConn(c, cfg)
	if err != nil {
		cfg.Logger.Warn("control socket: refused a client", "err", err)
		writeResponse(c, Response{Error: "refused: " + err.Error()})
		return
	}
	r := bufio.NewReaderSize(&limitedReader{c: c, n: maxRequest}, 512)
	line, err := r.ReadSlice('\n')
	if err != nil {
		writeResponse(c, Response{Error: fmt.Sprintf("no request within %d bytes and %v", maxRequest, ioTimeout)})
		return
	}
	var req Request
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		writeResponse(c, Response{Error: "bad request: " + err.Error()})
		return
	}
	if r, ok := answerApprovals(req, cfg, c); ok {
		writeResponse(c, r)
		return
	}
	if req.Cmd == CmdPhase || req.Cmd == CmdReload {
		// A switch waits for its record to be in the audit log, and may
		// cut many flows: not bound by the read's deadline.
		c.SetDeadline(time.Now().Add(steerTimeout))
	}
	writeResponse(c, answer(req, cfg.Source, peer.requester(req.Cmd)))
}

// steerTimeout bounds how long a client waits for a phase switch or a
// reload to be answered.
const steerTimeout = 30 * time.Second

// answer is the response to req from by.
func answer(req Request, src Source, by Requester) Response {
	switch req.Cmd {
	case CmdStatus:
		st := src.Status()
		return Response{Status: &st}
	case CmdMetrics:
		var b bytes.Buffer
		if err := WriteMetrics(&b, src); err != nil {
			return Response{Error: "metrics: " + err.Error()}
		}
		return Response{Metrics: b.String()}
	case CmdFlows:
		return Response{Flows: src.Flows()}
	case CmdPhase, CmdReload:
		st, ok := src.(Steerer)
		if !ok {
			return Response{Error: "this tunwall's policy cannot change while it runs"}
		}
		var ch Change
		var err error
		if req.Cmd == CmdPhase {
			if req.Phase == "" {
				return Response{Error: "phase: which phase? (tunwall ctl phase NAME)"}
			}
			ch, err = st.SetPhase(req.Phase, by)
		} else {
			ch, err = st.Reload(by)
		}
		if err != nil {
			return Response{Error: err.Error()}
		}
		return Response{Change: &ch}
	}
	return Response{Error: fmt.Sprintf("unknown command %q (want %s, %s, %s, %s or %s)", req.Cmd, CmdStatus, CmdFlows, CmdMetrics, CmdPhase, CmdReload)}
}

func writeResponse(c net.Conn, r Response) {
	b, err := json.Marshal(r)
	if err != nil {
		b, _ = json.Marshal(Response{Error: err.Error()})
	}
	c.Write(append(b, '\n'))
}

// limitedReader reads at most n bytes from c, then reports EOF.
type limitedReader struct {
	c net.Conn
	n int
}

func (r *limitedReader) Read(p []byte) (int, error) {
	if r.n <= 0 {
		return 0, syscall.EMSGSIZE
	}
	if len(p) > r.n {
		p = p[:r.n]
	}
	n, err := r.c.Read(p)
	r.n -= n
	return n, err
}

// Close stops serving: no new client, the open ones closed, every
// goroutine gone, and the socket removed. It may be called more than once.
func (l *Listener) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	err := l.ln.Close()
	for c := range l.conns {
		c.Close()
	}
	l.mu.Unlock()
	l.wg.Wait()
	return err
}
