package audit

import (
	"bytes"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestATableWiderThanATerminalIsNarrowedToFitIt(t *testing.T) {
	long := strings.Repeat("a", 60) + ".evil.test"
	tb := table{shrink: []shrinkCol{{col: 0, min: 24, middle: true}, {col: 2, min: 12}}}
	tb.add("HOST", "VERDICT", "PROCESSES")
	tb.add(long, "deny", strings.Repeat("curl,", 20))
	tb.add("short.test", "allow", "-")
	var out bytes.Buffer
	tb.write(&out)
	for l := range strings.SplitSeq(strings.TrimSuffix(out.String(), "\n"), "\n") {
		if n := utf8.RuneCountInString(l); n > SummaryWidth {
			t.Errorf("line of %d columns: %q", n, l)
		}
	}
	// The host is cut in the middle: both ends stay.
	if !strings.Contains(out.String(), "aaa...") || !strings.Contains(out.String(), "evil.test  deny") {
		t.Errorf("the long host was not cut in the middle:\n%s", out.String())
	}
	// A table that fits is left alone.
	var small bytes.Buffer
	tb2 := table{shrink: []shrinkCol{{col: 0, min: 4, middle: true}}}
	tb2.add("HOST", "VERDICT")
	tb2.add("pypi.org", "allow")
	tb2.write(&small)
	if small.String() != "HOST      VERDICT\npypi.org  allow\n" {
		t.Errorf("a narrow table was changed: %q", small.String())
	}
}

func TestCutTo(t *testing.T) {
	for _, c := range []struct {
		s      string
		n      int
		middle bool
		want   string
	}{
		{"abcdef", 6, false, "abcdef"},
		{"abcdefgh", 6, false, "abc..."},
		{"abcdefgh", 6, true, "ab...h"},
		{"abcdefgh", 3, true, "abc"},
		{"ééééé", 4, false, "é..."},
	} {
		if got := cutTo(c.s, c.n, c.middle); got != c.want {
			t.Errorf("cutTo(%q, %d, %v) = %q, want %q", c.s, c.n, c.middle, got, c.want)
		}
	}
}
