package main

import (
	"fmt"
	"strconv"
	"strings"

	"golang.org/x/net/publicsuffix"

	"github.com/tunwall/tunwall/policy"
)

// ruleWarning says why a valid rule is probably not what its author meant, or
// "" if nothing is wrong with it: a wildcard over a public suffix (*.com,
// *.co.uk, *.github.io: every site registered under it), a cidr rule of
// every address (0.0.0.0/0, ::/0), or an inject rule that allows a port
// plain HTTP is served on. Such rules load; tools print the warning.
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
	return injectPlainWarning(r)
}

// plainHTTPPorts are the ports plain HTTP is served on by convention.
var plainHTTPPorts = []uint16{80, 8000, 8008, 8080, 8888}

// injectPlainWarning warns of a rule that injects a secret and allows a
// port plain HTTP is served on: tunwall injects only over TLS it
// verified, so a request there that carries the placeholder is refused.
func injectPlainWarning(r policy.Rule) string {
	if len(r.Inject) == 0 {
		return ""
	}
	var plain []string
	for _, p := range plainHTTPPorts {
		for _, pr := range r.Ports {
			if pr.Contains(p) {
				plain = append(plain, strconv.Itoa(int(p)))
				break
			}
		}
	}
	if len(plain) == 0 {
		return ""
	}
	names := make([]string, 0, len(r.Inject))
	for _, in := range r.Inject {
		names = append(names, in.Secret)
	}
	return fmt.Sprintf("%s injects %s and allows port %s, where requests are plain HTTP: tunwall injects secrets only over TLS it verified, so a plain HTTP request carrying a placeholder is refused (drop the port unless the server speaks TLS there)",
		r.Host, strings.Join(names, ", "), strings.Join(plain, ", "))
}
