package session

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"

	"github.com/tunwall/tunwall/dnsintercept"
	"github.com/tunwall/tunwall/internal/audit"
	"github.com/tunwall/tunwall/internal/leaktest"
	"github.com/tunwall/tunwall/internal/netplan"
	"github.com/tunwall/tunwall/policy"
)

// rules is a one-phase rule set allowing allowed.test.
func rules(t *testing.T) *policy.RuleSet {
	t.Helper()
	p, err := policy.Parse("p.yaml", []byte("version: 1\nphases:\n  exec:\n    allow:\n      - host: allowed.test\n      - host: \"*.wild.test\"\n"))
	if err != nil {
		t.Fatal(err)
	}
	rs, err := policy.Select(p, "", nil, policy.Guard{Extra: netplan.Default.Guarded()})
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

// options are valid Options writing the audit log into a temporary
// directory; the DNS upstream is never contacted (the tests ask for names
// answered locally).
func options(t *testing.T, stderr *bytes.Buffer) Options {
	return Options{
		Rules:  rules(t),
		Stderr: stderr,
		DNS:    DNSOptions{Upstream: []netip.AddrPort{netip.MustParseAddrPort("192.0.2.53:53")}, UpstreamFrom: "test"},
		Audit:  AuditOptions{Path: filepath.Join(t.TempDir(), "audit.jsonl")},
		MTU:    1500,
	}
}

// peerClosed reports whether the other end of peer's socketpair was
// closed (peer reads EOF within 5s, after whatever was sent to it). It is
// asked of the peer, not of the descriptor's number, which the process may
// have given to a new file meanwhile.
func peerClosed(peer int) bool {
	b := make([]byte, 65536)
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); {
		pfd := []unix.PollFd{{Fd: int32(peer), Events: unix.POLLIN}}
		if n, err := unix.Poll(pfd, 100); err != nil || n == 0 {
			continue
		}
		if n, err := unix.Read(peer, b); err != nil || n == 0 {
			return true
		}
	}
	return false
}

// socketpair returns a SOCK_SEQPACKET pair: a TUN stand-in (one packet per
// message) or a descriptor to hand over.
func socketpair(t *testing.T) (int, int) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	return fds[0], fds[1]
}

func TestOptionsAreValidatedAndTheDiagDescriptorIsClosedOnEveryPath(t *testing.T) {
	var stderr bytes.Buffer
	for _, c := range []struct {
		name string
		mod  func(*Options)
		ok   bool
	}{
		{"no rules", func(o *Options) { o.Rules = nil }, false},
		{"no DNS upstream", func(o *Options) { o.DNS.Upstream = nil }, false},
		{"a negative limit", func(o *Options) { o.Limits.MaxTCPFlows = -1 }, false},
		{"a negative audit cap", func(o *Options) { o.Audit.MaxSize = -1 }, false},
		{"an upstream that is not socks5://", func(o *Options) { o.Upstream = "http://192.0.2.9:1080" }, false},
		{"a socks5:// upstream", func(o *Options) { o.Upstream = "socks5://u:p@192.0.2.9:1080" }, true},
		{"a descriptor that is not sock_diag (attribution off)", func(*Options) {}, true},
		{"unaudited", func(o *Options) { o.Audit.Off = true }, true},
		{"a shared resolver asking DNS.Upstream", func(o *Options) { o.DNS.Resolver = sharedResolver(t, "192.0.2.53:53") }, true},
		{"a shared resolver asking another upstream", func(o *Options) { o.DNS.Resolver = sharedResolver(t, "192.0.2.54:53") }, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			o := options(t, &stderr)
			c.mod(&o)
			diag, other := socketpair(t)
			defer unix.Close(other)
			o.DiagFD = diag
			s, err := New(o)
			if c.ok {
				if err != nil {
					t.Fatalf("New: %v", err)
				}
				defer s.Close()
			} else {
				if !errors.Is(err, ErrOptions) || s != nil {
					t.Fatalf("New = %v, %v; want an ErrOptions error and no session", s, err)
				}
			}
			// Not a sock_diag socket, so attribution never takes it: the
			// session closed it, whatever happened.
			if !peerClosed(other) {
				t.Errorf("the diag descriptor is still open after New")
			}
		})
	}
}

