package inspect

import "testing"

func TestSearchExpands(t *testing.T) {
	search := []string{"corp.test", "lab.corp.test"}
	tests := []struct {
		short, fqdn string
		want        bool
	}{
		{"intra", "intra.corp.test", true},
		{"intra", "intra.lab.corp.test", true},
		{"intra.eu", "intra.eu.corp.test", true},
		{"intra", "intra.evil.test", false},      // not a search domain
		{"evil", "intra.corp.test", false},       // another name
		{"intra.corp", "intra.corp.test", false}, // not short + a whole domain
		{"ntra", "intra.corp.test", false},
		{"intra.corp.test", "intra.corp.test", false}, // equal is checked elsewhere
		{"", "intra.corp.test", false},
	}
	for _, tt := range tests {
		if got := searchExpands(search, tt.short, tt.fqdn); got != tt.want {
			t.Errorf("searchExpands(%q, %q) = %v, want %v", tt.short, tt.fqdn, got, tt.want)
		}
	}
	if searchExpands(nil, "intra", "intra.corp.test") {
		t.Error("no search list: a short name must not be accepted")
	}
}
