package integration

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tunwall/tunwall/internal/testworld"
)

// lrL7ResetScript: over HTTP to a host tunwall terminates (an http rule),
// a download the server aborts mid-body and an upload the client aborts
// mid-body.
const lrL7ResetScript = `
import socket, struct, sys, time
host = sys.argv[1]
s = socket.create_connection((host, PORT_RST), timeout=20)
s.sendall(b"GET /big HTTP/1.1\r\nHost: " + host.encode() + b":PORT_RST\r\n\r\n")
got = b""
try:
    while True:
        b = s.recv(65536)
        if not b:
            print("download: EOF after %d bytes" % len(got), flush=True)
            break
        got += b
except ConnectionResetError:
    print("download: ECONNRESET after %d bytes" % len(got), flush=True)
except Exception as e:
    print("download: %s after %d bytes" % (type(e).__name__, len(got)), flush=True)
s = socket.create_connection((host, PORT_SINK), timeout=20)
s.sendall(b"POST /up HTTP/1.1\r\nHost: " + host.encode() + b":PORT_SINK\r\nContent-Length: 1000000\r\n\r\n")
s.sendall(bytes(range(256)) * 400)
time.sleep(0.5)
s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
s.close()
print("upload: aborted", flush=True)
time.sleep(0.5)
`

// TestResetsStayResetsOnTerminatedFlows: on a flow tunwall terminates
// (http or inject rules: it speaks HTTP to each end), a reset of either end
// must reach the other as a reset, as it does on relayed flows: a server
// that aborts mid-body leaves the sandbox ECONNRESET, not a clean close,
// and a sandbox that aborts mid-upload leaves the server ECONNRESET, not
// an EOF that looks like a client that gave up.
func TestResetsStayResetsOnTerminatedFlows(t *testing.T) {
	requireTools(t, "python3")
	w := newWorld(t)
	const rstPort, sinkPort = 2311, 2312
	serve := func(port uint16, h func(*net.TCPConn, *bufio.Reader)) {
		ln, err := w.Listen("tcp", netip.AddrPortFrom(testworld.Echo4, port).String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				go func() {
					defer c.Close()
					c.SetDeadline(time.Now().Add(30 * time.Second))
					br := bufio.NewReader(c)
					h(c.(*net.TCPConn), br)
				}()
			}
		}()
	}
	serve(rstPort, func(c *net.TCPConn, br *bufio.Reader) {
		if _, err := http.ReadRequest(br); err != nil {
			return
		}
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\n"+strings.Repeat("x", 100_000))
		// Abort once tunwall has every byte sent (a reset discards what
		// the kernel still holds): the reset comes mid-body.
		waitSent(t, c, 10*time.Second)
		c.SetLinger(0)
	})
	ended := make(chan error, 4)
	serve(sinkPort, func(c *net.TCPConn, br *bufio.Reader) {
		req, err := http.ReadRequest(br)
		if err != nil {
			ended <- err
			return
		}
		n, err := io.Copy(io.Discard, req.Body)
		ended <- fmt.Errorf("after %d bytes: %w", n, err)
	})
	pol := writeSetupPolicy(t, w, "l7resets.yaml", fmt.Sprintf(`version: 1
phases:
  exec:
    allow:
      - host: echo.test
        ports: [%d, %d]
        http: [{methods: ["*"], paths: ["/**"]}]
`, rstPort, sinkPort))
	script := strings.NewReplacer("PORT_RST", fmt.Sprint(rstPort), "PORT_SINK", fmt.Sprint(sinkPort)).Replace(lrL7ResetScript)
	py := filepath.Join(w.dir, "l7resets.py")
	if err := os.WriteFile(py, []byte(script), 0o644); err != nil {
		t.Fatal(err)
	}
	r := w.mustRun(0, runOpts{flags: []string{"--policy", pol}, script: "python3 " + py + " echo.test"})
	t.Logf("sandbox:\n%s", r.stdout)
	if !strings.Contains(r.stdout, "download: ECONNRESET after") {
		t.Errorf("the server's abort mid-body did not reach the sandbox as a reset:\n%s", r)
	}
	select {
	case err := <-ended:
		t.Logf("server's read of the upload ended: %v", err)
		if !errors.Is(err, syscall.ECONNRESET) {
			t.Errorf("the sandbox's abort mid-upload reached the server as %v, want ECONNRESET", err)
		}
	case <-time.After(10 * time.Second):
		t.Errorf("the server's read of the aborted upload did not end within 10s")
	}
}

// waitSent waits, at most d, until the kernel holds none of what c sent
// unacknowledged (SIOCOUTQ is 0).
func waitSent(t *testing.T, c *net.TCPConn, d time.Duration) {
	t.Helper()
	rc, err := c.SyscallConn()
	if err != nil {
		t.Error(err)
		return
	}
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		n, ierr := 0, error(nil)
		rc.Control(func(fd uintptr) { n, ierr = unix.IoctlGetInt(int(fd), unix.SIOCOUTQ) })
		if ierr != nil || n == 0 {
			return
		}
	}
}
