package session

import (
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/tunwall/tunwall/dnsintercept"
	"github.com/tunwall/tunwall/internal/audit"
	"github.com/tunwall/tunwall/internal/engine"
	"github.com/tunwall/tunwall/stack"
)

// LimitSummary is what the end-of-run summary says about packets and flows
// the stack dropped or refused.
func LimitSummary(st stack.Stats, refusedUnrecorded uint64) []string {
	var out []string
	if st.ForeignSource > 0 {
		out = append(out, fmt.Sprintf("dropped %d packets whose source address is not the sandbox's", st.ForeignSource))
	}
	if st.TCPLimitReset > 0 {
		out = append(out, fmt.Sprintf("reset %d SYNs: too many concurrent TCP flows (--max-tcp-flows)", st.TCPLimitReset))
	}
	if st.TCPInFlightReset > 0 {
		out = append(out, fmt.Sprintf("reset %d SYNs: too many TCP handshakes already in progress (--max-tcp-handshakes)", st.TCPInFlightReset))
	}
	if st.TCPDestReset > 0 {
		out = append(out, fmt.Sprintf("reset %d SYNs: too many TCP handshakes in progress to one destination (4x --max-dials-per-dest)", st.TCPDestReset))
	}
	if st.UDPLimitRefused > 0 {
		out = append(out, fmt.Sprintf("refused %d UDP sessions: too many concurrent sessions (--max-udp-sessions)", st.UDPLimitRefused))
	}
	if st.MemoryRefused > 0 {
		out = append(out, fmt.Sprintf("refused %d flows: tunwall's memory was near --max-memory", st.MemoryRefused))
	}
	if st.HandshakeTimeouts > 0 {
		out = append(out, fmt.Sprintf("%d TCP handshakes were not completed by the sandbox within --tcp-handshake-timeout", st.HandshakeTimeouts))
	}
	if refusedUnrecorded > 0 {
		out = append(out, fmt.Sprintf("%d refused flows were counted but not recorded one by one (too many at once)", refusedUnrecorded))
	}
	return out
}

// printDNSLimits says which DNS limits were reached, if any.
func printDNSLimits(w io.Writer, d dnsintercept.Stats) {
	var parts []string
	for _, p := range []struct {
		n    uint64
		what string
	}{
		{d.Evicted, "idle sessions closed to make room"},
		{d.Refused, "sessions refused with every one busy"},
		{d.Overrun, "UDP queries dropped with too many in flight"},
		{d.UpstreamBusy, "queries answered SERVFAIL with the upstream busy"},
		{d.Exhausted, "refused with the fake-address pool full"},
	} {
		if p.n > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", p.n, p.what))
		}
	}
	if len(parts) > 0 {
		fmt.Fprintf(w, "tunwall: DNS limits reached: %s\n", strings.Join(parts, ", "))
	}
}

// printSummary prints the end-of-run summary of the log at path: totals,
// what enforce would have denied (learn mode), the hosts (denied ones first, then the busiest; five at most), lost
// records, and how to verify the log.
func printSummary(w io.Writer, path string, t audit.Totals, sum audit.Summary) {
	fmt.Fprintf(w, "tunwall: %d flows allowed, %d denied; %d DNS queries answered, %d denied; %s out, %s in\n",
		t.FlowsAllowed, t.FlowsDenied, t.DNSAllowed, t.DNSDenied, HumanBytes(t.BytesOut), HumanBytes(t.BytesIn))
	if t.FlowsWouldDeny+t.DNSWouldDeny > 0 {
		fmt.Fprintf(w, "tunwall: learn mode: enforcing would deny %d of those flows and %d of those DNS queries (the hosts marked would-deny); tunwall policy suggest %s writes a policy that allows what ran\n",
			t.FlowsWouldDeny, t.DNSWouldDeny, path)
	}
	hosts := append([]audit.HostTotals(nil), t.Hosts...)
	sort.SliceStable(hosts, func(i, j int) bool {
		if hosts[i].DeniedOrWould() != hosts[j].DeniedOrWould() {
			return hosts[i].DeniedOrWould()
		}
		return hosts[i].Flows()+hosts[i].DNS() > hosts[j].Flows()+hosts[j].DNS()
	})
	for i, h := range hosts {
		if i == 5 {
			fmt.Fprintf(w, "tunwall:   ... and %d more hosts\n", len(hosts)-5+t.OtherHosts)
			break
		}
		fmt.Fprintf(w, "tunwall:   %-40s %-10s %d flows, %d DNS\n", TruncateMiddle(engine.Printable(h.Host), 40), h.Verdicts(), h.Flows(), h.DNS())
	}
	if sum.Lost > 0 {
		fmt.Fprintf(w, "tunwall: WARNING: %d audit records could not be written\n", sum.Lost)
	}
	// Count is the lines before the trailer, the header among them; the
	// records are the rest, as audit verify counts them.
	fmt.Fprintf(w, "tunwall: audit log %s (%d records, last sha256 %s); check it with: tunwall audit verify %s --expect %s\n",
		path, max(sum.Count-1, 0), sum.Last, path, sum.Last)
}

// HumanBytes writes n bytes with a binary unit (B, KiB, MiB, GiB).
func HumanBytes(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

// TruncateMiddle shortens s to at most n characters (runes) by cutting its
// middle, so that a table fits 100 columns and both ends of a long name
// (the subdomain and the registered domain) stay readable.
func TruncateMiddle(s string, n int) string {
	r := []rune(s)
	if len(r) <= n || n < 3 {
		return s
	}
	head := (n - 1) / 2
	tail := n - 1 - head
	return string(r[:head]) + "…" + string(r[len(r)-tail:])
}
