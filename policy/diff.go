package policy

import (
	"fmt"
	"slices"
	"strings"
)

// Diff says how b differs from a, one line per rule as a user would
// compare them: "allow HOST:PORTS/PROTO" (with its http entries, injected
// secrets and ca) or "deny ...", and "default: public" when the default
// differs. added are in b and not in a, removed in a and not in b, each in
// b's (a's) order. Where a rule came from (its file and line) is not
// compared: a rule that only moved is no change.
func Diff(a, b *RuleSet) (added, removed []string) {
	as, bs := describeRules(a), describeRules(b)
	for _, s := range bs {
		if !slices.Contains(as, s) {
			added = append(added, s)
		}
	}
	for _, s := range as {
		if !slices.Contains(bs, s) {
			removed = append(removed, s)
		}
	}
	return added, removed
}

// describeRules lists rs's rules as Diff compares them.
func describeRules(rs *RuleSet) []string {
	var out []string
	if rs.Open() {
		out = append(out, "default: public")
	}
	for _, r := range rs.Rules() {
		out = append(out, "allow "+ruleLine(r))
	}
	for _, r := range rs.DenyRules() {
		out = append(out, "deny "+ruleLine(r))
	}
	return out
}

func ruleLine(r Rule) string {
	s := r.String()
	if r.HTTP != nil {
		var hs []string
		for _, h := range r.HTTP {
			hs = append(hs, h.String())
		}
		s += " http [" + strings.Join(hs, "; ") + "]"
	}
	if len(r.Inject) > 0 {
		var in []string
		for _, i := range r.Inject {
			x := i.Secret
			if i.Header != "" {
				x += fmt.Sprintf(" into %s", i.Header)
			}
			in = append(in, x)
		}
		s += " inject [" + strings.Join(in, ", ") + "]"
	}
	if r.CA != "" {
		s += " ca " + r.CA
	}
	return s
}
