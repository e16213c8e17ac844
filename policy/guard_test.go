package policy

import (
	"net/netip"
	"strings"
	"testing"
)

func TestGuarded(t *testing.T) {
	g := Guard{Extra: []netip.Prefix{
		netip.MustParsePrefix("198.18.0.0/15"),
		netip.MustParsePrefix("fd7a:7a11::/64"),
		netip.MustParsePrefix("::ffff:203.0.113.200/128"), // a host address, written IPv4-mapped
	}}
	tests := []struct {
		name string
		ip   string
		want string // "" means not guarded; otherwise the reason must start with it
	}{
		{"0.0.0.0 is unspecified", "0.0.0.0", "unspecified"},
		{"the rest of 0.0.0.0/8 is this network", "0.1.2.3", "this network"},
		{"127.0.0.1 is loopback", "127.0.0.1", "loopback"},
		{"the top of 127.0.0.0/8 is loopback", "127.255.255.254", "loopback"},
		{"10.0.0.0/8 is private", "10.20.30.40", "RFC 1918 private"},
		{"the bottom of 172.16.0.0/12 is private", "172.16.0.1", "RFC 1918 private"},
		{"the top of 172.16.0.0/12 is private", "172.31.255.255", "RFC 1918 private"},
		{"172.32.0.1 is just outside 172.16.0.0/12", "172.32.0.1", ""},
		{"192.168.0.0/16 is private", "192.168.1.1", "RFC 1918 private"},
		{"169.254.0.0/16 is link-local", "169.254.1.1", "link-local"},
		{"169.254.169.254 is cloud metadata", "169.254.169.254", "cloud metadata"},
		{"the ECS task metadata address is cloud metadata", "169.254.170.2", "cloud metadata"},
		{"the Azure wireserver is cloud metadata", "168.63.129.16", "cloud metadata"},
		{"its neighbour is public", "168.63.129.17", ""},
		{"the Alibaba metadata address is cloud metadata", "100.100.100.200", "cloud metadata"},
		{"100.64.0.0/10 is shared address space", "100.64.0.1", "shared address space (RFC 6598)"},
		{"the top of 100.64.0.0/10 is shared address space", "100.127.255.255", "shared address space (RFC 6598)"},
		{"100.128.0.1 is just outside 100.64.0.0/10", "100.128.0.1", ""},
		{"224.0.0.1 is multicast", "224.0.0.1", "multicast"},
		{"239.255.255.250 is multicast", "239.255.255.250", "multicast"},
		{"240.0.0.1 is reserved", "240.0.0.1", "reserved"},
		{"255.255.255.255 is broadcast", "255.255.255.255", "broadcast"},
		{":: is unspecified", "::", "unspecified"},
		{"::1 is loopback", "::1", "loopback"},
		{"fc00::/7 is unique local", "fd12:3456::1", "unique local (fc00::/7)"},
		{"the AWS IPv6 metadata address is cloud metadata", "fd00:ec2::254", "cloud metadata"},
		{"fe80::/10 is link-local", "fe80::1", "link-local"},
		{"a zoned link-local address is link-local", "fe80::1%eth0", "link-local"},
		{"ff00::/8 is multicast", "ff02::1", "multicast"},
		{"an IPv4-compatible address is judged by what it embeds", "::7f00:1", "loopback (127.0.0.1 embedded in ::/96)"},
		{"an IPv4-compatible address of a public one is guarded whole", "::c000:201", "IPv4-compatible"},
		{"IPv4-mapped loopback is loopback", "::ffff:127.0.0.1", "loopback"},
		{"IPv4-mapped metadata is cloud metadata", "::ffff:169.254.169.254", "cloud metadata"},
		{"NAT64 loopback is loopback", "64:ff9b::7f00:1", "loopback (127.0.0.1 embedded in 64:ff9b::/96)"},
		{"NAT64 metadata is cloud metadata", "64:ff9b::a9fe:a9fe", "cloud metadata"},
		{"6to4 of loopback is loopback", "2002:7f00:1::", "loopback (127.0.0.1 embedded in 2002::/16)"},
		{"6to4 of a private address is private", "2002:a00:1::5", "RFC 1918 private"},
		{"6to4 of metadata is cloud metadata", "2002:a9fe:a9fe::1", "cloud metadata"},
		{"a fake-pool address from Extra is guarded, Extra's reason first", "198.19.255.1", "this host / tunwall pool"},
		{"an IPv6 fake-pool address from Extra is guarded", "fd7a:7a11::5", "this host / tunwall pool"},
		{"an IPv4-mapped Extra entry guards the IPv4 address", "203.0.113.200", "this host / tunwall pool"},
		{"192.0.2.0/24 is an ordinary address", "192.0.2.1", ""},
		{"198.51.100.0/24 is an ordinary address", "198.51.100.1", ""},
		{"203.0.113.0/24 is an ordinary address", "203.0.113.1", ""},
		{"2001:db8::/32 is an ordinary address", "2001:db8::1", ""},
		{"IPv4-mapped documentation space is ordinary", "::ffff:203.0.113.9", ""},
		{"NAT64 of documentation space is ordinary", "64:ff9b::c000:201", ""},
		{"6to4 of documentation space is ordinary", "2002:c000:201::1", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, why := g.Guarded(netip.MustParseAddr(tt.ip))
			if got != (tt.want != "") || !strings.HasPrefix(why, tt.want) {
				t.Errorf("Guarded(%s) = %v, %q; want guarded=%v reason starting %q", tt.ip, got, why, tt.want != "", tt.want)
			}
		})
	}
	if got, why := (Guard{}).Guarded(netip.Addr{}); !got || why != "invalid address" {
		t.Errorf("Guarded(invalid) = %v, %q; want true, invalid address", got, why)
	}
	if got, _ := (Guard{}).Guarded(netip.MustParseAddr("203.0.113.200")); got {
		t.Error("the zero Guard guards 203.0.113.200, which only Extra should add")
	}
}

