package integration

import (
	"fmt"
	"strings"
	"testing"

	"github.com/tunwall/tunwall/internal/audit"
)

// publicOnlyPolicy allows GET and POST under /public/ of allowed.test:80.
const publicOnlyPolicy = `version: 1
phases:
  exec:
    allow:
      - host: allowed.test
        ports: [80]
        http: [{methods: [GET, POST], paths: ["/public/**"]}]
`

// statusFn is a shell function: c NAME CURL-ARGS... prints "NAME: STATUS".
const statusFn = `c() { printf '%s: ' "$1"; shift; curl -s -o /dev/null -w '%{http_code}\n' "$@"; }
`

// TestRequestRuleEdgesAreDecidedAsAServerWouldReadThem: an http list that
// allows GET and POST under /public/ must not let through what a server
// reads as another path or another method:
//   - a dot segment in overlong UTF-8 (%c0%ae) or as a fullwidth or
//     halfwidth look-alike (U+FF0E, U+FF61; U+FF0F for /), which a
//     normalising server reads as ".." or "/";
//   - a method override (X-HTTP-Method-Override, X-HTTP-Method,
//     X-Method-Override, or _method in the query) naming a method the list
//     does not allow;
//
// and a request tunwall's own HTTP server would answer itself (OPTIONS *)
// must be decided and recorded like any other.
func TestRequestRuleEdgesAreDecidedAsAServerWouldReadThem(t *testing.T) {
	requireTools(t, "curl")
	w := newWorld(t)
	pol := writeSetupPolicy(t, w, "edges.yaml", publicOnlyPolicy)
	script := statusFn + `c plain http://allowed.test/public/x
c overlong http://allowed.test/public/%c0%ae%c0%ae/secret
c overlong3 http://allowed.test/public/%e0%80%ae%e0%80%ae/secret
c fullwidth http://allowed.test/public/%ef%bc%8e%ef%bc%8e/secret
c halfwidth http://allowed.test/public/%ef%bd%a1%ef%bd%a1/secret
c fullslash http://allowed.test/public/x%ef%bc%8f..%ef%bc%8fsecret
c invalid http://allowed.test/public/%ff
c override -X POST -H 'X-HTTP-Method-Override: DELETE' http://allowed.test/public/x
c override2 -X POST -H 'X-HTTP-Method: PUT' http://allowed.test/public/x
c override3 -X GET -H 'X-Method-Override: DELETE' http://allowed.test/public/x
c query -X POST 'http://allowed.test/public/x?_method=DELETE'
c allowed-override -X POST -H 'X-HTTP-Method-Override: GET' http://allowed.test/public/x
c options -X OPTIONS --request-target '*' http://allowed.test/
`
	r := w.mustRun(0, runOpts{flags: []string{"--policy", pol}, script: script})
	for k, want := range map[string]string{
		"plain": "200", "allowed-override": "200",
		"overlong": "403", "overlong3": "403", "fullwidth": "403", "halfwidth": "403", "fullslash": "403", "invalid": "403",
		"override": "403", "override2": "403", "override3": "403", "query": "403", "options": "403",
	} {
		if !strings.Contains(r.stdout, k+": "+want+"\n") {
			t.Errorf("%s: want %s\n%s", k, want, r)
		}
	}
	recs := httpRecords(t, r.audit)
	sawOptions := false
	for _, rec := range recs {
		if rec.Method == "OPTIONS" {
			sawOptions = true
		}
	}
	if !sawOptions {
		t.Errorf("OPTIONS * left no http record (%d records)", len(recs))
	}
}

