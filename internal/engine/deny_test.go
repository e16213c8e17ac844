package engine

import (
	"bytes"
	"strings"
	"testing"
)

// The denial printer writes one line per denial to the user's terminal; the
// sandbox chooses part of it (names, reasons quoting them), so it must not
// be able to end the line, start another, or send escape sequences.
func TestDenyPrinterCannotBeMadeToForgeLines(t *testing.T) {
	for _, c := range []struct {
		name, in, want string
	}{
		{"a newline", "evil.test\ntunwall: allowed everything", `evil.test\x0atunwall: allowed everything`},
		{"a carriage return", "evil.test\rtunwall: ok", `evil.test\x0dtunwall: ok`},
		{"an escape sequence", "x\x1b[2J\x1b]0;title\x07", `x\x1b[2J\x1b]0;title\x07`},
		{"C1 controls", "x\u009b31m\u0085y", `x\u009b31m\u0085y`},
		{"invalid UTF-8", "x\xff\xfey", `x\xff\xfey`},
		{"bidi overrides and zero-width", "a\u202eb\u2066c\u200bd", `a\u202eb\u2066c\u200bd`},
		{"a tab", "a\tb", `a\x09b`},
		{"printable text is kept", "bücher.example: no rule allows it (100%)", "bücher.example: no rule allows it (100%)"},
	} {
		var out bytes.Buffer
		p := denyPrinter{w: &out}
		p.printf("tunwall: denied %s %s: %s", c.in, "tcp", "why")
		want := "tunwall: denied " + c.want + " tcp: why\n"
		if out.String() != want {
			t.Errorf("%s: printed %q, want %q", c.name, out.String(), want)
		}
		if strings.Count(out.String(), "\n") != 1 {
			t.Errorf("%s: %d lines", c.name, strings.Count(out.String(), "\n"))
		}
	}
}