func TestCheckDialUnlocksOnlyExplicitRules(t *testing.T) {
	var extra []Rule
	for _, s := range []string{
		"0.0.0.0/0:*",                // never unlocks anything guarded
		"[::/0]:*",                   // nor this
		"10.0.0.0/8:443",             // unlocks 10/8 on 443
		"127.0.0.1:8080",             // unlocks one loopback address on 8080/tcp
		"169.254.0.0/16:80",          // link-local on 80, but not the metadata address
		"169.254.170.2:80",           // one metadata address, named exactly
		"[2002:7f00::/24]:443",       // 6to4 image of 127/8
		"[2002::/16]:8443",           // too broad for 6to4 loopback
		"[64:ff9b::a00:0/104]:9000",  // NAT64 image of 10/8
		"198.18.0.0/15:443",          // the Extra pool itself
		"[fd00::/8]:443",             // inside fc00::/7
		"[fc00::/6]:444",             // wider than fc00::/7
		"192.168.1.0/24:53/udp",      // udp only
		"[::ffff:172.16.0.0/108]:22", // an IPv4-mapped rule for 172.16/12
	} {
		r, err := ParseAllow(s)
		if err != nil {
			t.Fatal(err)
		}
		extra = append(extra, r)
	}
	rs, err := Select(nil, "", extra, Guard{Extra: []netip.Prefix{netip.MustParsePrefix("198.18.0.0/15"), netip.MustParsePrefix("192.0.2.77/32")}})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		ip     string
		port   uint16
		proto  Proto
		allow  bool
		rule   string // exact, or "" to skip
		reason string // substring
	}{
		{"an ordinary address passes the guard", "192.0.2.1", 443, TCP, true, "guard", "not a guarded address"},
		{"an ordinary IPv6 address passes the guard", "2001:db8::1", 22, UDP, true, "guard", "not a guarded address"},
		{"loopback is denied on a port no narrow rule names", "127.0.0.1", 443, TCP, false, "guard", "127.0.0.1 is loopback (never dialled unless a cidr rule names it); rule 0.0.0.0/0:*/tcp is broader than 127.0.0.0/8"},
		{"loopback named by a /32 rule is allowed on its port", "127.0.0.1", 8080, TCP, true, "127.0.0.1/32:8080/tcp (--allow 127.0.0.1:8080)", "naming"},
		{"loopback named by a /32 rule is denied over another proto", "127.0.0.1", 8080, UDP, false, "guard", "loopback"},
		{"another loopback address is not named by the /32 rule", "127.0.0.2", 8080, TCP, false, "guard", "loopback"},
		{"IPv4-mapped loopback is unlocked by the IPv4 rule", "::ffff:127.0.0.1", 8080, TCP, true, "127.0.0.1/32:8080/tcp (--allow 127.0.0.1:8080)", ""},
		{"::1 is never unlocked by ::/0", "::1", 443, TCP, false, "guard", "::1 is loopback"},
		{"a private address is unlocked by its /8 rule", "10.1.2.3", 443, TCP, true, "10.0.0.0/8:443/tcp (--allow 10.0.0.0/8:443)", ""},
		{"a private address on another port is denied despite 0.0.0.0/0", "10.1.2.3", 444, TCP, false, "guard", "broader than 10.0.0.0/8"},
		{"a link-local address is unlocked by the /16 rule", "169.254.1.1", 80, TCP, true, "169.254.0.0/16:80/tcp (--allow 169.254.0.0/16:80)", ""},
		{"the metadata address is not unlocked by the link-local /16 rule", "169.254.169.254", 80, TCP, false, "guard", "169.254.169.254 is cloud metadata (never dialled unless a cidr rule names it); rule 169.254.0.0/16:80/tcp is broader than 169.254.169.254/32"},
		{"a metadata address named exactly is unlocked", "169.254.170.2", 80, TCP, true, "169.254.170.2/32:80/tcp (--allow 169.254.170.2:80)", ""},
		{"6to4 loopback is unlocked by the 6to4 image of 127/8", "2002:7f00:1::1", 443, TCP, true, "[2002:7f00::/24]:443/tcp (--allow [2002:7f00::/24]:443)", ""},
		{"6to4 loopback is not unlocked by all of 2002::/16", "2002:7f00:1::1", 8443, TCP, false, "guard", "broader than 2002:7f00::/24"},
		{"NAT64 of a private address is unlocked by the NAT64 image of 10/8", "64:ff9b::a01:203", 9000, TCP, true, "[64:ff9b::a00:0/104]:9000/tcp (--allow [64:ff9b::a00:0/104]:9000)", ""},
		{"NAT64 of loopback is not unlocked by the image of 10/8", "64:ff9b::7f00:1", 9000, TCP, false, "guard", "loopback"},
		{"a fake-pool address is unlocked only by a rule inside the pool", "198.18.3.4", 443, TCP, true, "198.18.0.0/15:443/tcp (--allow 198.18.0.0/15:443)", ""},
		{"a host address in Extra needs an exact rule even in public space", "192.0.2.77", 443, TCP, false, "guard", "this host / tunwall pool"},
		{"a unique local address is unlocked by a rule inside fc00::/7", "fd00::1", 443, TCP, true, "[fd00::/8]:443/tcp (--allow [fd00::/8]:443)", ""},
		{"a unique local address is not unlocked by a rule wider than fc00::/7", "fd00::1", 444, TCP, false, "guard", "broader than fc00::/7"},
		{"the IPv6 metadata address is not unlocked by fd00::/8", "fd00:ec2::254", 443, TCP, false, "guard", "cloud metadata"},
		{"a udp rule unlocks udp", "192.168.1.53", 53, UDP, true, "192.168.1.0/24:53/udp (--allow 192.168.1.0/24:53/udp)", ""},
		{"a udp rule does not unlock tcp", "192.168.1.53", 53, TCP, false, "guard", "RFC 1918 private"},
		{"an IPv4-mapped rule unlocks the IPv4 address", "172.20.0.1", 22, TCP, true, "172.16.0.0/12:22/tcp (--allow [::ffff:172.16.0.0/108]:22)", ""},
		{"an invalid address is denied", "", 443, TCP, false, "guard", "invalid address"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var ip netip.Addr
			if tt.ip != "" {
				ip = netip.MustParseAddr(tt.ip)
			}
			d := rs.CheckDial(ip, tt.port, tt.proto)
			if d.Allowed() != tt.allow || (tt.rule != "" && d.Rule != tt.rule) || !strings.Contains(d.Reason, tt.reason) {
				t.Errorf("CheckDial(%s, %d, %s) = %+v\nwant allow=%v rule=%q reason containing %q", tt.ip, tt.port, tt.proto, d, tt.allow, tt.rule, tt.reason)
			}
			// DecideIP applies the same guard on top of its own matching:
			// whatever it allows, CheckDial must allow too.
			if di := rs.DecideIP(ip, tt.port, tt.proto); di.Allowed() && !d.Allowed() {
				t.Errorf("DecideIP allowed (%+v) what CheckDial denied (%+v)", di, d)
			}
		})
	}
}

