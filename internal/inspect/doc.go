// Package inspect holds the name checks of a TCP flow (ARCHITECTURE.md:
// "names are read before bytes move") as an Inspector: a state machine
// over the bytes a client sends, one method per state, with no I/O (no
// connection, no clock, no goroutine). The caller reads the client's
// bytes, holds them, shows them to Next, and does what the Step says:
// wait for more, pass some on, reset the client, or answer with a 403.
//
//   - The client's first bytes are classified (sniff.Classify) whenever they
//     come, however late, and whoever spoke first. Neither TLS nor HTTP:
//     the flow is judged by its name alone and the inspector steps aside.
//   - TLS: the ClientHello is held until it is complete and parsed, then its
//     SNI must be the flow's name; after it TLS is opaque and passes as is.
//   - HTTP: every request head is held until complete and parsed, strictly,
//     and its Host must be the flow's name; bodies are followed (length,
//     chunked) to find the next head. After a WebSocket upgrade that the
//     server accepted (its 101, which the caller watches and reports with
//     Switched) bytes pass as is.
//   - Anything that is or may be TLS or HTTP and cannot be parsed whole and
//     unambiguously is refused (Refuse: the caller resets), and so is a
//     request that parses but asks for what cannot be checked (Forbid: a
//     403). Timing (the sniff timeout), buffers and their budget are the
//     caller's.
//
// Bytes that cannot complete anything a server acts on (the first word of
// what may become a request line) pass at once, so a protocol whose client
// sends a short token and waits is not held up.
//
// Whether a name is allowed is not decided here: a flow's name comes in
// Config, and on a flow to a raw IP the first name read is judged by the
// injected Config.Decide. The package imports only the parsers
// (internal/sniff), flow and policy's name normalisation.
//
// Glossary (one word per concept; docs/development.md has the whole list):
// a flow is one TCP or UDP connection the sandbox opens; a rule is one
// policy entry; a verdict is the decision on a flow (allow or deny, rule,
// reason); the inspector is this package's checker of a flow's client
// bytes; the terminator (internal/l7) ends TLS for hosts with http or
// inject rules.
package inspect
