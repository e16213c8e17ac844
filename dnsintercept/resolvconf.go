package dnsintercept

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strings"
)

// HostResolvConf reads the first valid nameserver from a resolv.conf-format file
// (the default upstream when none is configured) and returns it with port
// 53. An IPv6 zone ("fe80::1%eth0") is kept.
func HostResolvConf(path string) (netip.AddrPort, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("dnsintercept: read resolver config: %w", err)
	}
	ap, err := parseResolvConf(b)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("dnsintercept: %s: %w", path, err)
	}
	return ap, nil
}

// parseResolvConf returns the first valid "nameserver ADDR" of a
// resolv.conf; nameserver lines that do not hold an IP address are skipped,
// as glibc does. '#' and ';' start comments.
func parseResolvConf(b []byte) (netip.AddrPort, error) {
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	line := 0
	var bad error // the first unparsable nameserver, for the error message
	for sc.Scan() {
		line++
		text := sc.Text()
		if i := strings.IndexAny(text, "#;"); i >= 0 {
			text = text[:i]
		}
		fields := strings.Fields(text)
		if len(fields) < 2 || fields[0] != "nameserver" {
			continue
		}
		addr, err := netip.ParseAddr(fields[1])
		if err != nil {
			if bad == nil {
				bad = fmt.Errorf("line %d: nameserver %q is not an IP address", line, fields[1])
			}
			continue // glibc skips such lines too
		}
		return netip.AddrPortFrom(addr.Unmap(), 53), nil
	}
	if err := sc.Err(); err != nil {
		return netip.AddrPort{}, fmt.Errorf("line %d: %w", line+1, err)
	}
	if bad != nil {
		return netip.AddrPort{}, fmt.Errorf("no valid nameserver line (%w)", bad)
	}
	return netip.AddrPort{}, errors.New("no nameserver line")
}
