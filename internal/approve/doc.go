// Package approve holds the requests tunwall --ask does not deny at once:
// a DNS name (or, later, a flow) that only the default rule would deny.
// It owns the pending set (its IDs, its bounds, the waiting), the standing
// approvals and denials of a run, the external decider's process
// (--decider) and the overlay file "always" appends to. It decides
// nothing about a flow itself: the engine asks it only about what the
// policy denied by default (not a deny rule, not the guard, not a
// placeholder or fronting check), and an answer comes from a person
// (tunwall ctl allow|deny) or the decider, or is a denial (timeout, a
// dead decider, a bound).
package approve
