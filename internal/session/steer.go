package session

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/tunwall/tunwall/internal/audit"
	"github.com/tunwall/tunwall/internal/control"
	"github.com/tunwall/tunwall/policy"
)

// Steering a running session: the policy in effect changes (a phase
// switch, a reload of the file), every decision from then on uses the new
// one, and the open flows it denies are cut. Each change is a record of
// kind phase in the audit log, with who asked, written before the change
// takes effect: a change the log cannot take is refused.

// errNoRebuild is the refusal of a change by a session without
// Options.Rebuild.
var errNoRebuild = errors.New("this run's policy cannot change: it came from a pipe or standard input, or from --allow rules alone (give --policy FILE)")

// SetPhase switches the session to phase of its policy file, as the file
// is on disk now.
func (s *Session) SetPhase(phase string, by control.Requester) (control.Change, error) {
	if s.o.Rebuild == nil {
		return control.Change{}, errNoRebuild
	}
	if phase == "" {
		return control.Change{}, errors.New("no phase given")
	}
	s.steerMu.Lock()
	defer s.steerMu.Unlock()
	rs, src, err := s.o.Rebuild(phase)
	if err != nil {
		return control.Change{}, err
	}
	return s.setRules(rs, src, by)
}

// Reload re-reads the policy file and makes the phase in effect, as the
// file now has it, the policy. A file that does not parse, or no longer
// has the phase, is refused with the error that says where, and the
// policy in effect stays.
func (s *Session) Reload(by control.Requester) (control.Change, error) {
	if s.o.Rebuild == nil {
		return control.Change{}, errNoRebuild
	}
	s.steerMu.Lock()
	defer s.steerMu.Unlock()
	rs, src, err := s.o.Rebuild(s.engine.Rules().Phase())
	if err != nil {
		return control.Change{}, err
	}
	return s.setRules(rs, src, by)
}

// setRules records the change, then makes rs the policy in effect.
func (s *Session) setRules(rs *policy.RuleSet, src []byte, by control.Requester) (control.Change, error) {
	from := s.engine.Rules().Phase()
	if err := s.engine.CheckRules(rs); err != nil {
		return control.Change{}, err
	}
	ch := control.Change{From: from, To: rs.Phase()}
	ch.Added, ch.Removed = policy.Diff(s.engine.Rules(), rs)
	if src != nil {
		sum := sha256.Sum256(src)
		ch.PolicySHA256 = hex.EncodeToString(sum[:])
	}
	if s.audit != nil {
		if err := s.recordChange(ch, by); err != nil {
			return control.Change{}, fmt.Errorf("the audit log cannot record the change (%v): the policy in effect stays", err)
		}
	}
	revoked, err := s.engine.SetRules(rs)
	if err != nil {
		return control.Change{}, err
	}
	s.phase.Store(&ch.To)
	if src != nil {
		s.polSHA.Store(&ch.PolicySHA256)
	}
	for _, r := range revoked {
		ch.Revoked = append(ch.Revoked, control.Revoked{Flow: controlFlow(r.OpenFlow, time.Now()), Reason: r.Reason})
	}
	if !s.o.Quiet {
		what := fmt.Sprintf("phase %s", ch.To)
		if from != ch.To {
			what = fmt.Sprintf("phase %s -> %s", from, ch.To)
		}
		fmt.Fprintf(s.o.Stderr, "tunwall: %s (asked by %s): %d rules added, %d removed, %d open flows revoked\n", what, by, len(ch.Added), len(ch.Removed), len(revoked))
		for _, r := range ch.Added {
			fmt.Fprintf(s.o.Stderr, "tunwall:   + %s\n", r)
		}
		for _, r := range ch.Removed {
			fmt.Fprintf(s.o.Stderr, "tunwall:   - %s\n", r)
		}
	}
	return ch, nil
}

// recordChange writes the record of kind phase and waits for it to be in
// the file.
func (s *Session) recordChange(ch control.Change, by control.Requester) error {
	reason := fmt.Sprintf("phase %s -> %s", ch.From, ch.To)
	if ch.PolicySHA256 != "" {
		reason += fmt.Sprintf(" (policy %s, sha256 %s)", s.o.PolicyFile, ch.PolicySHA256)
	}
	reason += ", asked by " + by.String()
	reason += rulesChanged("added", ch.Added) + rulesChanged("removed", ch.Removed)
	r := audit.Record{
		TS:     time.Now(),
		Kind:   audit.KindPhase,
		Phase:  ch.To,
		Rule:   by.Via,
		Reason: reason,
		PID:    int(by.PID),
		Comm:   by.Comm,
		Exe:    by.Exe,
	}
	if by.PID == 0 {
		r.Owner = "unknown"
	}
	t := time.NewTimer(10 * time.Second)
	defer t.Stop()
	select {
	case err := <-s.audit.Commit(r):
		return err
	case <-t.C:
		return errors.New("it did not take the record within 10s")
	}
}

// CanChange reports whether the session's policy can change while it runs
// (Options.Rebuild).
func (s *Session) CanChange() bool { return s.o.Rebuild != nil }

// maxRulesRecorded bounds the rules a phase record lists as added and as
// removed.
const maxRulesRecorded = 32

// rulesChanged is "; rules added: a, b" for a phase record.
func rulesChanged(what string, rules []string) string {
	if len(rules) == 0 {
		return ""
	}
	s := "; rules " + what + ": " + strings.Join(rules[:min(len(rules), maxRulesRecorded)], ", ")
	if len(rules) > maxRulesRecorded {
		s += fmt.Sprintf(" and %d more", len(rules)-maxRulesRecorded)
	}
	return s
}