// TestAFormBodyNamingAForbiddenMethodIsDecidedAsThatMethod: Rails
// (Rack::MethodOverride) reads _method from a form body, not the query, and
// Laravel from either: a POST whose urlencoded body says _method=DELETE is a
// DELETE to such a server, and an http list without DELETE refuses it.
func TestAFormBodyNamingAForbiddenMethodIsDecidedAsThatMethod(t *testing.T) {
	requireTools(t, "curl")
	w := newWorld(t)
	pol := writeSetupPolicy(t, w, "form.yaml", publicOnlyPolicy)
	script := statusFn + `c form-get -X POST --data 'a=1&_method=GET' http://allowed.test/public/x
c form-delete -X POST --data 'a=1&_method=DELETE' http://allowed.test/public/x
c form-put -X POST --data '_method=put' http://allowed.test/public/x
c form-encoded -X POST --data '%5Fmethod=DELETE' http://allowed.test/public/x
c json -X POST -H 'Content-Type: application/json' --data '{"_method":"DELETE"}' http://allowed.test/public/x
{ printf 'a='; head -c 70000 /dev/zero | tr '\0' a; printf '&_method=DELETE'; } | c form-long -X POST -H 'Content-Type: application/x-www-form-urlencoded' --data-binary @- http://allowed.test/public/x
`
	r := w.mustRun(0, runOpts{flags: []string{"--policy", pol}, script: script})
	for k, want := range map[string]string{
		"form-get": "200", "json": "200",
		"form-delete": "403", "form-put": "403", "form-encoded": "403",
		// past the 64 KiB read, _method is not seen: refused while the
		// list does not allow every method
		"form-long": "403",
	} {
		if !strings.Contains(r.stdout, k+": "+want+"\n") {
			t.Errorf("%s: want %s\n%s", k, want, r)
		}
	}
	var named, long int
	for _, rec := range httpRecords(t, r.audit) {
		if rec.Status == 403 && strings.Contains(rec.Reason, "_method=DELETE asks the server to take it as DELETE") {
			named++
		}
		if rec.Status == 403 && strings.Contains(rec.Reason, "could name _method") {
			long++
		}
	}
	if named != 2 || long != 1 {
		t.Errorf("records: %d denials naming _method=DELETE (want 2), %d of a long form (want 1)", named, long)
	}
}

// localAnswersPy sends, on one keep-alive connection each, an allowed
// request and then a request whose head net/http refuses before any
// handler sees it, and prints "NAME: STATUS" for the second answer.
const localAnswersPy = `python3 - <<'PY'
import socket
good = b"GET /public/x HTTP/1.1\r\nHost: allowed.test\r\n\r\n"
cases = [
    ("badname", b"GET /public/bad HTTP/1.1\r\nHost: allowed.test\r\nBad Name: x\r\n\r\n"),
    ("big", b"GET /public/big HTTP/1.1\r\nHost: allowed.test\r\nX-Big: " + b"a" * 100000 + b"\r\n\r\n"),
    ("version", b"GET /public/ver HTTP/2.5\r\nHost: allowed.test\r\n\r\n"),
    ("expect", b"POST /public/exp HTTP/1.1\r\nHost: allowed.test\r\nExpect: 200-ok\r\nContent-Length: 1\r\n\r\nx"),
    ("te", b"POST /public/te HTTP/1.1\r\nHost: allowed.test\r\nTransfer-Encoding: gzip\r\n\r\n"),
    ("nohost", b"GET /public/nohost HTTP/1.1\r\n\r\n"),
]
def head(f):
    line = f.readline()
    n = 0
    while True:
        h = f.readline()
        if h in (b"\r\n", b""):
            break
        if h.lower().startswith(b"content-length:"):
            n = int(h.split(b":")[1])
    f.read(n)
    return line
for name, bad in cases:
    s = socket.create_connection(("allowed.test", 80), timeout=10)
    f = s.makefile("rb")
    s.sendall(good)
    first = head(f)
    try:
        s.sendall(bad)
        line = f.readline()
    except OSError as e:
        line = repr(e).encode()
    print(name + ": " + first.split(b" ")[1].decode() + " then " + (line.split(b" ")[1].decode() if line.startswith(b"HTTP/") else "none " + repr(line)), flush=True)
    s.close()
PY
`

