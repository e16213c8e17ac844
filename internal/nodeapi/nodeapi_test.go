package nodeapi

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tunwall/tunwall/internal/testenv"
)

func TestChoosePolicyFirstMatchWinsAndNoneFails(t *testing.T) {
	have := map[string]bool{"web": true, "team-b": true, "fallback": true}
	exists := func(n string) bool { return have[n] }
	for _, c := range []struct {
		name                    string
		req                     Request
		want, from, errContains string
	}{
		{"the annotation wins over the namespace and the default", Request{Annotation: "web", K8sNamespace: "team-b", DefaultPolicy: "fallback"}, "web", FromAnnotation, ""},
		{"the namespace's file wins over the default", Request{K8sNamespace: "team-b", DefaultPolicy: "fallback"}, "team-b", FromNamespace, ""},
		{"the default when nothing else", Request{K8sNamespace: "team-z", DefaultPolicy: "fallback"}, "fallback", FromDefault, ""},
		{"an annotation naming no policy never falls through", Request{Annotation: "nope", K8sNamespace: "team-b", DefaultPolicy: "fallback"}, "", "", "nope"},
		{"an annotation that is a path is refused", Request{Annotation: "../etc/x", DefaultPolicy: "fallback"}, "", "", "not a policy name"},
		{"a default naming no policy fails", Request{DefaultPolicy: "gone"}, "", "", "gone"},
		{"nothing at all fails", Request{K8sNamespace: "team-z"}, "", "", "no policy for the pod"},
		{"outside Kubernetes, the default", Request{DefaultPolicy: "web"}, "web", FromDefault, ""},
	} {
		got, from, err := ChoosePolicy(c.req, exists)
		switch {
		case c.errContains != "" && (err == nil || !strings.Contains(err.Error(), c.errContains)):
			t.Errorf("%s: err %v, want one saying %q", c.name, err, c.errContains)
		case c.errContains == "" && (err != nil || got != c.want || from != c.from):
			t.Errorf("%s: %q from %q (%v), want %q from %q", c.name, got, from, err, c.want, c.from)
		}
	}
}

func TestPolicyNamesAndRequestIDsCannotNameAPath(t *testing.T) {
	for _, bad := range []string{"", ".", "..", "../x", "a/b", ".hidden", "A", "x.", "-x", strings.Repeat("a", 65), "a\x00b"} {
		if CheckPolicyName(bad) == nil {
			t.Errorf("CheckPolicyName(%q) accepted it", bad)
		}
	}
	for _, good := range []string{"web", "team-b", "a", "x.y_z-1"} {
		if err := CheckPolicyName(good); err != nil {
			t.Errorf("CheckPolicyName(%q): %v", good, err)
		}
	}
	for _, id := range []string{"", "../x", "a/b", "a b", strings.Repeat("a", 129)} {
		if CheckRequest(Request{Op: OpAdd, ContainerID: id, IfName: "eth0"}) == nil {
			t.Errorf("container id %q accepted", id)
		}
	}
	if CheckRequest(Request{Op: OpAdd, ContainerID: "abc", IfName: "eth0", K8sPod: "Bad_Name"}) == nil {
		t.Error("a pod name that is not a Kubernetes name was accepted")
	}
	if CheckRequest(Request{Op: "exec"}) == nil {
		t.Error("an unknown op was accepted")
	}
	if err := CheckRequest(Request{Op: OpAdd, ContainerID: "0123abc", IfName: "eth0", K8sNamespace: "team-a", K8sPod: "pod-1"}); err != nil {
		t.Error(err)
	}
}

func TestCallToNoAgentIsUnreachable(t *testing.T) {
	_, err := Call(filepath.Join(t.TempDir(), "none.sock"), Request{Op: OpStatus})
	if !errors.Is(err, ErrUnreachable) {
		t.Fatalf("Call with no agent: %v, want ErrUnreachable", err)
	}
}

// TestDepsKeepThePluginSmall: the protocol package (and so tunwall-cni)
// never pulls in the session, the netstack or the policy engine.
func TestDepsKeepThePluginSmall(t *testing.T) {
	const mod = "github.com/tunwall/tunwall"
	for _, d := range testenv.Deps(t) {
		for _, f := range []string{mod + "/internal/session", mod + "/internal/engine", mod + "/stack", mod + "/policy", mod + "/dnsintercept", "gvisor.dev/", "github.com/miekg/dns", "github.com/prometheus/"} {
			if testenv.Under(d.Path, f) {
				t.Errorf("nodeapi depends on %s (forbidden: %s)", d.Path, f)
			}
		}
	}
}
