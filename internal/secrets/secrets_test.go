package secrets

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tunwall/tunwall/policy"
)

const (
	ghValue  = "ghp_realGitHubTokenValue0123456789abcdef"
	npmValue = "npm_realNpmTokenValue9876543210"
)

func load(t *testing.T) (*Store, []string) {
	t.Helper()
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, ".config/tunwall"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, ".config/tunwall/npm-token"), []byte(npmValue+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var warnings []string
	env := map[string]string{"GH_PAT": ghValue}
	st, err := Load([]policy.SecretSource{
		{Name: "GITHUB_TOKEN", Env: "GH_PAT"},
		{Name: "NPM_TOKEN", File: "~/.config/tunwall/npm-token"},
	}, Options{
		LookupEnv: func(k string) (string, bool) { v, ok := env[k]; return v, ok },
		Home:      dir,
		Warn:      func(s string) { warnings = append(warnings, s) },
	})
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	return st, warnings
}

func TestLoadReadsValuesAndMakesPlaceholders(t *testing.T) {
	st, warnings := load(t)
	gh, _ := st.Get("GITHUB_TOKEN")
	npm, _ := st.Get("NPM_TOKEN")
	if gh.Value().Reveal() != ghValue || npm.Value().Reveal() != npmValue {
		t.Fatal("values were not read (or the file's newline was kept)")
	}
	for _, s := range []*Secret{gh, npm} {
		if !strings.HasPrefix(s.Placeholder, "twp_"+s.Name+"_") || len(s.Placeholder) != len("twp_"+s.Name+"_")+32 {
			t.Errorf("placeholder %q", s.Placeholder)
		}
	}
	st2, _ := load(t)
	if g2, _ := st2.Get("GITHUB_TOKEN"); g2.Placeholder == gh.Placeholder {
		t.Error("two runs got the same placeholder")
	}
	if len(warnings) != 1 || !strings.Contains(warnings[0], "mode 0644") || strings.Contains(warnings[0], npmValue) {
		t.Errorf("warnings = %q, want one about the file's mode", warnings)
	}
	if got := st.Files(); len(got) != 1 || !strings.HasSuffix(got[0], "/.config/tunwall/npm-token") || !filepath.IsAbs(got[0]) {
		t.Errorf("Files() = %q", got)
	}
}

func TestLoadErrorsNameTheSecretNeverTheValue(t *testing.T) {
	dir := t.TempDir()
	nl := filepath.Join(dir, "nl")
	os.WriteFile(nl, []byte("abc\ndef-"+ghValue), 0o600)
	empty := filepath.Join(dir, "empty")
	os.WriteFile(empty, []byte("\n"), 0o600)
	env := map[string]string{"EMPTY": "", "NL": "a\rb" + ghValue}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	for _, tc := range []struct {
		src  policy.SecretSource
		want string
	}{
		{policy.SecretSource{Name: "A", Env: "MISSING"}, "has no MISSING"},
		{policy.SecretSource{Name: "A", Env: "EMPTY"}, "no value"},
		{policy.SecretSource{Name: "A", Env: "NL"}, "line break"},
		{policy.SecretSource{Name: "A", File: nl}, "line break"},
		{policy.SecretSource{Name: "A", File: empty}, "no value"},
		{policy.SecretSource{Name: "A", File: filepath.Join(dir, "none")}, "no such file"},
		{policy.SecretSource{Name: "A", File: dir}, "not a regular file"},
	} {
		_, err := Load([]policy.SecretSource{tc.src}, Options{LookupEnv: lookup})
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "A") || strings.Contains(err.Error(), ghValue) {
			t.Errorf("Load(%+v) = %v, want %q", tc.src, err, tc.want)
		}
	}
	_, err := Load([]policy.SecretSource{{Name: "A", Env: "X"}, {Name: "A", Env: "Y"}}, Options{LookupEnv: func(string) (string, bool) { return "v", true }})
	if err == nil || !strings.Contains(err.Error(), "declared twice") {
		t.Errorf("a duplicate: %v", err)
	}
}