func TestZeroValuesMeanTheDocumentedDefaults(t *testing.T) {
	o, err := (Options{Rules: rules(t), DNS: DNSOptions{Upstream: []netip.AddrPort{netip.MustParseAddrPort("192.0.2.53:53")}}}).withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if o.Plan != netplan.Default || o.MTU != 65520 || o.Limits.MaxTCPFlows != DefaultMaxFlows || o.Limits.MaxMemory != DefaultMaxMemory ||
		o.Limits.SniffTimeout != DefaultSniffTimeout || o.Limits.DialTimeout != DefaultDialTimeout || o.Limits.MaxDialsPerDest != DefaultMaxDialsPerDest ||
		o.Audit.MaxSize != audit.DefaultMaxSize || o.Audit.MaxRate != audit.DefaultMaxRate || o.DiagFD != -1 || o.Stderr == nil || o.Logger == nil {
		t.Errorf("defaults not applied: %+v", o)
	}
}

func TestStartTwiceOrAfterCloseIsRefusedAndTheDescriptorClosed(t *testing.T) {
	leaktest.Check(t)
	var stderr bytes.Buffer
	s, err := New(options(t, &stderr))
	if err != nil {
		t.Fatal(err)
	}
	if s.PeerGone() != nil {
		t.Error("PeerGone before Start is not nil")
	}
	tunFD, sandbox := socketpair(t)
	defer unix.Close(sandbox)
	if err := s.Start(tunFD); err != nil {
		t.Fatal(err)
	}
	again, other := socketpair(t)
	defer unix.Close(other)
	if err := s.Start(again); !errors.Is(err, ErrStarted) {
		t.Errorf("second Start: %v, want ErrStarted", err)
	}
	if !peerClosed(other) {
		t.Error("a refused Start left its descriptor open")
	}
	if _, err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if !peerClosed(sandbox) {
		t.Error("Close left the TUN descriptor open")
	}
	late, other2 := socketpair(t)
	defer unix.Close(other2)
	if err := s.Start(late); !errors.Is(err, ErrClosed) || !peerClosed(other2) {
		t.Errorf("Start after Close: %v, want ErrClosed and the descriptor closed", err)
	}
	if _, err := s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

// TestCloseEndsTheStackBeforeTheAuditLog sends DNS queries and a malformed
// packet through a served TUN, then closes: what the stack saw is said, and
// recorded, before the audit log gets its trailer and the summary is
// printed; the log verifies and its header holds every setting.
func TestCloseEndsTheStackBeforeTheAuditLog(t *testing.T) {
	leaktest.Check(t)
	var stderr bytes.Buffer
	o := options(t, &stderr)
	o.Limits.DialRate = -1 // recorded as 0, as --dial-rate spells "no limit"
	o.DNS.PoolIdle = -1    // recorded as 0s, as --dns-pool-idle spells "never"
	o.AllowFlags = []string{"allowed.test"}
	s, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	if stderr.Len() != 0 {
		t.Errorf("New printed %q: a session prints nothing, its front end does (WriteBanner, Report.Write)", stderr.String())
	}
	// What the front end prints; o.Stderr gets the denial lines, as the
	// flows go.
	var said bytes.Buffer
	s.WriteBanner(&said)
	tunFD, sandbox := socketpair(t)
	defer unix.Close(sandbox)
	if err := s.Start(tunFD); err != nil {
		t.Fatal(err)
	}
	src := netip.AddrPortFrom(netplan.Default.Addr4.Addr(), 40000)
	dst := netip.AddrPortFrom(netplan.Default.Resolver4, 53)
	for _, name := range []string{"allowed.test.", "denied.test."} {
		q := new(dns.Msg)
		q.SetQuestion(name, dns.TypeA)
		b, _ := q.Pack()
		if _, err := unix.Write(sandbox, udp4(src, dst, b)); err != nil {
			t.Fatal(err)
		}
		answer(t, sandbox) // the query was decided, and recorded
	}
	// A UDP datagram whose length field exceeds the packet: malformed.
	bad := udp4(src, netip.MustParseAddrPort("192.0.2.1:9999"), []byte("payload"))
	header.UDP(bad[header.IPv4MinimumSize:]).SetLength(200)
	if _, err := unix.Write(sandbox, bad); err != nil {
		t.Fatal(err)
	}
	// The stack counts the malformed packet when it reads it: wait until
	// it has (bounded), so that Close has it to say.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		if st := s.Stats().Stack; st != nil && st.Malformed > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the stack never counted the malformed packet")
		}
	}
	r, err := s.Close()
	if err != nil {
		t.Fatalf("Close: %v", err)
	}
	// Closed: nothing writes to o.Stderr any more. It holds the denial of
	// denied.test, and nothing Start or Close would have said.
	for _, l := range strings.Split(strings.TrimSpace(stderr.String()), "\n") {
		if l != "" && !strings.HasPrefix(l, "tunwall: denied ") {
			t.Errorf("Start or Close printed %q: a session prints nothing, its front end does", l)
		}
	}
	r.Write(&said, false)

	out := said.String()
	dropped := strings.Index(out, "tunwall: dropped 1 malformed packets from the sandbox")
	summary := strings.Index(out, "tunwall: 0 flows allowed, 0 denied; 1 DNS queries answered, 1 denied")
	if dropped < 0 || summary < 0 || dropped > summary {
		t.Errorf("want the stack's line before the audit summary:\n%s", out)
	}
	for _, want := range []string{"tunwall: run " + s.Run() + `, phase "exec", audit log `, "tunwall:   denied.test", "check it with: tunwall audit verify " + s.AuditPath()} {
		if !strings.Contains(out, want) {
			t.Errorf("stderr lacks %q:\n%s", want, out)
		}
	}

	f, err := os.Open(s.AuditPath())
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	res, err := audit.VerifyWith(f, audit.VerifyOptions{})
	if err != nil || !res.Complete || res.Records != 2 {
		t.Fatalf("audit log: %+v, %v; want a complete log of 2 records", res, err)
	}
	f.Seek(0, 0)
	var qnames []string
	for r, err := range audit.Records(f) {
		if err != nil {
			t.Fatal(err)
		}
		qnames = append(qnames, r.Qname+" "+r.Verdict)
	}
	if strings.Join(qnames, ",") != "allowed.test allow,denied.test deny" {
		t.Errorf("records: %q", qnames)
	}
	f.Seek(0, 0)
	line, _ := bufio.NewReader(f).ReadBytes('\n')
	var hdr struct {
		Config map[string]string `json:"config"`
	}
	if err := json.Unmarshal(line, &hdr); err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]string{
		"phase": "exec", "learn": "false", "dns_upstream": "192.0.2.53:53 (test)", "mtu": "1500", "allow": "allowed.test",
		"fake_pool4": "198.18.0.0/15", "fake_pool6": "fd74:756e:7761:6c6d::/64", "rules": "2", "deny_rules": "0", "default": "deny", "dial_rate": "0", "dns_pool_idle": "0s",
		"max_tcp_flows": "16384", "max_memory": "268435456", "sniff_timeout": "10s", "dial_timeout": "10s", "max_dials_per_dest": "256",
		"audit_max_size": "1073741824", "audit_max_rate": "10000", "secrets": "", "terminated": "", "inject": "",
	} {
		if got, ok := hdr.Config[k]; !ok || got != want {
			t.Errorf("header config %s = %q (present %v), want %q", k, got, ok, want)
		}
	}
}

