package policy

import (
	"errors"
	"net/netip"
	"reflect"
	"strings"
	"testing"

	"golang.org/x/net/publicsuffix"

	"github.com/tunwall/tunwall/flow"
)

// FuzzParse: Parse never panics; every error is a *ParseError with a
// sensible position; every accepted rule survives a trip through its
// String form and ParseAllow; every phase can be selected.
func FuzzParse(f *testing.F) {
	f.Add([]byte(specExample))
	f.Add([]byte(matchPolicy))
	f.Add([]byte(twoPhases))
	f.Add([]byte(credsPolicy))
	f.Add([]byte("version: 1\nphases:\n  exec:\n    allow:\n      - cidr: \"[2001:db8::/64]\"\n        ports: [\"1-2\", \"*\"]\n"))
	f.Add([]byte("version: 1\nphases:\n  a: {allow: [{host: x.example, ports: [1]}]}\ndns: {upstream: \"[2001:db8::1]:53\"}\n"))
	f.Add([]byte("version: 1\nphases: &a\n  b: *a\n"))
	f.Add([]byte("- [a, {b: c}]\n"))
	f.Add([]byte(""))
	f.Add([]byte(denyPolicy))
	f.Add([]byte(publicPolicy))
	f.Add([]byte("version: 1\nphases:\n  b: {default: public, deny: [{cidr: \"10.0.0.0/8\", proto: udp}]}\n"))
	f.Fuzz(func(t *testing.T, src []byte) {
		p, err := Parse("f.yaml", src)
		if err != nil {
			var pe *ParseError
			if !errors.As(err, &pe) {
				t.Fatalf("error %v is %T, not *ParseError", err, err)
			}
			if pe.File != "f.yaml" || pe.Line < 0 || pe.Col < 0 || pe.Msg == "" {
				t.Fatalf("bad ParseError %#v", pe)
			}
			// YAML breaks lines at \n, \r, NEL, LS and PS.
			breaks := strings.Count(string(src), "\n") + strings.Count(string(src), "\r") +
				strings.Count(string(src), "\u0085") + strings.Count(string(src), "\u2028") + strings.Count(string(src), "\u2029")
			if pe.Line > breaks+2 {
				t.Fatalf("ParseError line %d past the end of a file with %d line breaks: %v", pe.Line, breaks, err)
			}
			return
		}
		if len(p.Phases()) == 0 {
			t.Fatal("Parse accepted a policy without phases")
		}
		for _, ph := range p.Phases() {
			rules := p.Rules(ph)
			if len(rules) == 0 && p.Default(ph) != DefaultPublic {
				t.Fatalf("phase %q has no rules and default %q", ph, p.Default(ph))
			}
			for _, r := range p.DenyRules(ph) {
				if r.terminates() || r.CA != "" || len(r.Ports) == 0 {
					t.Fatalf("deny rule %s of phase %q has http, inject, ca or no ports", r, ph)
				}
			}
			for _, r := range rules {
				checkCanonical(t, r)
			}
			if _, err := Select(p, ph, nil, Guard{}); err != nil {
				t.Fatalf("Select(%q): %v", ph, err)
			}
		}
	})
}

// checkCanonical asserts r is canonical and round-trips through ParseAllow.
func checkCanonical(t *testing.T, r Rule) {
	t.Helper()
	n, err := r.normalized()
	if err != nil {
		t.Fatalf("rule %+v is not valid: %v", r, err)
	}
	if !reflect.DeepEqual(n, r) {
		t.Fatalf("rule %+v is not canonical: %+v", r, n)
	}
	back, err := ParseAllow(r.String())
	if err != nil {
		t.Fatalf("ParseAllow(%q): %v", r.String(), err)
	}
	back.Source = r.Source
	// The HTTP layer has no --allow form.
	back.HTTP, back.Inject, back.CA = r.HTTP, r.Inject, r.CA
	if !reflect.DeepEqual(back, r) {
		t.Fatalf("ParseAllow(%q) = %+v, want %+v", r.String(), back, r)
	}
}

// FuzzParseAllow: ParseAllow never panics, and what it accepts is canonical
// and round-trips through String.
func FuzzParseAllow(f *testing.F) {
	for _, s := range []string{
		"pypi.org", "pypi.org:80", "*.x.org:443/udp", "example.test:*", "example.test:8000-8100,22",
		"192.0.2.1", "192.0.2.0/24:5432/udp", "2001:db8::1", "[2001:db8::/64]:53/udp", "[::ffff:192.0.2.1]",
		"bücher.example", "[", "]:", "::", "/udp", "a:b:c", "*.", "0:0",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := ParseAllow(s)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "--allow ") {
				t.Fatalf("error %q does not name the flag", err)
			}
			return
		}
		if r.Source != "--allow "+s {
			t.Fatalf("Source = %q", r.Source)
		}
		checkCanonical(t, r)
		if _, err := Select(nil, "", []Rule{r}, Guard{}); err != nil {
			t.Fatalf("Select rejected a parsed rule: %v", err)
		}
	})
}