// TestValuesNeverPrint formats a secret every way a log line, an error or
// a record could.
func TestValuesNeverPrint(t *testing.T) {
	st, _ := load(t)
	gh, _ := st.Get("GITHUB_TOKEN")
	var out bytes.Buffer
	for _, f := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x", "%X", "%d", "%10.3s"} {
		fmt.Fprintf(&out, f+"\n", gh)
		fmt.Fprintf(&out, f+"\n", *gh)
		fmt.Fprintf(&out, f+"\n", gh.Value())
		fmt.Fprintf(&out, f+"\n", st)
	}
	fmt.Fprintln(&out, gh, gh.Value(), st.All())
	j, err := json.Marshal(map[string]any{"s": gh, "v": gh.Value(), "all": st.All()})
	if err != nil {
		t.Fatal(err)
	}
	out.Write(j)
	slog.New(slog.NewJSONHandler(&out, nil)).Info("x", "secret", gh, "value", gh.Value())
	slog.New(slog.NewTextHandler(&out, nil)).Info("x", "secret", gh, "value", gh.Value())
	if name, ok := st.ContainsValue(out.Bytes()); ok {
		t.Fatalf("the value of %s was printed:\n%s", name, out.String())
	}
	if !strings.Contains(out.String(), "[redacted]") {
		t.Fatalf("no [redacted] in:\n%s", out.String())
	}
}

func TestEnvironHoldsPlaceholdersOnly(t *testing.T) {
	st, _ := load(t)
	gh, _ := st.Get("GITHUB_TOKEN")
	npm, _ := st.Get("NPM_TOKEN")
	env := st.Environ([]string{
		"HOME=/home/u",
		"GH_PAT=" + ghValue,
		"GITHUB_TOKEN=stale",
		"GH_TOKEN=" + ghValue,
		"NPM_CONFIG_X=//registry/:_authToken=" + npmValue + ";" + ghValue,
	})
	joined := strings.Join(env, "\n")
	if name, ok := st.ContainsValue([]byte(joined)); ok {
		t.Fatalf("the value of %s is in the environment:\n%s", name, joined)
	}
	want := []string{
		"HOME=/home/u",
		"GH_TOKEN=" + gh.Placeholder,
		"NPM_CONFIG_X=//registry/:_authToken=" + npm.Placeholder + ";" + gh.Placeholder,
		"GITHUB_TOKEN=" + gh.Placeholder,
		"NPM_TOKEN=" + npm.Placeholder,
	}
	if joined != strings.Join(want, "\n") {
		t.Fatalf("Environ =\n%s\nwant\n%s", joined, strings.Join(want, "\n"))
	}
}

func TestScanFindsPlaceholdersInEveryFormAClientSends(t *testing.T) {
	st, _ := load(t)
	gh, _ := st.Get("GITHUB_TOKEN")
	npm, _ := st.Get("NPM_TOKEN")
	ph := gh.Placeholder
	b64 := base64.StdEncoding.EncodeToString([]byte("x-access-token:" + ph))
	for _, tc := range []struct {
		name, in string
		want     []*Secret
	}{
		{"as is", "Authorization: token " + ph, []*Secret{gh}},
		{"upper case (a DNS name)", strings.ToUpper(ph) + ".evil.test", []*Secret{gh}},
		{"the random part alone", "x-" + ph[len(ph)-32:] + ".evil.test", []*Secret{gh}},
		{"percent-encoded", "/?q=" + strings.ReplaceAll(url(ph), "a", "%61"), []*Secret{gh}},
		{"Basic credentials", "Authorization: Basic " + b64, []*Secret{gh}},
		{"URL-safe base64 without padding", base64.RawURLEncoding.EncodeToString([]byte("??>>" + ph + "??")), []*Secret{gh}},
		{"base64 in JSON", `{"content":"` + base64.StdEncoding.EncodeToString([]byte("token="+npm.Placeholder)) + `"}`, []*Secret{npm}},
		{"two secrets", npm.Placeholder + " " + ph, []*Secret{gh, npm}},
		{"nothing", "Authorization: Bearer " + ghValue, nil},
		{"too short", "twp_", nil},
	} {
		got := st.Scan([]byte(tc.in))
		if fmt.Sprint(names(got)) != fmt.Sprint(names(tc.want)) {
			t.Errorf("%s: Scan = %v, want %v", tc.name, names(got), names(tc.want))
		}
	}
}

