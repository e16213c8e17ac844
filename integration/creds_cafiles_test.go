package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// caKeyMarker is in a private key block the user's CA file also holds.
const caKeyMarker = "TW-PRIVATE-KEY-OF-THE-CA-FILE"

// TestCredsOnlyCertificatesOfTheUsersCAFilesReachTheSandbox: tunwall
// copies the user's CA files (NODE_EXTRA_CA_CERTS, ..., and the host
// roots of SSL_CERT_FILE) into the run's directory, which the sandbox
// reads, so that they hold the run's CA too. A file that also holds a
// private key (a cert and its key in one PEM, as some set-ups keep them)
// or anything else must not hand that to the sandbox: only certificates
// are copied.
func TestCredsOnlyCertificatesOfTheUsersCAFilesReachTheSandbox(t *testing.T) {
	requireTools(t, "curl")
	cw := newCredsWorld(t, 0)
	ca, err := os.ReadFile(cw.caPEM)
	if err != nil {
		t.Fatal(err)
	}
	mixed := filepath.Join(cw.world.dir, "corp-with-key.pem")
	junk := "-----BEGIN PRIVATE KEY-----\n" + caKeyMarker + "\n-----END PRIVATE KEY-----\n" + caKeyMarker + "-trailing-text\n"
	if err := os.WriteFile(mixed, append(append([]byte(junk), ca...), junk...), 0o644); err != nil {
		t.Fatal(err)
	}
	hostRoots, _ := os.ReadFile("/etc/ssl/certs/ca-certificates.crt")
	roots := filepath.Join(cw.world.dir, "roots-with-key.pem")
	if err := os.WriteFile(roots, append(append(append([]byte(junk), hostRoots...), ca...), junk...), 0o644); err != nil {
		t.Fatal(err)
	}
	r := cw.world.run(runOpts{
		flags:  []string{"--policy", cw.policy},
		script: `echo "marker lines: $(cat "$NODE_EXTRA_CA_CERTS" "$SSL_CERT_FILE" "$CURL_CA_BUNDLE" /etc/ssl/certs/ca-certificates.crt 2>/dev/null | grep -c ` + caKeyMarker + `)"; curl -sS https://plain.creds.test/ca-ok`,
		env: []string{"TW_TEST_GITHUB_TOKEN=" + credsToken, "SSL_CERT_FILE=" + roots,
			"NODE_EXTRA_CA_CERTS=" + mixed, "CURL_CA_BUNDLE=" + mixed},
	})
	if !strings.Contains(r.stdout, "marker lines: 0\n") {
		t.Errorf("the sandbox read what the user's CA file holds besides certificates\n%s", r)
	}
	if !strings.Contains(r.stdout, "paste: stored") {
		t.Errorf("the user's CA no longer works in the sandbox (its certificates were not copied)\n%s", r)
	}
}

// TestCredsAFIFONamedAsACAFileDoesNotHangTheStart: a CA variable (or the
// host roots' SSL_CERT_FILE, a FIFO in SSL_CERT_DIR) naming a FIFO, a device or a directory must
// not hang tunwall's start reading it, nor a rule's ca: naming one: each
// is refused or passed over with a line that names it, at once.
func TestCredsAFIFONamedAsACAFileDoesNotHangTheStart(t *testing.T) {
	cw := newCredsWorld(t, 0)
	fifo := filepath.Join(cw.world.dir, "ca.fifo")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	// A directory of certificates (SSL_CERT_DIR, read for the host's
	// roots) holding a FIFO.
	certDir := filepath.Join(cw.world.dir, "certdir")
	if err := os.Mkdir(certDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(certDir, "ca.pem"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		env  []string
		pol  string
		want string
	}{
		{"NODE_EXTRA_CA_CERTS", []string{"NODE_EXTRA_CA_CERTS=" + fifo}, cw.policy, "NODE_EXTRA_CA_CERTS=" + fifo + " cannot be used"},
		{"SSL_CERT_FILE", []string{"SSL_CERT_FILE=" + fifo}, cw.policy, "SSL_CERT_FILE=" + fifo},
		{"a rule's ca", nil, "", "fifo-ca.yaml:5: ca "},
		{"SSL_CERT_DIR", []string{"SSL_CERT_DIR=" + certDir}, cw.policy, "SSL_CERT_DIR=" + certDir},
	} {
		func() {
			pol := c.pol
			if pol == "" {
				pol = writeSetupPolicy(t, cw.world, "fifo-ca.yaml", fmt.Sprintf(`version: 1
phases:
  exec:
    allow:
      - host: api.creds.test
        http: [{methods: [GET], paths: ["/**"]}]
        ca: %s
`, fifo))
			}
			start := time.Now()
			r := cw.world.run(runOpts{flags: []string{"--policy", pol}, script: "true", timeout: 20 * time.Second,
				env: append([]string{"TW_TEST_GITHUB_TOKEN=" + credsToken}, c.env...)})
			if took := time.Since(start); took > 15*time.Second {
				t.Fatalf("tunwall took %v to start with a FIFO as %s\n%s", took, c.name, r)
			}
			if !strings.Contains(r.stderr, c.want) {
				t.Errorf("%s: no line naming the FIFO (%q)\n%s", c.name, c.want, r)
			}
		}()
	}
}