func TestDecideIPAppliesTheGuard(t *testing.T) {
	var extra []Rule
	for _, s := range []string{"0.0.0.0/0:443", "10.0.0.0/8:22", "[::/0]:443"} {
		r, err := ParseAllow(s)
		if err != nil {
			t.Fatal(err)
		}
		extra = append(extra, r)
	}
	rs, err := Select(nil, "", extra, Guard{})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		ip     string
		port   uint16
		allow  bool
		rule   string
		reason string
	}{
		{"a broad rule allows a public address", "203.0.113.9", 443, true, "0.0.0.0/0:443/tcp (--allow 0.0.0.0/0:443)", "allowed by rule"},
		{"a broad rule does not allow loopback", "127.0.0.1", 443, false, "guard", "rule 0.0.0.0/0:443/tcp is broader than 127.0.0.0/8"},
		{"a broad rule does not allow IPv4-mapped metadata", "::ffff:169.254.169.254", 443, false, "guard", "::ffff:169.254.169.254 is cloud metadata"},
		{"a broad IPv6 rule does not allow NAT64 loopback", "64:ff9b::7f00:1", 443, false, "guard", "loopback"},
		{"a broad IPv6 rule allows NAT64 of a public address", "64:ff9b::cb00:7109", 443, true, "[::/0]:443/tcp (--allow [::/0]:443)", ""},
		{"an explicit private rule allows its range", "10.9.9.9", 22, true, "10.0.0.0/8:22/tcp (--allow 10.0.0.0/8:22)", "naming"},
		{"a guarded address without any matching rule is denied by the guard", "192.168.0.1", 80, false, "guard", "RFC 1918 private (never dialled unless a cidr rule names it)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := rs.DecideIP(netip.MustParseAddr(tt.ip), tt.port, TCP)
			if d.Allowed() != tt.allow || d.Rule != tt.rule || !strings.Contains(d.Reason, tt.reason) {
				t.Errorf("DecideIP(%s, %d) = %+v\nwant allow=%v rule=%q reason containing %q", tt.ip, tt.port, d, tt.allow, tt.rule, tt.reason)
			}
		})
	}
}

