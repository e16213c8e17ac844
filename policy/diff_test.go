package policy

import (
	"slices"
	"testing"
)

func TestDiffSaysWhatAChangeOfPolicyAddsAndRemoves(t *testing.T) {
	sel := func(src, phase string) *RuleSet {
		t.Helper()
		p, err := Parse("p.yaml", []byte(src))
		if err != nil {
			t.Fatal(err)
		}
		rs, err := Select(p, phase, nil, Guard{})
		if err != nil {
			t.Fatal(err)
		}
		return rs
	}
	const src = `version: 1
phases:
  setup:
    allow:
      - host: registry.test
      - host: api.test
        http:
          - {methods: [GET], paths: ["/**"]}
  exec:
    allow:
      - host: api.test
        http:
          - {methods: [GET, POST], paths: ["/**"]}
    deny:
      - host: gist.api.test
    default: public
`
	added, removed := Diff(sel(src, "setup"), sel(src, "exec"))
	for _, want := range []string{"default: public", "deny gist.api.test:*/tcp+udp"} {
		if !slices.Contains(added, want) {
			t.Errorf("added %q, want %q among them", added, want)
		}
	}
	if len(added) != 3 || len(removed) != 2 || !slices.Contains(removed, "allow registry.test:443/tcp") {
		t.Errorf("added %q, removed %q", added, removed)
	}
	// The same rules from another line of the file are no change.
	moved := "version: 1\nphases:\n  x:\n    allow:\n\n      - host: registry.test\n"
	if a, r := Diff(sel("version: 1\nphases:\n  x:\n    allow:\n      - host: registry.test\n", "x"), sel(moved, "x")); len(a)+len(r) != 0 {
		t.Errorf("a rule that moved: added %q removed %q", a, r)
	}
}
