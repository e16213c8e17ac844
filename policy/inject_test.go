package policy

import (
	"strings"
	"testing"
)

func TestParseInject(t *testing.T) {
	for _, tc := range []struct {
		in, host, ports, secret, err string
	}{
		{in: "api.github.com=GITHUB_TOKEN", host: "api.github.com", ports: "443", secret: "GITHUB_TOKEN"},
		{in: "Registry.NPMJS.org.:8443=NPM_TOKEN", host: "registry.npmjs.org", ports: "8443", secret: "NPM_TOKEN"},
		{in: "*.example.test=T", host: "*.example.test", ports: "443", secret: "T"},
		{in: "api.github.com", err: "want HOST[:PORT]=SECRET"},
		{in: "=GITHUB_TOKEN", err: "want HOST[:PORT]=SECRET"},
		{in: "api.github.com=", err: "want HOST[:PORT]=SECRET"},
		{in: "api.github.com=1TOKEN", err: "is not a secret name"},
		{in: "192.0.2.1=T", err: "needs a host name"},
		{in: "api.github.com/udp=T", err: "drop /udp"},
		{in: "https://api.github.com=T", err: "a URL is not a rule"},
	} {
		r, err := ParseInject(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) || !strings.Contains(err.Error(), "--inject") {
				t.Errorf("ParseInject(%q) = %v, want an error with %q", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("ParseInject(%q): %v", tc.in, err)
			continue
		}
		if r.Host != tc.host || portsString(r.Ports) != tc.ports || r.Proto != TCP || len(r.Inject) != 1 || r.Inject[0] != (Injection{Secret: tc.secret}) || r.Source != "--inject "+tc.in {
			t.Errorf("ParseInject(%q) = %+v", tc.in, r)
		}
	}
}

func TestAnInjectFlagRuleTerminatesAndInjectsItsSecret(t *testing.T) {
	r, err := ParseInject("api.github.com=GITHUB_TOKEN")
	if err != nil {
		t.Fatal(err)
	}
	rs, err := Select(nil, "", []Rule{r}, Guard{})
	if err != nil {
		t.Fatal(err)
	}
	v := rs.HTTPFor("api.github.com", 443)
	if !v.Terminate || len(v.Inject) != 1 || v.Inject[0].Secret != "GITHUB_TOKEN" {
		t.Errorf("HTTPFor = %+v", v)
	}
	if hs := rs.InjectHosts("GITHUB_TOKEN"); len(hs) != 1 || hs[0] != "api.github.com" {
		t.Errorf("InjectHosts = %q", hs)
	}
	if err := rs.CheckSecrets(func(string) bool { return false }); err == nil || !strings.Contains(err.Error(), "--inject api.github.com=GITHUB_TOKEN") {
		t.Errorf("CheckSecrets = %v, want it to name the flag", err)
	}
}

func TestPolicyInjectsLooksAtEveryPhase(t *testing.T) {
	p, err := Parse("p.yaml", []byte(`version: 1
secrets:
  A: {env: A}
  B: {env: B}
phases:
  setup:
    allow:
      - host: a.example
  exec:
    allow:
      - host: b.example
        inject: [{secret: A, header: Authorization, value: "Bearer {}"}]
`))
	if err != nil {
		t.Fatal(err)
	}
	if !p.Injects("A") || p.Injects("B") || (*Policy)(nil).Injects("A") {
		t.Errorf("Injects: A %v, B %v", p.Injects("A"), p.Injects("B"))
	}
}

func TestParseSecretList(t *testing.T) {
	got, err := ParseSecretList("GITHUB_TOKEN=env:GH NPM_TOKEN=file:/home/a b/npm token X=env:Y", "run.jsonl header")
	if err != nil {
		t.Fatal(err)
	}
	want := []SecretSource{
		{Name: "GITHUB_TOKEN", Env: "GH", Source: "run.jsonl header"},
		{Name: "NPM_TOKEN", File: "/home/a b/npm token", Source: "run.jsonl header"},
		{Name: "X", Env: "Y", Source: "run.jsonl header"},
	}
	if len(got) != len(want) {
		t.Fatalf("ParseSecretList = %+v", got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("item %d = %+v, want %+v", i, got[i], want[i])
		}
	}
	if l, err := ParseSecretList("  ", "h"); err != nil || l != nil {
		t.Errorf("an empty list = %v, %v", l, err)
	}
	for _, bad := range []string{"junk", "junk A=env:B", "A=env:1B"} {
		if _, err := ParseSecretList(bad, "h"); err == nil {
			t.Errorf("ParseSecretList(%q) is not an error", bad)
		}
	}
}

func TestSuggestWritesTheSecretsItsInjectRulesNeed(t *testing.T) {
	obs := []Observation{
		{Host: "api.github.com", Port: 443, Proto: TCP},
		{Host: "api.github.com", Port: 443, Proto: TCP, Method: "GET", Path: "/repos/a", Secrets: []string{"GITHUB_TOKEN"}},
		{Host: "registry.npmjs.org", Port: 443, Proto: TCP},
		{Host: "registry.npmjs.org", Port: 443, Proto: TCP, Method: "GET", Path: "/x", Secrets: []string{"NPM_TOKEN"}},
		{Host: "ai.example", Port: 443, Proto: TCP},
		{Host: "ai.example", Port: 443, Proto: TCP, Method: "POST", Path: "/v1", Secrets: []string{"AI_KEY"}},
	}
	known := []SecretSource{
		{Name: "GITHUB_TOKEN", Env: "TW_GH"},
		{Name: "NPM_TOKEN", File: "/home/u/npm token"},
		{Name: "UNUSED", Env: "UNUSED"},
	}
	out := SuggestWithSecrets(obs, "exec", "now", nil, known)
	s := string(out)
	for _, want := range []string{
		"secrets:",
		"  AI_KEY: {env: AI_KEY}\n",
		"  GITHUB_TOKEN: {env: TW_GH}\n",
		`  NPM_TOKEN: {file: "/home/u/npm token"}` + "\n",
		"# Note: the learn run's header does not say where secret AI_KEY was read",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("the suggestion has no %q:\n%s", want, s)
		}
	}
	if strings.Contains(s, "UNUSED") {
		t.Errorf("the suggestion declares a secret no rule injects:\n%s", s)
	}
	p, err := Parse("suggested.yaml", out)
	if err != nil {
		t.Fatalf("the suggestion does not parse: %v\n%s", err, s)
	}
	rs, err := Select(p, "", nil, Guard{})
	if err != nil {
		t.Fatal(err)
	}
	declared := map[string]bool{}
	for _, src := range p.Secrets() {
		declared[src.Name] = true
	}
	if err := rs.CheckSecrets(func(n string) bool { return declared[n] }); err != nil {
		t.Errorf("the suggestion injects an undeclared secret: %v", err)
	}
	if strings.Contains(string(Suggest(obs[:1], "exec", "now", nil)), "secrets:") {
		t.Errorf("a suggestion without inject rules has a secrets section")
	}
}