// TestGuardFollowsTheIANARegistries walks the IANA IPv4 and IPv6
// Special-Purpose Address Registries (and the embeddings of IPv4 in IPv6):
// every block that is not globally reachable is guarded at its first, last
// and a middle address; every globally reachable one is not, even where it
// sits inside a guarded block. The documentation blocks are ordinary here
// (ARCHITECTURE.md), so tests can use them.
func TestGuardFollowsTheIANARegistries(t *testing.T) {
	tests := []struct {
		block string
		name  string
		want  string // reason prefix; "" means not guarded
	}{
		// IPv4 Special-Purpose Address Registry.
		{"0.0.0.1/32", `"This network"`, "this network"},
		{"0.128.0.0/9", `"This network"`, "this network"},
		{"0.0.0.0/32", `"This host on this network"`, "unspecified"},
		{"10.0.0.0/8", "Private-Use", "RFC 1918 private"},
		{"100.64.0.0/10", "Shared Address Space", "shared address space"},
		{"127.0.0.0/8", "Loopback", "loopback"},
		{"169.254.0.0/16", "Link Local", "link-local"},
		{"172.16.0.0/12", "Private-Use", "RFC 1918 private"},
		{"192.0.0.0/24", "IETF Protocol Assignments", ""}, // checked by its sub-blocks below
		{"192.0.0.0/29", "IPv4 Service Continuity Prefix", "IPv4 service continuity"},
		{"192.0.0.8/32", "IPv4 dummy address", "IPv4 dummy address"},
		{"192.0.0.9/32", "Port Control Protocol Anycast (global)", ""},
		{"192.0.0.10/32", "TURN Anycast (global)", ""},
		{"192.0.0.11/32", "rest of IETF Protocol Assignments", "IETF protocol assignments"},
		{"192.0.0.128/25", "rest of IETF Protocol Assignments", "IETF protocol assignments"},
		{"192.0.0.170/31", "NAT64/DNS64 Discovery", "NAT64/DNS64 discovery"},
		{"192.0.2.0/24", "Documentation (TEST-NET-1): ordinary here", ""},
		{"192.31.196.0/24", "AS112-v4 (global)", ""},
		{"192.52.193.0/24", "AMT (global)", ""},
		{"192.88.99.0/24", "Deprecated 6to4 Relay Anycast (N/A)", ""},
		{"192.168.0.0/16", "Private-Use", "RFC 1918 private"},
		{"192.175.48.0/24", "Direct Delegation AS112 Service (global)", ""},
		{"198.18.0.0/15", "Benchmarking", "benchmarking"},
		{"198.51.100.0/24", "Documentation (TEST-NET-2): ordinary here", ""},
		{"203.0.113.0/24", "Documentation (TEST-NET-3): ordinary here", ""},
		{"240.0.0.0/4", "Reserved", ""}, // its top is broadcast: checked below
		{"240.0.0.0/5", "Reserved", "reserved"},
		{"248.0.0.0/6", "Reserved", "reserved"},
		{"255.255.255.254/32", "Reserved", "reserved"},
		{"255.255.255.255/32", "Limited Broadcast", "broadcast"},
		{"224.0.0.0/4", "multicast (its own registry)", "multicast"},

		// IPv6 Special-Purpose Address Registry.
		{"::1/128", "Loopback Address", "loopback"},
		{"::/128", "Unspecified Address", "unspecified"},
		{"64:ff9b::c000:200/120", "IPv4-IPv6 Translat. (global), public IPv4 inside", ""},
		{"64:ff9b:1::/48", "IPv4-IPv6 Translat. (local use)", ""}, // checked below: its embeddings differ
		{"64:ff9b:1::c000:200/120", "IPv4-IPv6 Translat. (local use), /96 form", "local-use NAT64"},
		{"64:ff9b:1:ffff::c000:200/120", "IPv4-IPv6 Translat. (local use)", "local-use NAT64"},
		{"100::/64", "Discard-Only Address Block", "discard-only"},
		{"100:0:0:1::/64", "Dummy IPv6 Prefix", "dummy prefix"},
		{"2001::/32", "TEREDO", ""}, // checked below: its embeddings differ
		{"2001:1::/128", "IETF Protocol Assignments", "IETF protocol assignments"},
		{"2001:1::1/128", "Port Control Protocol Anycast (global)", ""},
		{"2001:1::2/128", "TURN Anycast (global)", ""},
		{"2001:1::3/128", "DNS-SD SRP Anycast (global)", ""},
		{"2001:1::4/126", "IETF Protocol Assignments", "IETF protocol assignments"},
		{"2001:2::/48", "Benchmarking", "benchmarking"},
		{"2001:3::/32", "AMT (global)", ""},
		{"2001:4:112::/48", "AS112-v6 (global)", ""},
		{"2001:4:113::/48", "IETF Protocol Assignments", "IETF protocol assignments"},
		{"2001:10::/28", "Deprecated (previously ORCHID)", "deprecated ORCHID"},
		{"2001:20::/28", "ORCHIDv2 (global)", ""},
		{"2001:30::/28", "Drone Remote ID Protocol Entity Tags (global)", ""},
		{"2001:40::/26", "IETF Protocol Assignments", "IETF protocol assignments"},
		{"2001:100::/24", "IETF Protocol Assignments", "IETF protocol assignments"},
		{"2001:200::/23", "just past 2001::/23: ordinary", ""},
		{"2001:db8::/32", "Documentation: ordinary here", ""},
		{"2620:4f:8000::/48", "Direct Delegation AS112 Service (global)", ""},
		{"3fff::/20", "Documentation: ordinary here", ""},
		{"5f00::/16", "Segment Routing (SRv6) SIDs", "SRv6 SIDs"},
		{"fc00::/7", "Unique-Local", "unique local"},
		{"fe80::/10", "Link-Local Unicast", "link-local"},
		{"fec0::/10", "site-local (deprecated)", "site-local"},
		{"ff00::/8", "multicast", "multicast"},
		{"::ffff:0:c000:200/120", "SIIT of a public address", "SIIT"},
		{"::c000:200/120", "IPv4-compatible of a public address", "IPv4-compatible"},
	}
	for _, tt := range tests {
		p := netip.MustParsePrefix(tt.block)
		for _, a := range samples(p) {
			if tt.want == "" && (tt.block == "192.0.0.0/24" || tt.block == "64:ff9b:1::/48" || tt.block == "2001::/32" || tt.block == "240.0.0.0/4") {
				continue // blocks whose addresses are checked by their parts
			}
			got, why := (Guard{}).Guarded(a)
			if got != (tt.want != "") || !strings.HasPrefix(why, tt.want) {
				t.Errorf("%s (%s, %s): Guarded = %v, %q; want guarded=%v reason starting %q", a, tt.block, tt.name, got, why, tt.want != "", tt.want)
			}
		}
	}

	// Embedded forms: each family's forbidden IPv4 addresses, written every
	// way IPv6 can carry them, are judged by the embedded address.
	embedded := []struct {
		name string
		ip   string
		want string
	}{
		{"IPv4-mapped loopback", "::ffff:127.0.0.1", "loopback"},
		{"IPv4-mapped public", "::ffff:192.0.2.1", ""},
		{"IPv4-compatible metadata", "::a9fe:a9fe", "cloud metadata (169.254.169.254 embedded in ::/96)"},
		{"SIIT loopback", "::ffff:0:7f00:1", "loopback (127.0.0.1 embedded in ::ffff:0:0:0/96)"},
		{"SIIT private", "::ffff:0:a00:5", "RFC 1918 private (10.0.0.5 embedded in ::ffff:0:0:0/96)"},
		{"NAT64 loopback", "64:ff9b::7f00:1", "loopback (127.0.0.1 embedded in 64:ff9b::/96)"},
		{"NAT64 shared space", "64:ff9b::6440:1", "shared address space"},
		{"NAT64 public", "64:ff9b::c000:201", ""},
		{"local-use NAT64 metadata", "64:ff9b:1::a9fe:a9fe", "cloud metadata (169.254.169.254 embedded in 64:ff9b:1::/48)"},
		{"local-use NAT64 public is guarded whole", "64:ff9b:1::c000:201", "local-use NAT64"},
		{"6to4 loopback", "2002:7f00:1::", "loopback (127.0.0.1 embedded in 2002::/16)"},
		{"6to4 benchmarking", "2002:c612:1::1", "benchmarking"},
		{"6to4 public", "2002:c000:201::1", ""},
		{"Teredo server loopback", "2001:0:7f00:1:8000:ffff:3fff:fdfe", "loopback (127.0.0.1, the Teredo server, embedded in 2001::/32)"},
		{"Teredo client metadata (obfuscated)", "2001:0:c000:20a:8000:f227:5601:5601", "cloud metadata (169.254.169.254, the Teredo client, embedded in 2001::/32)"},
		{"Teredo client private (obfuscated)", "2001:0:c000:20a::f5ff:fffa", "RFC 1918 private (10.0.0.5, the Teredo client"},
		{"Teredo with public server and client is guarded whole", "2001:0:c000:20a:8000:f227:3fff:fdf5", "Teredo (2001::/32)"},
	}
	for _, tt := range embedded {
		got, why := (Guard{}).Guarded(netip.MustParseAddr(tt.ip))
		if got != (tt.want != "") || !strings.HasPrefix(why, tt.want) {
			t.Errorf("%s (%s): Guarded = %v, %q; want guarded=%v reason starting %q", tt.ip, tt.name, got, why, tt.want != "", tt.want)
		}
	}
}

