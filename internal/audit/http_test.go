package audit

import (
	"bytes"
	"strings"
	"testing"
)

// TestHTTPRecordsAreChainedReadBackAndSummarisedByHostAndMethod: an http
// record carries method, path, status and the names of injected secrets
// after the flow's keys; it verifies, reads back, and the summary groups
// requests by host and method.
func TestHTTPRecordsAreChainedReadBackAndSummarisedByHostAndMethod(t *testing.T) {
	flow := fixedRecords()[1]
	req := func(method, path string, status int, allow bool, secrets string) Record {
		r := flow
		r.Kind, r.Host, r.Method, r.Path, r.Status, r.Secrets = KindHTTP, "api.github.com", method, path, status, secrets
		r.Verdict, r.Rule, r.Reason = VerdictAllow, "api.github.com:443/tcp (p.yaml:7)", "allowed by rule"
		if !allow {
			r.Verdict, r.Reason = VerdictDeny, "no http rule of api.github.com allows "+method+" "+path
		}
		return r
	}
	recs := []Record{
		req("GET", "/repos/acme/widget", 200, true, "GITHUB_TOKEN"),
		req("GET", "/repos/acme/widget/issues", 200, true, "GITHUB_TOKEN"),
		req("POST", "/gists", 403, false, ""),
	}
	log := buildLog(t, fixedHeader(testRun), recs, true)
	line := string(splitLines(log)[1])
	if !strings.Contains(line, `"dial":"`) || !strings.Contains(line, `"method":"GET","path":"/repos/acme/widget","status":200,"secrets":"GITHUB_TOKEN","prev"`) {
		t.Fatalf("http line: %s", line)
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
	if len(got) != 3 || got[0].Method != "GET" || got[0].Path != "/repos/acme/widget" || got[0].Secrets != "GITHUB_TOKEN" || got[2].Status != 403 || got[2].Verdict != VerdictDeny {
		t.Fatalf("read back %+v", got)
	}
	var sum bytes.Buffer
	if err := Summarize(bytes.NewReader(log), &sum); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"http       2 requests allowed, 1 denied", "HTTP HOST", "api.github.com  POST    0        1       403:1", "api.github.com  GET     2        0       200:2", "no http rule of api.github.com allows POST /gists"} {
		if !strings.Contains(sum.String(), want) {
			t.Errorf("summary has no %q:\n%s", want, sum.String())
		}
	}
	if strings.Index(sum.String(), "POST") > strings.Index(sum.String(), "  GET  ") {
		t.Errorf("denials are not first:\n%s", sum.String())
	}
}