// FuzzWildcard: "*.S" never matches S itself nor any name that does not end
// in ".S"; and it matches every valid name that does.
func FuzzWildcard(f *testing.F) {
	f.Add("x.org", "x.org")
	f.Add("x.org", "evilx.org")
	f.Add("x.org", "a.x.org")
	f.Add("x.org", "A.X.ORG.")
	f.Add("pythonhosted.org", "files.pythonhosted.org.evil.test")
	f.Add("bücher.example", "a.xn--bcher-kva.example")
	f.Add("x.org", "a..x.org")
	f.Add("x.org", ".x.org")
	f.Fuzz(func(t *testing.T, suffix, host string) {
		w, err := NormalizeHost("*." + suffix)
		if err != nil || strings.Count(w, "*") != 1 {
			return
		}
		canonSuffix := w[2:]
		rs, err := Select(nil, "", []Rule{{Host: w, Ports: []PortRange{{1, 65535}}, Proto: TCP, Source: "fuzz"}}, Guard{})
		if err != nil {
			t.Fatalf("Select(%q): %v", w, err)
		}
		d := rs.DecideName(host, 443, TCP)
		na := rs.NameAllowed(host)
		// They agree, but on a query name that is no host name (an
		// underscore label, a label with a hyphen at its edge): DNS may
		// answer it, no flow goes to it.
		if d.Allowed() && !na.Allowed() {
			t.Fatalf("DecideName %+v allows %q, which NameAllowed %+v does not answer", d, host, na)
		}
		ascii := strings.ToLower(strings.TrimSuffix(host, "."))
		queryOnly := flow.CheckName(ascii, flow.QueryName) == "" && flow.CheckName(ascii, flow.Hostname) != ""
		if na.Allowed() && !d.Allowed() && !queryOnly {
			t.Fatalf("DecideName %+v and NameAllowed %+v disagree on %q", d, na, host)
		}
		h, herr := NormalizeHost(host)
		if d.Allowed() {
			lower := strings.ToLower(strings.TrimSuffix(host, "."))
			if herr == nil {
				lower = h
			}
			if lower == canonSuffix || !strings.HasSuffix(lower, "."+canonSuffix) {
				t.Fatalf("%s matched %q (canonical %q)", w, host, lower)
			}
		}
		if herr == nil && !strings.HasPrefix(h, "*.") && strings.HasSuffix(h, "."+canonSuffix) && !d.Allowed() {
			t.Fatalf("%s did not match %q (canonical %q): %+v", w, host, h, d)
		}
		// An exact rule for the suffix matches only the suffix.
		rs2, err := Select(nil, "", []Rule{{Host: canonSuffix, Ports: []PortRange{{443, 443}}, Proto: TCP}}, Guard{})
		if err != nil {
			t.Fatalf("Select(%q): %v", canonSuffix, err)
		}
		if d2 := rs2.DecideName(host, 443, TCP); d2.Allowed() && (herr != nil || h != canonSuffix) {
			t.Fatalf("exact rule %q matched %q", canonSuffix, host)
		}
	})
}

