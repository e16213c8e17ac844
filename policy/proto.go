package policy

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/tunwall/tunwall/flow"
)

// Proto is the transport protocol of a flow or rule: flow's, the one type
// the stack, the engine and the audit log use too.
type Proto = flow.Proto

// The protocols a rule can name. The zero Proto is not a protocol; no rule
// matches it.
const (
	TCP = flow.TCP
	UDP = flow.UDP
)

// AnyProto is the protocol of a deny rule that names none: it denies
// both TCP and UDP. Allow rules always name one protocol.
const AnyProto Proto = 0

// ParseProto parses "tcp" or "udp", case-insensitively (flow.ParseProto).
func ParseProto(s string) (Proto, error) { return flow.ParseProto(s) }

// Verdict is the outcome of a decision (flow's). The zero Verdict is Deny.
type Verdict = flow.Verdict

// The two verdicts.
const (
	Deny  = flow.Deny
	Allow = flow.Allow
)

// PortRange is an inclusive range of ports, 1 <= Lo <= Hi. A single port p is
// {p, p}; "*" is {1, 65535}. Port 0 is never in any range.
type PortRange struct{ Lo, Hi uint16 }

// Contains reports whether port lies in r.
func (r PortRange) Contains(port uint16) bool {
	return port != 0 && r.Lo <= port && port <= r.Hi
}

// String returns "443", "8000-8100" or "*" (for 1-65535).
func (r PortRange) String() string {
	switch {
	case r.Lo <= 1 && r.Hi == 65535:
		return "*"
	case r.Lo == r.Hi:
		return strconv.Itoa(int(r.Lo))
	}
	return strconv.Itoa(int(r.Lo)) + "-" + strconv.Itoa(int(r.Hi))
}

// defaultPorts is what a rule gets when it names no port.
func defaultPorts() []PortRange { return []PortRange{{443, 443}} }

// parsePortNumber parses a decimal port 1..65535.
func parsePortNumber(s string) (uint16, error) {
	if s == "" || strings.Trim(s, "0123456789") != "" {
		return 0, fmt.Errorf("bad port %q (want 1-65535, \"lo-hi\" or \"*\")", s)
	}
	digits := strings.TrimLeft(s, "0")
	if digits == "" {
		digits = "0"
	}
	if len(digits) > 5 {
		return 0, fmt.Errorf("port %s out of range 1-65535", digits)
	}
	n, err := strconv.Atoi(digits)
	if err != nil || n < 1 || n > 65535 {
		return 0, fmt.Errorf("port %s out of range 1-65535", digits)
	}
	return uint16(n), nil
}

// parsePortSpec parses one port item: "443", "8000-8100" or "*".
func parsePortSpec(s string) (PortRange, error) {
	if s == "*" {
		return PortRange{1, 65535}, nil
	}
	if lo, hi, ok := strings.Cut(s, "-"); ok {
		l, err := parsePortNumber(lo)
		if err != nil {
			return PortRange{}, err
		}
		h, err := parsePortNumber(hi)
		if err != nil {
			return PortRange{}, err
		}
		if l > h {
			return PortRange{}, fmt.Errorf("port range %q is reversed (want lo-hi with lo <= hi)", s)
		}
		return PortRange{l, h}, nil
	}
	p, err := parsePortNumber(s)
	if err != nil {
		return PortRange{}, err
	}
	return PortRange{p, p}, nil
}

// normalizePorts returns the ranges sorted by Lo with overlapping and
// adjacent ranges merged, in a new slice.
func normalizePorts(in []PortRange) []PortRange {
	rs := slices.Clone(in)
	slices.SortFunc(rs, func(a, b PortRange) int {
		if a.Lo != b.Lo {
			return int(a.Lo) - int(b.Lo)
		}
		return int(a.Hi) - int(b.Hi)
	})
	out := rs[:0]
	for _, r := range rs {
		if n := len(out); n > 0 && int(r.Lo) <= int(out[n-1].Hi)+1 {
			out[n-1].Hi = max(out[n-1].Hi, r.Hi)
			continue
		}
		out = append(out, r)
	}
	return out
}

// portsString joins normalized ranges with commas: "80,443,8000-8100".
func portsString(rs []PortRange) string {
	if len(rs) == 0 {
		return "none"
	}
	var b strings.Builder
	for i, r := range rs {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(r.String())
	}
	return b.String()
}

// portsContain reports whether any range contains port.
func portsContain(rs []PortRange, port uint16) bool {
	for _, r := range rs {
		if r.Contains(port) {
			return true
		}
	}
	return false
}
