package dnsintercept

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// ResolvConf is what tunwall takes from the host's resolv.conf(5): the
// nameservers its own resolver asks (in order, with failover), and the
// settings the sandbox's resolver library applies itself (search list,
// ndots, timeout, attempts and a few flags), which tunwall writes into the
// sandbox's resolv.conf so that short names behave as on the host.
type ResolvConf struct {
	// Servers are the valid "nameserver" lines in order, port 53. An IPv6
	// zone ("fe80::1%eth0") is kept.
	Servers []netip.AddrPort
	// Search is the search list: the last "search" or "domain" line wins,
	// as in glibc. Invalid domains are skipped.
	Search []string
	// Options are the resolver options carried into the sandbox, in the
	// host's order, normalized ("ndots:2", "timeout:1", "attempts:3",
	// "single-request", "single-request-reopen", "no-tld-query",
	// "no-aaaa", "use-vc"). Others (edns0, trust-ad: tunwall writes those
	// itself; rotate, inet6, debug) are not carried.
	Options []string
	// Timeout is the host's "options timeout:N" (0 when not set): how long
	// one server is waited for.
	Timeout time.Duration

	noServer error // why Servers is empty, for ReadResolvConf
}

// HostResolvConf reads the first valid nameserver from a resolv.conf-format file
// (the default upstream when none is configured) and returns it with port
// 53. An IPv6 zone ("fe80::1%eth0") is kept.
func HostResolvConf(path string) (netip.AddrPort, error) {
	rc, err := ReadResolvConf(path)
	if err != nil {
		return netip.AddrPort{}, err
	}
	return rc.Servers[0], nil
}

// ReadResolvConf parses a resolv.conf-format file. It fails when the file
// cannot be read or names no valid nameserver; a file without nameservers
// whose search list is still wanted can be read with ParseResolvConf.
func ReadResolvConf(path string) (*ResolvConf, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("dnsintercept: read resolver config: %w", err)
	}
	rc, err := ParseResolvConf(b)
	if err == nil && len(rc.Servers) == 0 {
		err = rc.noServer
	}
	if err != nil {
		return nil, fmt.Errorf("dnsintercept: %s: %w", path, err)
	}
	return rc, nil
}

// maxCarriedTimeout caps "options timeout:N" (glibc caps it at 30 s too).
const maxCarriedTimeout = 30

// ParseResolvConf parses a resolv.conf(5). nameserver lines that do not hold
// an IP address are skipped, as glibc does; '#' and ';' start comments. It
// fails only when a line is too long to read (over 1 MiB).
func ParseResolvConf(b []byte) (*ResolvConf, error) {
	rc := &ResolvConf{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	line := 0
	var bad error // the first unparsable nameserver, for the error message
	opts := resolvOptions{vals: map[string]string{}}
	for sc.Scan() {
		line++
		text := sc.Text()
		if i := strings.IndexAny(text, "#;"); i >= 0 {
			text = text[:i]
		}
		fields := strings.Fields(text)
		if len(fields) == 0 {
			continue
		}
		switch fields[0] {
		case "nameserver":
			if len(fields) < 2 {
				continue
			}
			if err := rc.addNameserver(fields[1]); err != nil && bad == nil {
				bad = fmt.Errorf("line %d: %w", line, err)
			}
		case "domain", "search":
			rc.setSearch(fields[0], fields[1:])
		case "options":
			rc.parseOptions(fields[1:], &opts)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("line %d: %w", line+1, err)
	}
	rc.Options = opts.list()
	if len(rc.Servers) == 0 {
		rc.noServer = errors.New("no nameserver line")
		if bad != nil {
			rc.noServer = fmt.Errorf("no valid nameserver line (%w)", bad)
		}
	}
	return rc, nil
}

// addNameserver adds a nameserver line's address (port 53, once). An
// argument that is not an IP address is an error; the caller skips the
// line, as glibc does.
func (rc *ResolvConf) addNameserver(arg string) error {
	addr, err := netip.ParseAddr(arg)
	if err != nil {
		return fmt.Errorf("nameserver %q is not an IP address", arg)
	}
	ap := netip.AddrPortFrom(addr.Unmap(), 53)
	if !slices.Contains(rc.Servers, ap) {
		rc.Servers = append(rc.Servers, ap)
	}
	return nil
}

// setSearch replaces the search list with a search line's valid names
// (once each), or a domain line's first name.
func (rc *ResolvConf) setSearch(directive string, names []string) {
	rc.Search = rc.Search[:0:0]
	for _, d := range names {
		d = normalizeName(d)
		if validHostname(d) && !slices.Contains(rc.Search, d) {
			rc.Search = append(rc.Search, d)
		}
		if directive == "domain" {
			break // domain takes one name
		}
	}
}

// parseOptions records an options line's known options into opts,
// clamping numbers as glibc does (and carrying timeout into rc.Timeout);
// malformed or unknown ones are ignored, as glibc ignores them.
func (rc *ResolvConf) parseOptions(args []string, opts *resolvOptions) {
	for _, o := range args {
		key, val, hasVal := strings.Cut(o, ":")
		switch key {
		case "ndots", "timeout", "attempts":
			if !hasVal {
				continue
			}
			n, err := strconv.Atoi(val)
			if err != nil || n < 0 {
				continue // glibc ignores it too
			}
			switch key {
			case "ndots":
				n = min(n, 15)
			case "timeout":
				n = min(max(n, 1), maxCarriedTimeout)
				rc.Timeout = time.Duration(n) * time.Second
			case "attempts":
				n = min(max(n, 1), 5)
			}
			opts.set(key, strconv.Itoa(n))
		case "single-request", "single-request-reopen", "no-tld-query", "no-aaaa", "use-vc":
			if !hasVal {
				opts.set(key, "")
			}
		}
	}
}

// resolvOptions holds the options of a resolv.conf, each once, in the
// order first seen; a later value replaces an earlier one.
type resolvOptions struct {
	vals  map[string]string
	order []string
}

func (o *resolvOptions) set(key, val string) {
	if _, ok := o.vals[key]; !ok {
		o.order = append(o.order, key)
	}
	o.vals[key] = val
}

// list is the options as resolv.conf spells them: KEY or KEY:VALUE.
func (o *resolvOptions) list() []string {
	var out []string
	for _, k := range o.order {
		if v := o.vals[k]; v != "" {
			out = append(out, k+":"+v)
		} else {
			out = append(out, k)
		}
	}
	return out
}
