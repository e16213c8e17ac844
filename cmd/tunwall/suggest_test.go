package main

import (
	"bytes"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tunwall/tunwall/internal/audit"
)

// writeLearnLog writes one run of a learn log to path: a flow and a
// request that received secret T, to each host, under a header whose
// policy injected T into api.test only. It returns the run's last hash.
func writeLearnLog(t *testing.T, path string, hosts ...string) string {
	t.Helper()
	w, err := audit.Open(audit.Options{Path: path, Header: audit.Header{Run: audit.NewRunID(), Phase: "exec",
		Config: map[string]string{"inject": "api.test=T", "secrets": "T=env:T"}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range hosts {
		now := time.Now()
		w.Write(audit.Record{TS: now, Kind: audit.KindFlow, Proto: "tcp", Src: netip.MustParseAddrPort("198.18.0.2:40000"),
			Dst: netip.MustParseAddrPort("192.0.2.10:443"), Host: h, HostFrom: audit.HostFromDNS, Port: 443, Verdict: audit.VerdictAllow, Rule: "learn"})
		w.Write(audit.Record{TS: now, Kind: audit.KindHTTP, Host: h, Port: 443, Verdict: audit.VerdictAllow, Rule: "learn",
			Method: "GET", Path: "/x", Secrets: "T"})
	}
	sum, err := w.Close()
	if err != nil {
		t.Fatal(err)
	}
	return sum.Last
}

// suggest proposes an inject only where the record's run header says its
// policy injected, and with --expect reads only the lines it pins.
func TestSuggestInjectsOnlyWhereTheLearnRunsPolicyDid(t *testing.T) {
	path := filepath.Join(t.TempDir(), "learn.jsonl")
	last := writeLearnLog(t, path, "api.test", "evil.test")
	var out, errb bytes.Buffer
	if code := policySuggest([]string{path}, &out, &errb); code != exitOK {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	y := out.String()
	i, j := strings.Index(y, `"api.test"`), strings.Index(y, `"evil.test"`)
	if i < 0 || j < 0 {
		t.Fatalf("want both hosts allowed:\n%s", y)
	}
	if !strings.Contains(y[i:], "inject: [T]") || (j > i && strings.Contains(y[j:], "inject")) || (j < i && strings.Contains(y[j:i], "inject")) {
		t.Errorf("want inject for api.test only:\n%s", y)
	}
	if !strings.Contains(errb.String(), "injected T into evil.test, which that run's policy does not inject into") {
		t.Errorf("stderr does not say why evil.test gets no inject:\n%s", errb.String())
	}

	// A second run appended after the hash the first printed: --expect
	// pins the first, and the rest is not read.
	writeLearnLog(t, path, "later.test")
	out.Reset()
	errb.Reset()
	if code := policySuggest([]string{"--expect", last, path}, &out, &errb); code != exitOK {
		t.Fatalf("--expect: exit %d: %s", code, errb.String())
	}
	if strings.Contains(out.String(), "later.test") || !strings.Contains(errb.String(), "are not pinned") {
		t.Errorf("--expect read past its anchor:\n%s\n%s", out.String(), errb.String())
	}
	if code := policySuggest([]string{"--expect", strings.Repeat("ab", 32), path}, &out, &errb); code != exitFail {
		t.Errorf("--expect of a hash no line has: exit %d, want %d", code, exitFail)
	}
}
