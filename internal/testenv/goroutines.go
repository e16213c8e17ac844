package testenv

import (
	"bytes"
	"runtime"
	"strconv"
	"testing"
	"time"
)

// Goid is the calling goroutine's id, from its stack trace's header.
func Goid() uint64 {
	b := make([]byte, 64)
	b = b[:runtime.Stack(b, false)]
	b = bytes.TrimPrefix(b, []byte("goroutine "))
	n, _ := strconv.ParseUint(string(b[:bytes.IndexByte(b, ' ')]), 10, 64)
	return n
}

// WaitParked waits until goroutine id is parked in a select (the pool's
// wait for work), bounded. The pool counts a goroutine as waiting just
// before it parks; until it has, a hand-off finds no receiver.
func WaitParked(t testing.TB, id uint64) {
	t.Helper()
	prefix := []byte("goroutine " + strconv.FormatUint(id, 10) + " [select")
	buf := make([]byte, 1<<20)
	for deadline := time.Now().Add(10 * time.Second); ; runtime.Gosched() {
		n := runtime.Stack(buf, true)
		if n == len(buf) { // the dump did not fit: take it whole next time
			buf = make([]byte, 2*len(buf))
			continue
		}
		for g := range bytes.SplitSeq(buf[:n], []byte("\n\n")) {
			if bytes.HasPrefix(g, prefix) {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("goroutine %d is not parked in a select after 10s", id)
		}
	}
}
