package approve

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tunwall/tunwall/internal/audit"
	"github.com/tunwall/tunwall/policy"
)

// recorder keeps approval records.
type recorder struct {
	mu   sync.Mutex
	recs []audit.Record
}

func (r *recorder) record(rec audit.Record) {
	r.mu.Lock()
	r.recs = append(r.recs, rec)
	r.mu.Unlock()
}

func (r *recorder) outcomes() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, rec := range r.recs {
		out = append(out, rec.Host+" "+rec.Outcome+" "+rec.Verdict)
	}
	return out
}

func newQueue(t *testing.T, cfg Config) (*Queue, *recorder) {
	t.Helper()
	rec := &recorder{}
	cfg.Record = rec.record
	q, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(q.Close)
	return q, rec
}

func dnsReq(host string) Request { return Request{Phase: "exec", Proto: ProtoDNS, Host: host} }

// waitPending waits until n requests are pending.
func waitPending(t *testing.T, q *Queue, n int) []Request {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if p := q.Pending(); len(p) == n {
			return p
		}
	}
	t.Fatalf("pending %v, want %d", q.Pending(), n)
	return nil
}

func TestAnAnswerWithinTheHoldIsGivenAndTheRunScopeStands(t *testing.T) {
	q, rec := newQueue(t, Config{})
	done := make(chan bool)
	go func() {
		d, pending := q.Ask(context.Background(), dnsReq("a.example.com"))
		done <- d.Allowed() && !pending
	}()
	p := waitPending(t, q, 1)
	if err := q.Decide(p[0].ID, true, ScopeRun, "test", "", ""); err != nil {
		t.Fatal(err)
	}
	if !<-done {
		t.Fatal("the waiting Ask was not allowed")
	}
	for _, c := range []struct {
		port  uint16
		proto string
		want  bool
	}{{0, ProtoDNS, true}, {443, ProtoTCP, true}, {80, ProtoTCP, false}, {443, ProtoUDP, false}} {
		if _, ok := q.Granted("exec", "a.example.com", c.port, c.proto); ok != c.want {
			t.Errorf("Granted(a.example.com, %d, %s) = %v, want %v", c.port, c.proto, ok, c.want)
		}
	}
	if _, ok := q.Granted("exec", "b.example.com", 443, ProtoTCP); ok {
		t.Error("another name is granted")
	}
	if _, ok := q.Granted("setup", "a.example.com", 443, ProtoTCP); ok {
		t.Error("granted in another phase")
	}
	if got := strings.Join(rec.outcomes(), ","); got != "a.example.com pending deny,a.example.com approved allow" {
		t.Errorf("records %s", got)
	}
	if err := q.Decide(p[0].ID, false, ScopeOnce, "test", "", ""); !errors.Is(err, ErrUnknown) {
		t.Errorf("deciding twice: %v, want ErrUnknown", err)
	}
}

