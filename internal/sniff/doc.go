// Package sniff parses what a client sends on a TCP connection to learn the
// hostnames it wants: the server_name of a TLS ClientHello, and the Host of
// every HTTP/1.x request head on the connection.
//
// It owns parsing only. It decides nothing (policy and the engine do), does
// no I/O and logs nothing. Every parser fills a struct the caller owns, and
// its byte-slice fields alias the input, so parsing allocates nothing; the
// one exception is a TLS field that the sender split across records, which
// has to be copied to be contiguous.
//
// Classify is deliberately loose and the parsers deliberately strict: what
// any lenient server could take for TLS or HTTP is classified as such, and
// what the parsers cannot read unambiguously they refuse (NotThis, saying
// why in Bad), so that a caller that refuses NotThis never lets a name past
// that a server would read differently.
//
// Hello.Parse and Request.Parse are incremental in the simplest way: the
// caller buffers what it has read so far and calls Parse again with the
// longer prefix after each read; they keep no state between calls. The
// answer is NeedMore until the message is complete, then Done; NotThis as
// soon as the bytes seen so far cannot be that protocol, are malformed, or
// the message would exceed the size bound. NotThis and Done are final: a
// longer prefix of the same stream never changes them. Body (a request
// body's framing) and Switch (a server's answer to an Upgrade) follow a
// stream instead: they keep their state and are fed each read once.
//
// It must not import anything outside the standard library, and must not
// treat a syntactically valid name as a trusted one: a sniffed name is only a
// claim by the client, to be checked by policy.
package sniff