// FuzzDecide: whatever a rule set allows is allowed by a rule that really
// covers the name or address, port and proto; a guarded address is only
// allowed by a rule inside its guarded range; and whatever DecideIP allows
// passes CheckDial.
func FuzzDecide(f *testing.F) {
	f.Add("pypi.org", "pypi.org", []byte{192, 0, 2, 1}, uint16(443), uint8(1))
	f.Add("*.x.org:*/udp", "a.x.org", []byte{127, 0, 0, 1}, uint16(53), uint8(2))
	f.Add("0.0.0.0/0:*", "x", []byte{169, 254, 169, 254}, uint16(80), uint8(1))
	f.Add("10.0.0.0/8", "", []byte{10, 1, 2, 3}, uint16(443), uint8(1))
	f.Add("[::/0]:*", "", []byte{0x20, 0x02, 0x7f, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}, uint16(443), uint8(1))
	f.Add("[64:ff9b::/96]:*", "", []byte{0, 0x64, 0xff, 0x9b, 0, 0, 0, 0, 0, 0, 0, 0, 10, 0, 0, 1}, uint16(1), uint8(1))
	f.Add("[2001::/32]:*", "", []byte{0x20, 0x01, 0, 0, 0xc0, 0, 2, 10, 0x80, 0, 0xf2, 0x27, 0x56, 0x01, 0x56, 0x01}, uint16(443), uint8(1))
	f.Add("[::ffff:0:0:0/96]:*", "", []byte{0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0, 0, 127, 0, 0, 1}, uint16(443), uint8(1))
	f.Add("[64:ff9b:1::/48]:*", "", []byte{0, 0x64, 0xff, 0x9b, 0, 1, 0, 0, 0, 0, 0, 0, 192, 0, 2, 1}, uint16(443), uint8(1))
	f.Fuzz(func(t *testing.T, spec, host string, ipb []byte, port uint16, proto uint8) {
		r, err := ParseAllow(spec)
		if err != nil {
			return
		}
		g := Guard{Extra: []netip.Prefix{netip.MustParsePrefix("198.18.0.0/15")}}
		rs, err := Select(nil, "", []Rule{r}, g)
		if err != nil {
			t.Fatalf("Select: %v", err)
		}
		p := Proto(proto)
		if d := rs.DecideName(host, port, p); d.Allowed() {
			if r.Host == "" || r.Proto != p || !portsContain(r.Ports, port) {
				t.Fatalf("DecideName(%q, %d, %s) allowed by %s", host, port, p, r)
			}
			h, err := NormalizeHost(strings.ToLower(host))
			if err == nil && h != r.Host && !(strings.HasPrefix(r.Host, "*.") && strings.HasSuffix(h, r.Host[1:])) {
				t.Fatalf("DecideName(%q) = %q allowed by %s", host, h, r)
			}
		}
		ip, ok := netip.AddrFromSlice(ipb)
		if !ok {
			return
		}
		d := rs.DecideIP(ip, port, p)
		c := rs.CheckDial(ip, port, p)
		guarded, _ := g.Guarded(ip)
		if !c.Allowed() && !guarded {
			t.Fatalf("CheckDial denied unguarded %s: %+v", ip, c)
		}
		if d.Allowed() {
			if !r.CIDR.IsValid() || !r.CIDR.Contains(ip.Unmap()) || r.Proto != p || !portsContain(r.Ports, port) {
				t.Fatalf("DecideIP(%s, %d, %s) allowed by %s", ip, port, p, r)
			}
			if !c.Allowed() {
				t.Fatalf("DecideIP allowed %s but CheckDial denied it: %+v", ip, c)
			}
			if guarded {
				grange, _, _ := guardMatch(g.Extra, ip)
				if !within(r.CIDR, grange) {
					t.Fatalf("guarded %s allowed by %s, which is not inside %s", ip, r, grange)
				}
			}
		}
		if c.Allowed() && guarded && (!r.CIDR.IsValid() || r.Proto != p || !portsContain(r.Ports, port)) {
			t.Fatalf("CheckDial allowed guarded %s without a matching cidr rule (%s): %+v", ip, r, c)
		}
	})
}

// FuzzDenyWins: whatever an allow rule (and the open default) allows, a
// flow, query or dial the deny rule covers is denied, explicitly; and the
// open default never lets a guarded address through without a cidr rule
// naming it.
func FuzzDenyWins(f *testing.F) {
	f.Add("*.github.com", "gist.github.com", "gist.github.com", []byte{192, 0, 2, 1}, uint16(443), uint8(1), false)
	f.Add("*.x.org:*/udp", "*.a.x.org:53/udp", "b.a.x.org", []byte{127, 0, 0, 1}, uint16(53), uint8(2), true)
	f.Add("192.0.2.0/24:*", "192.0.2.66", "", []byte{192, 0, 2, 66}, uint16(80), uint8(1), false)
	f.Add("10.0.0.0/8:*", "[2001:db8::/32]", "x.test", []byte{0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}, uint16(443), uint8(1), true)
	f.Fuzz(func(t *testing.T, allow, deny, host string, ipb []byte, port uint16, proto uint8, open bool) {
		a, err := ParseAllow(allow)
		if err != nil {
			return
		}
		d, err := ParseAllow(deny)
		if err != nil {
			return
		}
		if !strings.Contains(deny, "/udp") && !strings.Contains(deny, "/tcp") {
			d.Proto = AnyProto
		}
		d.Source = "f.yaml:9"
		pol := &Policy{file: "f.yaml", phases: []phase{{name: "x", deny: []Rule{d}, open: open}}}
		g := Guard{Extra: []netip.Prefix{netip.MustParsePrefix("198.18.0.0/15")}}
		rs, err := Select(pol, "", []Rule{a}, g)
		if err != nil {
			t.Fatalf("Select: %v", err)
		}
		p := Proto(proto)
		if h, err := NormalizeHost(strings.ToLower(host)); err == nil && d.Host != "" && d.denies(port, p) &&
			(h == d.Host || strings.HasPrefix(d.Host, "*.") && strings.HasSuffix(h, d.Host[1:])) {
			if v := rs.DecideName(host, port, p); v.Allowed() || !v.Explicit {
				t.Fatalf("DecideName(%q, %d, %s) = %+v despite deny rule %s", host, port, p, v, d)
			}
			if d.Proto == AnyProto && len(d.Ports) == 1 && d.Ports[0] == (PortRange{1, 65535}) {
				if v := rs.NameAllowed(host); v.Allowed() {
					t.Fatalf("NameAllowed(%q) = %+v despite deny rule %s on every flow", host, v, d)
				}
			}
		}
		if v := rs.DecideName(host, port, p); v.Allowed() {
			if q := rs.NameAllowed(host); !q.Allowed() {
				t.Fatalf("DecideName(%q, %d, %s) = %+v but DNS refuses the name: %+v", host, port, p, v, q)
			}
		}
		ip, ok := netip.AddrFromSlice(ipb)
		if !ok {
			return
		}
		v, c := rs.DecideIP(ip, port, p), rs.CheckDial(ip, port, p)
		if d.CIDR.IsValid() && d.CIDR.Contains(ip.Unmap()) && d.denies(port, p) {
			if v.Allowed() || c.Allowed() || !v.Explicit || !c.Explicit {
				t.Fatalf("%s:%d/%s: DecideIP %+v, CheckDial %+v despite deny rule %s", ip, port, p, v, c, d)
			}
		}
		guarded, _ := g.Guarded(ip)
		named := a.CIDR.IsValid() && a.CIDR.Contains(ip.Unmap()) && a.allows(port, p)
		if guarded && !named && (v.Allowed() || c.Allowed()) {
			t.Fatalf("guarded %s allowed without a cidr rule naming it: DecideIP %+v, CheckDial %+v", ip, v, c)
		}
		if v.Allowed() && v.Rule == RuleDefaultPublic && (!open || p != TCP) {
			t.Fatalf("DecideIP(%s, %d, %s) = %+v without default: public over tcp", ip, port, p, v)
		}
	})
}

