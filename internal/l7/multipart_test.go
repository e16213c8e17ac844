package l7

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/tunwall/tunwall/policy"
)

// onlyGETAndPOST decides a method as a list allowing GET and POST would.
func onlyGETAndPOST(m string) policy.RequestDecision {
	switch strings.TrimSpace(m) {
	case "GET", "POST":
		return policy.RequestDecision{Verdict: policy.Allow}
	}
	return policy.RequestDecision{Verdict: policy.Deny, Reason: "_method=" + strings.TrimSpace(m) + " is not allowed"}
}

// feedParts feeds body to a formParts in the pieces cut at cuts, handing
// on what it settles, as partsBody does; it returns what went on.
func feedParts(boundary string, body []byte, cuts ...int) ([]byte, error) {
	fp := newFormParts(boundary, onlyGETAndPOST)
	var out, pend []byte
	prev := 0
	for _, c := range append(cuts, len(body)) {
		pend = append(pend, body[prev:c]...)
		prev = c
		n, err := fp.feed(pend, c == len(body))
		if err != nil {
			return out, err
		}
		out = append(out, pend[:n]...)
		pend = pend[n:]
	}
	return out, nil
}

func part(boundary, name, value string) string {
	return "--" + boundary + "\r\nContent-Disposition: form-data; name=\"" + name + "\"\r\n\r\n" + value + "\r\n"
}

func TestMultipartPartsNamingAMethodAreDecidedBeforeTheyGoOn(t *testing.T) {
	const b = "XbOuNdArY"
	end := "--" + b + "--\r\n"
	file := "--" + b + "\r\nContent-Disposition: form-data; name=\"f\"; filename=\"a.bin\"\r\nContent-Type: application/octet-stream\r\n\r\n" + strings.Repeat("z", 5000) + "\r\n"
	for _, c := range []struct {
		name, body string
		deny       bool
	}{
		{"no method", part(b, "a", "1") + file + end, false},
		{"allowed method", part(b, "_method", "GET") + file + end, false},
		{"denied first", part(b, "_method", "DELETE") + file + end, true},
		{"denied last", file + part(b, "_method", "DELETE") + end, true},
		{"denied, no close delimiter", file + part(b, "_method", "DELETE"), true},
		{"denied, the body ends in its value", file + "--" + b + "\r\nContent-Disposition: form-data; name=\"_method\"\r\n\r\nDELETE", true},
		{"upper-case name", file + part(b, "_METHOD", "DELETE") + end, true},
		{"name*", file + "--" + b + "\r\nContent-Disposition: form-data; name*=utf-8''%5Fmethod\r\n\r\nDELETE\r\n" + end, true},
		{"unquoted name", file + "--" + b + "\r\nContent-Disposition: form-data; name=_method\r\n\r\nDELETE\r\n" + end, true},
		{"unparsable disposition", file + "--" + b + "\r\nContent-Disposition: form-data; name=\"_method\r\n\r\nPUT\r\n" + end, true},
		{"LF only", strings.ReplaceAll(file+part(b, "_method", "DELETE")+end, "\r\n", "\n"), true},
		{"padding after the delimiter", file + "--" + b + "  \r\nContent-Disposition: form-data; name=\"_method\"\r\n\r\nDELETE\r\n" + end, true},
		{"value over the bound", file + part(b, "_method", strings.Repeat("D", 300)) + end, true},
		{"headers over the bound", file + "--" + b + "\r\nX-Pad: " + strings.Repeat("p", 17<<10) + "\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\n1\r\n" + end, true},
		{"the delimiter as content, not a line", file[:100] + "--" + b + file[100:] + end, false},
		{"after the close delimiter", part(b, "a", "1") + end + part(b, "_method", "DELETE"), false},
	} {
		body := []byte(c.body)
		out, err := feedParts(b, body)
		var o *overridden
		if got := err != nil; got != c.deny || (err != nil && !errors.As(err, &o)) {
			t.Errorf("%s: err %v, want denied %v", c.name, err, c.deny)
			continue
		}
		if !c.deny && !bytes.Equal(out, body) {
			t.Errorf("%s: %d of %d bytes went on", c.name, len(out), len(body))
		}
		if c.deny && (bytes.Contains(out, []byte("DELETE")) || bytes.Contains(out, []byte("PUT"))) {
			t.Errorf("%s: the denied value went on before the denial: %q", c.name, out)
		}
		// The same at every split.
		for i := 0; i <= len(body); i++ {
			out2, err2 := feedParts(b, body, i)
			if (err2 != nil) != c.deny {
				t.Fatalf("%s: split at %d: err %v, want denied %v", c.name, i, err2, c.deny)
			}
			if c.deny && !bytes.HasPrefix(out, out2) && !bytes.HasPrefix(out2, out) {
				t.Fatalf("%s: split at %d: what went on differs", c.name, i)
			}
			if c.deny && bytes.Contains(out2, []byte("DELETE")) {
				t.Fatalf("%s: split at %d: the denied value went on", c.name, i)
			}
		}
	}
}

// FuzzMultipartParts: whatever the body, and wherever it is cut, the
// verdict is the one on the whole body, nothing goes on past a denial, and
// an allowed body goes on whole.
func FuzzMultipartParts(f *testing.F) {
	const b = "B"
	f.Add([]byte(part(b, "_method", "DELETE")+"--B--\r\n"), 3, 40)
	f.Add([]byte(part(b, "a", "1")+part(b, "_method", "GET")+"--B--"), 10, 70)
	f.Add([]byte("pre\n--B\nContent-Disposition: form-data; name=_method\n\nPUT\n--B--"), 1, 2)
	f.Fuzz(func(t *testing.T, body []byte, c1, c2 int) {
		if len(body) > 40<<10 {
			return
		}
		cut := func(c int) int {
			if c < 0 {
				c = -c
			}
			if len(body) == 0 {
				return 0
			}
			return c % (len(body) + 1)
		}
		x, y := cut(c1), cut(c2)
		if x > y {
			x, y = y, x
		}
		whole, err := feedParts(b, body)
		split, err2 := feedParts(b, body, x, y)
		if (err == nil) != (err2 == nil) {
			t.Fatalf("whole: %v, cut at %d and %d: %v", err, x, y, err2)
		}
		if err == nil && (!bytes.Equal(whole, body) || !bytes.Equal(split, body)) {
			t.Fatalf("allowed, yet %d and %d of %d bytes went on", len(whole), len(split), len(body))
		}
		if len(split) > len(body) || len(whole) > len(body) {
			t.Fatalf("more went on than came")
		}
	})
}
