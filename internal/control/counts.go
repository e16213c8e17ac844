package control

import (
	"sync"

	"github.com/tunwall/tunwall/internal/audit"
)

// maxRuleLabels bounds the distinct rules Counts keeps denials of, per
// phase; denials by further rules are counted under OtherRule. Rules are
// the policy's rule names and tunwall's own (default-deny, the guard, the
// audit bounds), never free text, so the bound is rarely reached.
const maxRuleLabels = 64

// OtherRule is the rule label of denials beyond maxRuleLabels distinct rules.
const OtherRule = "other"

// FlowKey, DenialKey and DNSKey label the counters of a Snapshot.
type (
	FlowKey struct {
		Phase, Verdict, Outcome string // Outcome "" for a denied flow
	}
	DenialKey struct {
		Phase, Kind, Rule string // Kind audit.KindFlow, KindDNS or KindHTTP
	}
	DNSKey struct {
		Phase, Verdict string
	}
)

// Counts counts what a session's audit records say: flows by verdict and
// outcome, denials by rule, DNS queries and HTTP requests by verdict, and
// the bytes of ended flows, per phase. Its methods may be called from any
// goroutine.
type Counts struct {
	mu       sync.Mutex
	flows    map[FlowKey]uint64
	denials  map[DenialKey]uint64
	dns      map[DNSKey]uint64
	http     map[DNSKey]uint64
	bytesOut map[string]uint64
	bytesIn  map[string]uint64
	rules    map[string]int // distinct rules of denials seen, per phase
}

// NewCounts returns empty counters.
func NewCounts() *Counts {
	return &Counts{
		flows: map[FlowKey]uint64{}, denials: map[DenialKey]uint64{}, dns: map[DNSKey]uint64{},
		http: map[DNSKey]uint64{}, bytesOut: map[string]uint64{}, bytesIn: map[string]uint64{},
		rules: map[string]int{},
	}
}

// Observe counts one record as the engine writes it (before the audit log
// folds repeated denials: each is counted). Start records are not
// counted: a flow counts once, when it ends or is denied.
func (c *Counts) Observe(r audit.Record) {
	if c == nil {
		return
	}
	phase := r.Phase
	allowed := r.Verdict == audit.VerdictAllow
	c.mu.Lock()
	defer c.mu.Unlock()
	switch r.Kind {
	case audit.KindFlow:
		k := FlowKey{Phase: phase, Verdict: r.Verdict}
		if allowed {
			k.Outcome = r.Outcome
		}
		c.flows[k]++
		if r.BytesOut > 0 {
			c.bytesOut[phase] += uint64(r.BytesOut)
		}
		if r.BytesIn > 0 {
			c.bytesIn[phase] += uint64(r.BytesIn)
		}
	case audit.KindDNS:
		c.dns[DNSKey{phase, r.Verdict}]++
	case audit.KindHTTP:
		c.http[DNSKey{phase, r.Verdict}]++
	default:
		return
	}
	if !allowed {
		c.denials[DenialKey{Phase: phase, Kind: r.Kind, Rule: c.ruleLocked(phase, r.Rule)}]++
	}
}

// ruleLocked is the label of rule: itself while the phase has seen fewer
// than maxRuleLabels distinct rules, else OtherRule.
func (c *Counts) ruleLocked(phase, rule string) string {
	for _, k := range []string{audit.KindFlow, audit.KindDNS, audit.KindHTTP} {
		if _, ok := c.denials[DenialKey{phase, k, rule}]; ok {
			return rule
		}
	}
	if c.rules[phase] >= maxRuleLabels {
		return OtherRule
	}
	c.rules[phase]++
	return rule
}

// Snapshot is a copy of the counters at one moment.
type Snapshot struct {
	Flows    map[FlowKey]uint64
	Denials  map[DenialKey]uint64
	DNS      map[DNSKey]uint64
	HTTP     map[DNSKey]uint64
	BytesOut map[string]uint64 // by phase
	BytesIn  map[string]uint64
}

// Snapshot copies the counters.
func (c *Counts) Snapshot() Snapshot {
	if c == nil {
		return Snapshot{}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return Snapshot{
		Flows: cloneMap(c.flows), Denials: cloneMap(c.denials), DNS: cloneMap(c.dns),
		HTTP: cloneMap(c.http), BytesOut: cloneMap(c.bytesOut), BytesIn: cloneMap(c.bytesIn),
	}
}

func cloneMap[K comparable](m map[K]uint64) map[K]uint64 {
	out := make(map[K]uint64, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// Totals sums a snapshot over its labels, for status.
func (s Snapshot) Totals() Totals {
	var t Totals
	for k, v := range s.Flows {
		if k.Verdict == audit.VerdictAllow {
			t.FlowsAllowed += v
		} else {
			t.FlowsDenied += v
		}
	}
	for k, v := range s.DNS {
		if k.Verdict == audit.VerdictAllow {
			t.DNSAllowed += v
		} else {
			t.DNSDenied += v
		}
	}
	for _, v := range s.BytesOut {
		t.BytesOut += v
	}
	for _, v := range s.BytesIn {
		t.BytesIn += v
	}
	return t
}

// Totals are the counts status shows.
type Totals struct {
	FlowsAllowed uint64 `json:"flows_allowed"`
	FlowsDenied  uint64 `json:"flows_denied"`
	DNSAllowed   uint64 `json:"dns_allowed"`
	DNSDenied    uint64 `json:"dns_denied"`
	BytesOut     uint64 `json:"bytes_out"`
	BytesIn      uint64 `json:"bytes_in"`
}
