package integration

import (
	"regexp"
	"strings"
	"testing"
)

// streamProbe is a node program that sends each probe as the body of its
// own HTTP/2 request to an echo on a host that injects the token, which
// answers it at once and then keeps the response open; the program
// prints what came back within a second.
const streamProbe = `
const http2 = require('http2');
const c = http2.connect('https://api.creds.test');
function probe(s) {
  return new Promise(res => {
    const req = c.request({':method': 'POST', ':path': '/reflect/stream', 'authorization': 'token ' + process.env.GITHUB_TOKEN});
    let got = '';
    req.setEncoding('utf8');
    req.on('data', d => { got += d; });
    req.on('error', e => { got += ' error: ' + e; });
    req.end(s);
    setTimeout(() => { req.close(); res('probe ' + s + ' echoed: [' + got + ']'); }, 1000);
  });
}
(async () => {
  for (const s of process.argv.slice(1)) console.log(await probe(s));
  c.close();
})();
`

// TestCredsTheMaskerHoldsBackTheSameWhateverTheBytes: the masker holds
// back the end of a response until it knows whether a value begins there.
// If what it holds depended on the bytes (only a tail that is a prefix of
// the secret), a duplex echo on an injecting host would be an oracle: the
// sandbox sends a guess, and a guess held back is a prefix of the secret,
// one byte more each time. What is held back, and when it goes, must not
// depend on the bytes: every probe comes back alike, while the response
// is still open.
func TestCredsTheMaskerHoldsBackTheSameWhateverTheBytes(t *testing.T) {
	requireTools(t, "node")
	cw := newCredsWorld(t, 0)
	pol := writeSetupPolicy(t, cw.world, "stream.yaml", apiInjectPolicy+`        http: [{methods: [POST], paths: ["/reflect/stream"]}]
`)
	probes := []string{"xhp_", credsToken[:4], "zz", credsToken[:2], credsToken[:12]}
	r := cw.world.run(runOpts{flags: []string{"--policy", pol},
		argv: append([]string{"node", "-e", streamProbe}, probes...),
		env:  []string{"TW_TEST_GITHUB_TOKEN=" + credsToken}})
	for _, p := range probes {
		m := regexp.MustCompile(`(?m)^probe ` + regexp.QuoteMeta(p) + ` echoed: \[(.*)\]$`).FindStringSubmatch(r.stdout)
		if m == nil || m[1] != p {
			t.Errorf("probe %q did not come back within a second while the response was open (%q): what is held back depends on the bytes\n%s", p, m, r)
		}
	}
	if strings.Contains(r.stdout, "error:") {
		t.Errorf("a probe failed\n%s", r)
	}
	noValueAnywhere(t, r)
}
