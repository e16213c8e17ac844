package node

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/tunwall/tunwall/internal/control"
	"github.com/tunwall/tunwall/internal/nodeapi"
	"github.com/tunwall/tunwall/tun"
)

// maxConns bounds the plugin's calls handled at once; past it a call is
// answered "try again later" at once.
const maxConns = 16

// connTimeout bounds one call, the ADD's attach included.
const connTimeout = 60 * time.Second

// Server is the agent's unix socket, which the CNI plugin calls.
type Server struct {
	a    *Agent
	ln   *net.UnixListener
	path string
	sem  chan struct{}
	wg   sync.WaitGroup
	once sync.Once
}

// Listen makes the socket at path (mode 0600, in a directory it creates
// 0700), replacing a socket no agent answers at; another agent's live
// socket is an error.
func Listen(path string) (*net.UnixListener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("node: socket directory: %w", err)
	}
	if st, err := os.Lstat(path); err == nil {
		if st.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("node: %s exists and is not a socket", path)
		}
		c, err := net.Dial("unixpacket", path)
		if err == nil {
			c.Close()
			return nil, fmt.Errorf("node: another agent serves %s", path)
		}
		if !errors.Is(err, syscall.ECONNREFUSED) {
			return nil, fmt.Errorf("node: %s: %w", path, err)
		}
		os.Remove(path) // a dead agent's
	}
	old := syscall.Umask(0o177)
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
	syscall.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("node: %w", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("node: %w", err)
	}
	return ln, nil
}

// Serve answers the plugin's calls on ln for a until Close.
func Serve(a *Agent, ln *net.UnixListener) *Server {
	s := &Server{a: a, ln: ln, path: ln.Addr().String(), sem: make(chan struct{}, maxConns)}
	s.wg.Add(1)
	go s.runAccept()
	return s
}

func (s *Server) runAccept() {
	defer s.wg.Done()
	for {
		c, err := s.ln.AcceptUnix()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			s.a.cfg.Logger.Warn("node socket accept", "err", err)
			time.Sleep(50 * time.Millisecond) // EMFILE and the like: do not spin
			continue
		}
		select {
		case s.sem <- struct{}{}:
		default:
			tun.Send(c, nodeapi.Response{Code: nodeapi.CodeTryAgainLater, Error: "the tunwall node agent is busy"})
			c.Close()
			continue
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer func() { <-s.sem }()
			defer c.Close()
			s.handle(c)
		}()
	}
}

// handle answers one call: the peer must be root in the agent's own user
// namespace (control.CheckRootPeer); a pod never is.
func (s *Server) handle(c *net.UnixConn) {
	c.SetDeadline(time.Now().Add(connTimeout))
	refuse := func(err error) {
		s.a.cfg.Logger.Warn("node socket: refused a peer", "err", err)
		tun.Send(c, nodeapi.Response{Code: nodeapi.CodeInternal, Error: "refused: " + err.Error()})
	}
	peer, err := control.CheckRootPeer(c)
	if err != nil {
		refuse(err)
		return
	}
	// Root of the host, but inside a pod: a privileged pod that found
	// the socket steers nothing.
	if s.a.servesNetNS(peer.NS.Net) {
		refuse(fmt.Errorf("process %d is in the network namespace of a pod the agent serves", peer.Pid))
		return
	}
	var req nodeapi.Request
	fds, err := tun.Recv(c, &req)
	if err != nil {
		return
	}
	var nsFile *os.File
	for i, fd := range fds {
		if i == 0 {
			nsFile = os.NewFile(uintptr(fd), "netns")
			defer nsFile.Close()
			continue
		}
		closeFD(fd)
	}
	if nsFile != nil {
		if ino, err := nsInode(nsFile); err != nil || ino == peer.NS.Net {
			refuse(fmt.Errorf("process %d is in the network namespace it asks about", peer.Pid))
			return
		}
	}
	tun.Send(c, s.answer(req, nsFile))
}

func (s *Server) answer(req nodeapi.Request, nsFile *os.File) nodeapi.Response {
	fail := func(code uint, err error) nodeapi.Response {
		return nodeapi.Response{Code: code, Error: err.Error()}
	}
	if err := nodeapi.CheckRequest(req); err != nil {
		return fail(nodeapi.CodeInvalidConfig, err)
	}
	needNS := req.Op == nodeapi.OpAdd || req.Op == nodeapi.OpCheck
	if needNS && nsFile == nil {
		return fail(nodeapi.CodeInvalidNetNS, errors.New("no network namespace came with the request"))
	}
	switch req.Op {
	case nodeapi.OpAdd:
		r, err := s.a.Add(req, nsFile)
		if err != nil {
			var rf *refusal
			if errors.As(err, &rf) {
				return fail(rf.code, rf.err)
			}
			return fail(nodeapi.CodeInternal, err)
		}
		return r
	case nodeapi.OpDel:
		s.a.Del(req.ContainerID)
	case nodeapi.OpCheck:
		if err := s.a.Check(req, nsFile); err != nil {
			return fail(nodeapi.CodeInternal, err)
		}
	case nodeapi.OpGC:
		s.a.GC(req.Network, req.Valid)
	case nodeapi.OpStatus:
		s.a.mu.Lock()
		closed := s.a.closed
		s.a.mu.Unlock()
		if closed {
			return fail(nodeapi.CodeTryAgainLater, errors.New("the agent is stopping"))
		}
	}
	return nodeapi.Response{OK: true}
}

// Close stops accepting, waits for the calls in progress and removes the
// socket.
func (s *Server) Close() {
	s.once.Do(func() {
		s.ln.SetUnlinkOnClose(true)
		s.ln.Close()
		s.wg.Wait()
	})
}
