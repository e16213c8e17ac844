package policy

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	"golang.org/x/net/publicsuffix"
)

const credsPolicy = `version: 1
secrets:
  GITHUB_TOKEN: {env: GITHUB_TOKEN}
  NPM_TOKEN: {file: ~/.config/tunwall/npm-token}
phases:
  exec:
    allow:
      - host: api.github.com
        inject: [GITHUB_TOKEN]
        http:
          - {methods: [GET, head], paths: ["/repos/acme/**"]}
          - {methods: [POST], paths: ["/repos/acme/widget/pulls"]}
      - host: registry.npmjs.org
        inject: [{secret: NPM_TOKEN, header: Authorization, value: "Bearer {}"}]
        ca: /etc/private-ca.pem
      - host: github.com
        ports: [80, 443]
        http: [{methods: ["*"], paths: ["/acme/*/**", "/acme/widget.git/info/refs"]}]
      - host: "*.githubusercontent.com"
      - host: gist.github.com
`

func TestParseReadsTheHTTPLayer(t *testing.T) {
	p, err := Parse("agent.yaml", []byte(credsPolicy))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	wantSecrets := []SecretSource{
		{Name: "GITHUB_TOKEN", Env: "GITHUB_TOKEN", Source: "agent.yaml:3"},
		{Name: "NPM_TOKEN", File: "~/.config/tunwall/npm-token", Source: "agent.yaml:4"},
	}
	if got := p.Secrets(); !reflect.DeepEqual(got, wantSecrets) {
		t.Errorf("Secrets() = %+v\nwant %+v", got, wantSecrets)
	}
	rules := p.Rules("exec")
	if got, want := rules[0].Inject, []Injection{{Secret: "GITHUB_TOKEN"}}; !reflect.DeepEqual(got, want) {
		t.Errorf("rule 0 inject = %+v, want %+v", got, want)
	}
	if got, want := rules[0].HTTP, []HTTPRule{
		{Methods: []string{"GET", "HEAD"}, Paths: []string{"/repos/acme/**"}},
		{Methods: []string{"POST"}, Paths: []string{"/repos/acme/widget/pulls"}},
	}; !reflect.DeepEqual(got, want) {
		t.Errorf("rule 0 http = %+v, want %+v", got, want)
	}
	if got, want := rules[1].Inject, []Injection{{Secret: "NPM_TOKEN", Header: "Authorization", Value: "Bearer {}"}}; !reflect.DeepEqual(got, want) {
		t.Errorf("rule 1 inject = %+v, want %+v", got, want)
	}
	if rules[1].CA != "/etc/private-ca.pem" || rules[1].HTTP != nil {
		t.Errorf("rule 1 = %+v", rules[1])
	}
	if rules[3].terminates() || rules[4].terminates() {
		t.Errorf("rules without http or inject terminate: %+v %+v", rules[3], rules[4])
	}
	// The returned rules are copies.
	rules[0].HTTP[0].Methods[0] = "DELETE"
	if p.Rules("exec")[0].HTTP[0].Methods[0] != "GET" {
		t.Error("Rules shares the http lists with the policy")
	}
}

