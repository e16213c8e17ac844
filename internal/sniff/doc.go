// Package sniff parses the first bytes a client sends on a TCP connection to
// learn the hostname it wants: the server_name of a TLS ClientHello, or the
// Host of an HTTP/1.x request head.
//
// It owns parsing only. It decides nothing (policy does), does no I/O, keeps
// no state between calls and logs nothing. Every parser fills a struct the
// caller owns, and its byte-slice fields alias the input, so parsing
// allocates nothing; the one exception is a TLS field that the sender split
// across records, which has to be copied to be contiguous.
//
// Parsers are incremental in the simplest way: the caller buffers what it has
// read so far and calls Parse again with the longer prefix after each read.
// The answer is NeedMore until the message is complete, then Done; NotThis as
// soon as the bytes seen so far cannot be that protocol, are malformed, or the
// message would exceed the size bound. NotThis and Done are final: a longer
// prefix of the same stream never changes them.
//
// It must not import anything outside the standard library, and must not
// treat a syntactically valid name as a trusted one: a sniffed name is only a
// claim by the client, to be checked by policy.
package sniff
