package audit

import (
	"bytes"
	"testing"
)

func TestRecordsWithHeadersGivesEachRunsHeaderBeforeItsRecords(t *testing.T) {
	h1 := fixedHeader("tw-0000000000000001")
	h1.Config = map[string]string{"secrets": "GITHUB_TOKEN=env:GH"}
	first := buildLog(t, h1, fixedRecords()[:1], true)
	h2 := fixedHeader("tw-0000000000000002")
	h2.Config = map[string]string{"secrets": "NPM_TOKEN=file:/t"}
	log := append(first, buildLogAfter(t, first, h2, fixedRecords()[:1], true)...)
	var seen []string
	for r, err := range RecordsWithHeaders(bytes.NewReader(log), func(h Header) {
		seen = append(seen, "header "+h.Run+" "+h.Config["secrets"])
	}) {
		if err != nil {
			t.Fatal(err)
		}
		seen = append(seen, "record "+r.Run)
	}
	want := []string{
		"header tw-0000000000000001 GITHUB_TOKEN=env:GH", "record tw-0000000000000001",
		"header tw-0000000000000002 NPM_TOKEN=file:/t", "record tw-0000000000000002",
	}
	if len(seen) != len(want) {
		t.Fatalf("seen %q, want %q", seen, want)
	}
	for i := range want {
		if seen[i] != want[i] {
			t.Errorf("line %d: %q, want %q", i, seen[i], want[i])
		}
	}
}