func TestTheDefaultAuditPathIsInTheStateDirectoryAndPruned(t *testing.T) {
	state := t.TempDir()
	t.Setenv("XDG_STATE_HOME", state)
	dir := filepath.Join(state, "tunwall")
	os.MkdirAll(dir, 0o700)
	old := filepath.Join(dir, "tw-0000000000000001.jsonl")
	os.WriteFile(old, []byte("{}\n"), 0o600)
	long := time.Now().Add(-48 * time.Hour)
	os.Chtimes(old, long, long)
	var stderr bytes.Buffer
	o := options(t, &stderr)
	o.Audit = AuditOptions{KeepDays: 1}
	o.Quiet = true
	s, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	s.WriteBanner(&stderr)
	r, err := s.Close()
	if err != nil {
		t.Fatal(err)
	}
	r.Write(&stderr, true)
	if want := filepath.Join(dir, s.Run()+".jsonl"); s.AuditPath() != want {
		t.Errorf("audit path %s, want %s", s.AuditPath(), want)
	}
	if _, err := os.Stat(old); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a 2-day-old log survived KeepDays 1: %v", err)
	}
	// --quiet says nothing, the pruning included.
	if stderr.Len() != 0 {
		t.Errorf("quiet stderr: %q", stderr.String())
	}
}

