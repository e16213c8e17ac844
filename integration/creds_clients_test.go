package integration

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/tunwall/tunwall/internal/audit"
	"github.com/tunwall/tunwall/internal/testworld"
)

// Keeping credentials out of the sandbox (README): the sandbox holds a
// placeholder, tunwall puts the real token into requests to the hosts whose
// rules inject it, refuses the placeholder anywhere else, and never writes
// the value down.

const (
	credsToken    = "ghp_realTokenOfTheCredsTest0123456789abcd"
	credsNPMToken = "npm_realRegistryTokenOfTheCredsTest42"
)

// credsWorld is a test world with the credentials servers, a policy and
// the secret file.
type credsWorld struct {
	*world
	creds    *testworld.Creds
	policy   string
	npmToken string // path of the NPM_TOKEN file
}

func newCredsWorld(t *testing.T, owner int) *credsWorld {
	t.Helper()
	w := newWorld(t)
	repoDir := filepath.Join(w.dir, "git")
	os.MkdirAll(repoDir, 0o777)
	c, err := w.StartCreds(testworld.CredsOptions{Token: credsToken, NPMToken: credsNPMToken, RepoDir: repoDir})
	if err != nil {
		t.Fatalf("credentials world: %v", err)
	}
	cw := &credsWorld{world: w, creds: c}
	cw.npmToken = filepath.Join(w.dir, "npm-token")
	if err := os.WriteFile(cw.npmToken, []byte(credsNPMToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if owner != 0 {
		os.Chown(cw.npmToken, owner, owner)
	}
	cw.policy = filepath.Join(w.dir, "creds.yaml")
	pol := fmt.Sprintf(`version: 1
secrets:
  GITHUB_TOKEN: {env: TW_TEST_GITHUB_TOKEN}
  NPM_TOKEN: {file: %s}
phases:
  exec:
    allow:
      - host: api.creds.test
        ports: [80, 443]
        inject: [GITHUB_TOKEN]
        http:
          - {methods: [GET, HEAD], paths: ["/**"]}
          - {methods: [POST], paths: ["/repos/acme/widget/pulls"]}
      - host: git.creds.test
        inject: [GITHUB_TOKEN]
        ca: %s
        http:
          - {methods: [GET], paths: ["/repo.git/info/refs"]}
          - {methods: [POST], paths: ["/repo.git/git-upload-pack"]}
      - host: npm.creds.test
        inject: [{secret: NPM_TOKEN, header: Authorization, value: "Bearer {}"}]
      - host: untrusted.creds.test
        inject: [GITHUB_TOKEN]
      - host: paste.creds.test
        ports: [80, 443]
        http: [{methods: ["*"], paths: ["/**"]}]
      - host: mtls.creds.test
      - host: "*.creds.test"
        ports: [80, 443]
`, cw.npmToken, w.caPEM)
	if err := os.WriteFile(cw.policy, []byte(pol), 0o644); err != nil {
		t.Fatal(err)
	}
	return cw
}

// run runs tunwall with the credentials policy and the token in its
// environment.
func (cw *credsWorld) run(o runOpts) result {
	cw.t.Helper()
	o.flags = append([]string{"--policy", cw.policy}, o.flags...)
	o.env = append(o.env, "TW_TEST_GITHUB_TOKEN="+credsToken)
	return cw.world.run(o)
}

// noValue fails the test if a secret's value is in s.
func noValue(t *testing.T, what, s string) {
	t.Helper()
	for _, v := range []string{credsToken, credsNPMToken, base64.StdEncoding.EncodeToString([]byte("x-access-token:" + credsToken))} {
		if strings.Contains(s, v) {
			t.Errorf("a secret's value is in %s", what)
		}
	}
}

// noValueAnywhere checks the audit log and stderr of r.
func noValueAnywhere(t *testing.T, r result) {
	t.Helper()
	b, err := os.ReadFile(r.audit)
	if err != nil {
		t.Fatal(err)
	}
	noValue(t, "the audit log", string(b))
	noValue(t, "tunwall's stderr", r.stderr)
}

// httpRecords returns the audit log's http records.
func httpRecords(t *testing.T, path string) []audit.Record {
	t.Helper()
	var out []audit.Record
	for _, r := range records(t, path) {
		if r.Kind == audit.KindHTTP {
			out = append(out, r)
		}
	}
	return out
}

// TestCredsRealClientsGetTheTokenTheSandboxNeverHeld: curl (HTTP/1.1 and
// HTTP/2), node fetch and python3 urllib reach the API with the real token
// from the placeholder in $GITHUB_TOKEN; the sandbox's processes hold only
// the placeholder, and the secret file reads empty inside.
func TestCredsRealClientsGetTheTokenTheSandboxNeverHeld(t *testing.T) {
	requireTools(t, "curl", "node", "python3")
	for _, c := range []struct {
		name   string
		asUser int
		bwrap  []string
	}{
		{"run as root", 0, nil},
		{"run rootless", 65534, nil},
		{"bwrap", 0, []string{"--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp", "--bind", "/tmp", "/tmp"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.bwrap != nil {
				requireTools(t, "bwrap")
			}
			cw := newCredsWorld(t, c.asUser)
			script := `
echo "PLACEHOLDER=$GITHUB_TOKEN"
echo "NPM=$NPM_TOKEN"
echo "BUNDLE=$SSL_CERT_FILE $NODE_EXTRA_CA_CERTS $CURL_CA_BUNDLE $GIT_SSL_CAINFO $REQUESTS_CA_BUNDLE"
echo "SECRETFILE=$(cat ` + cw.npmToken + ` 2>&1 | head -c 200)"
echo "ENVIRON-BEGIN"
for f in /proc/[0-9]*/environ; do { tr '\0' '\n' < "$f"; } 2>/dev/null; done
echo "ENVIRON-END"
curl -sS --http1.1 https://api.creds.test/curl1 -H "Authorization: Bearer $GITHUB_TOKEN" -w 'curl1 spoke HTTP/%{http_version}\n'
curl -sS --http2 https://api.creds.test/curl2 -H "Authorization: Bearer $GITHUB_TOKEN" -w 'curl2 spoke HTTP/%{http_version}\n'
node -e 'fetch("https://api.creds.test/node",{headers:{authorization:"token "+process.env.GITHUB_TOKEN}}).then(r=>r.text()).then(t=>process.stdout.write(t)).catch(e=>{console.log("node failed", e.cause||e);process.exit(1)})'
python3 -c 'import os,urllib.request; r=urllib.request.Request("https://api.creds.test/python", headers={"Authorization":"token "+os.environ["GITHUB_TOKEN"]}); print(urllib.request.urlopen(r).read().decode(), end="")'
curl -sS http://api.creds.test/plain -H "Authorization: Bearer $GITHUB_TOKEN"
`
			r := cw.run(runOpts{script: script, asUser: c.asUser, bwrap: c.bwrap})
			if r.code != 0 {
				t.Fatalf("the sandbox failed\n%s", r)
			}
			out := r.stdout
			noValue(t, "the sandbox (its environment, files and output)", out)
			noValueAnywhere(t, r)
			if !strings.Contains(out, "PLACEHOLDER=twp_GITHUB_TOKEN_") || !strings.Contains(out, "NPM=twp_NPM_TOKEN_") {
				t.Fatalf("the sandbox's environment has no placeholders\n%s", r)
			}
			if !strings.Contains(out, "SECRETFILE=\n") && !strings.Contains(out, "SECRETFILE=cat:") {
				t.Errorf("the secret file is readable inside:\n%s", r)
			}
			// The server speaks HTTP/2 to tunwall, whatever the client spoke.
			for _, want := range []string{
				"api: hello HTTP/2.0 GET /curl1", "curl1 spoke HTTP/1.1",
				"api: hello HTTP/2.0 GET /curl2", "curl2 spoke HTTP/2",
				"api: hello HTTP/2.0 GET /node",
				"api: hello HTTP/2.0 GET /python",
				// Over plain HTTP the secret is never injected.
				"tunwall: GET http://api.creds.test/plain denied: credential placeholder GITHUB_TOKEN in a plain HTTP request to api.creds.test",
			} {
				if !strings.Contains(out, want) {
					t.Errorf("missing %q\n%s", want, r)
				}
			}
			auths := cw.creds.Auths("api")
			if len(auths) != 4 {
				t.Fatalf("the API got %d requests, want 4", len(auths))
			}
			for _, a := range auths {
				if a != "Bearer "+credsToken && a != "token "+credsToken {
					t.Errorf("the API got Authorization %q, want the real token", strings.ReplaceAll(a, credsToken, "<value>"))
				}
			}
			recs := httpRecords(t, r.audit)
			if len(recs) != 5 {
				t.Fatalf("%d http records, want 5", len(recs))
			}
			for _, rec := range recs {
				if rec.Path == "/plain" {
					if rec.Verdict != audit.VerdictDeny || rec.Status != 403 || rec.Secrets != "" || rec.Rule != "credential-placeholder" {
						t.Errorf("http record of the plain request %+v", rec)
					}
					continue
				}
				if rec.Verdict != audit.VerdictAllow || rec.Secrets != "GITHUB_TOKEN" || rec.Status != 200 || rec.Host != "api.creds.test" || rec.Method != "GET" {
					t.Errorf("http record %+v", rec)
				}
			}
		})
	}
}

// lockedBuffer is a bytes.Buffer a command writes while a test reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
