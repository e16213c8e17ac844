package session

import (
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/tunwall/tunwall/internal/testenv"
	"github.com/tunwall/tunwall/policy"
)

func TestCredentialsReadTheSecretsAndMakeACAOnlyForTheTerminatedHosts(t *testing.T) {
	t.Setenv("TW_SESSION_TOKEN", "s3cr3t-value-of-enough-length")
	file := filepath.Join(t.TempDir(), "key")
	os.WriteFile(file, []byte("another-secret-value-long-enough"), 0o600)
	var warned []string
	cr, err := NewCredentials(CredentialsOptions{
		Secrets: []policy.SecretSource{
			{Name: "TOKEN", Env: "TW_SESSION_TOKEN", Source: "test"},
			{Name: "KEY", File: file, Source: "test"},
		},
		Terminate: []string{"api.example", "*.corp.example"},
		Warn:      func(s string) { warned = append(warned, s) },
	})
	if err != nil {
		t.Fatal(err)
	}
	ss := cr.Secrets()
	if cr.Len() != 2 || len(ss) != 2 || ss[0].Name != "TOKEN" || ss[0].From != "env:TW_SESSION_TOKEN" || ss[1].Name != "KEY" || !strings.HasPrefix(ss[1].From, "file:") {
		t.Fatalf("secrets %+v", ss)
	}
	env := cr.Environ([]string{"TW_SESSION_TOKEN=s3cr3t-value-of-enough-length", "COPY=x s3cr3t-value-of-enough-length", "HOME=/h"})
	for _, kv := range env {
		if strings.Contains(kv, "s3cr3t") {
			t.Errorf("the sandbox's environment holds the value: %q", kv)
		}
	}
	if !slices.Contains(env, "TOKEN="+ss[0].Placeholder) || !slices.Contains(env, "HOME=/h") {
		t.Errorf("environment %q", env)
	}
	if files := cr.Files(); len(files) != 1 || files[0] != file {
		t.Errorf("files to hide %q, want [%s]", files, file)
	}
	blk, _ := pem.Decode(cr.CACertPEM())
	if blk == nil {
		t.Fatal("no CA certificate")
	}
	ca, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if !ca.IsCA || !slices.Equal(ca.PermittedDNSDomains, []string{"api.example", "corp.example"}) {
		t.Errorf("CA: IsCA %v, permitted %q", ca.IsCA, ca.PermittedDNSDomains)
	}

	// Nothing terminated: no CA.
	cr, err = NewCredentials(CredentialsOptions{})
	if err != nil || cr.CACertPEM() != nil || cr.Len() != 0 {
		t.Errorf("no secrets, no rule terminating: %v, CA %v, %d secrets", err, cr.CACertPEM() != nil, cr.Len())
	}
	// None at all: nil says so.
	var none *Credentials
	if none.Len() != 0 || none.Secrets() != nil || none.Files() != nil || none.CACertPEM() != nil || len(none.Environ([]string{"A=b"})) != 1 {
		t.Errorf("nil credentials are not empty")
	}
	// A secret that cannot be read fails.
	if _, err := NewCredentials(CredentialsOptions{Secrets: []policy.SecretSource{{Name: "GONE", Env: "TW_SESSION_UNSET", Source: "test"}}}); err == nil {
		t.Errorf("an unset variable's secret was loaded")
	}
}

func TestLocalNamespaceIsTunwallsOwn(t *testing.T) {
	diag, netns, err := LocalNamespace()
	if err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Stat("/proc/self/ns/net", &st); err != nil {
		t.Fatal(err)
	}
	if netns != st.Ino {
		t.Errorf("netns %d, want %d", netns, st.Ino)
	}
	if diag < 0 {
		testenv.Skip(t, "no sock_diag socket in this namespace (the inode was checked)")
	}
	unix.Close(diag)
}
