package stack

import (
	"bytes"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
	glog "gvisor.dev/gvisor/pkg/log"
)

// syncBuffer is a bytes.Buffer safe for the logger's concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// captureStderr runs fn with file descriptor 2 pointing at a temporary file
// and returns what was written there.
func captureStderr(t *testing.T, fn func()) string {
	t.Helper()
	f, err := os.CreateTemp(t.TempDir(), "stderr")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	saved, err := unix.Dup(2)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(saved)
	if err := unix.Dup2(int(f.Fd()), 2); err != nil {
		t.Fatal(err)
	}
	func() {
		defer unix.Dup2(saved, 2)
		fn()
	}()
	b, err := os.ReadFile(f.Name())
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// gVisor's global log (which writes to stderr by default) goes through the
// stack's logger, at debug level, escaped; never to stderr.
func TestGVisorLogGoesThroughTheLoggerAtDebugOnly(t *testing.T) {
	var debug, warn syncBuffer
	forged := "forged\ntunwall: allowed everything\x1b[2J"
	out := captureStderr(t, func() {
		s, _ := newTestStack(t, newFakeHandler(), func(c *Config) {
			c.Logger = slog.New(slog.NewTextHandler(&debug, &slog.HandlerOptions{Level: slog.LevelDebug}))
		})
		glog.Warningf("a warning about %s", forged)
		glog.Infof("some info")
		closeWithin(t, s, 5e9)

		// A quieter stack made later: nothing below warn reaches it.
		s2, _ := newTestStack(t, newFakeHandler(), func(c *Config) {
			c.Logger = slog.New(slog.NewTextHandler(&warn, &slog.HandlerOptions{Level: slog.LevelWarn}))
		})
		glog.Warningf("another warning")
		closeWithin(t, s2, 5e9)
	})
	if out != "" {
		t.Errorf("gVisor wrote to stderr: %q", out)
	}
	got := debug.String()
	if !strings.Contains(got, "level=DEBUG") || !strings.Contains(got, `gvisor: a warning about forged\ntunwall: allowed everything\x1b[2J`) || !strings.Contains(got, "some info") {
		t.Errorf("the debug logger got %q, want both gVisor lines at DEBUG, quoted", got)
	}
	for _, l := range strings.Split(strings.TrimSuffix(got, "\n"), "\n") {
		if !strings.HasPrefix(l, "time=") || strings.ContainsAny(l, "\x1b\r") {
			t.Errorf("a gVisor line forged a log line or an escape: %q", l)
		}
	}
	if w := warn.String(); w != "" {
		t.Errorf("gVisor's warning reached a logger above debug: %q", w)
	}
}