// FuzzNormalizeHost: normalization is idempotent and its output is LDH.
func FuzzNormalizeHost(f *testing.F) {
	for _, s := range []string{"PyPI.org.", "bücher.example", "*.x.org", "xn--bcher-kva.example", "ｅｘａｍｐｌｅ.test", "a..b", "1.2.3.4"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		h, err := NormalizeHost(s)
		if err != nil {
			return
		}
		again, err := NormalizeHost(h)
		if err != nil || again != h {
			t.Fatalf("NormalizeHost(%q) = %q, but NormalizeHost(%q) = %q, %v", s, h, h, again, err)
		}
		if msg := flow.CheckName(strings.TrimPrefix(h, "*."), flow.Hostname); msg != "" {
			t.Fatalf("NormalizeHost(%q) = %q, not LDH: %s", s, h, msg)
		}
	})
}

// FuzzSuggest: whatever is observed, the suggested file parses (when
// anything usable was observed) and allows every usable observation.
func FuzzSuggest(f *testing.F) {
	f.Add("a.cdn.example.org b.cdn.example.org c.cdn.example.org pypi.org 192.0.2.1 2001:db8::1", []byte{1, 2, 3, 4, 5, 6})
	f.Add("a.github.io b.github.io c.github.io x.y.z", []byte{0, 0, 0})
	f.Fuzz(func(t *testing.T, names string, ports []byte) {
		var obs []Observation
		for i, w := range strings.Fields(names) {
			if i >= 40 {
				break
			}
			var port uint16 = 443
			proto := TCP
			if i < len(ports) {
				port = uint16(ports[i]) * 257
				if ports[i]&1 == 1 {
					proto = UDP
				}
			}
			if a, err := netip.ParseAddr(w); err == nil {
				obs = append(obs, Observation{IP: a, Port: port, Proto: proto})
			} else {
				obs = append(obs, Observation{Host: w, Port: port, Proto: proto})
			}
		}
		out := Suggest(obs, "exec", "fuzz", publicsuffix.PublicSuffix)
		checkWildcards(t, out)
		var usable []Observation
		for _, o := range obs {
			if o.Port == 0 {
				continue
			}
			if o.Host != "" {
				if h, err := NormalizeHost(o.Host); err != nil || strings.HasPrefix(h, "*.") {
					continue
				}
			}
			usable = append(usable, o)
		}
		p, err := Parse("s.yaml", out)
		if len(usable) == 0 {
			return
		}
		if err != nil {
			t.Fatalf("Parse(Suggest) = %v\n%s", err, out)
		}
		rs, err := Select(p, "", nil, Guard{})
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range usable {
			var d Decision
			if o.Host != "" {
				d = rs.DecideName(o.Host, o.Port, o.Proto)
			} else {
				d = rs.DecideIP(o.IP, o.Port, o.Proto)
			}
			if !d.Allowed() {
				t.Fatalf("%+v not allowed: %+v\n%s", o, d, out)
			}
		}
	})
}
