// Package secrets owns the credentials tunwall keeps out of the sandbox:
// reading each secret's value when tunwall starts (from tunwall's own
// environment or a file), the placeholder the sandbox holds instead (random
// per run), finding placeholders wherever the sandbox may send them
// (Scan; Stale for an earlier run's), putting the value in their place for
// the terminator (ReplaceIn), and
// the command's environment with placeholders for values (Environ).
//
// A value is held in a Value, which prints, formats and marshals as
// "[redacted]": nothing that logs or records a Secret can leak it. Reveal
// is the only way to the bytes, and only the terminator calls it, to write a
// request to a host whose rule injects the secret. policy and audit must
// not import this package (deps_test.go).
package secrets

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/tunwall/tunwall/policy"
)

// redacted is what a Value shows of itself.
const redacted = "[redacted]"

// Value is a secret's value. It never shows itself: String, GoString,
// Format (every verb), MarshalJSON and MarshalText give "[redacted]". The
// bytes sit behind a pointer, so that fmt, which prints unexported fields
// by reflection without their methods, shows an address and not them.
type Value struct{ b *box }

type box struct{ s string }

func (Value) String() string               { return redacted }
func (Value) GoString() string             { return redacted }
func (Value) Format(f fmt.State, _ rune)   { io.WriteString(f, redacted) }
func (Value) MarshalJSON() ([]byte, error) { return []byte(`"` + redacted + `"`), nil }
func (Value) MarshalText() ([]byte, error) { return []byte(redacted), nil }
func (v Value) str() string {
	if v.b == nil {
		return ""
	}
	return v.b.s
}

// Len returns the value's length.
func (v Value) Len() int                        { return len(v.str()) }
func (v Value) equal(s string) bool             { return v.str() == s }
func (v Value) containedIn(s string) bool       { return v.str() != "" && strings.Contains(s, v.str()) }
func (v Value) replaceIn(s, with string) string { return strings.ReplaceAll(s, v.str(), with) }

// Reveal returns the value itself. Only the terminator calls it, to write the
// value into a request to a host whose rule injects it.
func (v Value) Reveal() string { return v.str() }

// Secret is one loaded secret.
type Secret struct {
	// Name is the secret's name (and the environment variable the
	// sandbox's command gets its placeholder in).
	Name string
	// From says where the value was read: "env:VAR" or "file:PATH".
	From string
	// Placeholder is what the sandbox holds instead of the value:
	// "twp_" + Name + "_" + 32 random hex digits, new every run (or
	// derived from a project's key: Options.PlaceholderKey).
	Placeholder string
	// token is the placeholder's random part, lower-case hex.
	token string
	// envVar is the variable the value was read from, if any.
	envVar string
	// file is the absolute path the value was read from, if any.
	file  string
	value Value
}

// Value returns the secret's value (which prints as "[redacted]").
func (s *Secret) Value() Value { return s.value }

// String names the secret and its source, never its value.
func (s Secret) String() string { return "secret " + s.Name + " (" + s.From + ")" }

// GoString is String.
func (s Secret) GoString() string { return s.String() }

// Format writes String, whatever the verb.
func (s Secret) Format(f fmt.State, _ rune) { io.WriteString(f, s.String()) }

// tokenHexLen is the length of a placeholder's random part: 128 bits.
const tokenHexLen = 32

// PlaceholderPrefix starts every placeholder.
const PlaceholderPrefix = "twp_"

// maxFileSize bounds a secret file.
const maxFileSize = 64 << 10

// Options configures Load. Zero values mean the process's own.
type Options struct {
	// LookupEnv reads tunwall's environment; nil means os.LookupEnv.
	LookupEnv func(string) (string, bool)
	// Home expands "~/" in file paths; "" means os.UserHomeDir.
	Home string
	// Warn receives one line per warning (a secret file others may read,
	// a value shorter than MinMaskedLen);
	// nil discards.
	Warn func(string)
	// Rand is the source of placeholders; nil means crypto/rand.
	Rand io.Reader
	// PlaceholderKey, when set, makes placeholders stable: each is
	// derived from the key and the secret's name (never its value), so a
	// project's runs with the same key hand out the same placeholders
	// (ProjectKey). nil means random placeholders, new every run.
	PlaceholderKey []byte
}

