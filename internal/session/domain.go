package session

import (
	"strings"

	"golang.org/x/net/publicsuffix"

	"github.com/tunwall/tunwall/internal/audit"
)

// registrableDomain is what the audit log folds denials by past its denial
// budget (audit.Options.Domain): a name's registrable domain by the public
// suffix list (eTLD+1: a.b.example.co.uk is example.co.uk), the name itself
// if it is a public suffix (github.io), and audit's approximation (the last
// two labels) for what the list cannot parse, such as a name with an empty
// label.
func registrableDomain(name string) string {
	name = strings.ToLower(strings.TrimSuffix(name, "."))
	if d, err := publicsuffix.EffectiveTLDPlusOne(name); err == nil {
		return d
	}
	if ps, _ := publicsuffix.PublicSuffix(name); ps == name {
		return name
	}
	return audit.RegistrableDomain(name)
}
