package integration

import (
	"regexp"
	"strings"
	"testing"
)

// TestCredsAShortSecretIsWarnedOfAtTheStart: masking finds a value whole,
// so it tells whoever can make a server echo which of its guesses is the
// value (that one comes back as stars). For a long random token that is
// no help; a short value, here a 4-digit PIN, is recovered by sending all
// 10,000 candidates through an echo on the host that injects it, a few
// requests in all. This cannot be masked away, so tunwall must say so at
// the start, naming the secret.
func TestCredsAShortSecretIsWarnedOfAtTheStart(t *testing.T) {
	requireTools(t, "curl", "seq")
	const pin = "4827"
	cw := newCredsWorld(t, 0)
	pol := writeSetupPolicy(t, cw.world, "short.yaml", apiInjectPolicy+`        http: [{methods: [POST], paths: ["/reflect/stream"]}]
`)
	// The echo reads 4 KiB of a body: 800 candidates a request.
	script := `set -f
for s in $(seq 0 800 9999); do
  e=$((s+799)); [ $e -gt 9999 ] && e=9999
  out=$(seq -f %04g $s $e | tr '\n' ' ' | curl -sS --max-time 1 -H "Authorization: token $GITHUB_TOKEN" --data-binary @- https://api.creds.test/reflect/stream 2>/dev/null)
  i=$s
  for w in $out; do
    [ "$w" = "****" ] && echo "recovered: $(printf %04d $i)"
    i=$((i+1))
  done
done
echo done`
	r := cw.world.run(runOpts{flags: []string{"--policy", pol}, script: script,
		env: []string{"TW_TEST_GITHUB_TOKEN=" + pin}})
	if !strings.Contains(r.stdout, "done") {
		t.Fatalf("the probe did not run to its end\n%s", r)
	}
	if m := regexp.MustCompile(`recovered: (\d{4})`).FindStringSubmatch(r.stdout); m != nil {
		t.Logf("as documented, the sandbox tested every guess through the echo and found %s", m[1])
	}
	if !regexp.MustCompile(`WARNING: secret GITHUB_TOKEN .*4 bytes`).MatchString(r.stderr) {
		t.Errorf("tunwall did not warn that GITHUB_TOKEN is too short for masking to hide it\n%s", r)
	}
	if strings.Contains(r.stderr, pin) {
		t.Errorf("the warning holds the value\n%s", r)
	}
}
