package integration

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
)

// TestCredsARangeOfAReflectionDoesNotHandTheValueBackInSlices: a server
// that reflects the request (its Authorization as a document) and honours
// Range hands back any slice of it the sandbox asks for. A slice shorter
// than the value is no occurrence of it, so the masker cannot see it; the
// sandbox would read the secret a few bytes at a time. A request that
// receives a secret is sent without Range and If-Range, so the server
// answers in full, which is masked whole.
func TestCredsARangeOfAReflectionDoesNotHandTheValueBackInSlices(t *testing.T) {
	requireTools(t, "curl")
	cw := newCredsWorld(t, 0)
	// "reflect: token " is 15 bytes; the value follows. Ask for it in
	// slices of 6 bytes, HTTP/1.1 and HTTP/2.
	var script strings.Builder
	for _, proto := range []string{"--http1.1", "--http2"} {
		for off := 15; off < 15+len(credsToken); off += 6 {
			fmt.Fprintf(&script, "printf 'slice %s %d: '; curl -sS %s -r %d-%d -H \"Authorization: token $GITHUB_TOKEN\" https://api.creds.test/reflect/range; echo\n",
				proto, off, proto, off, off+5)
		}
	}
	r := cw.world.run(runOpts{flags: []string{"--policy", cw.policy}, script: script.String(), env: []string{"TW_TEST_GITHUB_TOKEN=" + credsToken}})
	for _, proto := range []string{"--http1.1", "--http2"} {
		var got strings.Builder
		for _, m := range regexp.MustCompile(`(?m)^slice `+proto+` \d+: (.*)$`).FindAllStringSubmatch(r.stdout, -1) {
			s := m[1]
			if len(s) > 6 {
				s = "" // a whole answer: not a slice
			}
			got.WriteString(s)
		}
		if strings.Contains(got.String(), credsToken[:12]) || strings.Contains(r.stdout, credsToken[6:18]) {
			t.Errorf("%s: the slices put the secret together: %q\n%s", proto, got.String(), r)
		}
	}
	noValue(t, "the sandbox's output", r.stdout)
	noValueAnywhere(t, r)
}
