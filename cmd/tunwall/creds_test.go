package main

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"software.sslmate.com/src/go-pkcs12"

	"github.com/tunwall/tunwall/internal/session"
	"github.com/tunwall/tunwall/policy"
)

// testCAPEM makes a self-signed CA certificate, as PEM.
func testCAPEM(t *testing.T, cn string) ([]byte, *x509.Certificate) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: cn}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := x509.ParseCertificate(der)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), c
}

func TestPolicyCheckFailsOnAnUndeclaredSecretAndWarnsOfAnUninjectedOne(t *testing.T) {
	dir := t.TempDir()
	undeclared := filepath.Join(dir, "undeclared.yaml")
	os.WriteFile(undeclared, []byte("version: 1\nphases:\n  exec:\n    allow:\n      - host: api.example\n        inject: [TOKEN]\n"), 0o600)
	unused := filepath.Join(dir, "unused.yaml")
	os.WriteFile(unused, []byte("version: 1\nsecrets:\n  TOKEN: {env: T}\n  SPARE: {env: S}\nphases:\n  exec:\n    allow:\n      - host: api.example\n        inject: [TOKEN]\n"), 0o600)
	for _, tc := range []struct {
		name      string
		args      []string
		code      int
		out, errs string
	}{
		{"an undeclared secret fails", []string{"policy", "check", undeclared}, exitFail, "", "injects secret TOKEN, which is not declared"},
		{"--secret declares it", []string{"policy", "check", undeclared, "--secret", "TOKEN=env:T"}, exitOK, ": ok:", ""},
		{"a bad --secret", []string{"policy", "check", undeclared, "--secret", "TOKEN"}, exitUsage, "", "want NAME=env:VAR"},
		{"an uninjected secret is a warning", []string{"policy", "check", unused}, exitOK, "warning: secret SPARE is declared but no rule injects it; the sandbox gets its placeholder, which works nowhere (" + unused + ":4: add it", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			code := run(context.Background(), tc.args, &out, &errb)
			if code != tc.code || !strings.Contains(out.String(), tc.out) || !strings.Contains(errb.String(), tc.errs) {
				t.Errorf("exit %d, want %d\nstdout: %s\nstderr: %s", code, tc.code, out.String(), errb.String())
			}
			if tc.name == "an uninjected secret is a warning" && strings.Contains(out.String(), "TOKEN is declared") {
				t.Errorf("a warning for an injected secret:\n%s", out.String())
			}
		})
	}
}

func TestRunWarnsOfASecretNoRuleInjects(t *testing.T) {
	t.Setenv("TW_UNIT_TOKEN", "v")
	c := &commonFlags{secrets: secretFlags{"SPARE=env:TW_UNIT_TOKEN"}, inject: injectFlags{"api.example=TW_UNIT_TOKEN"}}
	p, rs, _, err := c.loadRules()
	if err != nil {
		t.Fatal(err)
	}
	var errb bytes.Buffer
	cr, err := loadCredentials(c, p, rs, []*policy.RuleSet{rs}, &errb)
	if err != nil {
		t.Fatal(err)
	}
	defer cr.close()
	want := "tunwall: WARNING: secret SPARE is declared but no rule injects it; the sandbox gets its placeholder, which works nowhere (--secret SPARE: "
	if !strings.Contains(errb.String(), want) || strings.Count(errb.String(), "no rule injects") != 1 {
		t.Errorf("stderr:\n%s\nwant one line: %s", errb.String(), want)
	}
	i := slices.IndexFunc(cr.creds.Secrets(), func(s session.Secret) bool { return s.Name == "TW_UNIT_TOKEN" })
	if i < 0 || cr.creds.Secrets()[i].From != "env:TW_UNIT_TOKEN" {
		t.Errorf("--inject's secret is not declared from its own variable: %v", cr.creds.Secrets())
	}
}

