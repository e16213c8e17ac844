package sandbox

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestTheUsersOwnCAFilesAndJavaOptionsAreKept(t *testing.T) {
	c := &Creds{
		Env:          []string{"PATH=/bin", "NODE_EXTRA_CA_CERTS=/corp/ca.pem", "JAVA_TOOL_OPTIONS=-Xss2m", "SSL_CERT_FILE=/x"},
		Bundle:       "/run/bundle.pem",
		Own:          []OwnBundle{{Var: "NODE_EXTRA_CA_CERTS", User: "/corp/ca.pem", File: "/tmp/d/NODE_EXTRA_CA_CERTS.pem"}},
		JavaStore:    "/tmp/d/java.p12",
		JavaPassword: "changeit",
	}
	env := c.environ("/etc/ssl/certs/ca-certificates.crt")
	for k, want := range map[string]string{
		"NODE_EXTRA_CA_CERTS": "/tmp/d/NODE_EXTRA_CA_CERTS.pem",
		"SSL_CERT_FILE":       "/etc/ssl/certs/ca-certificates.crt",
		"CURL_CA_BUNDLE":      "/etc/ssl/certs/ca-certificates.crt",
		"JAVA_TOOL_OPTIONS":   "-Xss2m -Djavax.net.ssl.trustStore=/tmp/d/java.p12 -Djavax.net.ssl.trustStoreType=PKCS12 -Djavax.net.ssl.trustStorePassword=changeit",
		"PATH":                "/bin",
	} {
		if v, _ := envOf(env, k); v != want {
			t.Errorf("%s=%q, want %q", k, v, want)
		}
	}
	n := 0
	for _, kv := range env {
		if strings.HasPrefix(kv, "JAVA_TOOL_OPTIONS=") || strings.HasPrefix(kv, "NODE_EXTRA_CA_CERTS=") {
			n++
		}
	}
	if n != 2 {
		t.Errorf("a variable is set twice: %q", env)
	}
	c.JavaStore = ""
	if _, ok := envOf(c.environ("/b"), "JAVA_TOOL_OPTIONS"); !ok {
		t.Errorf("without a trust store the user's JAVA_TOOL_OPTIONS is dropped")
	}
}

func TestBwrapShowsTheUsersOwnCAFileWhereItCan(t *testing.T) {
	dir := t.TempDir()
	user := filepath.Join(dir, "corp.pem")
	os.WriteFile(user, []byte("corp"), 0o644)
	merged := filepath.Join(dir, "creds", "NODE_EXTRA_CA_CERTS.pem")
	store := filepath.Join(dir, "creds", "java.p12")
	c := &Creds{
		Env:       []string{"NODE_EXTRA_CA_CERTS=" + user},
		Bundle:    filepath.Join(dir, "creds", "bundle.pem"),
		Own:       []OwnBundle{{Var: "NODE_EXTRA_CA_CERTS", User: user, File: merged}},
		JavaStore: store, JavaPassword: "changeit",
	}
	setenv := func(out []string, k string) string {
		for i := 0; i+2 < len(out); i++ {
			if out[i] == "--setenv" && out[i+1] == k {
				return out[i+2]
			}
		}
		return ""
	}
	hasBind := func(out []string, src, dst string) bool {
		for i := 0; i+2 < len(out); i++ {
			if out[i] == "--ro-bind" && out[i+1] == src && out[i+2] == dst {
				return true
			}
		}
		return false
	}
	// The whole host, /tmp-like dir of tunwall's files hidden by a tmpfs:
	// the user's file is covered with the merged one.
	out := c.bwrapExtra([]string{"--ro-bind", "/", "/", "--tmpfs", filepath.Join(dir, "creds")}, DefaultHostUser())
	if v := setenv(out, "NODE_EXTRA_CA_CERTS"); v != user || !hasBind(out, merged, user) {
		t.Errorf("a tmpfs over tunwall's files: NODE_EXTRA_CA_CERTS=%q, args %q", v, out)
	}
	// tunwall's files visible: named where they are.
	out = c.bwrapExtra([]string{"--ro-bind", "/", "/"}, DefaultHostUser())
	if v := setenv(out, "NODE_EXTRA_CA_CERTS"); v != merged || hasBind(out, merged, user) {
		t.Errorf("tunwall's files visible: NODE_EXTRA_CA_CERTS=%q, args %q", v, out)
	}
	if v := setenv(out, "JAVA_TOOL_OPTIONS"); !strings.Contains(v, "-Djavax.net.ssl.trustStore="+store+" ") {
		t.Errorf("JAVA_TOOL_OPTIONS=%q", v)
	}
	// Neither visible: the shared bundle, and no Java options naming a
	// file the sandbox cannot open.
	out = c.bwrapExtra([]string{"--ro-bind", "/usr", "/usr"}, DefaultHostUser())
	if v := setenv(out, "NODE_EXTRA_CA_CERTS"); v != BundlePaths[0] || slices.Contains(out, merged) {
		t.Errorf("nothing visible: NODE_EXTRA_CA_CERTS=%q, args %q", v, out)
	}
	if v := setenv(out, "JAVA_TOOL_OPTIONS"); v != "" || !slices.Contains(out, "--unsetenv") {
		t.Errorf("JAVA_TOOL_OPTIONS=%q (args %q): want it unset, the store is not visible", v, out)
	}
	c.Env = append(c.Env, "JAVA_TOOL_OPTIONS=-Xss2m")
	if v := setenv(c.bwrapExtra([]string{"--ro-bind", "/usr", "/usr"}, DefaultHostUser()), "JAVA_TOOL_OPTIONS"); v != "-Xss2m" {
		t.Errorf("JAVA_TOOL_OPTIONS=%q, want the user's own, the store is not visible", v)
	}
}
