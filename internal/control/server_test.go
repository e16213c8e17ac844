package control

import (
	"errors"
	"fmt"
	"net"

	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tunwall/tunwall/internal/audit"
	"github.com/tunwall/tunwall/internal/leaktest"
)

// fakeSource is a Source with fixed answers.
type fakeSource struct{ counts *Counts }

func (f fakeSource) Status() Status {
	return Status{Run: "tw-test", Phase: "exec", Started: time.Now().Add(-time.Minute), Totals: f.counts.Snapshot().Totals()}
}
func (f fakeSource) Counts() Snapshot { return f.counts.Snapshot() }
func (f fakeSource) Lost() uint64     { return 3 }
func (f fakeSource) Flows() []Flow {
	return []Flow{{Proto: "tcp", Host: "allowed.test", Start: time.Now()}}
}

func serve(t *testing.T) (*Listener, string) {
	t.Helper()
	leaktest.Check(t)
	path := filepath.Join(t.TempDir(), "tw-test.sock")
	l, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	c := NewCounts()
	c.Observe(audit.Record{Kind: audit.KindFlow, Phase: "exec", Verdict: audit.VerdictAllow, Outcome: audit.OutcomeOK, BytesIn: 7, BytesOut: 5})
	c.Observe(audit.Record{Kind: audit.KindDNS, Phase: "exec", Verdict: audit.VerdictDeny, Rule: "default-deny"})
	if err := l.Serve(ServeConfig{Source: fakeSource{c}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l, path
}

func TestTheSocketIsOnlyItsOwnersAndNoChildInheritsIt(t *testing.T) {
	l, path := serve(t)
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o600 {
		t.Errorf("socket mode %v, want a socket of mode 0600", fi.Mode())
	}
	raw, err := l.ln.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	raw.Control(func(fd uintptr) {
		flags, err := unix.FcntlInt(fd, unix.F_GETFD, 0)
		if err != nil || flags&unix.FD_CLOEXEC == 0 {
			t.Errorf("listener descriptor flags %#x (%v), want FD_CLOEXEC", flags, err)
		}
	})
}

func TestItsOwnUserGetsTheStatusAndTheMetrics(t *testing.T) {
	_, path := serve(t)
	r, err := Ask(path, Request{Cmd: CmdStatus})
	if err != nil {
		t.Fatal(err)
	}
	if r.Status == nil || r.Status.Run != "tw-test" || r.Status.Totals.FlowsAllowed != 1 || r.Status.Totals.DNSDenied != 1 || r.Status.Totals.BytesIn != 7 {
		t.Errorf("status %+v", r.Status)
	}
	r, err = Ask(path, Request{Cmd: CmdMetrics})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`tunwall_flows_total{outcome="ok",phase="exec",verdict="allow"} 1`,
		`tunwall_denials_total{kind="dns",phase="exec",rule="default-deny"} 1`,
		`tunwall_bytes_total{direction="in",phase="exec"} 7`,
		`tunwall_audit_records_lost_total 3`,
	} {
		if !strings.Contains(r.Metrics, want) {
			t.Errorf("metrics lack %q:\n%s", want, r.Metrics)
		}
	}
	if _, err := Ask(path, Request{Cmd: "pahse"}); err == nil || !strings.Contains(err.Error(), "unknown command") {
		t.Errorf("an unknown command: %v, want unknown command", err)
	}
}

func TestARequestLongerThanTheBoundIsRefusedAndTheServerGoesOn(t *testing.T) {
	_, path := serve(t)
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	c.Write([]byte(strings.Repeat("x", 2*maxRequest))) // no newline, ever
	b := make([]byte, 1024)
	n, _ := c.Read(b)
	if !strings.Contains(string(b[:n]), "no request within") {
		t.Errorf("answer %q, want a refusal of the request", b[:n])
	}
	if _, err := Ask(path, Request{Cmd: CmdStatus}); err != nil {
		t.Errorf("after a flood: %v", err)
	}
}

func TestClientsBeyondTheBoundAreToldBusyAndCloseEndsTheHangingOnes(t *testing.T) {
	l, path := serve(t)
	var hang []net.Conn
	for range maxClients {
		c, err := net.Dial("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		hang = append(hang, c) // connected, sending nothing
	}
	defer func() {
		for _, c := range hang {
			c.Close()
		}
	}()
	// The slots are taken once the server has accepted them all.
	var err error
	for i := 0; i < 100; i++ {
		if _, err = Ask(path, Request{Cmd: CmdStatus}); err != nil && strings.Contains(err.Error(), "busy") {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err == nil || !strings.Contains(err.Error(), "busy") {
		t.Fatalf("client %d: %v, want busy", maxClients+1, err)
	}
	start := time.Now()
	l.Close()
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("Close took %v with hanging clients", d)
	}
	if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket still there after Close: %v", err)
	}
}

func TestListenReplacesADeadSocketButNotALiveOne(t *testing.T) {
	leaktest.Check(t)
	dir := t.TempDir()
	path := filepath.Join(dir, "run.sock")
	// A socket file nobody listens on: what a killed tunwall leaves.
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: path}); err != nil {
		t.Fatal(err)
	}
	unix.Close(fd)
	l, err := Listen(path)
	if err != nil {
		t.Fatalf("over a dead socket: %v", err)
	}
	defer l.Close()
	if _, err := Listen(path); err == nil || !strings.Contains(err.Error(), "another tunwall") {
		t.Errorf("over a live socket: %v", err)
	}
	// PruneDead removes a dead socket, and leaves the live one.
	dead := filepath.Join(dir, "dead.sock")
	fd, _ = unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM, 0)
	unix.Bind(fd, &unix.SockaddrUnix{Name: dead})
	unix.Close(fd)
	if n := PruneDead(dir); n != 1 {
		t.Errorf("PruneDead removed %d, want 1", n)
	}
	if _, err := os.Lstat(dead); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the dead socket is still there: %v", err)
	}
	if _, err := os.Lstat(path); err != nil {
		t.Errorf("the live socket went: %v", err)
	}
	file := filepath.Join(dir, "file")
	os.WriteFile(file, nil, 0o600)
	if _, err := Listen(file); err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Errorf("over a file: %v", err)
	}
}

