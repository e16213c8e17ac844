package main

import (
	"errors"
	"fmt"
	"io"
	"slices"

	"github.com/tunwall/tunwall/internal/session"
	"github.com/tunwall/tunwall/policy"
)

// selectWithOverlay is policy.Select, with the allow rules the overlay
// next to file (session.OverlayPath: "always" approvals of --ask) has for
// the selected phase added after extra.
func selectWithOverlay(file string, p *policy.Policy, phase string, extra []policy.Rule, g policy.Guard) (*policy.RuleSet, error) {
	rs, err := policy.Select(p, phase, extra, g)
	if err != nil || p == nil {
		return rs, err
	}
	ov, err := session.ReadOverlay(session.OverlayPath(file))
	if err != nil {
		return nil, err
	}
	add := ov.Rules(rs.Phase())
	if len(add) == 0 {
		return rs, nil
	}
	return policy.Select(p, rs.Phase(), append(slices.Clone(extra), add...), g)
}

// checkOverlay says what the overlay next to file holds (policy check):
// its allow rules per phase, and a phase the policy does not have. It
// returns false if the overlay does not parse.
func checkOverlay(file string, p *policy.Policy, stdout, stderr io.Writer) bool {
	path := session.OverlayPath(file)
	ov, err := session.ReadOverlay(path)
	if err != nil {
		printErrors(stderr, "", err)
		return false
	}
	if ov == nil {
		return true
	}
	for _, ph := range ov.Phases() {
		if !slices.Contains(p.Phases(), ph) {
			fmt.Fprintf(stdout, "%s: warning: phase %s is not in %s: its approvals are never read\n", path, ph, file)
			continue
		}
		for _, r := range ov.Rules(ph) {
			fmt.Fprintf(stdout, "%s: phase %s also allows %s (approved)\n", r.Source, ph, r)
		}
	}
	return true
}

// askOptions maps --ask, --decider and --ask-timeout to the session's
// options, starting the decider (now: under run and bwrap the sandbox
// exists already, so it inherits nothing of it). tunwall never prompts
// on its terminal: under run and bwrap the sandbox shares it (it could
// read the user's answer, or print a prompt of its own), which is said
// once here.
func (c *commonFlags) askOptions(stderr io.Writer) (session.AskOptions, error) {
	if !c.ask {
		if c.decider != "" {
			return session.AskOptions{}, errors.New("--decider needs --ask")
		}
		return session.AskOptions{}, nil
	}
	if c.askTimeout <= 0 {
		return session.AskOptions{}, errors.New("--ask-timeout must be positive")
	}
	if c.learn {
		return session.AskOptions{}, errors.New("--ask and --learn: learn mode allows what --ask would hold")
	}
	o := session.AskOptions{On: true, Timeout: c.askTimeout, Overlay: session.OverlayPath(c.policyFile)}
	if c.decider != "" {
		d, err := startDecider(c.decider, stderr)
		if err != nil {
			return session.AskOptions{}, err
		}
		o.Decider = d
	}
	if !c.quiet {
		by := "tunwall ctl pending lists them; tunwall ctl allow|deny ID decides"
		if c.decider != "" {
			by = "the decider, or tunwall ctl allow|deny ID, decides"
		}
		fmt.Fprintf(stderr, "tunwall: --ask: names only the default rule denies wait up to %v for a decision (%s); no prompt here: this terminal is not out of the sandbox's reach\n", c.askTimeout, by)
	}
	return o, nil
}