// Store holds a run's secrets. It is immutable after Load and safe for
// concurrent use.
type Store struct {
	list   []*Secret
	byName map[string]*Secret
}

// MinMaskedLen is the length below which a value is warned of at the
// start. The masker finds a value whole, so anyone who can make an
// injecting host echo what they send learns which of their guesses is the
// value (that one comes back as stars): a long random token is out of
// reach of guessing, a PIN or a short password is not (10,000 PINs fit
// in 13 requests of 4 KiB). Below 9 bytes, some of the base64 forms the
// masker looks for are also too short to look for. Masking cannot fix
// either, so the user is told.
const MinMaskedLen = 16

func shortWarning(name string, n int) string {
	return fmt.Sprintf("secret %s is %d bytes long: masking cannot hide a short value (a sandbox that makes an injecting host echo its guesses sees which one comes back masked); inject only long random values (%d bytes or more) into hosts that may echo", name, n, MinMaskedLen)
}

// ErrNoValue is wrapped by Load's error for a secret with an empty value.
var ErrNoValue = errors.New("secret has no value")

// Load reads every secret's value and makes its placeholder. A missing or
// empty variable, an unreadable or empty file, a value with a line break
// or NUL (it could not go into a header) are errors; a file that group or
// others may read is a warning. Errors name the secret and its source,
// never the value.
func Load(srcs []policy.SecretSource, opts Options) (*Store, error) {
	if opts.LookupEnv == nil {
		opts.LookupEnv = os.LookupEnv
	}
	if opts.Rand == nil {
		opts.Rand = rand.Reader
	}
	st := &Store{byName: map[string]*Secret{}}
	for _, src := range srcs {
		if !policy.ValidSecretName(src.Name) {
			return nil, fmt.Errorf("secrets: bad secret name %q", src.Name)
		}
		if prev, ok := st.byName[src.Name]; ok {
			return nil, fmt.Errorf("secrets: %s is declared twice (%s and %s)", src.Name, prev.From, src)
		}
		s := &Secret{Name: src.Name, From: src.String()}
		var raw string
		switch {
		case src.Env != "" && src.File == "":
			v, ok := opts.LookupEnv(src.Env)
			if !ok {
				return nil, fmt.Errorf("secrets: %s: tunwall's environment has no %s (%s)", src.Name, src.Env, src.Source)
			}
			raw, s.envVar = v, src.Env
		case src.File != "" && src.Env == "":
			path, err := expandHome(src.File, opts.Home)
			if err != nil {
				return nil, fmt.Errorf("secrets: %s: %w", src.Name, err)
			}
			b, mode, err := readSecretFile(path)
			if err != nil {
				return nil, fmt.Errorf("secrets: %s (%s): %w", src.Name, src.Source, err)
			}
			if mode&0o077 != 0 && opts.Warn != nil {
				opts.Warn(fmt.Sprintf("secret %s: %s may be read by group or others (mode %04o); chmod 600 it", src.Name, path, mode&0o7777))
			}
			raw, s.file = b, path
		default:
			return nil, fmt.Errorf("secrets: %s: give exactly one of env and file", src.Name)
		}
		v := strings.TrimRight(raw, "\r\n")
		if v == "" {
			return nil, fmt.Errorf("secrets: %s (%s): %w", src.Name, s.From, ErrNoValue)
		}
		if strings.ContainsAny(v, "\r\n\x00") {
			return nil, fmt.Errorf("secrets: %s (%s): the value contains a line break or NUL, which no header can carry", src.Name, s.From)
		}
		if len(v) < MinMaskedLen && opts.Warn != nil {
			opts.Warn(shortWarning(src.Name, len(v)))
		}
		s.value = Value{&box{v}}
		if opts.PlaceholderKey != nil {
			s.token = stableToken(opts.PlaceholderKey, src.Name)
		} else {
			var rb [tokenHexLen / 2]byte
			if _, err := io.ReadFull(opts.Rand, rb[:]); err != nil {
				return nil, fmt.Errorf("secrets: placeholder for %s: %w", src.Name, err)
			}
			s.token = hex.EncodeToString(rb[:])
		}
		s.Placeholder = PlaceholderPrefix + src.Name + "_" + s.token
		if strings.Contains(v, s.token) {
			return nil, fmt.Errorf("secrets: %s: the value contains its own placeholder (the random source is broken)", src.Name)
		}
		st.list = append(st.list, s)
		st.byName[s.Name] = s
	}
	return st, nil
}

