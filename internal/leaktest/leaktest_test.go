package leaktest

import (
	"fmt"
	"strings"
	"testing"
)

// recorder is a testing.TB that keeps what Check reports.
type recorder struct {
	testing.TB
	cleanups []func()
	errs     []string
}

func (r *recorder) Helper()                   {}
func (r *recorder) Failed() bool              { return len(r.errs) > 0 }
func (r *recorder) Cleanup(f func())          { r.cleanups = append(r.cleanups, f) }
func (r *recorder) Error(args ...any)         { r.errs = append(r.errs, fmt.Sprint(args...)) }
func (r *recorder) Errorf(f string, a ...any) { r.errs = append(r.errs, fmt.Sprintf(f, a...)) }

func TestCheckReportsAGoroutineLeftRunningAndPassesWhenItEnds(t *testing.T) {
	stop := make(chan struct{})
	r := &recorder{TB: t}
	Check(r)
	go func() { <-stop }()
	r.cleanups[0]()
	if len(r.errs) == 0 || !strings.Contains(strings.Join(r.errs, "\n"), "leaktest.TestCheckReports") {
		t.Fatalf("a leaked goroutine was not reported: %q", r.errs)
	}
	close(stop)

	r = &recorder{TB: t}
	Check(r)
	done := make(chan struct{})
	go func() { close(done) }()
	<-done
	r.cleanups[0]()
	if len(r.errs) != 0 {
		t.Fatalf("reported %q with no goroutine left", r.errs)
	}
}
