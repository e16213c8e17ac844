package session

import (
	"bytes"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"

	"github.com/tunwall/tunwall/internal/audit"
	"github.com/tunwall/tunwall/internal/control"
	"github.com/tunwall/tunwall/internal/leaktest"
	"github.com/tunwall/tunwall/internal/netplan"
)

// TestTheControlSocketCountsWhatTheSessionDecidesAndGoesWithIt serves a
// session with a control socket, sends it an allowed and a denied DNS
// query, and reads them in the socket's status and metrics; Close removes
// the socket, and a session that fails New closes the one it was given.
func TestTheControlSocketCountsWhatTheSessionDecidesAndGoesWithIt(t *testing.T) {
	leaktest.Check(t)
	var stderr bytes.Buffer
	o := options(t, &stderr)
	path := filepath.Join(t.TempDir(), "tw-sessiontest.sock")
	ln, err := control.Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	o.Control, o.Run = ln, "tw-sessiontest"
	if o.Audit.Labels, err = audit.NewLabels(map[string]string{"task": "T-12"}); err != nil {
		t.Fatal(err)
	}
	s, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	if s.Run() != "tw-sessiontest" || s.ControlPath() != path {
		t.Errorf("run %q, control %q", s.Run(), s.ControlPath())
	}
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
		answer(t, sandbox)
	}
	var st *control.Status
	for deadline := time.Now().Add(5 * time.Second); ; {
		r, err := control.Ask(path, control.Request{Cmd: control.CmdStatus})
		if err != nil {
			t.Fatal(err)
		}
		st = r.Status
		if st.Totals.DNSAllowed+st.Totals.DNSDenied == 2 || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if st.Run != "tw-sessiontest" || st.Phase != "exec" || st.PolicyFile != "" || st.Totals.DNSAllowed != 1 || st.Totals.DNSDenied != 1 || st.Pid != os.Getpid() || st.Labels["task"] != "T-12" {
		t.Errorf("status %+v", st)
	}
	r, err := control.Ask(path, control.Request{Cmd: control.CmdMetrics})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`tunwall_dns_queries_total{phase="exec",verdict="deny"} 1`,
		`tunwall_denials_total{kind="dns",phase="exec",rule="default-deny"} 1`,
		`tunwall_run_info{phase="exec",run="tw-sessiontest"} 1`,
	} {
		if !strings.Contains(r.Metrics, want) {
			t.Errorf("metrics lack %q:\n%s", want, r.Metrics)
		}
	}
	if _, err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the socket outlived Close: %v", err)
	}

	// A session that fails New closes the socket it was given.
	ln2, err := control.Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	bad := options(t, &stderr)
	bad.Control, bad.Run = ln2, "../escape"
	if _, err := New(bad); !errors.Is(err, ErrOptions) {
		t.Errorf("New with run %q: %v, want ErrOptions", bad.Run, err)
	}
	if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the socket outlived a failed New: %v", err)
	}
}
