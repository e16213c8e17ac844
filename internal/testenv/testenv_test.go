package testenv

import (
	"fmt"
	"runtime"
	"testing"
)

// fakeTB records how a test ended.
type fakeTB struct {
	testing.TB
	fatal, skip string
}

func (f *fakeTB) Helper() {}
func (f *fakeTB) Fatalf(format string, args ...any) {
	f.fatal = fmt.Sprintf(format, args...)
	runtime.Goexit()
}
func (f *fakeTB) Skipf(format string, args ...any) {
	f.skip = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func run(fn func(*fakeTB)) *fakeTB {
	f := &fakeTB{}
	done := make(chan struct{})
	go func() { defer close(done); fn(f) }()
	<-done
	return f
}

func TestSkipFailsUnderCI(t *testing.T) {
	t.Setenv("CI", "true")
	if f := run(func(f *fakeTB) { Skip(f, "no %s", "curl") }); f.fatal == "" || f.skip != "" {
		t.Fatalf("under CI=true: fatal %q, skip %q", f.fatal, f.skip)
	}
	t.Setenv("CI", "")
	if f := run(func(f *fakeTB) { Skip(f, "no %s", "curl") }); f.skip != "!!! SKIPPING: no curl !!!" || f.fatal != "" {
		t.Fatalf("outside CI: fatal %q, skip %q", f.fatal, f.skip)
	}
}

func TestUnder(t *testing.T) {
	for _, c := range []struct {
		path, prefix string
		want         bool
	}{
		{"gvisor.dev/gvisor/pkg/tcpip", "gvisor.dev/", true},
		{"golang.org/x/sys/unix", "golang.org/x/sys", true},
		{"golang.org/x/system", "golang.org/x/sys", false},
		{"net/http", "net/http", true},
		{"net/http/httptrace", "net/http", true},
		{"net", "net/http", false},
	} {
		if got := Under(c.path, c.prefix); got != c.want {
			t.Errorf("Under(%q, %q) = %v", c.path, c.prefix, got)
		}
	}
}
