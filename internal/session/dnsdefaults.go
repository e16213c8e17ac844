package session

import "github.com/tunwall/tunwall/dnsintercept"

// The DNS defaults (DNSOptions' zero values mean them), for a front end's
// flags; the session builds the DNS server, so its front ends need not
// import dnsintercept.
const (
	DefaultDNSPoolSize = dnsintercept.DefaultPoolSize
	DefaultDNSPoolIdle = dnsintercept.DefaultReuseAfter
	DefaultDNSMaxTCP   = dnsintercept.DefaultMaxTCPConns
	DefaultDNSMaxUDP   = dnsintercept.DefaultMaxUDPSessions
)

// ResolvConf is a host's resolv.conf, parsed (dnsintercept.ResolvConf).
type ResolvConf = dnsintercept.ResolvConf

// ParseResolvConf parses a resolv.conf (dnsintercept.ParseResolvConf).
func ParseResolvConf(b []byte) (*ResolvConf, error) { return dnsintercept.ParseResolvConf(b) }
