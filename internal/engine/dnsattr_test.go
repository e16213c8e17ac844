package engine

import (
	"testing"
	"time"
)

func TestTokenBucketAllowsABurstThenTheRate(t *testing.T) {
	b := newTokenBucket(100, 16)
	t0 := time.Unix(1e9, 0)
	n := 0
	for i := 0; i < 100; i++ {
		if b.take(t0) {
			n++
		}
	}
	if n != 16 {
		t.Fatalf("burst: %d taken, want 16", n)
	}
	// 100 a second: one every 10ms.
	if b.take(t0.Add(5 * time.Millisecond)) {
		t.Error("a token after 5ms")
	}
	if !b.take(t0.Add(11 * time.Millisecond)) {
		t.Error("no token after 11ms")
	}
	n = 0
	for ms := 12; ms <= 1011; ms++ {
		if b.take(t0.Add(time.Duration(ms) * time.Millisecond)) {
			n++
		}
	}
	if n < 99 || n > 101 {
		t.Errorf("over a second: %d taken, want about 100", n)
	}
	// Idle for long: the burst again, never more.
	n = 0
	for i := 0; i < 100; i++ {
		if b.take(t0.Add(time.Hour)) {
			n++
		}
	}
	if n != 16 {
		t.Errorf("after an hour idle: %d taken, want 16", n)
	}
}
