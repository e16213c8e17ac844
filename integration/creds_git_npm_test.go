package integration

import (
	"fmt"
	"strings"
	"testing"

	"github.com/tunwall/tunwall/internal/audit"
)

// TestCredsGitCloneIsAllowedAndPushIsDeniedByAPathRule: a real git clone
// over HTTPS through git http-backend, authenticated with the token that
// only tunwall holds (git sends the placeholder as Basic credentials), and
// a git push that the rule's paths do not allow (git-receive-pack): denied
// with a 403 whose reason git shows.
func TestCredsGitCloneIsAllowedAndPushIsDeniedByAPathRule(t *testing.T) {
	requireTools(t, "git")
	cw := newCredsWorld(t, 0)
	script := `
set -e
export GIT_CONFIG_NOSYSTEM=1 GIT_TERMINAL_PROMPT=0 HOME=$(mktemp -d)
cd "$HOME"
git config --global user.email t@example.test
git config --global user.name t
git clone -q "https://x-access-token:$GITHUB_TOKEN@git.creds.test/repo.git" clone
cat clone/README
cd clone
echo change > file
git add file
git commit -q -m change
set +e
git push origin main 2>&1
echo "push exit $?"
`
	r := cw.run(runOpts{script: script})
	if r.code != 0 {
		t.Fatalf("the sandbox failed\n%s", r)
	}
	t.Logf("the sandbox's output (git's included):\n%s", r.stdout)
	noValue(t, "the sandbox's output", r.stdout)
	noValueAnywhere(t, r)
	if !strings.Contains(r.stdout, "tunwall credentials test repository") {
		t.Fatalf("git clone did not work\n%s", r)
	}
	if !strings.Contains(r.stdout, "push exit 1") && !strings.Contains(r.stdout, "push exit 128") {
		t.Fatalf("git push did not fail\n%s", r)
	}
	if !strings.Contains(r.stdout, "remote: tunwall: GET https://git.creds.test/repo.git/info/refs denied: no http rule of git.creds.test allows POST /repo.git/git-receive-pack") {
		t.Errorf("git's output does not show the 403's reason\n%s", r)
	}
	for _, a := range cw.creds.Auths("git") {
		if strings.Contains(a, "twp_") {
			t.Errorf("the git server got a placeholder: %q", a)
		}
	}
	var pushDenied, cloneAllowed bool
	for _, rec := range httpRecords(t, r.audit) {
		switch {
		case rec.Verdict == audit.VerdictDeny && rec.Status == 403 && strings.Contains(rec.Reason, "allows POST /repo.git/git-receive-pack"):
			pushDenied = true
		case rec.Method == "POST" && rec.Path == "/repo.git/git-upload-pack" && rec.Verdict == audit.VerdictAllow && rec.Secrets == "GITHUB_TOKEN" && rec.Status == 200:
			cloneAllowed = true
		}
		if strings.Contains(rec.Path, "?") {
			t.Errorf("a record holds the query: %+v", rec)
		}
	}
	if !pushDenied || !cloneAllowed {
		t.Errorf("records: clone allowed %v, push denied %v", cloneAllowed, pushDenied)
	}
	for _, g := range cw.creds.Got("git") {
		if strings.Contains(g, "git-receive-pack") && strings.HasPrefix(g, "POST") {
			t.Errorf("the push reached the server: %s", g)
		}
	}
}

// TestCredsNPMInstallsFromATokenGuardedRegistry: the real npm installs a
// package from a registry that demands a bearer token the sandbox never
// had (the rule's explicit form sets Authorization).
func TestCredsNPMInstallsFromATokenGuardedRegistry(t *testing.T) {
	requireTools(t, "npm", "node")
	cw := newCredsWorld(t, 0)
	script := `
set -e
export HOME=$(mktemp -d) npm_config_cache=$(mktemp -d)
cd "$HOME"
echo '{"name":"app","version":"1.0.0"}' > package.json
npm install --registry https://npm.creds.test/ --no-audit --no-fund --no-update-notifier --loglevel=error tw-creds-pkg 2>&1
node -e 'console.log(require("tw-creds-pkg"))'
`
	r := cw.run(runOpts{script: script})
	if r.code != 0 {
		t.Fatalf("npm install failed\n%s", r)
	}
	noValue(t, "the sandbox's output", r.stdout)
	noValueAnywhere(t, r)
	if !strings.Contains(r.stdout, "installed from the token-guarded registry") {
		t.Fatalf("the package did not install\n%s", r)
	}
	auths := cw.creds.Auths("npm")
	if len(auths) < 2 {
		t.Fatalf("the registry got %d requests", len(auths))
	}
	for _, a := range auths {
		if a != "Bearer "+credsNPMToken {
			t.Errorf("the registry got Authorization %q", strings.ReplaceAll(a, credsNPMToken, "<value>"))
		}
	}
	for _, rec := range httpRecords(t, r.audit) {
		if rec.Host == "npm.creds.test" && rec.Secrets != "NPM_TOKEN" {
			t.Errorf("record %+v does not name NPM_TOKEN", rec)
		}
	}
}

// TestCredsNPMInstallsAScopedPackageThroughAPathRule: npm asks for a
// scoped package as /@scope%2fname. Through a registry rule with an http
// list naming the scope (/@tw-scope/*), the real npm installs it, the
// token injected; an encoded / anywhere else is still refused.
func TestCredsNPMInstallsAScopedPackageThroughAPathRule(t *testing.T) {
	requireTools(t, "npm", "node", "curl")
	cw := newCredsWorld(t, 0)
	pol := writeSetupPolicy(t, cw.world, "npm-scope.yaml", fmt.Sprintf(`version: 1
secrets:
  NPM_TOKEN: {file: %s}
phases:
  exec:
    allow:
      - host: npm.creds.test
        inject: [{secret: NPM_TOKEN, header: Authorization, value: "Bearer {}"}]
        http:
          - {methods: [GET], paths: ["/@tw-scope/*", "/@tw-scope/*/-/*"]}
`, cw.npmToken))
	script := `
export HOME=$(mktemp -d) npm_config_cache=$(mktemp -d)
cd "$HOME"
echo '{"name":"app","version":"1.0.0"}' > package.json
npm install --registry https://npm.creds.test/ --no-audit --no-fund --no-update-notifier --loglevel=error @tw-scope/creds-pkg 2>&1
node -e 'console.log(require("@tw-scope/creds-pkg"))'
for p in /@tw-scope%2fcreds-pkg%2f..%2fx /@tw-scope/creds-pkg%2fx /x/@tw-scope%2fcreds-pkg /@other%2fpkg; do
  printf '%s: ' "$p"; curl -s -o /dev/null -w '%{http_code}\n' "https://npm.creds.test$p"
done
`
	r := cw.world.run(runOpts{flags: []string{"--policy", pol}, script: script})
	noValue(t, "the sandbox's output", r.stdout)
	noValueAnywhere(t, r)
	if !strings.Contains(r.stdout, "installed from the token-guarded registry: @tw-scope/creds-pkg") {
		t.Errorf("npm did not install the scoped package\n%s", r)
	}
	for _, p := range []string{"/@tw-scope%2fcreds-pkg%2f..%2fx", "/@tw-scope/creds-pkg%2fx", "/x/@tw-scope%2fcreds-pkg", "/@other%2fpkg"} {
		if !strings.Contains(r.stdout, p+": 403\n") {
			t.Errorf("%s was not refused\n%s", p, r)
		}
	}
}
