// Package socksserver is tunwall's SOCKS5 front end (tunwall socks): a
// SOCKS5 server (github.com/things-go/go-socks5) whose clients' CONNECT and
// UDP ASSOCIATE requests, by name or by address, are decided, dialled,
// relayed and recorded by the engine, through its decision API for proxies
// (engine.Connect, engine.OpenUDP), as the TUN path's flows are through
// stack.Handler.
//
// It owns the server side of the SOCKS5 protocol, the UDP relay socket of
// each association and the shutdown drain. It decides nothing: a name is
// only normalized here (policy.NormalizeHost) and never resolved; the
// engine resolves it once the policy allows it. The reply to a request the
// engine did not open is chosen by the error's type (engine.ErrDenied,
// syscall.ECONNREFUSED), never by its text.
package socksserver
