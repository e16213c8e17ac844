package engine

import (
	"net/netip"
	"testing"
	"time"

	"github.com/tunwall/tunwall/stack"
)

func TestAFlowIsListedFromItsStartRecordUntilItsFlowRecord(t *testing.T) {
	r := newRig(t, allowTLS, nil)
	e := r.e
	t0 := time.Now()
	mk := func(port uint16, start time.Time) *flowRecord {
		fr := &flowRecord{f: stack.Flow{Proto: stack.TCP, Src: netip.MustParseAddrPort("10.0.0.2:40000"),
			Dst: netip.AddrPortFrom(netip.MustParseAddr("198.18.0.1"), port)}, start: start, rs: r.rules}
		fr.Host = "allowed.test"
		return fr
	}
	a, b := mk(80, t0), mk(443, t0.Add(time.Millisecond))
	e.admitOpen(t.Context(), b)
	e.admitOpen(t.Context(), a)
	e.open.dialled(a, netip.MustParseAddrPort("192.0.2.10:80"))
	got := e.OpenFlows()
	if len(got) != 2 || got[0].Dst.Port() != 80 || got[0].Dial.String() != "192.0.2.10:80" || got[1].Dial.IsValid() || got[0].Host != "allowed.test" {
		t.Fatalf("open flows %+v, want port 80 (dialled) then 443 (not yet)", got)
	}
	// Its copy ends it too (the SOCKS path records a copy).
	c := *a
	e.open.remove(&c)
	if got := e.OpenFlows(); len(got) != 1 || got[0].Dst.Port() != 443 {
		t.Errorf("after port 80's flow record: %+v", got)
	}
}