// TestRequestsTunwallsHTTPServerAnswersItselfLeaveARecord: net/http
// answers some requests itself, before any handler sees them (a malformed
// header name, a head over the limit, an unknown HTTP version, an Expect it
// does not support, a transfer coding it does not know, a missing Host).
// None of them is sent on, and each must still leave an http record
// saying what the client was answered, so the log holds every request.
func TestRequestsTunwallsHTTPServerAnswersItselfLeaveARecord(t *testing.T) {
	requireTools(t, "python3")
	w := newWorld(t)
	pol := writeSetupPolicy(t, w, "local.yaml", publicOnlyPolicy)
	r := w.mustRun(0, runOpts{flags: []string{"--policy", pol}, script: localAnswersPy})
	want := map[string]int{"badname": 400, "big": 431, "version": 505, "expect": 417, "te": 501, "nohost": 400}
	for k, st := range want {
		if !strings.Contains(r.stdout, fmt.Sprintf("%s: 200 then %d\n", k, st)) {
			t.Errorf("%s: want 200 then %d\n%s", k, st, r)
		}
	}
	got := map[int]int{}
	for _, rec := range httpRecords(t, r.audit) {
		if rec.Status != 200 {
			if rec.Verdict != audit.VerdictDeny {
				t.Errorf("a request answered %d locally is recorded allowed: %+v", rec.Status, rec)
			}
			got[rec.Status]++
		}
	}
	for k, st := range want {
		if got[st] == 0 {
			t.Errorf("%s: no http record with status %d (records by status: %v)", k, st, got)
		}
	}
	for _, rec := range httpRecords(t, r.audit) {
		if rec.Status == 505 && (rec.Method != "GET" || rec.Path != "/public/ver") {
			t.Errorf("the 505's record names %s %s, want GET /public/ver", rec.Method, rec.Path)
		}
	}
	if got[400] < 2 {
		t.Errorf("want two records with status 400 (badname, nohost), got %d", got[400])
	}
}

// TestAMultipartFormNamingAForbiddenMethodIsDecidedAsThatMethod: Rails,
// Laravel and Spring read _method from a multipart/form-data body too, and
// such a body may be an upload of any size: a part named _method=DELETE,
// first, after a 100 KiB file or in the last bytes, is a DELETE to such a
// server, and an http list without DELETE refuses it (before the part goes
// on), while the same upload without it, or naming an allowed method,
// passes whole.
func TestAMultipartFormNamingAForbiddenMethodIsDecidedAsThatMethod(t *testing.T) {
	requireTools(t, "curl")
	w := newWorld(t)
	pol := writeSetupPolicy(t, w, "multipart.yaml", publicOnlyPolicy)
	script := statusFn + `head -c 100000 /dev/zero | tr '\0' a > /tmp/upload.bin
c mp-get -F _method=GET -F f=@/tmp/upload.bin http://allowed.test/public/x
c mp-plain -F a=1 -F f=@/tmp/upload.bin http://allowed.test/public/x
c mp-first -F _method=DELETE -F f=@/tmp/upload.bin http://allowed.test/public/x
c mp-after -F f=@/tmp/upload.bin -F _method=DELETE http://allowed.test/public/x
c mp-lower -F f=@/tmp/upload.bin -F _method=delete http://allowed.test/public/x
c mp-star -F f=@/tmp/upload.bin -F "x=1;headers=\"Content-Disposition: form-data; name*=utf-8''_method\"" http://allowed.test/public/x
`
	r := w.mustRun(0, runOpts{flags: []string{"--policy", pol}, script: script})
	for k, want := range map[string]string{
		"mp-get": "200", "mp-plain": "200",
		"mp-first": "403", "mp-after": "403", "mp-lower": "403",
	} {
		if !strings.Contains(r.stdout, k+": "+want+"\n") {
			t.Errorf("%s: want %s\n%s", k, want, r)
		}
	}
	if strings.Contains(r.stdout, "mp-star: 200\n") {
		t.Errorf("mp-star: a part named _method with name* went on\n%s", r)
	}
	n := 0
	for _, rec := range httpRecords(t, r.audit) {
		if rec.Verdict == audit.VerdictDeny && strings.Contains(rec.Reason, "_method") {
			n++
		}
	}
	if n < 4 {
		t.Errorf("%d denials naming _method in the log, want 4\n%s", n, r)
	}
}
