// Package l4 names the transport protocols tunwall decides on, once, for
// every package: the policy's rules and queries, the stack's flows, the
// engine and the audit log speak of the same Proto. It is the lowest of
// tunwall's packages: it imports only the standard library, and both the
// pure policy and the stack (which decides nothing) may import it.
package l4

import (
	"fmt"
	"strconv"
	"strings"
)

// Proto is the transport protocol of a flow or rule.
type Proto uint8

// The protocols. The zero Proto is not a protocol; no rule matches it.
const (
	TCP Proto = 1
	UDP Proto = 2
)

// String returns "tcp" or "udp" ("proto(N)" for anything else), the names
// the policy file and the audit log use.
func (p Proto) String() string {
	switch p {
	case TCP:
		return "tcp"
	case UDP:
		return "udp"
	}
	return "proto(" + strconv.Itoa(int(p)) + ")"
}

// ParseProto parses "tcp" or "udp", case-insensitively.
func ParseProto(s string) (Proto, error) {
	switch strings.ToLower(s) {
	case "tcp":
		return TCP, nil
	case "udp":
		return UDP, nil
	}
	return 0, fmt.Errorf("unknown proto %q (want tcp or udp)", s)
}
