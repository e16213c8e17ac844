package integration

import (
	"strings"
	"testing"
)

// TestCredsACompressedReflectionDoesNotHandTheValueBack: a request that
// receives a secret is sent with Accept-Encoding: identity, but a server
// may compress its answer anyway; the value inside the gzip stream is no
// byte string the masker can see, and the client decompresses it. Such a
// response must not reach the client, HTTP/1.1 and HTTP/2.
func TestCredsACompressedReflectionDoesNotHandTheValueBack(t *testing.T) {
	requireTools(t, "curl")
	cw := newCredsWorld(t, 0)
	script := `for v in --http1.1 --http2; do
  echo "proto $v"
  curl -sS $v --compressed --max-time 10 -H "Authorization: token $GITHUB_TOKEN" -w '\nstatus %{http_code}\n' https://api.creds.test/reflect/gzip
done`
	r := cw.run(runOpts{script: script})
	if strings.Count(r.stdout, "status ") != 2 {
		t.Fatalf("the requests did not complete\n%s", r)
	}
	if strings.Contains(r.stdout, credsToken) {
		t.Errorf("the compressed reflection handed the value back\n%s", r)
	}
	if strings.Count(r.stdout, "status 502") != 2 || !strings.Contains(r.stdout, "Content-Encoding: gzip") {
		t.Errorf("want both refused with 502\n%s", r)
	}
	noValueAnywhere(t, r)
}
