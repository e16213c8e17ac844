package procattr

import "testing"

func TestKnownIsAnsweredAtOnceWithTheOwner(t *testing.T) {
	o := Owner{PID: 7, Inode: 9, Comm: "curl"}
	p := Known(o)
	if got, ok := p.Owner(); !ok || got != o {
		t.Fatalf("Owner() = %+v, %v", got, ok)
	}
	if got := p.Finish(0); got != o {
		t.Fatalf("Finish(0) = %+v", got)
	}
	select {
	case <-p.Done():
	default:
		t.Fatal("Done is not closed")
	}
}
