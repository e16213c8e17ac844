// Package leaktest checks that a test leaves no goroutine running, with
// go.uber.org/goleak. It is imported only by tests.
package leaktest

import (
	"testing"
	"time"

	"go.uber.org/goleak"
)

// Wait bounds how long Check waits for goroutines to end.
const Wait = 5 * time.Second

// Check fails t if goroutines started after the call are still running once
// t's other cleanups have run (it waits up to Wait for them to end, and
// names them). Call it first in a test, so that its cleanup runs last, after
// every server and conn the test closes. A test that already failed is not
// checked.
func Check(t testing.TB) {
	t.Helper()
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() {
		if t.Failed() {
			return
		}
		// goleak.Find retries for about half a second; retry it up to Wait.
		deadline := time.Now().Add(Wait)
		for goleak.Find(ignore) != nil && time.Now().Before(deadline) {
		}
		goleak.VerifyNone(t, ignore)
	})
}
