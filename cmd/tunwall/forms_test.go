package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tunwall/tunwall/policy"
)

const pipePolicy = "version: 1\nphases:\n  exec:\n    allow:\n      - host: allowed.test\n"

// pipeWith returns the read end of a pipe that holds s and is closed for
// writing: a file that can be read once, as /dev/stdin or <(...) are.
func pipeWith(t *testing.T, s string) *os.File {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	if _, err := w.WriteString(s); err != nil {
		t.Fatal(err)
	}
	w.Close()
	return r
}

// TestPolicyFromAPipeIsReadOnce loads a run's policy the way run, bwrap,
// attach and socks do (preflight, credentials, then the session's own
// loadRules) from a pipe that can be read only once.
func TestPolicyFromAPipeIsReadOnce(t *testing.T) {
	for _, form := range []string{"/dev/fd/N (as <(...))", "-"} {
		t.Run(form, func(t *testing.T) {
			r := pipeWith(t, pipePolicy)
			c := commonFlags{policyFile: fmt.Sprintf("/proc/self/fd/%d", r.Fd())}
			if form == "-" {
				saved := os.Stdin
				os.Stdin = r
				t.Cleanup(func() { os.Stdin = saved })
				c.policyFile = "-"
			}
			var stderr bytes.Buffer
			if code := c.preflight(&stderr); code != exitOK {
				t.Fatalf("preflight: exit %d\n%s", code, stderr.String())
			}
			defer c.creds.close()
			for i := range 2 {
				_, rs, _, err := c.loadRules()
				if err != nil {
					t.Fatalf("loadRules #%d after preflight: %v", i+2, err)
				}
				if d := rs.DecideName("allowed.test", 443, policy.TCP); !d.Allowed() {
					t.Errorf("loadRules #%d: allowed.test:443 %v", i+2, d.Verdict)
				}
			}
		})
	}
}

func TestInputFormMessages(t *testing.T) {
	dir := t.TempDir()
	multi := filepath.Join(dir, "multi.yaml")
	os.WriteFile(multi, []byte("version: 1\nphases:\n  exec:\n    allow:\n      - host: .example.com\n      - host: ok.test\n      - cidr: 10.0.0.0/33\n      - host: a.test\n        ports: [0]\n"), 0o600)
	wide := filepath.Join(dir, "wide.yaml")
	os.WriteFile(wide, []byte("version: 1\nphases:\n  exec:\n    allow:\n      - host: \"*.co.uk\"\n      - cidr: 0.0.0.0/0\n        ports: [443]\n"), 0o600)
	net := []string{"--dns-upstream", "192.0.2.53:53"}
	cases := []struct {
		name        string
		args        []string
		code        int
		out, errOut []string // substrings of stdout, stderr
		notErr      []string // not in stderr
	}{
		{"--allow is named once", append(append([]string{"run"}, net...), "--allow", "X:", "--", "true"), 2,
			nil, []string{`--allow "X:": bad port`}, []string{`--allow X:`}},
		{"icmp is not a bad cidr", append(append([]string{"run"}, net...), "--allow", "allowed.test/icmp", "--", "true"), 2,
			nil, []string{`unknown protocol "icmp"`}, []string{"cidr"}},
		{"a URL", append(append([]string{"run"}, net...), "--allow", "https://allowed.test", "--", "true"), 2,
			nil, []string{"want HOST[:PORT]"}, []string{"cidr"}},
		{"two ports", append(append([]string{"run"}, net...), "--allow", "allowed.test:443:80", "--", "true"), 2,
			nil, []string{"want HOST:PORT"}, []string{"cidr"}},
		{"IPv6 and a port without brackets", append(append([]string{"run"}, net...), "--allow", "2001:db8::10:443", "--", "true"), 2,
			nil, []string{"[2001:db8::10]:443"}, nil},
		{"a leading dot", append(append([]string{"run"}, net...), "--allow", ".example.com", "--", "true"), 2,
			nil, []string{`"*.example.com"`, `"example.com" as well`}, nil},
		{"policy check reports every error", []string{"policy", "check", multi}, 1,
			nil, []string{"multi.yaml:5:", "multi.yaml:7:", "multi.yaml:9:"}, nil},
		{"run reports every error of its policy", append(append([]string{"run"}, net...), "--policy", multi, "--", "true"), 2,
			nil, []string{"multi.yaml:5:", "multi.yaml:7:", "multi.yaml:9:"}, nil},
		{"policy check warns of a public suffix and 0.0.0.0/0", []string{"policy", "check", wide}, 0,
			[]string{"wide.yaml:5: warning: *.co.uk", "wide.yaml:6: warning: cidr 0.0.0.0/0"}, nil, nil},
		{"a serving command warns too", append(append([]string{"attach"}, net...), "--netns", "/nonexistent/ns", "--audit", "off", "--policy", wide), 125,
			nil, []string{"tunwall: warning: " + wide + ":5: *.co.uk", "warning: " + wide + ":6: cidr 0.0.0.0/0"}, nil},
		{"the audit log's error is not prefixed twice", append(append([]string{"socks"}, net...), "--listen", "127.0.0.1:0", "--allow", "a.test", "--audit", "/proc/tunwall-no-such-dir/a.jsonl"), 125,
			nil, []string{"tunwall: audit: "}, []string{"audit log: audit:"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(context.Background(), c.args, &stdout, &stderr)
			if code != c.code {
				t.Errorf("exit %d, want %d\n--- stdout\n%s--- stderr\n%s", code, c.code, stdout.String(), stderr.String())
			}
			for _, s := range c.out {
				if !strings.Contains(stdout.String(), s) {
					t.Errorf("stdout lacks %q:\n%s", s, stdout.String())
				}
			}
			for _, s := range c.errOut {
				if !strings.Contains(stderr.String(), s) {
					t.Errorf("stderr lacks %q:\n%s", s, stderr.String())
				}
			}
			for _, s := range c.notErr {
				if strings.Contains(stderr.String(), s) {
					t.Errorf("stderr has %q:\n%s", s, stderr.String())
				}
			}
		})
	}
}
