package policy

import (
	"errors"
	"strings"
	"testing"
)

func TestParseReportsEveryBadRule(t *testing.T) {
	src := `version: 1
phases:
  setup:
    allow:
      - host: .example.com
      - host: ok.test
      - cidr: 10.0.0.0/33
  bad name!:
    allow:
      - host: x.test
  exec:
    allow:
      - host: a.test
        ports: [0]
      - host: b.test
        proto: icmp
`
	_, err := Parse("p.yaml", []byte(src))
	if err == nil {
		t.Fatal("accepted")
	}
	want := []string{"p.yaml:5:", "p.yaml:7:", "p.yaml:8:", "p.yaml:14:", "p.yaml:16:"}
	lines := strings.Split(err.Error(), "\n")
	if len(lines) != len(want) {
		t.Fatalf("%d errors, want %d:\n%v", len(lines), len(want), err)
	}
	for i, w := range want {
		if !strings.HasPrefix(lines[i], w) {
			t.Errorf("error %d = %q, want it at %s", i, lines[i], w)
		}
	}
	var pe *ParseError
	if !errors.As(err, &pe) || pe.Line != 5 {
		t.Errorf("errors.As finds %+v, want the first error (line 5)", pe)
	}
}