func TestParseRefusesBadHTTPKeysWithTheirLine(t *testing.T) {
	head := "version: 1\nphases:\n  exec:\n    allow:\n"
	for _, tc := range []struct {
		name, src, want string
		line            int
	}{
		{"http on a cidr rule", head + "      - cidr: 192.0.2.0/24\n        http: [{methods: [GET], paths: [/]}]\n", "needs a host rule", 6},
		{"inject over udp", head + "      - host: x.test\n        proto: udp\n        inject: [A]\n", "needs proto tcp", 7},
		{"empty http", head + "      - host: x.test\n        http: []\n", "non-empty list", 6},
		{"http entry without paths", head + "      - host: x.test\n        http: [{methods: [GET]}]\n", "needs paths", 6},
		{"unknown key in an http entry", head + "      - host: x.test\n        http: [{methods: [GET], paths: [/], query: x}]\n", `unknown key "query"`, 6},
		{"a path without a slash", head + "      - host: x.test\n        http: [{methods: [GET], paths: [repos]}]\n", "must start with /", 6},
		{"a star inside a segment", head + "      - host: x.test\n        http: [{methods: [GET], paths: [\"/a*\"]}]\n", "whole segments", 6},
		{"a dot segment", head + "      - host: x.test\n        http: [{methods: [GET], paths: [\"/a/../b\"]}]\n", "dot segment", 6},
		{"an escaped pattern", head + "      - host: x.test\n        http: [{methods: [GET], paths: [\"/a%2fb\"]}]\n", "without %", 6},
		{"a bad method", head + "      - host: x.test\n        http: [{methods: [\"GE T\"], paths: [/]}]\n", "not an HTTP method", 6},
		{"a bad secret name", head + "      - host: x.test\n        inject: [1TOKEN]\n", "not a secret name", 6},
		{"a forbidden header", head + "      - host: x.test\n        inject: [{secret: A, header: Host}]\n", "cannot be injected", 6},
		{"a value without {}", head + "      - host: x.test\n        inject: [{secret: A, header: X-Token, value: Bearer}]\n", "must contain {}", 6},
		{"a value without a header", head + "      - host: x.test\n        inject: [{secret: A, value: \"Bearer {}\"}]\n", "value needs header", 6},
		{"the same secret twice", head + "      - host: x.test\n        inject: [A, {secret: A, header: X-A}]\n", "injected twice", 6},
		{"a secret with two sources", "version: 1\nsecrets:\n  A: {env: A, file: /x}\nphases: {e: {allow: [{host: x.test}]}}\n", "both env and file", 3},
		{"a secret with no source", "version: 1\nsecrets:\n  A: {}\nphases: {e: {allow: [{host: x.test}]}}\n", "needs env", 3},
		{"a bad secret key", "version: 1\nsecrets:\n  A-B: {env: A}\nphases: {e: {allow: [{host: x.test}]}}\n", "bad secret name", 3},
		{"an unknown secret source", "version: 1\nsecrets:\n  A: {vault: x}\nphases: {e: {allow: [{host: x.test}]}}\n", `unknown key "vault"`, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse("p.yaml", []byte(tc.src))
			var pe *ParseError
			if !errors.As(err, &pe) {
				t.Fatalf("Parse = %v, want a ParseError", err)
			}
			if !strings.Contains(pe.Msg, tc.want) || pe.Line != tc.line {
				t.Fatalf("Parse = %v, want line %d and %q", err, tc.line, tc.want)
			}
		})
	}
}