func TestTheRunsCABundlesAddToTheUsersOwn(t *testing.T) {
	dir := t.TempDir()
	corpPEM, _ := testCAPEM(t, "corp")
	runPEM, runCert := testCAPEM(t, "run")
	corp := filepath.Join(dir, "corp.pem")
	os.WriteFile(corp, corpPEM, 0o600)
	env := map[string]string{"NODE_EXTRA_CA_CERTS": corp, "PIP_CERT": filepath.Join(dir, "missing.pem"), "GIT_SSL_CAINFO": dir, "CURL_CA_BUNDLE": ""}
	var warnings []string
	own, err := ownBundles(dir, runPEM, func(k string) (string, bool) { v, ok := env[k]; return v, ok }, func(s string) { warnings = append(warnings, s) })
	if err != nil {
		t.Fatal(err)
	}
	if len(own) != 1 || own[0].Var != "NODE_EXTRA_CA_CERTS" || own[0].User != corp {
		t.Fatalf("own = %+v", own)
	}
	b, err := os.ReadFile(own[0].File)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(b, corpPEM) || !bytes.HasSuffix(b, runPEM) {
		t.Errorf("the sandbox's file is not the user's CA then the run's:\n%s", b)
	}
	if fi, _ := os.Stat(own[0].File); fi.Mode().Perm() != 0o644 {
		t.Errorf("mode %v, want 0644 (the sandbox's user reads it)", fi.Mode().Perm())
	}
	if len(warnings) != 2 || !strings.Contains(strings.Join(warnings, "\n"), "PIP_CERT="+filepath.Join(dir, "missing.pem")+" cannot be used") ||
		!strings.Contains(strings.Join(warnings, "\n"), "GIT_SSL_CAINFO="+dir+" cannot be used") {
		t.Errorf("warnings: %q", warnings)
	}

	host, hostCert := testCAPEM(t, "host root")
	store, err := writeJavaStore(dir, append(host, runPEM...), func(s string) { t.Error(s) })
	if err != nil {
		t.Fatal(err)
	}
	sb, err := os.ReadFile(store)
	if err != nil {
		t.Fatal(err)
	}
	certs, err := pkcs12.DecodeTrustStore(sb, javaStorePassword)
	if err != nil {
		t.Fatal(err)
	}
	if len(certs) != 2 || !certs[0].Equal(hostCert) || !certs[1].Equal(runCert) {
		t.Errorf("the trust store holds %d certificates, want the host's root and the run's CA", len(certs))
	}
}

// Only certificates of a user's CA file go into the copy the sandbox
// reads, and a file that is not a regular one is refused at once.
func TestCAFilesGiveOnlyCertificatesAndNeverBlock(t *testing.T) {
	dir := t.TempDir()
	corpPEM, _ := testCAPEM(t, "corp")
	key := []byte("-----BEGIN PRIVATE KEY-----\nTW-KEY\n-----END PRIVATE KEY-----\ntext between\n")
	bad := []byte("-----BEGIN CERTIFICATE-----\nTW-NOT-DER\n-----END CERTIFICATE-----\n")
	got := certsOnly(append(append(append(key, corpPEM...), bad...), key...))
	if !bytes.Equal(got, corpPEM) {
		t.Errorf("certsOnly kept %q, want only the certificate", got)
	}
	fifo := filepath.Join(dir, "fifo")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { _, err := readCAFile(fifo); done <- err }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "not a regular file") {
			t.Errorf("readCAFile(FIFO) = %v, want it refused as not a regular file", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("readCAFile blocked on a FIFO")
	}
	if _, err := readCAFile(dir); err == nil {
		t.Error("readCAFile took a directory")
	}
}

func TestCheckCertDirsRefusesWhatGoWouldHangOrDrownReading(t *testing.T) {
	ok := t.TempDir()
	os.WriteFile(filepath.Join(ok, "a.pem"), []byte("x"), 0o644)
	os.Mkdir(filepath.Join(ok, "sub"), 0o755)
	if err := checkCertDirs(ok + ":" + filepath.Join(ok, "missing")); err != nil {
		t.Fatalf("a directory of regular files: %v", err)
	}
	fifo := t.TempDir()
	if err := unix.Mkfifo(filepath.Join(fifo, "ca.pem"), 0o644); err != nil {
		t.Fatal(err)
	}
	dev := t.TempDir()
	os.Symlink("/dev/zero", filepath.Join(dev, "zero.pem"))
	for _, d := range []string{fifo, ok + ":" + dev} {
		done := make(chan error, 1)
		go func() { done <- checkCertDirs(d) }()
		select {
		case err := <-done:
			if err == nil || !strings.Contains(err.Error(), "not a regular file") {
				t.Errorf("%s: %v, want not a regular file", d, err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: checkCertDirs hung", d)
		}
	}
}
