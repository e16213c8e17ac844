package main

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/tunwall/tunwall/internal/session"
)

func TestAnIncompleteAuditLogIsExit122(t *testing.T) {
	var b bytes.Buffer
	if got := exitStatus(nil, 7, "the command exited", &b); got != 7 || b.Len() != 0 {
		t.Errorf("a whole log: exit %d, %q", got, b.String())
	}
	got := exitStatus(&session.AuditLostError{Lost: 3, Err: errors.New("disk full")}, 7, "the command exited", &b)
	want := "tunwall: the audit log is incomplete: 3 audit records were lost (disk full); the command exited 7; exiting 122\n"
	if got != exitLost || b.String() != want {
		t.Errorf("exit %d, %q; want %d, %q", got, b.String(), exitLost, want)
	}
}

// TestSessionOptionsCarryTheFlags maps a command line to session.Options:
// what the flags say for "none" or "no limit" becomes the Options' own
// spelling, and the rule set is the one preflight made.
func TestSessionOptionsCarryTheFlags(t *testing.T) {
	fs := newFlagSet("run", "", &bytes.Buffer{})
	var c commonFlags
	c.register(fs)
	if err := fs.Parse([]string{"--allow", "allowed.test", "--dns-upstream", "192.0.2.53", "--dial-rate", "0", "--dns-pool-idle", "0", "--audit", "off", "--quiet"}); err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	if code := c.preflight(&stderr); code != exitOK {
		t.Fatalf("preflight: %d %s", code, stderr.String())
	}
	defer c.creds.close()
	o, err := c.sessionOptions([]string{"tunwall", "run"}, -1, 0, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	_, rs, _, _ := c.loadRules()
	if o.Rules != rs || o.Limits.DialRate != -1 || o.DNS.PoolIdle != -1 || !o.Audit.Off || o.Audit.Path != "" || !o.Quiet ||
		o.DNS.Upstream[0].String() != "192.0.2.53:53" || o.DNS.UpstreamFrom != "--dns-upstream" || strings.Join(o.AllowFlags, ",") != "allowed.test" ||
		o.Limits.MaxMemory != defaultMaxMemory || o.Version != version {
		t.Errorf("options: %+v", o)
	}
	s, err := session.New(o)
	if err != nil {
		t.Fatal(err)
	}
	s.WriteBanner(&stderr)
	if _, err := s.Close(); err != nil {
		t.Error(err)
	}
	if !strings.Contains(stderr.String(), "is not audited (--audit off)") {
		t.Errorf("stderr: %q", stderr.String())
	}
}