func TestParseSecretFlag(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want SecretSource
		bad  string
	}{
		{in: "GITHUB_TOKEN=env:GH_TOKEN", want: SecretSource{Name: "GITHUB_TOKEN", Env: "GH_TOKEN", Source: "--secret GITHUB_TOKEN"}},
		{in: "NPM_TOKEN=file:~/.npm-token", want: SecretSource{Name: "NPM_TOKEN", File: "~/.npm-token", Source: "--secret NPM_TOKEN"}},
		{in: "NPM_TOKEN=file:/a:b", want: SecretSource{Name: "NPM_TOKEN", File: "/a:b", Source: "--secret NPM_TOKEN"}},
		{in: "NPM_TOKEN", bad: "want NAME="},
		{in: "NPM_TOKEN=ghp_abc", bad: "want NAME="},
		{in: "NPM_TOKEN=value:abc", bad: "unknown source"},
		{in: "9X=env:A", bad: "not a secret name"},
		{in: "X=env:A B", bad: "not an environment variable"},
		{in: "X=file:", bad: "empty file path"},
	} {
		got, err := ParseSecret(tc.in)
		if tc.bad != "" {
			if err == nil || !strings.Contains(err.Error(), tc.bad) {
				t.Errorf("ParseSecret(%q) = %+v, %v; want an error with %q", tc.in, got, err, tc.bad)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ParseSecret(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
	}
}

func credsRules(t *testing.T) *RuleSet {
	t.Helper()
	p, err := Parse("agent.yaml", []byte(credsPolicy))
	if err != nil {
		t.Fatal(err)
	}
	rs, err := Select(p, "", nil, Guard{})
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

func TestHTTPForTerminatesOnlyHostsWithHTTPOrInject(t *testing.T) {
	rs := credsRules(t)
	for _, tc := range []struct {
		host      string
		port      uint16
		terminate bool
		inject    []string
		ca        string
	}{
		{"api.github.com", 443, true, []string{"GITHUB_TOKEN"}, ""},
		{"API.GitHub.com.", 443, true, []string{"GITHUB_TOKEN"}, ""},
		{"api.github.com", 80, false, nil, ""}, // the rule allows only 443
		{"registry.npmjs.org", 443, true, []string{"NPM_TOKEN"}, "/etc/private-ca.pem"},
		{"github.com", 80, true, nil, ""},
		{"raw.githubusercontent.com", 443, false, nil, ""},
		{"gist.github.com", 443, false, nil, ""},
		{"evil.test", 443, false, nil, ""},
	} {
		v := rs.HTTPFor(tc.host, tc.port)
		var names []string
		for _, in := range v.Inject {
			names = append(names, in.Secret)
		}
		if v.Terminate != tc.terminate || !reflect.DeepEqual(names, tc.inject) || v.CA != tc.ca {
			t.Errorf("HTTPFor(%s, %d) = %+v", tc.host, tc.port, v)
		}
	}
	if !rs.HasHTTP() {
		t.Error("HasHTTP() = false")
	}
	plain, _ := Select(nil, "", []Rule{{Host: "x.test", Ports: defaultPorts(), Proto: TCP}}, Guard{})
	if plain.HasHTTP() || plain.HTTPFor("x.test", 443).Terminate {
		t.Error("a rule set without http or inject terminates")
	}
	if got := rs.InjectedSecrets(); !reflect.DeepEqual(got, []string{"GITHUB_TOKEN", "NPM_TOKEN"}) {
		t.Errorf("InjectedSecrets() = %v", got)
	}
	if err := rs.CheckSecrets(func(n string) bool { return n == "GITHUB_TOKEN" }); err == nil || !strings.Contains(err.Error(), "NPM_TOKEN") || !strings.Contains(err.Error(), "agent.yaml:13") {
		t.Errorf("CheckSecrets = %v", err)
	}
}

func TestDecideRequest(t *testing.T) {
	rs := credsRules(t)
	for _, tc := range []struct {
		name               string
		host               string
		port               uint16
		method, path       string
		allow              bool
		reason, hint, rule string
	}{
		{"a GET under the allowed tree", "api.github.com", 443, "GET", "/repos/acme/widget/issues", true, "", "", "http {methods: [GET, HEAD]"},
		{"** matches no segment", "api.github.com", 443, "GET", "/repos/acme", true, "", "", ""},
		{"the method is matched in any case", "api.github.com", 443, "head", "/repos/acme/x", true, "", "", ""},
		{"POST to the one allowed path", "api.github.com", 443, "POST", "/repos/acme/widget/pulls", true, "", "", "POST"},
		{"POST elsewhere", "api.github.com", 443, "POST", "/gists", false, "no http rule of api.github.com allows POST /gists", "add {methods: [POST], paths: [\"/gists\"]} to the http list of rule api.github.com (agent.yaml:8)", ""},
		{"another repository", "api.github.com", 443, "GET", "/repos/evil/x", false, "allows GET /repos/evil/x", "allowed: GET, HEAD /repos/acme/**; POST /repos/acme/widget/pulls", ""},
		{"a path that climbs out", "api.github.com", 443, "GET", "/repos/acme/../evil/x", false, "dot segment", "", ""},
		{"an encoded dot segment", "api.github.com", 443, "GET", "/repos/acme/%2e%2e/evil", false, "encoded .", "", ""},
		{"an encoded slash", "api.github.com", 443, "GET", "/repos/acme%2F..%2Fevil/x", false, "encoded /", "", ""},
		{"a backslash", "api.github.com", 443, "GET", "/repos/acme/..\\evil", false, "backslash", "", ""},
		{"a doubled slash", "api.github.com", 443, "GET", "/repos//acme/x", false, "empty segment", "", ""},
		{"a tomcat path parameter dot segment", "api.github.com", 443, "GET", "/repos/acme/..;/evil", false, "dot segment", "", ""},
		{"double encoding", "api.github.com", 443, "GET", "/repos/acme/%252e%252e/evil", false, "double encoding", "", ""},
		{"an encoded NUL", "api.github.com", 443, "GET", "/repos/acme/%00", false, "control", "", ""},
		{"a malformed escape", "api.github.com", 443, "GET", "/repos/acme/%zz", false, "malformed", "", ""},
		{"an asterisk-form target", "api.github.com", 443, "OPTIONS", "*", false, "not an absolute path", "", ""},
		{"a method that is not a token", "api.github.com", 443, "GE T", "/repos/acme", false, "not a token", "", ""},
		{"inject alone restricts nothing", "registry.npmjs.org", 443, "PUT", "/anything/at/all", true, "", "", "registry.npmjs.org:443/tcp (agent.yaml:13)"},
		{"* matches one non-empty segment", "github.com", 443, "POST", "/acme/widget.git/git-upload-pack", true, "", "", ""},
		{"* does not match an empty segment", "github.com", 443, "GET", "/acme//x", false, "empty segment", "", ""},
		{"a rule without http allows everything", "gist.github.com", 443, "POST", "/", true, "", "", ""},
		{"an unknown host", "evil.test", 443, "GET", "/", false, "no rule allows", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := rs.DecideRequest(tc.host, tc.port, tc.method, tc.path)
			if d.Allowed() != tc.allow || !strings.Contains(d.Reason, tc.reason) || !strings.Contains(d.Hint, tc.hint) || !strings.Contains(d.Rule, tc.rule) {
				t.Fatalf("DecideRequest(%s %s %s) = %+v", tc.host, tc.method, tc.path, d)
			}
		})
	}
}

func TestGlobMatch(t *testing.T) {
	for _, tc := range []struct {
		pat, path string
		want      bool
	}{
		{"/", "/", true},
		{"/", "/a", false},
		{"/a", "/a", true},
		{"/a", "/a/", false},
		{"/a/", "/a/", true},
		{"/*", "/a", true},
		{"/*", "/", false},
		{"/*", "/a/b", false},
		{"/**", "/", true},
		{"/**", "/a/b/c", true},
		{"/a/**", "/a", true},
		{"/a/**", "/ab", false},
		{"/a/**/z", "/a/z", true},
		{"/a/**/z", "/a/b/c/z", true},
		{"/a/**/z", "/a/b/c/zz", false},
		{"/a/*/z", "/a/b/z", true},
		{"/a/*/z", "/a/b/c/z", false},
		{"/**/x/**", "/q/x", true},
		{"/**/x/**", "/q/y", false},
	} {
		segs, bad := pathSegments(tc.path)
		if bad != "" {
			t.Fatalf("pathSegments(%q): %s", tc.path, bad)
		}
		if got := globMatch(patternSegments(tc.pat), segs); got != tc.want {
			t.Errorf("globMatch(%q, %q) = %v, want %v", tc.pat, tc.path, got, tc.want)
		}
	}
}

// globRef is a plain recursive matcher to check globMatch against.
func globRef(pat, segs []string) bool {
	if len(pat) == 0 {
		return len(segs) == 0
	}
	switch pat[0] {
	case "**":
		for k := 0; k <= len(segs); k++ {
			if globRef(pat[1:], segs[k:]) {
				return true
			}
		}
		return false
	case "*":
		return len(segs) > 0 && segs[0] != "" && globRef(pat[1:], segs[1:])
	}
	return len(segs) > 0 && segs[0] == pat[0] && globRef(pat[1:], segs[1:])
}

// FuzzDecideRequest: DecideRequest never panics; it never allows a path
// that is not canonical (a dot segment, an encoded / \ . or %, a control
// character, an empty inner segment) whatever the rules; an allowed
// request is matched by an entry of the rule (checked against a plain
// recursive matcher); and globMatch agrees with that matcher.
func FuzzDecideRequest(f *testing.F) {
	f.Add("/repos/**", "GET", "GET", "/repos/acme/x")
	f.Add("/a/*/z", "POST", "POST", "/a/%2e%2e/z")
	f.Add("/**/x/**", "*", "DELETE", "/q/x/..;/y")
	f.Add("/**", "*", "GET", "/a//b")
	f.Add("/", "GET", "get", "/")
	f.Add("/@types/*", "GET", "GET", "/@types%2fnode")
	f.Fuzz(func(t *testing.T, pattern, method, reqMethod, path string) {
		if checkPattern(pattern) != nil {
			return
		}
		m, err := checkMethod(method)
		if err != nil {
			return
		}
		r := Rule{Host: "x.test", Ports: defaultPorts(), Proto: TCP, Source: "fuzz",
			HTTP: []HTTPRule{{Methods: []string{m}, Paths: []string{pattern}}}}
		rs, err := Select(nil, "", []Rule{r}, Guard{})
		if err != nil {
			t.Fatalf("Select: %v", err)
		}
		d := rs.DecideRequest("x.test", 443, reqMethod, path)
		segs, bad := pathSegments(path)
		if !d.Allowed() {
			if d.Reason == "" {
				t.Fatal("a denial without a reason")
			}
			if bad == "" && validMethod(reqMethod) && (m == "*" || strings.EqualFold(m, reqMethod)) && globRef(patternSegments(pattern), segs) {
				t.Fatalf("DecideRequest(%s %q) denied what %s %q allows: %+v", reqMethod, path, m, pattern, d)
			}
			return
		}
		if bad != "" {
			t.Fatalf("DecideRequest allowed a path pathSegments refuses (%s): %q", bad, path)
		}
		lower := strings.ToLower(path)
		if scope, name, ok := splitScope(strings.SplitN(lower[1:], "/", 2)[0]); ok {
			// npm's scoped package: its one encoded / is a separator.
			lower = "/" + scope + "/" + name + lower[1+len(scope)+3+len(name):]
		}
		for _, s := range []string{"/./", "/../", "//", "%2f", "%5c", "%2e", "%25", "\\", "%00"} {
			if strings.Contains(lower, s) || (s[0] == '/' && s != "//" && strings.HasSuffix(lower+"/", s)) {
				t.Fatalf("DecideRequest allowed %q, which contains %q", path, s)
			}
		}
		if !globRef(patternSegments(pattern), segs) {
			t.Fatalf("DecideRequest allowed %q, which %q does not match", path, pattern)
		}
	})
}

func TestSuggestProposesHTTPRulesForTerminatedHosts(t *testing.T) {
	obs := []Observation{
		{Host: "api.github.com", Port: 443, Proto: TCP},
		{Host: "gist.github.com", Port: 443, Proto: TCP},
		{Host: "raw.github.com", Port: 443, Proto: TCP},
		{Host: "api.github.com", Port: 443, Proto: TCP, Method: "GET", Path: "/repos/acme/widget", Secrets: []string{"GITHUB_TOKEN"}},
		{Host: "api.github.com", Port: 443, Proto: TCP, Method: "HEAD", Path: "/repos/acme/widget", Secrets: []string{"GITHUB_TOKEN"}},
		{Host: "api.github.com", Port: 443, Proto: TCP, Method: "POST", Path: "/repos/acme/widget/pulls"},
		{Host: "api.github.com", Port: 443, Proto: TCP, Method: "GET", Path: "/repos/acme/../x"},
	}
	for i := range 12 {
		obs = append(obs, Observation{Host: "api.github.com", Port: 443, Proto: TCP, Method: "PUT", Path: fmt.Sprintf("/repos/acme/widget/contents/f%d", i)})
	}
	out := Suggest(obs, "exec", "test", publicsuffix.PublicSuffix)
	p, err := Parse("suggested.yaml", out)
	if err != nil {
		t.Fatalf("the suggestion does not parse: %v\n%s", err, out)
	}
	rs, err := Select(p, "exec", nil, Guard{})
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range obs {
		if o.Method == "" {
			continue
		}
		if d := rs.DecideRequest(o.Host, o.Port, o.Method, o.Path); !d.Allowed() && !strings.Contains(o.Path, "..") {
			t.Errorf("%s %s is denied by the suggestion: %+v\n%s", o.Method, o.Path, d, out)
		}
	}
	if d := rs.DecideRequest("api.github.com", 443, "DELETE", "/repos/acme/widget"); d.Allowed() {
		t.Errorf("DELETE is allowed by the suggestion\n%s", out)
	}
	if d := rs.DecideRequest("api.github.com", 443, "PUT", "/repos/acme/widget/contents/new"); !d.Allowed() {
		t.Errorf("many PUTs were not generalised to their common prefix\n%s", out)
	}
	if !strings.Contains(string(out), "inject: [GITHUB_TOKEN]") || !strings.Contains(string(out), `- host: "api.github.com"`) || strings.Contains(string(out), `"*.github.com"`) && !strings.Contains(string(out), "api.github.com\"") {
		t.Errorf("suggestion:\n%s", out)
	}
	if v := rs.HTTPFor("api.github.com", 443); !v.Terminate || !v.Restricted {
		t.Errorf("the suggested rule does not terminate: %+v\n%s", v, out)
	}
}

// npm's scoped packages: the first segment "@scope%2fname" is read as two,
// and path rules name it /@scope/name; every other encoded / is refused.
func TestAScopedPackagePathIsDecidedAsItsTwoSegments(t *testing.T) {
	for _, c := range []struct {
		path string
		segs []string
		bad  bool
	}{
		{"/@types%2fnode", []string{"@types", "node"}, false},
		{"/@types%2Fnode", []string{"@types", "node"}, false},
		{"/@tw-scope%2fcreds-pkg/-/creds-pkg-1.0.0.tgz", []string{"@tw-scope", "creds-pkg", "-", "creds-pkg-1.0.0.tgz"}, false},
		{"/@scope%2f..", nil, true},
		{"/@scope%2f%2e%2e", nil, true},
		{"/@scope%2fa%2fb", nil, true},
		{"/@scope%2f/x", nil, true},
		{"/x/@scope%2fname", nil, true},
		{"/scope%2fname", nil, true},
		{"/@scope/name%2fx", nil, true},
	} {
		segs, bad := pathSegments(c.path)
		if (bad != "") != c.bad || !c.bad && !slices.Equal(segs, c.segs) {
			t.Errorf("pathSegments(%q) = %q, %q; want %q, refused %v", c.path, segs, bad, c.segs, c.bad)
		}
	}
}

// FuzzSplitScope: a split scope is the segment with one encoded / taken
// out, begins with @, and holds no encoded / itself.
func FuzzSplitScope(f *testing.F) {
	for _, s := range []string{"@types%2fnode", "@a%2Fb%2fc", "%2f", "@", "@%2f", "x%2fy"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, seg string) {
		scope, name, ok := splitScope(seg)
		if !ok {
			return
		}
		if !strings.HasPrefix(scope, "@") || strings.Contains(scope, "%2f") || strings.Contains(scope, "%2F") {
			t.Fatalf("splitScope(%q) = %q, %q", seg, scope, name)
		}
		if len(scope)+3+len(name) != len(seg) || !strings.EqualFold(seg[len(scope):len(scope)+3], "%2f") || seg[len(scope)+3:] != name {
			t.Fatalf("splitScope(%q) = %q, %q: not the segment less one encoded /", seg, scope, name)
		}
	})
}

// A path a server could read as another, after decoding bytes leniently
// or normalising characters, is refused like the path it would become.
func TestLookAlikesOfDotAndSlashAreRefused(t *testing.T) {
	for _, p := range []string{
		"/public/%c0%ae%c0%ae/secret", "/public/%e0%80%ae/x", "/public/%c0%af", "/public/%ff",
		"/public/%ef%bc%8e%ef%bc%8e/secret", "/public/%e3%80%82%e3%80%82/x", "/public/%ef%bd%a1%ef%bd%a1/x",
		"/public/x%ef%bc%8f..%ef%bc%8fsecret", "/public/%ef%bc%bc", "/public/%ef%bc%85",
		"/public/．．/secret", "/public/x／y",
	} {
		if segs, bad := pathSegments(p); bad == "" {
			t.Errorf("pathSegments(%q) = %q, want it refused", p, segs)
		}
	}
	for _, p := range []string{"/public/caf%c3%a9", "/public/日本語", "/public/ﬁle.txt", "/public/%e2%82%ac"} {
		if _, bad := pathSegments(p); bad != "" {
			t.Errorf("pathSegments(%q) refused (%s), want it taken", p, bad)
		}
	}
}
