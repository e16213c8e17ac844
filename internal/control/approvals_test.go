package control

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/tunwall/tunwall/internal/leaktest"
)

// fakeApprovals holds one request, "abc", and records decisions.
type fakeApprovals struct {
	mu      sync.Mutex
	decided []string
}

func (f *fakeApprovals) Pending() []Pending {
	return []Pending{{ID: "abc", Proto: "dns", Host: "pypi.org"}}
}

func (f *fakeApprovals) Decide(id string, allow bool, scope, by string) error {
	if id != "abc" {
		return errors.New("no such pending request")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.decided = append(f.decided, strings.Join([]string{id, map[bool]string{true: "allow", false: "deny"}[allow], scope, by}, " "))
	return nil
}

func TestTheApprovalCommandsReachTheQueueAndNameWhoAsked(t *testing.T) {
	leaktest.Check(t)
	path := filepath.Join(t.TempDir(), "tw-ask.sock")
	l, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	a := &fakeApprovals{}
	if err := l.Serve(ServeConfig{Source: fakeSource{NewCounts()}, Approvals: a}); err != nil {
		t.Fatal(err)
	}
	r, err := Ask(path, Request{Cmd: CmdPending})
	if err != nil || len(r.Pending) != 1 || r.Pending[0].Host != "pypi.org" {
		t.Fatalf("pending: %+v %v", r, err)
	}
	if _, err := Ask(path, Request{Cmd: CmdAllow, ID: "abc", Scope: "run"}); err != nil {
		t.Fatal(err)
	}
	if _, err := Ask(path, Request{Cmd: CmdDeny, ID: "nope"}); err == nil || !strings.Contains(err.Error(), "no such pending request") {
		t.Errorf("deny of an unknown id: %v", err)
	}
	if _, err := Ask(path, Request{Cmd: CmdAllow}); err == nil || !strings.Contains(err.Error(), "no request id") {
		t.Errorf("allow with no id: %v", err)
	}
	exe, _ := os.Executable()
	if len(a.decided) != 1 || !strings.HasPrefix(a.decided[0], "abc allow run ctl uid ") || !strings.Contains(a.decided[0], exe) {
		t.Errorf("decided %q, want abc allowed for the run by this process (%s)", a.decided, exe)
	}
}

func TestTheApprovalCommandsOfARunWithoutAskSaySo(t *testing.T) {
	_, path := serve(t)
	for _, cmd := range []string{CmdPending, CmdAllow, CmdDeny} {
		if _, err := Ask(path, Request{Cmd: cmd, ID: "x"}); err == nil || !strings.Contains(err.Error(), "--ask") {
			t.Errorf("%s: %v, want an error naming --ask", cmd, err)
		}
	}
}
