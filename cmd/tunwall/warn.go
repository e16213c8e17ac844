package main

import (
	"fmt"
	"strings"

	"golang.org/x/net/publicsuffix"

	"github.com/tunwall/tunwall/policy"
)

// ruleWarning says why a valid rule is probably not what its author meant, or
// "" if nothing is wrong with it: a wildcard over a public suffix (*.com,
// *.co.uk, *.github.io: every site registered under it) or a cidr rule of
// every address (0.0.0.0/0, ::/0). Such rules load; tools print the warning.
func ruleWarning(r policy.Rule) string {
	if base, ok := strings.CutPrefix(r.Host, "*."); ok {
		if ps, icann := publicsuffix.PublicSuffix(base); ps == base {
			what := "a public suffix"
			if !icann && !strings.Contains(base, ".") {
				what = "a top-level domain"
			}
			return fmt.Sprintf("%s allows every name under %s, which is %s: any site anyone registers there (name the hosts, or *.SITE.%s)", r.Host, base, what, base)
		}
	}
	if r.Host == "" && r.CIDR.IsValid() && r.CIDR.Bits() == 0 {
		return fmt.Sprintf("cidr %s allows every %s address the guard allows (name the hosts or ranges you need)", r.CIDR, map[bool]string{true: "IPv4", false: "IPv6"}[r.CIDR.Addr().Is4()])
	}
	return ""
}
