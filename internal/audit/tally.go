package audit

import (
	"cmp"
	"slices"
	"strings"
)

// Totals counts the flows and DNS queries of a run, overall and per host.
type Totals struct {
	FlowsAllowed, FlowsDenied int
	DNSAllowed, DNSDenied     int
	BytesOut, BytesIn         int64
	// HTTPAllowed and HTTPDenied count the requests on terminated flows
	// (their bytes are in their flows').
	HTTPAllowed, HTTPDenied int
	// FlowsWouldDeny and DNSWouldDeny count the allowed flows and queries
	// that a learn-mode run allowed only because it was learning
	// (RuleLearn): enforce would have denied them.
	FlowsWouldDeny, DNSWouldDeny int
	// Lost is set by Writer.Totals only: records that are not in the file.
	Lost int
	// Hosts is sorted with hosts that saw a denial (or would have, under
	// enforce) first, then by flows,
	// then by DNS queries (both descending), then by name.
	Hosts []HostTotals
	// OtherHosts counts records about hosts beyond a Writer's cap on
	// distinct hosts; they are in the overall counts but not in Hosts.
	OtherHosts int
}

// HostTotals counts the records about one host. A record that is not
// VerdictAllow counts as denied.
type HostTotals struct {
	// Host is the record's host (else its qname) in lower case without a
	// trailing dot, or the destination IP when the record names no host.
	Host                      string
	FlowsAllowed, FlowsDenied int
	DNSAllowed, DNSDenied     int
	BytesOut, BytesIn         int64
	// Comms holds the distinct process names seen, first seen first, at most
	// maxComms of them; a record without a comm but with an owner note adds
	// the note in parentheses, e.g. "(gone)". MoreComms says some were left out.
	Comms     []string
	MoreComms bool
	// WouldDeny counts the allowed flows and queries that enforce would
	// have denied (RuleLearn); they are in the allowed counts too.
	WouldDeny int
	// DenyRule and DenyReason are those of the first denied record, or
	// else of the first that enforce would have denied.
	DenyRule, DenyReason string
}

// RuleLearn is the rule of a record a learn-mode run allowed that enforce
// would have denied; its reason says why enforce would have.
const RuleLearn = "learn"

// Flows returns the number of flows to the host.
func (h HostTotals) Flows() int { return h.FlowsAllowed + h.FlowsDenied }

// DNS returns the number of DNS queries for the host.
func (h HostTotals) DNS() int { return h.DNSAllowed + h.DNSDenied }

// Denied reports whether any flow or query about the host was denied.
func (h HostTotals) Denied() bool { return h.FlowsDenied+h.DNSDenied > 0 }

// DeniedOrWould reports whether the host saw a denial, or would have seen
// one under enforce: summaries list such hosts first.
func (h HostTotals) DeniedOrWould() bool { return h.Denied() || h.WouldDeny > 0 }

// Verdicts returns the verdicts the host's records had, joined by "+":
// "allow", "would-deny" (allowed by learn mode only) and "deny".
func (h HostTotals) Verdicts() string {
	var v []string
	if h.FlowsAllowed+h.DNSAllowed > h.WouldDeny {
		v = append(v, "allow")
	}
	if h.WouldDeny > 0 {
		v = append(v, "would-deny")
	}
	if h.Denied() {
		v = append(v, "deny")
	}
	if v == nil {
		return "allow"
	}
	return strings.Join(v, "+")
}

// maxComms bounds HostTotals.Comms.
const maxComms = 8

// Tally counts recs. Records of kinds other than flow and dns are ignored.
func Tally(recs []Record) Totals {
	var t tally
	for i := range recs {
		t.add(&recs[i])
	}
	return t.totals()
}

// tally accumulates Totals; its zero value is ready and unbounded.
type tally struct {
	t        Totals
	hosts    map[string]*HostTotals
	maxHosts int // 0 means no limit
}

// add counts r, a folded record as its count.
func (t *tally) add(r *Record) {
	allow := r.Verdict == VerdictAllow
	n := max(r.Count, 1)
	switch r.Kind {
	case KindFlow:
		if allow {
			t.t.FlowsAllowed += n
			if r.Rule == RuleLearn {
				t.t.FlowsWouldDeny += n
			}
		} else {
			t.t.FlowsDenied += n
		}
	case KindDNS:
		if allow {
			t.t.DNSAllowed += n
			if r.Rule == RuleLearn {
				t.t.DNSWouldDeny += n
			}
		} else {
			t.t.DNSDenied += n
		}
	case KindHTTP:
		if allow {
			t.t.HTTPAllowed += n
		} else {
			t.t.HTTPDenied += n
		}
		return
	default:
		return
	}
	t.t.BytesOut += r.BytesOut
	t.t.BytesIn += r.BytesIn

	key := hostKey(r)
	h := t.hosts[key]
	if h == nil {
		if t.maxHosts > 0 && len(t.hosts) >= t.maxHosts {
			t.t.OtherHosts += n
			return
		}
		if t.hosts == nil {
			t.hosts = make(map[string]*HostTotals)
		}
		h = &HostTotals{Host: key}
		t.hosts[key] = h
	}
	switch {
	case r.Kind == KindFlow && allow:
		h.FlowsAllowed += n
	case r.Kind == KindFlow:
		h.FlowsDenied += n
	case allow:
		h.DNSAllowed += n
	default:
		h.DNSDenied += n
	}
	h.BytesOut += r.BytesOut
	h.BytesIn += r.BytesIn
	learned := allow && r.Rule == RuleLearn
	if learned {
		h.WouldDeny += n
	}
	switch {
	case !allow && (h.DenyRule == "" || h.DenyRule == RuleLearn):
		h.DenyRule, h.DenyReason = r.Rule, r.Reason
	case learned && h.DenyRule == "":
		h.DenyRule, h.DenyReason = r.Rule, r.Reason
	}
	name := r.Comm
	if name == "" && r.Owner != "" {
		name = "(" + r.Owner + ")"
	}
	if name != "" && !slices.Contains(h.Comms, name) {
		if len(h.Comms) < maxComms {
			h.Comms = append(h.Comms, name)
		} else {
			h.MoreComms = true
		}
	}
}

// totals returns a deep copy of the counts with Hosts sorted.
func (t *tally) totals() Totals {
	out := t.t
	out.Hosts = make([]HostTotals, 0, len(t.hosts))
	for _, h := range t.hosts {
		c := *h
		c.Comms = slices.Clone(h.Comms)
		out.Hosts = append(out.Hosts, c)
	}
	slices.SortFunc(out.Hosts, func(a, b HostTotals) int {
		if a.DeniedOrWould() != b.DeniedOrWould() {
			if a.DeniedOrWould() {
				return -1
			}
			return 1
		}
		return cmp.Or(
			cmp.Compare(b.Flows(), a.Flows()),
			cmp.Compare(b.DNS(), a.DNS()),
			strings.Compare(a.Host, b.Host),
		)
	})
	return out
}

// hostKey names the host a record is about; records the Writer counted
// without a name (RuleOverflow, RuleMaxSize) are "(counted only)".
func hostKey(r *Record) string {
	name := r.Host
	if name == "" {
		name = r.Qname
	}
	if name != "" {
		return strings.ToLower(strings.TrimSuffix(name, "."))
	}
	if r.Dst.IsValid() {
		return r.Dst.Addr().String()
	}
	if r.Count > 0 {
		return "(counted only)"
	}
	return "(none)"
}
