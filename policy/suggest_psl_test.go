package policy

import (
	"regexp"
	"strings"
	"testing"

	"golang.org/x/net/publicsuffix"
)

// wildcardRule matches a suggested wildcard host rule.
var wildcardRule = regexp.MustCompile(`(?m)^\s*- host: "\*\.([^"]+)"$`)

// TestSuggestNeverWildcardsWhereOthersOwnNames: policy suggest never offers a
// wildcard that covers names other parties can own: none directly under a
// public suffix (ICANN or private: multi-tenant hosting), none whose grouped
// names are public suffixes themselves, and none at a registrable domain
// (which may delegate private suffixes below it, as amazonaws.com does for
// S3), whatever the Public Suffix List lists.
func TestSuggestNeverWildcardsWhereOthersOwnNames(t *testing.T) {
	parents := []string{
		// Private (multi-tenant) suffixes, many of them missing from the
		// excerpt policy once carried.
		"github.io", "s3.amazonaws.com", "herokuapp.com", "deno.dev", "pythonanywhere.com",
		"myshopify.com", "codeberg.page", "azurestaticapps.net", "s3.us-east-1.amazonaws.com",
		"replit.app", "ngrok.app", "cloudflare.net",
		// ICANN suffixes below the top level.
		"co.uk", "com.au", "k12.ca.us", "x.kawasaki.jp",
		// Names that are suffixes themselves (a wildcard suffix rule).
		"kawasaki.jp", "compute-1.amazonaws.com",
		// Registrable domains: the owner may delegate suffixes below.
		"amazonaws.com", "example.org",
	}
	for _, parent := range parents {
		obs := []Observation{obsHost("alice."+parent, 443, TCP), obsHost("bob."+parent, 443, TCP), obsHost("carol."+parent, 443, TCP)}
		out := string(suggestPSL(obs))
		if m := wildcardRule.FindStringSubmatch(out); m != nil {
			t.Errorf("siblings under %s: suggested *.%s:\n%s", parent, m[1], out)
		}
		for _, o := range obs {
			if !strings.Contains(out, `- host: "`+o.Host+`"`) {
				t.Errorf("siblings under %s: no rule of its own for %s:\n%s", parent, o.Host, out)
			}
		}
	}
	// Below a registrable domain, siblings are still grouped.
	out := string(suggestPSL([]Observation{obsHost("a.cdn.example.org", 443, TCP), obsHost("b.cdn.example.org", 443, TCP)}))
	if m := wildcardRule.FindStringSubmatch(out); m == nil || m[1] != "cdn.example.org" {
		t.Errorf("siblings under cdn.example.org are not grouped:\n%s", out)
	}
}

// checkWildcards fails if out has a wildcard the Public Suffix List says
// covers names others can own.
func checkWildcards(t *testing.T, out []byte) {
	t.Helper()
	for _, m := range wildcardRule.FindAllStringSubmatch(string(out), -1) {
		p := m[1]
		if s, _ := publicsuffix.PublicSuffix(p); s == p {
			t.Errorf("*.%s is a wildcard directly under a public suffix:\n%s", p, out)
		}
		if d, err := publicsuffix.EffectiveTLDPlusOne(p); err != nil || d == p {
			t.Errorf("*.%s is a wildcard at or above a registrable domain:\n%s", p, out)
		}
	}
}

func suggestPSL(obs []Observation) []byte {
	return Suggest(obs, "exec", "t", publicsuffix.PublicSuffix)
}

func TestSuggestWithoutASuffixListGroupsNothing(t *testing.T) {
	out := string(Suggest([]Observation{obsHost("a.cdn.example.org", 443, TCP), obsHost("b.cdn.example.org", 443, TCP)}, "exec", "t", nil))
	if wildcardRule.MatchString(out) || !strings.Contains(out, "no public suffix list") {
		t.Fatalf("grouped without a suffix list:\n%s", out)
	}
}