func TestARequestWithNoDecisionIsPendingAfterTheHoldAndDeniedAtTheTimeout(t *testing.T) {
	q, rec := newQueue(t, Config{Timeout: 300 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if d, pending := q.Ask(ctx, dnsReq("slow.example.com")); !pending || d.Allowed() {
		t.Fatalf("Ask after the hold: %+v pending %v, want pending", d, pending)
	}
	d, pending := q.Ask(context.Background(), dnsReq("slow.example.com")) // the retry, until the timeout
	if pending || d.Allowed() || !strings.Contains(d.Reason, "no decision within") {
		t.Fatalf("after the timeout: %+v pending %v, want a denial", d, pending)
	}
	if got := strings.Join(rec.outcomes(), ","); got != "slow.example.com pending deny,slow.example.com timeout deny" {
		t.Errorf("records %s", got)
	}
}

func TestThePendingSetIsBoundedInAllAndPerDomain(t *testing.T) {
	q, rec := newQueue(t, Config{MaxPending: 5, MaxPerDomain: 2, Timeout: time.Minute})
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // no hold: just queue them
	for i := range 4 {
		q.Ask(ctx, dnsReq(fmt.Sprintf("h%d.one.example", i)))
	}
	for i := range 10 {
		q.Ask(ctx, dnsReq(fmt.Sprintf("x.d%d.example", i)))
	}
	if n := len(q.Pending()); n != 5 {
		t.Errorf("%d pending, want 5", n)
	}
	d, pending := q.Ask(ctx, dnsReq("late.other.example"))
	if pending || d.Rule != RuleBound {
		t.Errorf("past the bound: %+v pending %v, want denied at once by %s", d, pending, RuleBound)
	}
	one := 0
	for _, p := range q.Pending() {
		if strings.HasSuffix(p.Host, ".one.example") {
			one++
		}
	}
	if one != 2 {
		t.Errorf("%d pending under one.example, want 2", one)
	}
	denied := 0
	for _, o := range rec.outcomes() {
		if strings.HasSuffix(o, "denied deny") {
			denied++
		}
	}
	if denied != 4+10+1-5 {
		t.Errorf("%d records of names denied at once, want %d", denied, 4+10+1-5)
	}
}

func TestAOnceApprovalOfANameLapses(t *testing.T) {
	q, _ := newQueue(t, Config{OnceFor: 50 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	q.Ask(ctx, dnsReq("once.example.com"))
	p := waitPending(t, q, 1)
	if err := q.Decide(p[0].ID, true, ScopeOnce, "test", "", ""); err != nil {
		t.Fatal(err)
	}
	if _, ok := q.Granted("exec", "once.example.com", 443, ProtoTCP); !ok {
		t.Fatal("not granted right after")
	}
	time.Sleep(80 * time.Millisecond)
	if _, ok := q.Granted("exec", "once.example.com", 443, ProtoTCP); ok {
		t.Fatal("still granted after OnceFor")
	}
}

func TestADenialForTheRunAnswersTheNextRequestsAtOnce(t *testing.T) {
	q, _ := newQueue(t, Config{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	q.Ask(ctx, dnsReq("no.example.com"))
	p := waitPending(t, q, 1)
	if err := q.Decide(p[0].ID, false, ScopeRun, "test", "", ""); err != nil {
		t.Fatal(err)
	}
	d, pending := q.Ask(context.Background(), dnsReq("no.example.com"))
	if pending || d.Allowed() || len(q.Pending()) != 0 {
		t.Fatalf("%+v pending %v, %d pending; want a denial at once", d, pending, len(q.Pending()))
	}
}

func TestAlwaysWithoutAnOverlayIsRefused(t *testing.T) {
	q, _ := newQueue(t, Config{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	q.Ask(ctx, dnsReq("x.example.com"))
	p := waitPending(t, q, 1)
	if err := q.Decide(p[0].ID, true, ScopeAlways, "test", "", ""); err == nil {
		t.Fatal("always with no overlay was accepted")
	}
	if len(q.Pending()) != 1 {
		t.Fatal("the refused decision took the request")
	}
}

func TestCloseDeniesWhatIsPendingAndLaterRequests(t *testing.T) {
	q, _ := newQueue(t, Config{})
	done := make(chan bool)
	go func() {
		d, pending := q.Ask(context.Background(), dnsReq("c.example.com"))
		done <- !d.Allowed() && !pending
	}()
	waitPending(t, q, 1)
	q.Close()
	if !<-done {
		t.Fatal("Close did not deny the waiting request")
	}
	if d, pending := q.Ask(context.Background(), dnsReq("d.example.com")); d.Allowed() || pending {
		t.Fatal("a request after Close was not denied")
	}
}

// fakeDecider records what it is sent.
type fakeDecider struct {
	mu   sync.Mutex
	q    *Queue
	sent []Request
}

func (f *fakeDecider) Serve(q *Queue) { f.q = q }
func (f *fakeDecider) Send(r Request) { f.mu.Lock(); f.sent = append(f.sent, r); f.mu.Unlock() }
func (f *fakeDecider) Stop()          {}

func TestADeadDeciderDeniesWhatIsPendingAndWhatComes(t *testing.T) {
	var said strings.Builder
	f := &fakeDecider{}
	q, _ := newQueue(t, Config{Decider: f, Stderr: &said})
	done := make(chan bool)
	go func() {
		d, _ := q.Ask(context.Background(), dnsReq("e.example.com"))
		done <- d.Allowed()
	}()
	waitPending(t, q, 1)
	q.DeciderDied("exited (test)")
	q.DeciderDied("exited (again)")
	if <-done {
		t.Fatal("allowed with a dead decider")
	}
	if d, pending := q.Ask(context.Background(), dnsReq("f.example.com")); d.Allowed() || pending {
		t.Fatal("a new request was not denied at once")
	}
	if n := strings.Count(said.String(), "tunwall: --decider"); n != 1 {
		t.Errorf("said %d times:\n%s", n, said.String())
	}
	if len(f.sent) != 1 || f.sent[0].Host != "e.example.com" || f.sent[0].ID == "" {
		t.Errorf("decider was sent %+v", f.sent)
	}
}

func TestTheOverlayGetsOneRuleAHostAndParses(t *testing.T) {
	dir := t.TempDir()
	pol := filepath.Join(dir, "p.yaml")
	path := OverlayPath(pol)
	if path != filepath.Join(dir, "p.approved.yaml") {
		t.Fatalf("OverlayPath = %s", path)
	}
	o := &Overlay{Path: path}
	for _, h := range []string{"a.example.com", "b.example.com", "a.example.com"} {
		if err := o.Add(dnsReq(h), "test"); err != nil {
			t.Fatal(err)
		}
	}
	for range 2 {
		if err := o.Add(Request{Phase: "exec", Proto: ProtoTCP, Host: "c.example.com", Port: 8080}, "test"); err != nil {
			t.Fatal(err)
		}
	}
	p, err := ReadOverlay(path)
	if err != nil {
		t.Fatal(err)
	}
	rules := p.Rules("exec")
	if len(rules) != 3 || rules[0].Host != "a.example.com" || rules[1].Host != "b.example.com" || rules[2].Host != "c.example.com" {
		t.Fatalf("overlay rules %v", rules)
	}
	rs, err := policy.Select(p, "exec", nil, policy.Guard{})
	if err != nil {
		t.Fatal(err)
	}
	if d := rs.DecideName("a.example.com", 443, policy.TCP); !d.Allowed() {
		t.Errorf("a.example.com:443 not allowed by the overlay: %+v", d)
	}
	if d := rs.DecideName("a.example.com", 80, policy.TCP); d.Allowed() {
		t.Errorf("a.example.com:80 allowed by the overlay")
	}
	if d := rs.DecideName("c.example.com", 8080, policy.TCP); !d.Allowed() {
		t.Errorf("c.example.com:8080 not allowed by the overlay: %+v", d)
	}
	if d := rs.DecideName("c.example.com", 443, policy.TCP); d.Allowed() {
		t.Errorf("c.example.com:443 allowed by the overlay")
	}
	// A file that is not one this can append to is left alone.
	os.WriteFile(path, []byte("version: 1\nphases:\n  exec: [1]\n"), 0o644)
	if err := o.Add(dnsReq("d.example.com"), "test"); err == nil {
		t.Error("appended to a malformed overlay")
	}
	if b, _ := os.ReadFile(path); string(b) != "version: 1\nphases:\n  exec: [1]\n" {
		t.Errorf("the malformed overlay was changed:\n%s", b)
	}
	if p, err := ReadOverlay(filepath.Join(dir, "none.yaml")); p != nil || err != nil {
		t.Errorf("a missing overlay: %v %v", p, err)
	}
}

func TestAPhaseSwitchDeniesWhatIsPendingForTheOldPhase(t *testing.T) {
	q, rec := newQueue(t, Config{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	q.Ask(ctx, dnsReq("old.example.com"))
	q.Ask(ctx, Request{Phase: "deploy", Proto: ProtoDNS, Host: "new.example.com"})
	waitPending(t, q, 2)
	q.SetPhase("deploy")
	p := q.Pending()
	if len(p) != 1 || p[0].Host != "new.example.com" {
		t.Fatalf("pending after the switch: %+v", p)
	}
	if got := strings.Join(rec.outcomes(), ","); !strings.Contains(got, "old.example.com denied deny") {
		t.Errorf("records %s", got)
	}
}
