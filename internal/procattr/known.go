package procattr

// Known returns a lookup already answered with o, for a caller that knows a
// flow's owner without a Resolver (a fake Resolver in another package's
// tests). Finish returns o and hints nothing.
func Known(o Owner) *Pending {
	p := &Pending{done: make(chan struct{}), owner: o}
	p.answered.Store(true)
	p.hinted.Store(true) // no Resolver to hint
	close(p.done)
	return p
}

// Unanswered returns a lookup that is never answered, for a fake Resolver
// whose lookups never finish (another package's tests of the bounds on
// waiting for one): Wait waits its whole bound, and Finish answers
// NoteOverloaded.
func Unanswered() *Pending {
	p := &Pending{done: make(chan struct{})}
	p.hinted.Store(true) // no Resolver to hint
	return p
}