// expandHome turns "~/x" into home/x and makes p absolute.
func expandHome(p, home string) (string, error) {
	if p == "~" || strings.HasPrefix(p, "~/") {
		if home == "" {
			h, err := os.UserHomeDir()
			if err != nil {
				return "", fmt.Errorf("cannot expand %s: %w", p, err)
			}
			home = h
		}
		p = filepath.Join(home, strings.TrimPrefix(p[1:], "/"))
	}
	return filepath.Abs(p)
}

// readSecretFile reads a regular file of at most maxFileSize bytes.
func readSecretFile(path string) (string, os.FileMode, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return "", 0, err
	}
	if !fi.Mode().IsRegular() {
		return "", 0, fmt.Errorf("%s is not a regular file", path)
	}
	b, err := io.ReadAll(io.LimitReader(f, maxFileSize+1))
	if err != nil {
		return "", 0, err
	}
	if len(b) > maxFileSize {
		return "", 0, fmt.Errorf("%s is larger than %d bytes", path, maxFileSize)
	}
	return string(b), fi.Mode().Perm() | fi.Mode()&(os.ModeSetuid|os.ModeSetgid|os.ModeSticky), nil
}

// Len returns how many secrets the store holds.
func (st *Store) Len() int {
	if st == nil {
		return 0
	}
	return len(st.list)
}

// Get returns the named secret.
func (st *Store) Get(name string) (*Secret, bool) {
	if st == nil {
		return nil, false
	}
	s, ok := st.byName[name]
	return s, ok
}

// Has reports whether the store holds the named secret.
func (st *Store) Has(name string) bool { _, ok := st.Get(name); return ok }

// All returns the secrets in declaration order.
func (st *Store) All() []*Secret {
	if st == nil {
		return nil
	}
	return append([]*Secret(nil), st.list...)
}

// Files returns the absolute paths the secrets were read from: the
// sandbox must not see them.
func (st *Store) Files() []string {
	var out []string
	for _, s := range st.All() {
		if s.file != "" {
			out = append(out, s.file)
		}
	}
	return out
}

// Environ returns env (KEY=VALUE entries) as the sandbox's command gets
// it: each secret's variable set to its placeholder, the variables values
// were read from removed, and every occurrence of a value in any other
// variable replaced by its placeholder (a copy under another name, such as
// GH_TOKEN beside GITHUB_TOKEN).
func (st *Store) Environ(env []string) []string {
	if st.Len() == 0 {
		return env
	}
	drop := map[string]bool{}
	for _, s := range st.list {
		drop[s.Name] = true
		if s.envVar != "" {
			drop[s.envVar] = true
		}
	}
	out := make([]string, 0, len(env)+len(st.list))
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		if drop[k] {
			continue
		}
		for _, s := range st.list {
			if s.value.equal(v) || s.value.containedIn(v) {
				v = s.value.replaceIn(v, s.Placeholder)
			}
		}
		out = append(out, k+"="+v)
	}
	for _, s := range st.list {
		out = append(out, s.Name+"="+s.Placeholder)
	}
	return out
}

// ContainsValue reports whether b holds any secret's value. Tests and
// checks of what tunwall writes use it; it says which secret, never the
// value.
func (st *Store) ContainsValue(b []byte) (string, bool) {
	for _, s := range st.All() {
		if s.value.containedIn(string(b)) {
			return s.Name, true
		}
	}
	return "", false
}
