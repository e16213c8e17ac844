package engine

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tunwall/tunwall/internal/audit"
	"github.com/tunwall/tunwall/internal/engine/enginetest"
	"github.com/tunwall/tunwall/policy"
	"github.com/tunwall/tunwall/stack"
)

const allowTwo = `      - host: setup.test
        ports: [443]
      - host: both.test
        ports: [443]
`

func TestANewPolicyCutsTheOpenFlowsItDeniesAndKeepsTheOthers(t *testing.T) {
	r := newRig(t, allowTwo, nil)
	r.resolves("setup.test", "192.0.2.10")
	r.resolves("both.test", "192.0.2.11")
	open := func(name string) (*tcpRun, func() []byte) {
		run := r.tcp(t, ap(r.fake(t, name).String(), 443))
		srv := r.dial.Server(t)
		run.waitAccepted(t)
		hello := enginetest.ClientHello(t, name)
		run.send(hello)
		if got := enginetest.ReadUpTo(t, srv, len(hello)); !bytes.Equal(got, hello) {
			t.Fatalf("%s: the upstream got %d bytes of the hello", name, len(got))
		}
		return run, func() []byte {
			go srv.Write([]byte("more"))
			return enginetest.ReadUpTo(t, run.client, 4)
		}
	}
	cut, _ := open("setup.test")
	kept, keptReads := open("both.test")

	exec, _ := enginetest.Policy(t, `      - host: both.test
        ports: [443]
`)
	revoked, err := r.e.SetRules(exec)
	if err != nil {
		t.Fatal(err)
	}
	if len(revoked) != 1 || revoked[0].Host != "setup.test" {
		t.Fatalf("revoked %+v, want the flow to setup.test alone", revoked)
	}
	// The cut flow ends at once, its record says so.
	cut.returned(t)
	rec := r.rec.WaitMatch(t, "the flow record of setup.test", func(x audit.Record) bool {
		return x.Kind == audit.KindFlow && x.Host == "setup.test"
	})
	if rec.Outcome != audit.OutcomeRevoked || !strings.Contains(rec.Reason, "revoked") {
		t.Errorf("the cut flow's record: outcome %q reason %q, want revoked", rec.Outcome, rec.Reason)
	}
	cut.client.SetReadDeadline(time.Now().Add(waitFor))
	if n, err := cut.client.Read(make([]byte, 1)); err == nil {
		t.Errorf("the sandbox read %d bytes of a revoked flow", n)
	}
	// The flow both policies allow goes on.
	if got := keptReads(); string(got) != "more" {
		t.Errorf("the flow the new policy allows got %q after the switch", got)
	}
	if kept.wasAccepted() && r.rec.Count(audit.KindFlow) != 1 {
		t.Errorf("%d flow records, want the revoked one alone", r.rec.Count(audit.KindFlow))
	}
	// A new flow to the name the new policy denies is denied.
	again := r.tcp(t, ap(r.fake(t, "setup.test").String(), 443))
	again.returned(t)
	if again.wasAccepted() {
		t.Error("a new flow to setup.test was accepted after the switch")
	}
	if r.e.Rules() != exec {
		t.Error("Rules() is not the new policy")
	}
}

func TestAFlowDecidedBeforeASwitchIsCheckedAgainWhenItOpens(t *testing.T) {
	r := newRig(t, allowTwo, nil)
	exec, _ := enginetest.Policy(t, `      - host: both.test
        ports: [443]
`)
	mk := func(host string) *flowRecord {
		fr := &flowRecord{f: stack.Flow{Proto: stack.TCP, Src: sandbox4, Dst: ap("198.18.0.9", 443)}, start: time.Now(), rs: r.rules}
		fr.Host = host
		fr.v = r.e.decideName(fr.rs, host, 443, policy.TCP)
		return fr
	}
	setup, both := mk("setup.test"), mk("both.test")
	if !setup.v.Allowed() || !both.v.Allowed() {
		t.Fatal("the first policy does not allow both")
	}
	if _, err := r.e.SetRules(exec); err != nil {
		t.Fatal(err)
	}
	ctx, ok := r.e.admitOpen(context.Background(), setup)
	if ok {
		t.Fatal("a flow the new policy denies was admitted as open")
	}
	if ctx.Err() != nil {
		t.Error("a refused flow's context ended the caller's")
	}
	rec := r.rec.WaitMatch(t, "the denial of setup.test", func(x audit.Record) bool {
		return x.Kind == audit.KindFlow && x.Host == "setup.test"
	})
	if rec.Verdict != audit.VerdictDeny || rec.Phase != "test" || !strings.Contains(rec.Reason, "changed as the flow opened") {
		t.Errorf("record %+v", rec)
	}
	fctx, ok := r.e.admitOpen(context.Background(), both)
	if !ok {
		t.Fatal("a flow both policies allow was refused")
	}
	if len(r.e.OpenFlows()) != 1 {
		t.Errorf("open flows %+v", r.e.OpenFlows())
	}
	r.e.writeFlow(both)
	if !errors.Is(fctx.Err(), context.Canceled) {
		t.Error("a finished flow's context was not released")
	}
}

func TestRulesWithHTTPAreRefusedWithoutATerminator(t *testing.T) {
	r := newRig(t, allowTwo, nil)
	withHTTP, _ := enginetest.Policy(t, `      - host: api.test
        ports: [443]
        http:
          - methods: [GET]
            paths: ["/**"]
`)
	if _, err := r.e.SetRules(withHTTP); err == nil || !strings.Contains(err.Error(), "terminator") {
		t.Fatalf("SetRules = %v, want a refusal naming the terminator", err)
	}
	if r.e.Rules() != r.rules {
		t.Error("the refused rules are in effect")
	}
}

func TestANewPolicyEndsAProxysUDPFlowItDenies(t *testing.T) {
	r := newRig(t, `      - host: game.test
        ports: [5000]
        proto: udp
`, nil)
	r.resolves("game.test", "192.0.2.30")
	up, err := r.e.OpenUDP(context.Background(), ProxyRequest{Client: ap("127.0.0.1", 50000), Host: "game.test", Port: 5000})
	if err != nil {
		t.Fatal(err)
	}
	r.dial.Server(t)
	none, _ := enginetest.Policy(t, `      - host: other.test
`)
	if revoked, err := r.e.SetRules(none); err != nil || len(revoked) != 1 {
		t.Fatalf("SetRules = %+v, %v; want the UDP flow revoked", revoked, err)
	}
	// The front end reads until its upstream fails, then closes it.
	done := make(chan error, 1)
	go func() {
		_, err := up.Read(make([]byte, 10))
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("a read of a revoked flow succeeded")
		}
	case <-time.After(waitFor):
		t.Fatal("a revoked UDP flow of the proxy was not ended")
	}
	up.Close()
	rec := r.rec.WaitMatch(t, "the game.test flow", func(x audit.Record) bool { return x.Kind == audit.KindFlow && x.Host == "game.test" })
	if rec.Outcome != audit.OutcomeRevoked {
		t.Errorf("outcome %q, want revoked", rec.Outcome)
	}
}
