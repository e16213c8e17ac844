// Package socks5 is tunwall's SOCKS5 client (RFC 1928, with RFC 1929
// username/password authentication): the upstream dialer used when allowed
// flows leave through a proxy (--upstream socks5://HOST:PORT).
//
// It owns the client side of the wire protocol: method negotiation,
// authentication, CONNECT and UDP ASSOCIATE requests, reply decoding and the
// SOCKS UDP datagram header. Hostnames are always sent to the proxy as
// hostnames (ATYP 0x03) and never resolved here: the proxy resolves them, so
// the DNS-rebinding decision for a proxied flow belongs to the proxy's
// operator, not to this package.
//
// It must not decide policy, log, keep global state, or dial anything other
// than the configured proxy (through Dialer.Forward). It uses only the
// standard library.
package socks5
