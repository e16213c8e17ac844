package engine

import (
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/tunwall/tunwall/internal/audit"
	"github.com/tunwall/tunwall/internal/engine/enginetest"
	"github.com/tunwall/tunwall/internal/procattr"
	"github.com/tunwall/tunwall/stack"
)

// A DNS session waits for its owner at most dnsAttributionWait before its
// first answer, and each query's record at most recordAttributionWait
// after its answer: when the owner cannot be found, every query is still
// answered and recorded, once, with no owner (pid 0) and a note saying why.
func TestADNSQueryWhoseOwnerIsNeverFoundIsAnsweredAndRecordedWithinTheBound(t *testing.T) {
	r := newRig(t, allowTLS, func(c *Config) { c.Attr = enginetest.StalledAttr{} })
	serve, ok := r.e.UDP(stack.Flow{Proto: stack.UDP, Src: sandbox4, Dst: ap("192.0.2.53", 53)})
	if !ok {
		t.Fatal("a DNS session over UDP was refused")
	}
	c := serveUDP(t, serve)
	names := []string{"allowed.test", "denied.test", "www.allowed.test"}
	start := time.Now()
	buf := make([]byte, 512)
	for i, name := range names {
		m := new(dns.Msg)
		m.SetQuestion(dns.Fqdn(name), dns.TypeA)
		wire, _ := m.Pack()
		go c.Write(wire)
		c.SetReadDeadline(time.Now().Add(waitFor))
		n, err := c.Read(buf)
		if err != nil {
			t.Fatalf("query %d (%s): no answer: %v", i, name, err)
		}
		var resp dns.Msg
		if err := resp.Unpack(buf[:n]); err != nil || resp.Id != m.Id {
			t.Fatalf("query %d (%s): answer %v %v", i, name, &resp, err)
		}
		if i == 0 {
			// The answer waited for the owner, no longer than the bound
			// (plus what a loaded machine adds).
			if took := time.Since(start); took < dnsAttributionWait || took > dnsAttributionWait+time.Second {
				t.Errorf("first answer after %v, want the bound %v (and at most 1 s more)", took, dnsAttributionWait)
			}
		}
	}
	r.rec.WaitN(t, audit.KindDNS, len(names))
	bound := dnsAttributionWait + time.Duration(len(names))*recordAttributionWait
	if took := time.Since(start); took > bound+time.Second {
		t.Errorf("the records were written %v after the first query, want within %v (and at most 1 s more)", took, bound)
	}
	time.Sleep(2 * recordAttributionWait) // a duplicate would come meanwhile
	got := map[string]int{}
	for _, rec := range r.rec.All() {
		if rec.Kind != audit.KindDNS {
			continue
		}
		got[rec.Qname]++
		if rec.PID != 0 || rec.Comm != "" || rec.Owner != procattr.NoteOverloaded {
			t.Errorf("record of %s: pid %d comm %q owner %q; want pid 0 and owner %q", rec.Qname, rec.PID, rec.Comm, rec.Owner, procattr.NoteOverloaded)
		}
	}
	for _, name := range names {
		if got[name] != 1 {
			t.Errorf("%d records of %s, want 1 (all: %v)", got[name], name, got)
		}
	}
	if len(got) != len(names) {
		t.Errorf("records of %v, want one of each of %v", got, names)
	}
}