func TestAnUnwritableAuditPathFailsNew(t *testing.T) {
	var stderr bytes.Buffer
	o := options(t, &stderr)
	o.Audit.Path = filepath.Join(t.TempDir(), "file", "under-a-file.jsonl")
	os.WriteFile(filepath.Dir(o.Audit.Path), nil, 0o600)
	if s, err := New(o); err == nil || s != nil {
		t.Fatalf("New = %v, %v; want an error", s, err)
	}
}

// udp4 builds an IPv4 UDP packet with correct checksums.
func udp4(src, dst netip.AddrPort, payload []byte) []byte {
	u := make([]byte, header.UDPMinimumSize+len(payload))
	header.UDP(u).Encode(&header.UDPFields{SrcPort: src.Port(), DstPort: dst.Port(), Length: uint16(len(u))})
	copy(u[header.UDPMinimumSize:], payload)
	s, d := tcpip.AddrFromSlice(src.Addr().AsSlice()), tcpip.AddrFromSlice(dst.Addr().AsSlice())
	xsum := header.PseudoHeaderChecksum(header.UDPProtocolNumber, s, d, uint16(len(u)))
	header.UDP(u).SetChecksum(^checksum.Checksum(u, xsum))
	b := make([]byte, header.IPv4MinimumSize+len(u))
	ip := header.IPv4(b)
	ip.Encode(&header.IPv4Fields{TotalLength: uint16(len(b)), TTL: 64, Protocol: uint8(header.UDPProtocolNumber), SrcAddr: s, DstAddr: d})
	ip.SetChecksum(^ip.CalculateChecksum())
	copy(b[header.IPv4MinimumSize:], u)
	return b
}

// answer waits (bounded) for one packet from the stack.
func answer(t *testing.T, fd int) []byte {
	t.Helper()
	pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	if n, err := unix.Poll(pfd, 5000); err != nil || n != 1 {
		t.Fatalf("no answer from the stack within 5s (%v)", err)
	}
	b := make([]byte, 65536)
	n, err := unix.Read(fd, b)
	if err != nil {
		t.Fatal(err)
	}
	return b[:n]
}

func sharedResolver(t *testing.T, server string) *dnsintercept.Resolver {
	t.Helper()
	r, err := dnsintercept.NewResolver(dnsintercept.ResolverConfig{Servers: []netip.AddrPort{netip.MustParseAddrPort(server)}})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestASharedResolverIsUsedAndOutlivesTheSession: a session given a
// resolver resolves through it, and closing the session leaves it
// serving the others that share it.
func TestASharedResolverIsUsedAndOutlivesTheSession(t *testing.T) {
	hosts := filepath.Join(t.TempDir(), "hosts")
	if err := os.WriteFile(hosts, []byte("192.0.2.7 shared.test\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r, err := dnsintercept.NewResolver(dnsintercept.ResolverConfig{Servers: []netip.AddrPort{netip.MustParseAddrPort("192.0.2.53:53")}, HostsFile: hosts})
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	o := options(t, &stderr)
	o.DNS.Resolver, o.DNS.HostsFile = r, hosts
	s, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	if s.resolver != r {
		t.Errorf("the session built its own resolver instead of the one it was given")
	}
	if _, err := s.Close(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if addrs, err := r.Resolve(ctx, "shared.test"); err != nil || len(addrs) != 1 || addrs[0] != netip.MustParseAddr("192.0.2.7") {
		t.Errorf("after the session closed, the shared resolver answers %v, %v", addrs, err)
	}
}
