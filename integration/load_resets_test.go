package integration

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tunwall/tunwall/internal/audit"
	"github.com/tunwall/tunwall/internal/testworld"
)

// Resets stay resets: a connection one end aborts must end in an abort at
// the other end too, or a truncated transfer looks complete to both sides
// (and to the audit log).

// resetServers starts, on the echo server's address, a server on port
// rstPort that sends part of a body and then resets the connection, and one
// on port sinkPort that reads an upload and reports (on the returned
// channel) how the read ended.
func resetServers(t *testing.T, w *world, rstPort, sinkPort uint16) <-chan error {
	t.Helper()
	serve := func(port uint16, h func(*net.TCPConn)) {
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
				go h(c.(*net.TCPConn))
			}
		}()
	}
	// 100 KB of a body announced as 1 MB; once the client says it has them
	// ("k"), an abort (SO_LINGER 0: RST, no FIN).
	serve(rstPort, func(c *net.TCPConn) {
		defer c.Close()
		c.SetDeadline(time.Now().Add(30 * time.Second))
		body := strings.Repeat("x", 100_000)
		if _, err := io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\n"+body); err != nil {
			return
		}
		buf := make([]byte, 1)
		if _, err := io.ReadFull(c, buf); err != nil {
			return
		}
		c.SetLinger(0)
	})
	ended := make(chan error, 16)
	// Reads an upload; after 100 KB it says "k"; then reads on until the
	// connection ends and reports how.
	serve(sinkPort, func(c *net.TCPConn) {
		defer c.Close()
		c.SetDeadline(time.Now().Add(30 * time.Second))
		buf := make([]byte, 64<<10)
		total, said := 0, false
		for {
			n, err := c.Read(buf)
			total += n
			if total >= 100_000 && !said {
				said = true
				c.Write([]byte("k"))
			}
			if err != nil {
				ended <- fmt.Errorf("after %d bytes: %w", total, err)
				return
			}
		}
	})
	return ended
}

// resetScript is the sandbox's side: a download the server aborts, and an
// upload the client aborts. HOST is what it connects to.
const resetScript = `
import socket, struct, sys, time
host = sys.argv[1]
def conn(port):
    return socket.create_connection((host, port), timeout=20)
# 1. the server aborts mid-body: ECONNRESET, never a clean EOF
s = conn(PORT_RST)
got = b""
while len(got) < 100000:
    b = s.recv(65536)
    if not b:
        break
    got += b
s.sendall(b"k")
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
# 2. the client aborts mid-upload (SO_LINGER 0 close: RST)
s = conn(PORT_SINK)
s.sendall(bytes(range(256)) * 400)  # binary: no protocol the name checks read
ack = s.recv(1)
print("upload: server acknowledged %r" % ack, flush=True)
s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
s.close()
time.sleep(0.5)  # let the RST leave before the sandbox (and its TUN) goes
`

func TestResetsStayResets(t *testing.T) {
	requireTools(t, "python3")
	// By name: the flow is relayed through the name checks (a gate). By a
	// raw IP a cidr rule allows: the flow is relayed by events. Both must
	// pass resets on.
	for _, tc := range []struct {
		name, host, allow string
		rst, sink         uint16
	}{
		{"by-name", "echo.test", "echo.test:2301,2302", 2301, 2302},
		{"by-cidr", testworld.Echo4.String(), testworld.Echo4.String() + ":2303,2304", 2303, 2304},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t)
			ended := resetServers(t, w, tc.rst, tc.sink)
			script := strings.NewReplacer("PORT_RST", fmt.Sprint(tc.rst), "PORT_SINK", fmt.Sprint(tc.sink)).Replace(resetScript)
			py := filepath.Join(w.dir, "resets.py")
			if err := os.WriteFile(py, []byte(script), 0o644); err != nil {
				t.Fatal(err)
			}
			r := w.mustRun(0, runOpts{
				flags:  []string{"--allow", tc.allow},
				script: "python3 " + py + " " + tc.host,
			})
			t.Logf("sandbox:\n%s", r.stdout)
			if !strings.Contains(r.stdout, "download: ECONNRESET after 100") {
				t.Errorf("the server's abort mid-body did not reach the sandbox as a reset:\n%s", r)
			}
			if !strings.Contains(r.stdout, "upload: server acknowledged b'k'") {
				t.Fatalf("the upload did not get going:\n%s", r)
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
			var flows []audit.Record
			for _, rec := range records(t, r.audit) {
				if rec.Kind == audit.KindFlow && (rec.Port == tc.rst || rec.Port == tc.sink) {
					flows = append(flows, rec)
				}
			}
			if len(flows) != 2 {
				t.Fatalf("want 2 flow records for ports %d and %d, got %d: %+v", tc.rst, tc.sink, len(flows), flows)
			}
			for _, rec := range flows {
				t.Logf("record: port %d outcome %q bytes_out %d bytes_in %d reason %q", rec.Port, rec.Outcome, rec.BytesOut, rec.BytesIn, rec.Reason)
				moved := rec.BytesIn
				if rec.Port == tc.sink {
					moved = rec.BytesOut
				}
				if rec.Outcome != "reset" || moved < 100_000 {
					t.Errorf("port %d: record says outcome %q with %d bytes moved, want reset with at least 100000", rec.Port, rec.Outcome, moved)
				}
			}
		})
	}
}
