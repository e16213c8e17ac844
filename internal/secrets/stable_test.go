package secrets

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/tunwall/tunwall/policy"
)

func TestAProjectKeyGivesTheSamePlaceholdersEveryRunAndNeverFromTheValue(t *testing.T) {
	state := t.TempDir()
	key, err := ProjectKey(state, "/home/u/widget")
	if err != nil {
		t.Fatal(err)
	}
	path := ProjectKeyPath(state, "/home/u/widget")
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file %s: %v, mode %v; want 0600", path, err, fi.Mode())
	}
	if di, _ := os.Stat(filepath.Dir(path)); di.Mode().Perm() != 0o700 {
		t.Errorf("key directory mode %v, want 0700", di.Mode().Perm())
	}
	srcs := []policy.SecretSource{{Name: "GITHUB_TOKEN", Env: "GH"}, {Name: "NPM_TOKEN", Env: "NPM"}}
	placeholders := func(key []byte, value string) []string {
		t.Helper()
		st, err := Load(srcs, Options{PlaceholderKey: key, LookupEnv: func(string) (string, bool) { return value, true }})
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, s := range st.All() {
			out = append(out, s.Placeholder)
		}
		return out
	}
	again, err := ProjectKey(state, "/home/u/widget")
	if err != nil {
		t.Fatal(err)
	}
	a, b := placeholders(key, "value-one"), placeholders(again, "another-value")
	if a[0] != b[0] || a[1] != b[1] {
		t.Errorf("one project's placeholders differ between runs (or with the value): %q, %q", a, b)
	}
	if !strings.HasPrefix(a[0], "twp_GITHUB_TOKEN_") || len(a[0]) != len("twp_GITHUB_TOKEN_")+32 || a[0][len("twp_GITHUB_TOKEN_"):] == a[1][len("twp_NPM_TOKEN_"):] {
		t.Errorf("placeholders %q", a)
	}
	other, err := ProjectKey(state, "/home/u/other")
	if err != nil {
		t.Fatal(err)
	}
	if c := placeholders(other, "value-one"); c[0] == a[0] {
		t.Errorf("two projects share a placeholder")
	}
	if r := placeholders(nil, "value-one"); r[0] == a[0] {
		t.Errorf("without a key the placeholder is the stable one")
	}
}

func TestABadProjectKeyFileIsAnError(t *testing.T) {
	state := t.TempDir()
	path := ProjectKeyPath(state, "/p")
	os.MkdirAll(filepath.Dir(path), 0o700)
	os.WriteFile(path, []byte(strings.Repeat("ab", 32)+"\n"), 0o644)
	if _, err := ProjectKey(state, "/p"); err == nil || !strings.Contains(err.Error(), "group or others") || !strings.Contains(err.Error(), "remove it") {
		t.Errorf("a key others may read: %v", err)
	}
	os.Chmod(path, 0o600)
	os.WriteFile(path, []byte("short\n"), 0o600)
	if _, err := ProjectKey(state, "/p"); err == nil || !strings.Contains(err.Error(), "64-hex-digit") {
		t.Errorf("a key file without a key: %v", err)
	}
	os.Remove(path)
	os.Symlink("/etc/hostname", path)
	if _, err := ProjectKey(state, "/p"); err == nil {
		t.Errorf("a symlinked key file is read")
	}
}

func TestRunsStartingAtOnceGetOneKey(t *testing.T) {
	state := t.TempDir()
	var wg sync.WaitGroup
	keys := make([]string, 8)
	for i := range keys {
		wg.Add(1)
		go func() {
			defer wg.Done()
			k, err := ProjectKey(state, "/p")
			if err != nil {
				t.Error(err)
			}
			keys[i] = string(k)
		}()
	}
	wg.Wait()
	for _, k := range keys[1:] {
		if k != keys[0] {
			t.Fatalf("runs started at once got different keys")
		}
	}
	left, _ := filepath.Glob(filepath.Join(filepath.Dir(ProjectKeyPath(state, "/p")), ".new-key-*"))
	if len(left) != 0 {
		t.Errorf("temporary key files left: %q", left)
	}
}
