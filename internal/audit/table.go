package audit

import (
	"fmt"
	"io"
	"strings"
	"unicode/utf8"
)

// SummaryWidth is the width `audit summary` fits: a terminal of 100
// columns, so that no line wraps.
const SummaryWidth = 100

// table is one of the summary's tables. Its cells are laid out in columns
// two spaces apart; when the table is wider than SummaryWidth, the
// columns of shrink are narrowed, in order, down to their minimum, and
// their cells cut (in the middle for names, whose both ends matter; at
// the end for text). Tab-safe cells only (tabSafe).
type table struct {
	rows   [][]string // rows[0] is the header
	shrink []shrinkCol
}

// shrinkCol is a column the table may narrow, down to min runes.
type shrinkCol struct {
	col, min int
	middle   bool // cut in the middle, not at the end
}

func (t *table) add(cells ...string) { t.rows = append(t.rows, cells) }

func (t *table) write(w io.Writer) {
	if len(t.rows) == 0 {
		return
	}
	n := len(t.rows[0])
	width := make([]int, n)
	for _, r := range t.rows {
		for i, c := range r {
			width[i] = max(width[i], utf8.RuneCountInString(c))
		}
	}
	total := 2 * (n - 1)
	for _, c := range width {
		total += c
	}
	for _, s := range t.shrink {
		if over := total - SummaryWidth; over > 0 && width[s.col] > s.min {
			cut := min(over, width[s.col]-s.min)
			width[s.col] -= cut
			total -= cut
			for _, r := range t.rows {
				r[s.col] = cutTo(r[s.col], width[s.col], s.middle)
			}
		}
	}
	var b strings.Builder
	for _, r := range t.rows {
		b.Reset()
		for i, c := range r {
			b.WriteString(c)
			if i < len(r)-1 {
				b.WriteString(strings.Repeat(" ", width[i]-utf8.RuneCountInString(c)+2))
			}
		}
		fmt.Fprintln(w, strings.TrimRight(b.String(), " "))
	}
}

// cutTo returns s cut to n runes with "..." where it was cut.
func cutTo(s string, n int, middle bool) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	if n <= 3 {
		return string(r[:n])
	}
	if !middle {
		return string(r[:n-3]) + "..."
	}
	head := (n - 3 + 1) / 2
	return string(r[:head]) + "..." + string(r[len(r)-(n-3-head):])
}
