package integration

import (
	"strings"
	"testing"
)

// TestCredsAReflectionInAnotherLetterCaseIsMasked: a server that quotes
// its request lower- or upper-cased (normalizing what it echoes) hands
// back the value in another case; the sandbox then knows it but for the
// case of its letters, which a few guesses settle. The body is searched
// without regard to ASCII case, as headers are, HTTP/1.1 and HTTP/2.
func TestCredsAReflectionInAnotherLetterCaseIsMasked(t *testing.T) {
	requireTools(t, "curl")
	cw := newCredsWorld(t, 0)
	script := `for v in --http1.1 --http2; do
  curl -sS $v --max-time 10 -H "Authorization: token $GITHUB_TOKEN" https://api.creds.test/reflect/lower
done`
	r := cw.run(runOpts{script: script})
	if strings.Count(r.stdout, "reflect: token ") != 2 || strings.Count(r.stdout, "REFLECT: TOKEN ") != 2 {
		t.Fatalf("the server's answers did not arrive\n%s", r)
	}
	for _, v := range []string{strings.ToLower(credsToken), strings.ToUpper(credsToken)} {
		if strings.Contains(r.stdout, v) {
			t.Errorf("the value came back as %q\n%s", v, r)
		}
	}
	if strings.Count(r.stdout, strings.Repeat("*", len(credsToken))) != 4 {
		t.Errorf("want the value masked in each of the 4 quotes\n%s", r)
	}
	noValueAnywhere(t, r)
}