func TestEnsureDirRefusesADirectoryOpenToOthers(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "tunwall")
	if err := EnsureDir(dir); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(dir); fi.Mode().Perm() != 0o700 {
		t.Errorf("made with mode %v, want 0700", fi.Mode().Perm())
	}
	os.Chmod(dir, 0o755)
	if err := EnsureDir(dir); err == nil {
		t.Error("a directory of mode 0755 was accepted")
	}
}

func TestDenialsOfMoreRulesThanTheBoundAreCountedAsOther(t *testing.T) {
	c := NewCounts()
	for i := range maxRuleLabels + 10 {
		c.Observe(audit.Record{Kind: audit.KindFlow, Phase: "p", Verdict: audit.VerdictDeny, Rule: fmt.Sprint("rule-", i)})
	}
	c.Observe(audit.Record{Kind: audit.KindDNS, Phase: "p", Verdict: audit.VerdictDeny, Rule: "rule-0"}) // a known rule stays
	s := c.Snapshot()
	rules := map[string]bool{}
	var total uint64
	for k, v := range s.Denials {
		rules[k.Rule] = true
		total += v
	}
	if len(rules) != maxRuleLabels+1 || !rules[OtherRule] || !rules["rule-0"] {
		t.Errorf("%d distinct rule labels (other: %v), want %d and other", len(rules), rules[OtherRule], maxRuleLabels+1)
	}
	if s.Denials[DenialKey{"p", audit.KindFlow, OtherRule}] != 10 || total != maxRuleLabels+11 {
		t.Errorf("other = %d, total = %d", s.Denials[DenialKey{"p", audit.KindFlow, OtherRule}], total)
	}
}

func TestTheFlowsCommandListsTheSourcesFlows(t *testing.T) {
	_, path := serve(t)
	r, err := Ask(path, Request{Cmd: CmdFlows})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Flows) != 1 || r.Flows[0].Host != "allowed.test" {
		t.Errorf("flows %+v", r.Flows)
	}
}

// BenchmarkObserve is what counting costs each record on the data path.
func BenchmarkObserve(b *testing.B) {
	c := NewCounts()
	r := audit.Record{Kind: audit.KindFlow, Phase: "exec", Verdict: audit.VerdictAllow, Outcome: audit.OutcomeOK, BytesIn: 100, BytesOut: 10}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			c.Observe(r)
		}
	})
}
