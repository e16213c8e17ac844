package session

import (
	"bytes"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/tunwall/tunwall/dnsintercept"
	"github.com/tunwall/tunwall/internal/audit"
	"github.com/tunwall/tunwall/internal/netplan"
	"github.com/tunwall/tunwall/stack"
)

func TestLongNamesAreTruncatedInTheMiddle(t *testing.T) {
	long := strings.Repeat("a", 200) + ".example.com"
	got := TruncateMiddle(long, 40)
	if utf8.RuneCountInString(got) != 40 || !strings.HasPrefix(got, "aaaa") || !strings.HasSuffix(got, ".example.com") || !strings.Contains(got, "…") {
		t.Errorf("TruncateMiddle = %q", got)
	}
	if TruncateMiddle("short.test", 40) != "short.test" {
		t.Error("a short name changed")
	}
	line := fmt.Sprintf("tunwall:   %-40s %-5s %d flows, %d DNS", TruncateMiddle(long, 40), "allow", 123456, 123456)
	if n := utf8.RuneCountInString(line); n > 100 {
		t.Errorf("summary line of %d columns", n)
	}
}

func TestHumanBytes(t *testing.T) {
	for n, want := range map[int64]string{0: "0 B", 1023: "1023 B", 1536: "1.5 KiB", 5 << 20: "5.0 MiB", 3 << 30: "3.0 GiB"} {
		if got := HumanBytes(n); got != want {
			t.Errorf("HumanBytes(%d) = %q, want %q", n, got, want)
		}
	}
}

// TestTheSummaryListsDeniedHostsFirstThenTheBusiest pins the end-of-run
// summary's shape: totals, at most five hosts with the denied first, the
// lost records, and how to verify the log.
func TestTheSummaryListsDeniedHostsFirstThenTheBusiest(t *testing.T) {
	tot := audit.Totals{FlowsAllowed: 9, FlowsDenied: 1, DNSAllowed: 4, DNSDenied: 2, BytesOut: 2048, BytesIn: 3 << 20, OtherHosts: 3}
	tot.Hosts = append(tot.Hosts, []audit.HostTotals{
		{Host: "quiet.test", FlowsAllowed: 1},
		{Host: "busy.test", FlowsAllowed: 5, DNSAllowed: 3},
		{Host: "evil.test", FlowsDenied: 1},
		{Host: "b.test", FlowsAllowed: 1}, {Host: "c.test", FlowsAllowed: 1}, {Host: "d.test", FlowsAllowed: 1},
	}...)
	var b bytes.Buffer
	printSummary(&b, "/x/audit.jsonl", tot, audit.Summary{Count: 17, Last: "abc", Lost: 2})
	lines := strings.Split(strings.TrimRight(b.String(), "\n"), "\n")
	want := []string{
		"tunwall: 9 flows allowed, 1 denied; 4 DNS queries answered, 2 denied; 2.0 KiB out, 3.0 MiB in",
		"tunwall:   evil.test",
		"tunwall:   busy.test",
	}
	for i, w := range want {
		if !strings.HasPrefix(lines[i], w) {
			t.Errorf("line %d = %q, want it to begin %q", i, lines[i], w)
		}
	}
	if !strings.Contains(b.String(), "... and 4 more hosts") || !strings.Contains(b.String(), "WARNING: 2 audit records could not be written") ||
		!strings.HasSuffix(b.String(), "check it with: tunwall audit verify /x/audit.jsonl --expect abc\n") {
		t.Errorf("summary:\n%s", b.String())
	}
}

func TestLimitAndDNSLinesSayOnlyWhatHappened(t *testing.T) {
	if got := LimitSummary(stack.Stats{}, 0); len(got) != 0 {
		t.Errorf("nothing happened, yet: %q", got)
	}
	got := LimitSummary(stack.Stats{ForeignSource: 1, TCPLimitReset: 2, TCPInFlightReset: 3, UDPLimitRefused: 4, MemoryRefused: 5, HandshakeTimeouts: 6}, 7)
	if len(got) != 7 || !strings.Contains(got[1], "reset 2 SYNs") || !strings.Contains(got[6], "7 refused flows") {
		t.Errorf("LimitSummary = %q", got)
	}
	var b bytes.Buffer
	printDNSLimits(&b, dnsStats(0))
	if b.Len() != 0 {
		t.Errorf("no DNS limit reached, yet: %q", b.String())
	}
	printDNSLimits(&b, dnsStats(1))
	if !strings.HasPrefix(b.String(), "tunwall: DNS limits reached: 1 idle sessions closed to make room, 1 sessions refused") {
		t.Errorf("DNS limits line: %q", b.String())
	}
}

func TestTheHostGuardHoldsThePlanAndThisHostsPublicAddresses(t *testing.T) {
	ipnet := func(s string) net.Addr {
		p := netip.MustParsePrefix(s)
		return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
	}
	g := hostGuard(netplan.Default, []net.Addr{ipnet("127.0.0.1/8"), ipnet("10.1.2.3/8"), ipnet("203.0.113.5/24"), ipnet("2001:db8::7/64"), ipnet("fe80::1/64")})
	want := []string{"198.18.0.0/15", "fd74:756e:7761:6c6c::/63", "203.0.113.5/32", "2001:db8::7/128"}
	var got []string
	for _, p := range g {
		got = append(got, p.String())
	}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("hostGuard = %v, want %v (loopback, private and link-local are guarded already)", got, want)
	}
	if g := HostGuard(netplan.Plan{}); len(g) < 2 || g[0] != netplan.Default.Fake4 {
		t.Errorf("HostGuard of the zero plan = %v, want the default plan's ranges first", g)
	}
}

func dnsStats(n uint64) (d dnsintercept.Stats) {
	d.Evicted, d.Refused, d.Overrun, d.UpstreamBusy, d.Exhausted = n, n, n, n, n
	return d
}
