package integration

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tunwall/tunwall/internal/audit"
	"github.com/tunwall/tunwall/internal/testworld"
)

// world is a test world for one test, removed when the test ends.
type world struct {
	*testworld.World
	t     *testing.T
	dir   string // scratch directory every user can write
	caPEM string // the world's TLS CA, for clients
	runs  atomic.Int32
	// lastPid is the pid of the tunwall runWithCtlMarks started last.
	lastPid int
}

// requireRoot skips a test when not root, loudly, but fails it in CI.
func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("integration tests need root, and CI=true: refusing to skip")
	}
	t.Skip("SKIPPING: integration tests need root (namespaces, veth); run 'sudo make test'")
}

// requireTools fails (or skips outside CI) when a client is missing.
func requireTools(t *testing.T, tools ...string) {
	t.Helper()
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("%s is not installed (.ci/run installs it)", tool)
			}
			t.Skipf("SKIPPING: %s is not installed", tool)
		}
	}
}

func newWorld(t *testing.T, opts ...testworld.Options) *world {
	t.Helper()
	requireRoot(t)
	var o testworld.Options
	if len(opts) > 0 {
		o = opts[0]
	}
	o.Logf = t.Logf
	tw, err := testworld.New(o)
	if err != nil {
		t.Fatalf("test world: %v", err)
	}
	t.Cleanup(tw.Close)
	dir, err := os.MkdirTemp("", "tunwall-world-")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(dir, 0o777)
	t.Cleanup(func() { os.RemoveAll(dir) })
	ca, err := tw.CA.WritePEM(dir)
	if err != nil {
		t.Fatal(err)
	}
	return &world{World: tw, t: t, dir: dir, caPEM: ca}
}

// runOpts describes one `tunwall run` in the agent namespace.
type runOpts struct {
	flags   []string      // tunwall flags; --dns-upstream, --resolv-conf and --audit are added unless given
	script  string        // run as sh -c SCRIPT inside the sandbox
	argv    []string      // or a command line
	asUser  int           // run tunwall as this uid (rootless); 0 means root
	timeout time.Duration // default 120s
	env     []string      // extra environment
	noAudit bool          // do not add --audit
	// bwrap runs `tunwall bwrap` instead of `tunwall run`, with these bwrap
	// options before the command.
	bwrap []string
}

type result struct {
	stdout, stderr string
	code           int
	audit          string // path of the audit log
	elapsed        time.Duration
}

func (r result) String() string {
	return fmt.Sprintf("exit %d\n--- stdout\n%s--- stderr\n%s", r.code, r.stdout, r.stderr)
}

// tunwallCmd builds the command line for one tunwall invocation in the agent
// namespace.
func (w *world) tunwallCmd(ctx context.Context, o runOpts, sub string) (*exec.Cmd, string) {
	n := w.runs.Add(1)
	auditPath := filepath.Join(w.dir, fmt.Sprintf("audit-%d.jsonl", n))
	args := []string{sub}
	if !hasFlag(o.flags, "--dns-upstream") && !hasFlag(o.flags, "--resolv-conf") {
		args = append(args, "--dns-upstream", "192.0.2.53:53")
	}
	if !hasFlag(o.flags, "--resolv-conf") {
		// The machine's resolver settings (search list, options) stay
		// out of the test world.
		args = append(args, "--resolv-conf", "/dev/null")
	}
	if !o.noAudit && !hasFlag(o.flags, "--audit") {
		args = append(args, "--audit", auditPath)
	}
	args = append(args, o.flags...)
	if sub == "bwrap" {
		args = append(append(args, "--"), o.bwrap...)
	}
	if o.script != "" {
		args = append(args, "--", "sh", "-c", o.script)
	} else if len(o.argv) > 0 {
		args = append(args, "--")
		args = append(args, o.argv...)
	}
	full := []string{tunwallBin}
	if o.asUser != 0 {
		full = append([]string{"setpriv", fmt.Sprintf("--reuid=%d", o.asUser), fmt.Sprintf("--regid=%d", o.asUser), "--clear-groups", "--"}, full...)
	}
	full = append(full, args...)
	cmd := w.AgentCommand(ctx, full[0], full[1:]...)
	cmd.Env = append(os.Environ(), "HOME="+w.dir, "SSL_CERT_FILE="+w.caPEM, "NODE_EXTRA_CA_CERTS="+w.caPEM, "CURL_CA_BUNDLE="+w.caPEM)
	cmd.Env = append(cmd.Env, o.env...)
	cmd.Dir = w.dir
	cmd.WaitDelay = 5 * time.Second
	return cmd, auditPath
}

func hasFlag(flags []string, name string) bool {
	for _, f := range flags {
		if f == name || strings.HasPrefix(f, name+"=") {
			return true
		}
	}
	return false
}

// run runs tunwall to completion.
func (w *world) run(o runOpts) result {
	w.t.Helper()
	if o.timeout == 0 {
		o.timeout = 120 * time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), o.timeout)
	defer cancel()
	sub := "run"
	if o.bwrap != nil {
		sub = "bwrap"
	}
	cmd, auditPath := w.tunwallCmd(ctx, o, sub)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	r := result{stdout: stdout.String(), stderr: stderr.String(), audit: auditPath, elapsed: time.Since(start)}
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		r.code = ee.ExitCode()
		if ctx.Err() != nil {
			w.t.Fatalf("tunwall %s timed out after %v\n%s", sub, o.timeout, r)
		}
	default:
		w.t.Fatalf("tunwall %s: %v\n%s", sub, err, r)
	}
	w.t.Logf("tunwall %s: exit %d in %v", sub, r.code, r.elapsed.Round(time.Millisecond))
	return r
}

// mustRun runs and fails the test unless tunwall exits with want.
func (w *world) mustRun(want int, o runOpts) result {
	w.t.Helper()
	r := w.run(o)
	if r.code != want {
		w.t.Fatalf("want exit %d\n%s", want, r)
	}
	return r
}

// records reads an audit log, failing the test on any error.
func records(t *testing.T, path string) []audit.Record {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []audit.Record
	for r, err := range audit.Records(f) {
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		out = append(out, r)
	}
	return out
}

// noArrivals fails the test if any of the named logging servers saw
// anything.
func (w *world) noArrivals(servers ...string) {
	w.t.Helper()
	for _, s := range servers {
		if a := w.Arrivals(s); len(a) > 0 {
			w.t.Errorf("server %q must never be reached, but saw %d arrivals, first %+v", s, len(a), a[0])
		}
	}
}

// lines returns the non-empty lines of s.
func lines(s string) []string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			out = append(out, l)
		}
	}
	return out
}

// wantLines checks that stdout has exactly these lines.
func wantLines(t *testing.T, r result, want ...string) {
	t.Helper()
	got := lines(r.stdout)
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("stdout:\n got %q\nwant %q\n%s", got, want, r)
	}
}
