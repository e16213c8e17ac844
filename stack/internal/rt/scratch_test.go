package rt

import "testing"

func TestScratchIsTheSmallestClassThatHoldsTheMove(t *testing.T) {
	for _, c := range []struct{ n, want, class int }{
		{2 << 10, 2 << 10, 4 << 10},
		{4 << 10, 4 << 10, 4 << 10},
		{4<<10 + 1, 4<<10 + 1, 16 << 10},
		{64 << 10, 64 << 10, MaxScratch},
		{4 << 20, MaxScratch, MaxScratch}, // a cap beyond the largest class
	} {
		b, h := GetScratch(c.n)
		if len(b) != c.want || len(*h) != c.class || &b[0] != &(*h)[0] {
			t.Errorf("GetScratch(%d): len %d of a %d-byte buffer, want %d of %d", c.n, len(b), len(*h), c.want, c.class)
		}
		PutScratch(h)
	}
}
