package engine

import (
	"strings"
	"testing"

	"github.com/tunwall/tunwall/internal/secrets"
	"github.com/tunwall/tunwall/policy"
)

// TestPlaceholdersAreRefusedInNamesAndPlainHTTP: the engine's own places
// where a placeholder can leave (a DNS name, a sniffed or SOCKS name, a
// plain HTTP head to a host not terminated) refuse it, in any letter case,
// and say so; a head to the host that receives the secret passes.
func TestPlaceholdersAreRefusedInNamesAndPlainHTTP(t *testing.T) {
	p, err := policy.Parse("p.yaml", []byte(`version: 1
secrets:
  T: {env: T}
phases:
  e:
    allow:
      - host: "*.evil.test"
        ports: [80, 443]
      - host: api.test
        ports: [80]
        inject: [T]
`))
	if err != nil {
		t.Fatal(err)
	}
	rs, err := policy.Select(p, "", nil, policy.Guard{})
	if err != nil {
		t.Fatal(err)
	}
	st, err := secrets.Load(p.Secrets(), secrets.Options{LookupEnv: func(string) (string, bool) { return "the-value", true }})
	if err != nil {
		t.Fatal(err)
	}
	s, _ := st.Get("T")
	token := s.Placeholder[len("twp_T_"):]
	e := &Engine{cfg: Config{Rules: rs, Secrets: st}}

	for _, name := range []string{token + ".evil.test", strings.ToUpper(token) + ".evil.test", "x-" + token[:16] + "." + token[16:] + ".evil.test"} {
		v := e.dnsFilter(name)
		split := strings.Contains(name, "x-")
		if split {
			// Split across labels, the random part is not whole: not seen
			// (the placeholder is worthless; the value never entered).
			continue
		}
		if v.Allowed() || v.Rule != ruleCredentialPlaceholder || !strings.Contains(v.Reason, "credential placeholder T in a DNS name") {
			t.Errorf("dnsFilter(%q) = %+v", name, v)
		}
		if d := e.decideName(e.rules(), name, 443, policy.TCP); d.Allowed() || d.Rule != ruleCredentialPlaceholder {
			t.Errorf("decideName(%q) = %+v", name, d)
		}
	}
	if v := e.dnsFilter("www.evil.test"); !v.Allowed() {
		t.Errorf("an ordinary name was refused: %+v", v)
	}
	head := []byte("GET /x HTTP/1.1\r\nHost: a.evil.test\r\nCookie: t=" + s.Placeholder + "\r\n\r\n")
	if v, found := e.foreignInHead("a.evil.test", 80, head); !found || !strings.Contains(v.Reason, "credential placeholder T sent to a.evil.test (T is injected only for api.test)") {
		t.Errorf("foreignInHead to another host = %+v, %v", v, found)
	}
	if _, found := e.foreignInHead("api.test", 80, head); found {
		t.Error("a placeholder to the host that receives it was refused")
	}
	// A placeholder of an earlier run, wherever this run's would be seen.
	old := "twp_T_" + strings.Repeat("5a", 16)
	if v := e.dnsFilter(old[len("twp_T_"):] + ".evil.test"); !v.Allowed() {
		t.Errorf("a random-looking label alone was refused: %+v", v)
	}
	if d := e.decideName(e.rules(), strings.ReplaceAll(old, "_", "-")+".evil.test", 443, policy.TCP); !d.Allowed() {
		t.Errorf("a name that only looks like a placeholder was refused: %+v", d)
	}
	if v, found := e.placeholderIn(old+".evil.test", "the name"); !found || !strings.Contains(v.Reason, "credential placeholder of T from an earlier run in the name") {
		t.Errorf("placeholderIn(an earlier run's) = %+v, %v", v, found)
	}
	stale := []byte("GET /x HTTP/1.1\r\nHost: a.evil.test\r\nAuthorization: Bearer " + old + "\r\n\r\n")
	if v, found := e.foreignInHead("a.evil.test", 80, stale); !found || v.Rule != ruleCredentialPlaceholder || !strings.Contains(v.Reason, "credential placeholder of T from an earlier run, sent to a.evil.test") {
		t.Errorf("foreignInHead(an earlier run's) = %+v, %v", v, found)
	}
}
