// Package socks5 is tunwall's SOCKS5 client (RFC 1928, with RFC 1929
// username/password authentication): the upstream dialer used when allowed
// flows leave through a proxy (--upstream socks5://HOST:PORT).
//
// It owns the client side of the wire protocol: method negotiation,
// authentication, CONNECT and UDP ASSOCIATE requests, reply decoding and the
// SOCKS UDP datagram header. It sends what it is given: an IP literal as an
// address, a hostname as a hostname (ATYP 0x03), never resolved here.
// tunwall's engine gives it only addresses it resolved and checked with the
// rebinding guard, so that a proxy never resolves a name on the sandbox's
// behalf (ParseURL refuses socks5h:// for the same reason).
//
// It must not decide policy, log, keep global state, or dial anything other
// than the configured proxy (through Dialer.Forward). Its wire codec is
// go-socks5's statute package, the one tunwall's SOCKS5 server
// (internal/socksserver) speaks: one SOCKS5 codec per binary. (x/net/proxy
// has a CONNECT client, but no UDP ASSOCIATE and no way to send the
// checked address while reporting the proxy's reply code.)
package socks5
