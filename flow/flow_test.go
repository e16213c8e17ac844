package flow

import (
	"testing"

	"github.com/tunwall/tunwall/internal/testenv"
)

func TestProtoNamesRoundTrip(t *testing.T) {
	for _, p := range []Proto{TCP, UDP} {
		got, err := ParseProto(p.String())
		if err != nil || got != p {
			t.Errorf("ParseProto(%q) = %v, %v", p.String(), got, err)
		}
	}
	for _, s := range []string{"TCP", "Udp"} {
		if _, err := ParseProto(s); err != nil {
			t.Errorf("ParseProto(%q): %v", s, err)
		}
	}
	for _, s := range []string{"", "icmp", "tcp6", " tcp"} {
		if _, err := ParseProto(s); err == nil {
			t.Errorf("ParseProto(%q) succeeded", s)
		}
	}
	if s := Proto(0).String(); s != "proto(0)" {
		t.Errorf("Proto(0) = %q", s)
	}
}

// TestDeps proves flow stays the lowest package: the standard library only,
// nothing of tunwall's.
func TestDeps(t *testing.T) {
	const mod = "github.com/tunwall/tunwall"
	testenv.CheckDeps(t, "flow", []string{"net", "os/exec"}, []string{mod + "/flow"})
}

func TestTheZeroDecisionIsADenial(t *testing.T) {
	var d Decision
	if d.Allowed() || d.Verdict.String() != "deny" {
		t.Fatalf("zero Decision: allowed %v, %v", d.Allowed(), d.Verdict)
	}
	if !(Decision{Verdict: Allow}).Allowed() || Allow.String() != "allow" || Verdict(7).String() != "verdict(7)" {
		t.Fatal("Allow")
	}
}