// samples returns the first, a middle and the last address of p.
func samples(p netip.Prefix) []netip.Addr {
	p = p.Masked()
	first := p.Addr()
	b := first.AsSlice()
	last := append([]byte(nil), b...)
	mid := append([]byte(nil), b...)
	host := len(b)*8 - p.Bits()
	for i := 0; i < host; i++ {
		byteIdx := len(b) - 1 - i/8
		last[byteIdx] |= 1 << (i % 8)
		if i == host-1 {
			mid[byteIdx] |= 1 << (i % 8)
		} else if i%3 == 0 {
			mid[byteIdx] |= 1 << (i % 8)
		}
	}
	l, _ := netip.AddrFromSlice(last)
	m, _ := netip.AddrFromSlice(mid)
	return []netip.Addr{first, m, l}
}

func TestCheckDialUnlocksEmbeddedAddressesOnlyByNarrowRules(t *testing.T) {
	var extra []Rule
	for _, s := range []string{
		"[2001::/32]:443",                     // all of Teredo
		"[2001:0:c000:20a::f5ff:ff00/120]:80", // the Teredo client image of 10.0.0.0/24 behind one server and port
		"[::ffff:0:a00:0/104]:443",            // the SIIT image of 10/8
		"[64:ff9b:1::/48]:443",                // all of local-use NAT64
	} {
		r, err := ParseAllow(s)
		if err != nil {
			t.Fatal(err)
		}
		extra = append(extra, r)
	}
	rs, err := Select(nil, "", extra, Guard{})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		ip    string
		port  uint16
		allow bool
	}{
		{"Teredo with public ends is unlocked by 2001::/32", "2001:0:c000:20a:8000:f227:3fff:fdf5", 443, true},
		{"Teredo with an obfuscated metadata client is not unlocked by 2001::/32", "2001:0:c000:20a:8000:f227:5601:5601", 443, false},
		{"Teredo with a loopback server is not unlocked by 2001::/32", "2001:0:7f00:1:8000:ffff:3fff:fdfe", 443, false},
		{"Teredo with a private client is unlocked by the rule naming its image", "2001:0:c000:20a::f5ff:fffa", 80, true},
		{"SIIT of a private address is unlocked by the SIIT image of 10/8", "::ffff:0:a00:5", 443, true},
		{"SIIT of loopback is not", "::ffff:0:7f00:1", 443, false},
		{"local-use NAT64 of a public address is unlocked by its /48", "64:ff9b:1::c000:201", 443, true},
		{"local-use NAT64 of metadata is not", "64:ff9b:1::a9fe:a9fe", 443, false},
	}
	for _, tt := range tests {
		d := rs.CheckDial(netip.MustParseAddr(tt.ip), tt.port, TCP)
		if d.Allowed() != tt.allow {
			t.Errorf("%s: CheckDial(%s, %d) = %+v, want allow=%v", tt.name, tt.ip, tt.port, d, tt.allow)
		}
	}
}