func url(s string) string { return s }

func names(list []*Secret) []string {
	var out []string
	for _, s := range list {
		out = append(out, s.Name)
	}
	return out
}

func TestReplaceInPutsTheValueWhereThePlaceholderWas(t *testing.T) {
	st, _ := load(t)
	gh, _ := st.Get("GITHUB_TOKEN")
	ph := gh.Placeholder
	enc := base64.StdEncoding.EncodeToString
	for _, tc := range []struct {
		name, in, want string
		did            bool
	}{
		{"bearer", "Bearer " + ph, "Bearer " + ghValue, true},
		{"token", "token " + ph, "token " + ghValue, true},
		{"basic, as git sends it", "Basic " + enc([]byte("x-access-token:"+ph)), "Basic " + enc([]byte("x-access-token:"+ghValue)), true},
		{"basic, token as user", "Basic " + enc([]byte(ph+":")), "Basic " + enc([]byte(ghValue+":")), true},
		{"basic, unpadded", "Basic " + base64.RawStdEncoding.EncodeToString([]byte("u:"+ph)), "Basic " + base64.RawStdEncoding.EncodeToString([]byte("u:"+ghValue)), true},
		{"twice", ph + "," + ph, ghValue + "," + ghValue, true},
		{"another secret's header", "Bearer nothing-here", "Bearer nothing-here", false},
		{"basic without the placeholder", "Basic " + enc([]byte("user:password-which-is-long-enough-to-be-a-run")), "Basic " + enc([]byte("user:password-which-is-long-enough-to-be-a-run")), false},
	} {
		got, did := gh.ReplaceIn(tc.in)
		if got != tc.want || did != tc.did {
			t.Errorf("%s: ReplaceIn = %q, %v; want %q, %v", tc.name, got, did, tc.want, tc.did)
		}
	}
}

// FuzzReplaceIn: whatever surrounds a placeholder, plainly or inside Basic
// credentials, ReplaceIn puts the value there and leaves no placeholder
// that Scan finds; and Scan finds every placeholder it is given.
func FuzzReplaceIn(f *testing.F) {
	f.Add("Bearer ", "", "x-access-token:", "", false)
	f.Add("", "", "", ":", true)
	f.Add("Basic ", "x", "u", "==", true)
	f.Add("a%", "%2", "\x00", "YWJj", false)
	st, err := Load([]policy.SecretSource{{Name: "T", Env: "T"}}, Options{LookupEnv: func(string) (string, bool) { return ghValue, true }})
	if err != nil {
		f.Fatal(err)
	}
	s, _ := st.Get("T")
	f.Fuzz(func(t *testing.T, before, after, user, pass string, basic bool) {
		in := before + s.Placeholder + after
		want := before + ghValue + after
		if basic {
			in = before + "Basic " + base64.StdEncoding.EncodeToString([]byte(user+s.Placeholder+pass)) + " " + after
			want = before + "Basic " + base64.StdEncoding.EncodeToString([]byte(user+ghValue+pass)) + " " + after
		}
		if len(st.ScanString(in)) != 1 {
			t.Fatalf("Scan missed the placeholder in %q", in)
		}
		got, did := s.ReplaceIn(in)
		if !did {
			t.Fatalf("ReplaceIn(%q) replaced nothing", in)
		}
		if strings.Contains(before+after+user+pass, "twp_") || strings.Contains(before+after+user+pass, s.Placeholder[4:8]) {
			return // the fuzzer wrote a placeholder of its own around ours
		}
		if got != want && !basic {
			t.Fatalf("ReplaceIn(%q) = %q, want %q", in, got, want)
		}
		if basic && !strings.Contains(got, base64.StdEncoding.EncodeToString([]byte(user+ghValue+pass))) {
			t.Fatalf("ReplaceIn(%q) = %q, want the Basic credentials re-encoded with the value", in, got)
		}
		if len(st.ScanString(got)) != 0 && !strings.Contains(strings.ToLower(before+after+user+pass), s.token[:4]) {
			t.Fatalf("a placeholder is left in %q", got)
		}
	})
}

