package audit

import (
	"bytes"
	"crypto/sha256"
	"net/netip"
	"testing"
	"time"
)

// t0 is the fixed start of the test logs.
var t0 = time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)

// fixedRecords is a small run with allowed and denied flows and queries.
func fixedRecords() []Record {
	ap := netip.MustParseAddrPort
	src := ap("198.51.100.2:40000")
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	return []Record{
		{TS: ms(100), Kind: KindDNS, Proto: ProtoUDP, Src: src, Dst: ap("198.51.100.1:53"), Host: "pypi.org", HostFrom: HostFromDNS, Port: 443,
			Verdict: VerdictAllow, Rule: "setup: host pypi.org ports [443]", Reason: "allowed name", PID: 41, Comm: "pip", Exe: "/usr/bin/python3",
			Qname: "pypi.org.", Qtype: "A", Rcode: "NOERROR"},
		{TS: ms(250), Kind: KindFlow, Proto: ProtoTCP, Src: src, Dst: ap("198.51.100.5:443"), Host: "pypi.org", HostFrom: HostFromDNS, Port: 443,
			Verdict: VerdictAllow, Rule: "setup: host pypi.org ports [443]", Reason: "allowed name", PID: 41, Comm: "pip", Exe: "/usr/bin/python3",
			BytesOut: 812, BytesIn: 40960, DurationMS: 1520.5, Dial: ap("192.0.2.10:443")},
		{TS: ms(900), Kind: KindDNS, Proto: ProtoUDP, Src: src, Dst: ap("198.51.100.1:53"), Host: "evil.example", HostFrom: HostFromDNS, Port: 443,
			Verdict: VerdictDeny, Rule: "default-deny", Reason: "no rule allows evil.example", PID: 57, Comm: "curl", Exe: "/usr/bin/curl",
			Qname: "evil.example.", Qtype: "AAAA", Rcode: "NXDOMAIN"},
		{TS: ms(1200), Kind: KindFlow, Proto: ProtoTCP, Src: src, Dst: ap("203.0.113.9:443"), Host: "", HostFrom: HostFromNone, Port: 443,
			Verdict: VerdictDeny, Rule: "default-deny", Reason: "raw IP with no cidr rule", PID: 57, Comm: "curl", Exe: "/usr/bin/curl",
			DurationMS: 0.2},
		{TS: ms(1500), Kind: KindFlow, Proto: ProtoTCP, Src: src, Dst: ap("198.51.100.5:443"), Host: "pypi.org", HostFrom: HostFromSNI, Port: 443,
			Verdict: VerdictAllow, Rule: "setup: host pypi.org ports [443]", Reason: "allowed name", PID: 0, Owner: "gone",
			BytesOut: 100, BytesIn: 2000, DurationMS: 80, Dial: ap("192.0.2.10:443")},
		{TS: ms(2000), Kind: KindFlow, Proto: ProtoUDP, Src: src, Dst: ap("198.51.100.9:5353"), Host: "files.pythonhosted.org", HostFrom: HostFromDNS, Port: 5353,
			Verdict: VerdictDeny, Rule: "default-deny", Reason: "port 5353/udp not allowed", PID: 41, Comm: "pip", Exe: "/usr/bin/python3"},
		{TS: ms(2100), Kind: KindFlow, Proto: ProtoTCP, Src: src, Dst: ap("198.51.100.9:443"), Host: "files.pythonhosted.org", HostFrom: HostFromDNS, Port: 443,
			Verdict: VerdictAllow, Rule: "setup: host *.pythonhosted.org ports [443]", Reason: "allowed name", PID: 41, Comm: "pip", Exe: "/usr/bin/python3",
			BytesOut: 900, BytesIn: 1 << 20, DurationMS: 3000, Dial: ap("[2001:db8::7]:443")},
		{TS: ms(2300), Kind: KindFlow, Proto: ProtoTCP, Src: src, Dst: ap("198.51.100.9:443"), Host: "files.pythonhosted.org", HostFrom: HostFromDNS, Port: 443,
			Verdict: VerdictAllow, Rule: "setup: host *.pythonhosted.org ports [443]", Reason: "allowed name", PID: 44, Comm: "pip3", Exe: "/usr/bin/python3",
			BytesOut: 700, BytesIn: 5000, DurationMS: 400, Dial: ap("[2001:db8::7]:443")},
	}
}

// fixedHeader is the header of the fixed log.
func fixedHeader(run string) Header {
	return Header{
		Run: run, Phase: "setup", Version: "0.1.0-test", Policy: "testdata/policy.yaml",
		PolicySHA256: "3b5d5c3712955042212316173ccf37be800d2f1d4f8e6b1a0b1c2d3e4f5a6b7c",
		Argv:         []string{"tunwall", "run", "--policy", "testdata/policy.yaml", "--", "pip", "install", "x"},
		Config:       map[string]string{"phase": "setup", "dns-upstream": "192.0.2.53:53", "mtu": "65520"},
	}
}

// buildLog encodes a run the way Writer does, with fixed timestamps: a
// header at t0, recs, and a trailer one second after the last record when
// trailer is set.
func buildLog(t testing.TB, h Header, recs []Record, trailer bool) []byte {
	t.Helper()
	return buildLogAfter(t, nil, h, recs, trailer)
}

// buildLogAfter is buildLog for a run appended to the log before, its
// header chaining to before's last line.
func buildLogAfter(t testing.TB, before []byte, h Header, recs []Record, trailer bool) []byte {
	t.Helper()
	prev := zeroHash
	if ls := splitLines(before); len(ls) > 0 {
		prev = sha256.Sum256(ls[len(ls)-1])
	}
	c := newChain()
	if _, err := c.header(t0, h, prev); err != nil {
		t.Fatal(err)
	}
	last := t0
	for _, r := range recs {
		r.Run = h.Run
		if r.Phase == "" {
			r.Phase = h.Phase
		}
		if _, err := c.record(&r); err != nil {
			t.Fatal(err)
		}
		last = r.TS
	}
	if trailer {
		if _, err := c.trailer(last.Add(time.Second), h.Run, h.Phase, 0, h.Labels); err != nil {
			t.Fatal(err)
		}
	}
	return bytes.Clone(c.buf.Bytes())
}

// splitLines splits a log into lines without their newlines.
func splitLines(b []byte) [][]byte {
	b = bytes.TrimSuffix(b, []byte("\n"))
	if len(b) == 0 {
		return nil
	}
	return bytes.Split(b, []byte("\n"))
}

// joinLines is the inverse of splitLines.
func joinLines(lines [][]byte) []byte {
	var out []byte
	for _, l := range lines {
		out = append(out, l...)
		out = append(out, '\n')
	}
	return out
}
