package engine

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"

	"github.com/tunwall/tunwall/policy"
	"github.com/tunwall/tunwall/stack"
)

// The policy in effect can change while the engine runs (a phase switch, a
// reload: SetRules). Every decision reads it once (rules) and keeps what it
// read; the open-flow registry is where a change meets the flows decided
// under the rules before it.

// CheckRules says why SetRules would refuse rs, or nil.
func (e *Engine) CheckRules(rs *policy.RuleSet) error {
	if rs == nil {
		return errors.New("engine: no rules")
	}
	if rs.HasHTTP() && e.cfg.L7 == nil {
		return errors.New("the new rules have http or inject rules, and this run has no terminator for them (it started with a policy that has none): start the run with such a policy")
	}
	return nil
}

// liveRules is the policy in effect.
type liveRules struct {
	p  atomic.Pointer[policy.RuleSet]
	mu sync.Mutex // serialises SetRules
}

// rules is the policy in effect now: Config.Rules until SetRules.
func (e *Engine) rules() *policy.RuleSet {
	if rs := e.live.p.Load(); rs != nil {
		return rs
	}
	return e.cfg.Rules
}

// Rules returns the policy in effect now.
func (e *Engine) Rules() *policy.RuleSet { return e.rules() }

// errRevoked is the cause of a flow's context when a change of the policy
// cut it.
var errRevoked = errors.New("the policy in effect changed to one that denies this flow")

// Revoked is one open flow a change of the policy cut.
type Revoked struct {
	OpenFlow
	Reason string // why the new rules deny it
}

// SetRules makes rs the policy in effect. From the moment it returns,
// every decision uses rs: a new flow, a DNS query, a request on a flow
// tunwall terminates. The flows open under the rules before that rs would
// not allow, as they were decided (by name, or by address for a raw IP),
// are cut: their context ends, which resets a TCP flow both ways (the
// sandbox's connection and the upstream one) and ends a UDP session; each
// is recorded with outcome revoked. So is a terminated flow whose host's
// http or inject rules changed (what the terminator does with it would
// differ from what it was opened for). SetRules returns the cut flows;
// their records are written as their relays end.
//
// rs is refused, and the rules in effect stay, when it needs what this
// engine was not built with: a terminator for its http or inject rules.
func (e *Engine) SetRules(rs *policy.RuleSet) ([]Revoked, error) {
	if err := e.CheckRules(rs); err != nil {
		return nil, err
	}
	e.live.mu.Lock()
	defer e.live.mu.Unlock()
	e.live.p.Store(rs)
	e.askPhase(rs) // --ask (ask.go)
	if e.cfg.L7 != nil {
		e.cfg.L7.SetRules(rs)
	}
	// A flow decided under old that registers from now on sees rs in
	// admit (under open.mu): either it is in the registry below, or it
	// checks itself.
	cut, owners := e.revokeDenied(rs)
	// Who owns them, as OpenFlows says it: outside open.mu.
	for i, l := range owners {
		if o, ok := l.known(); ok {
			cut[i].PID, cut[i].Comm = o.PID, o.Comm
		}
	}
	return cut, nil
}

// revokeDenied cuts the open flows rs denies, and returns them and their
// owners' lookups.
func (e *Engine) revokeDenied(rs *policy.RuleSet) ([]Revoked, []*ownerLookup) {
	e.open.mu.Lock()
	defer e.open.mu.Unlock()
	var cut []Revoked
	var owners []*ownerLookup
	for _, x := range e.open.m {
		if x.rs == rs {
			continue
		}
		v, ok := e.stillAllowed(x, x.rs, rs)
		if ok {
			x.rs = rs
			continue
		}
		if x.revoked == "" {
			x.cut(errRevoked)
			x.revoked = v.Reason
			cut = append(cut, Revoked{OpenFlow: x.f, Reason: v.Reason})
			owners = append(owners, x.owner)
		}
	}
	return cut, owners
}

// stillAllowed reports whether rules now would allow the open flow x, which
// was allowed under was, and if not, the verdict that says why.
func (e *Engine) stillAllowed(x *openEntry, was, now *policy.RuleSet) (verdict, bool) {
	f := x.f
	proto := policy.TCP
	if x.proto == stack.UDP {
		proto = policy.UDP
	}
	port := f.Dst.Port()
	var d verdict
	if f.Host != "" {
		d = e.granted(now, DecideName(now, e.cfg.Learn, f.Host, port, proto), f.Host, port, proto)
	} else {
		d = DecideIP(now, e.cfg.Learn, f.Dst.Addr(), port, proto)
	}
	d.Phase = now.Phase()
	if !d.Allowed() {
		return d, false
	}
	if f.Dial.IsValid() {
		if g := now.CheckDial(f.Dial.Addr(), f.Dial.Port(), proto); !g.Allowed() {
			g.Phase = d.Phase
			return g, false
		}
	}
	if f.Host != "" && proto == policy.TCP && e.cfg.L7 != nil {
		if a, b := was.HTTPFor(f.Host, port), now.HTTPFor(f.Host, port); !a.Equal(b) {
			return verdict{Rule: d.Rule, Reason: "the http or inject rules of " + f.Host + " changed (a terminated flow is opened for the rules it was decided by)", Phase: d.Phase}, false
		}
	}
	return d, true
}

// admit enters fr into the open-flow registry, with the context its dial
// and relay use from then on: SetRules ends it to cut the flow. If the
// rules changed since fr was decided and the new ones deny it, fr is not
// entered, and admit returns the verdict that says why.
func (o *openFlows) admit(e *Engine, ctx context.Context, fr *flowRecord) (context.Context, verdict, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	now := e.rules()
	x := &openEntry{
		f:     OpenFlow{Proto: fr.f.Proto.String(), Src: fr.f.Src, Dst: fr.f.Dst, Host: fr.Host, Start: fr.start},
		proto: fr.f.Proto,
		owner: fr.owner,
		rs:    fr.rs,
		prog:  new(stack.Progress),
	}
	if fr.rs != now {
		if v, ok := e.stillAllowed(x, fr.rs, now); !ok {
			return ctx, v, false
		}
		x.rs = now
	}
	ctx, x.cut = context.WithCancelCause(ctx)
	fr.ctx, fr.prog = ctx, x.prog
	if o.m == nil {
		o.m = map[openKey]*openEntry{}
	}
	o.m[keyOf(fr)] = x
	return ctx, verdict{}, true
}