// FuzzScan: Scan never panics on any input, and never finds a placeholder
// that is not there (the random part, in some form, must be).
func FuzzScan(f *testing.F) {
	f.Add([]byte("GET / HTTP/1.1\r\nAuthorization: Basic YWFhYWFhYWFhYWFhYWFhYWFhYWFhYWFhYWFhYWFhYWFhYWFhYWFh\r\n\r\n"))
	f.Add([]byte("%%%41%4"))
	st, err := Load([]policy.SecretSource{{Name: "T", Env: "T"}}, Options{LookupEnv: func(string) (string, bool) { return ghValue, true }})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(st.Scan(b)) != 0 {
			t.Fatalf("found a random placeholder in fuzz input %q", b)
		}
		s, _ := st.Get("T")
		in := append(append(append([]byte(nil), b...), s.Placeholder...), b...)
		if len(st.Scan(in)) != 1 {
			t.Fatalf("missed the placeholder in %q", in)
		}
	})
}

// TestPolicyAndAuditDoNotImportSecrets keeps values out of the packages
// that must never hold one (ARCHITECTURE.md).
func TestPolicyAndAuditDoNotImportSecrets(t *testing.T) {
	for _, pkg := range []string{"../../policy", "../audit"} {
		out, err := exec.Command("go", "list", "-deps", pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go list -deps %s: %v\n%s", pkg, err, out)
		}
		if strings.Contains(string(out), "internal/secrets") {
			t.Errorf("%s depends on internal/secrets", pkg)
		}
	}
}

func TestStaleFindsAnEarlierRunsPlaceholderInEveryFormAClientSends(t *testing.T) {
	st, _ := load(t)
	gh, _ := st.Get("GITHUB_TOKEN")
	old := "twp_GITHUB_TOKEN_" + strings.Repeat("0123456789abcdef", 2)
	enc := base64.StdEncoding.EncodeToString
	for _, tc := range []struct {
		name, in, want string
	}{
		{"a remote URL", "https://x-access-token:" + old + "@github.com/acme/widget.git", "GITHUB_TOKEN"},
		{"Basic credentials", "Basic " + enc([]byte("x-access-token:"+old)), "GITHUB_TOKEN"},
		{"percent-encoded", "/?t=" + strings.Replace(old, "_", "%5F", -1), "GITHUB_TOKEN"},
		{"upper case", strings.ToUpper(old), "GITHUB_TOKEN"},
		{"lower case", strings.ToLower(old), "GITHUB_TOKEN"},
		{"a name this run has not", "Bearer twp_OPENAI_API_KEY_" + strings.Repeat("ab", 16), "OPENAI_API_KEY"},
		{"beside this run's", gh.Placeholder + " " + old, "GITHUB_TOKEN"},
		{"this run's", "Bearer " + gh.Placeholder, ""},
		{"this run's in Basic", "Basic " + enc([]byte("x:"+gh.Placeholder)), ""},
		{"this run's, upper case", strings.ToUpper(gh.Placeholder), ""},
		{"too few hex digits", "twp_GITHUB_TOKEN_0123456789abcdef", ""},
		{"not hex", "twp_GITHUB_TOKEN_" + strings.Repeat("xyz", 11), ""},
		{"nothing", "Authorization: Bearer " + ghValue, ""},
	} {
		got, ok := st.StaleString(tc.in)
		if got != tc.want || ok != (tc.want != "") {
			t.Errorf("%s: Stale = %q, %v; want %q", tc.name, got, ok, tc.want)
		}
		found, got, ok := st.InspectString(tc.in)
		if got != tc.want || ok != (tc.want != "") || fmt.Sprint(names(found)) != fmt.Sprint(names(st.ScanString(tc.in))) {
			t.Errorf("%s: Inspect = %v, %q, %v; want Scan's and %q", tc.name, names(found), got, ok, tc.want)
		}
	}
}

