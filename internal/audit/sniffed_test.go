package audit

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

// TestSniffedNamesAreRecordedAfterDial: a flow record carries the TLS SNI
// and HTTP Host the client sent as "sni" and "http_host", right after
// "dial", only when set; the chain still verifies and reading gives them
// back.
func TestSniffedNamesAreRecordedAfterDial(t *testing.T) {
	recs := fixedRecords()[:2]
	sniffed := recs[1]
	sniffed.SNI, sniffed.HTTPHost = "pypi.org", "files.pythonhosted.org"
	recs = append(recs, sniffed)
	log := buildLog(t, fixedHeader(testRun), recs, true)
	lines := splitLines(log)
	keys := func(l []byte) string {
		dec := json.NewDecoder(bytes.NewReader(l))
		dec.Token()
		var out []string
		for dec.More() {
			tok, _ := dec.Token()
			out = append(out, tok.(string))
			var skip json.RawMessage
			dec.Decode(&skip)
		}
		return strings.Join(out, " ")
	}
	const base = "ts run phase kind proto src dst host host_from port verdict rule reason pid comm exe owner bytes_out bytes_in duration_ms dial"
	if got, want := keys(lines[2]), base+" prev"; got != want {
		t.Errorf("a flow without sniffed names:\n got %s\nwant %s", got, want)
	}
	if got, want := keys(lines[3]), base+" sni http_host prev"; got != want {
		t.Errorf("a flow with sniffed names:\n got %s\nwant %s", got, want)
	}
	if _, err := Verify(bytes.NewReader(log)); err != nil {
		t.Fatalf("Verify: %v", err)
	}
	var got []Record
	for r, err := range Records(bytes.NewReader(log)) {
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, r)
	}
	if len(got) != 3 || got[2].SNI != "pypi.org" || got[2].HTTPHost != "files.pythonhosted.org" || got[1].SNI != "" {
		t.Fatalf("read back %+v", got)
	}
}

// TestDenialsThatSniffedOtherNamesAreNotFolded: two denied flows that differ
// only in the name the client sent stay two records, each with its name.
func TestDenialsThatSniffedOtherNamesAreNotFolded(t *testing.T) {
	deny := fixedRecords()[3] // a denied flow
	a, b := deny, deny
	a.SNI, b.SNI = "one.example", "two.example"
	if foldKeyOf(&a) == foldKeyOf(&b) {
		t.Error("records with different sni share a fold key")
	}
	a, b = deny, deny
	a.HTTPHost, b.HTTPHost = "one.example", "two.example"
	if foldKeyOf(&a) == foldKeyOf(&b) {
		t.Error("records with different http_host share a fold key")
	}
	if a.Verdict != VerdictDeny || !repeatable(&a) {
		t.Fatalf("setup: %+v is not a repeatable denial", a)
	}
}