// BenchmarkScanningABody measures what a request body's first 64 KiB
// cost to search: this run's placeholders (Scan) and an earlier run's
// (Stale), or both at once (Inspect), in text with base64 runs in it.
func BenchmarkScanningABody(b *testing.B) {
	st, err := Load([]policy.SecretSource{{Name: "T", Env: "T"}}, Options{LookupEnv: func(string) (string, bool) { return ghValue, true }})
	if err != nil {
		b.Fatal(err)
	}
	blob := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte("some file content_ "), 1000))
	body := []byte(strings.Repeat(`{"name":"x_y","content":"`+blob[:2000]+`","text":"plain words and twp_ mentions"}`, 40))[:64<<10]
	for _, c := range []struct {
		name string
		fn   func([]byte)
	}{
		{"Scan", func(p []byte) { st.Scan(p) }},
		{"Stale", func(p []byte) { st.Stale(p) }},
		{"Inspect", func(p []byte) { st.Inspect(p) }},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			for i := 0; i < b.N; i++ {
				c.fn(body)
			}
		})
	}
}

func FuzzStale(f *testing.F) {
	f.Add([]byte("https://x:twp_T_0123456789abcdef0123456789abcdef@h/"))
	f.Add([]byte("twp_twp_T_" + strings.Repeat("_", 40)))
	f.Add([]byte("Basic " + base64.StdEncoding.EncodeToString([]byte("u:twp_A_B_"+strings.Repeat("Ab", 16)))))
	st, err := Load([]policy.SecretSource{{Name: "T", Env: "T"}}, Options{LookupEnv: func(string) (string, bool) { return ghValue, true }})
	if err != nil {
		f.Fatal(err)
	}
	s, _ := st.Get("T")
	f.Fuzz(func(t *testing.T, b []byte) {
		name, stale := st.Stale(b)
		found, iname, istale := st.Inspect(b)
		if len(b) >= tokenHexLen && (iname != name || istale != stale || len(found) != len(st.Scan(b))) {
			t.Fatalf("Inspect(%q) = %v %q %v, Scan and Stale say %v %q %v", b, names(found), iname, istale, names(st.Scan(b)), name, stale)
		}
		if stale {
			return
		}
		// This run's placeholder beside the input is never an earlier run's.
		in := append(append(append([]byte(nil), b...), (" "+s.Placeholder+" ")...), b...)
		if n, ok := st.Stale(in); ok {
			t.Fatalf("this run's placeholder in %q was taken for an earlier run's (%q)", in, n)
		}
		// An earlier run's is found wherever it is put.
		in = append(append(append([]byte(nil), b...), (" twp_T_"+strings.Repeat("0f", 16)+" ")...), b...)
		if n, ok := st.Stale(in); !ok || n == "" {
			t.Fatalf("missed an earlier run's placeholder in %q", in)
		}
	})
}

func TestLoadWarnsOfAValueTooShortToMaskNeverSayingIt(t *testing.T) {
	for _, tc := range []struct {
		value string
		warn  bool
	}{
		{"4827", true},
		{"hunter2!", true},
		{strings.Repeat("k", MinMaskedLen-1), true},
		{strings.Repeat("k", MinMaskedLen), false},
		{ghValue, false},
	} {
		var warnings []string
		_, err := Load([]policy.SecretSource{{Name: "PIN", Env: "PIN"}}, Options{
			LookupEnv: func(string) (string, bool) { return tc.value, true },
			Warn:      func(s string) { warnings = append(warnings, s) },
		})
		if err != nil {
			t.Fatalf("Load(%d bytes): %v", len(tc.value), err)
		}
		warned := len(warnings) == 1 && strings.Contains(warnings[0], "secret PIN is ") && strings.Contains(warnings[0], "masking cannot hide")
		if warned != tc.warn || len(warnings) > 1 {
			t.Errorf("%d bytes: warnings %q, want a warning: %v", len(tc.value), warnings, tc.warn)
		}
		for _, w := range warnings {
			if strings.Contains(w, tc.value) {
				t.Errorf("the warning holds the value: %q", w)
			}
		}
	}
}
