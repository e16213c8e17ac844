package secrets

import (
	"bytes"
	"encoding/base64"
	"strings"

	"github.com/tunwall/tunwall/internal/sniff"
)

// Finding placeholders. The placeholder itself is worthless outside the
// run (it is not the credential), so finding it is a tripwire, not the
// boundary: a placeholder on its way to a host whose rule does not inject
// its secret shows an attempt to send the credential somewhere it must not
// go, and the request is refused and recorded. Scan therefore looks for a
// placeholder's random part (128 bits, which nothing else holds by chance)
// in the forms a client sends without trying to hide it: any letter case
// (DNS names, hex-normalising tools), percent-encoded (URLs, forms) and
// base64 (Basic credentials, JSON fields). A sandbox that encrypts or
// splits it is not seen; it still holds only the placeholder.

// minB64Run is the shortest base64 run that can hold a placeholder's
// random part (32 bytes encode to 43 characters).
const minB64Run = 43

// Scan returns the secrets whose placeholders occur in b, each once, in
// declaration order: the placeholder's random part in any letter case, as
// is, percent-decoded, or inside a base64 token (standard or URL alphabet,
// padded or not).
func (st *Store) Scan(b []byte) []*Secret {
	if st.Len() == 0 || len(b) < tokenHexLen {
		return nil
	}
	var found []*Secret
	st.scanLower(b, &found)
	if bytes.IndexByte(b, '%') >= 0 {
		st.scanLower(percentDecode(b), &found)
	}
	if len(found) < len(st.list) {
		forB64Runs(b, func(dec []byte) bool {
			st.scanLower(dec, &found)
			if bytes.IndexByte(dec, '%') >= 0 {
				st.scanLower(percentDecode(dec), &found)
			}
			return len(found) < len(st.list)
		})
	}
	return found
}

// Inspect is Scan and Stale in one pass over b's forms: the secrets whose
// placeholders occur in b, and the name of a placeholder in it that is
// not this run's, if any.
func (st *Store) Inspect(b []byte) (found []*Secret, stale string, isStale bool) {
	if st.Len() == 0 || len(b) < tokenHexLen {
		return nil, "", false
	}
	look := func(v []byte) {
		st.scanLower(v, &found)
		if !isStale && len(v) >= minPlaceholderLen {
			stale, isStale = st.staleIn(v)
		}
	}
	lookDecoded := func(v []byte) bool {
		look(v)
		if bytes.IndexByte(v, '%') >= 0 {
			look(percentDecode(v))
		}
		return len(found) < len(st.list) || !isStale
	}
	if lookDecoded(b) {
		forB64Runs(b, lookDecoded)
	}
	return found, stale, isStale
}

// InspectString is Inspect of a string.
func (st *Store) InspectString(s string) ([]*Secret, string, bool) {
	if st.Len() == 0 || len(s) < tokenHexLen {
		return nil, "", false
	}
	return st.Inspect([]byte(s))
}

// ScanString is Scan of a string.
func (st *Store) ScanString(s string) []*Secret {
	if st.Len() == 0 || len(s) < tokenHexLen {
		return nil
	}
	return st.Scan([]byte(s))
}

// scanLower adds to found every secret whose token occurs in b, compared
// case-insensitively.
func (st *Store) scanLower(b []byte, found *[]*Secret) {
	if len(b) < tokenHexLen {
		return
	}
	var lower []byte
	for _, s := range st.list {
		if containsSecret(*found, s) {
			continue
		}
		if lower == nil {
			lower = bytes.ToLower(b)
		}
		if bytes.Contains(lower, []byte(s.token)) {
			*found = append(*found, s)
		}
	}
}

func containsSecret(list []*Secret, s *Secret) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// minPlaceholderLen is the length of the shortest placeholder: "twp_",
// a one-letter name, "_" and the random part.
const minPlaceholderLen = len(PlaceholderPrefix) + 2 + tokenHexLen

// Stale returns the secret name of the first placeholder in b that is not
// one of this run's (a placeholder changes every run, so it is an earlier
// run's, saved in a git remote URL or a config file), searched in the
// forms Scan searches: as is, percent-decoded, inside base64. The name is
// this run's spelling of it when the run has such a secret, else as found.
func (st *Store) Stale(b []byte) (string, bool) {
	if len(b) < minPlaceholderLen {
		return "", false
	}
	name, ok := st.staleIn(b)
	if !ok && bytes.IndexByte(b, '%') >= 0 {
		name, ok = st.staleIn(percentDecode(b))
	}
	if !ok {
		forB64Runs(b, func(dec []byte) bool {
			name, ok = st.staleIn(dec)
			if !ok && bytes.IndexByte(dec, '%') >= 0 {
				name, ok = st.staleIn(percentDecode(dec))
			}
			return !ok
		})
	}
	return name, ok
}

// StaleString is Stale of a string.
func (st *Store) StaleString(s string) (string, bool) {
	if len(s) < minPlaceholderLen {
		return "", false
	}
	return st.Stale([]byte(s))
}

// staleIn finds, in b as it is, a placeholder that is not this run's:
// "twp_" NAME "_" and 32 hex digits, in any letter case. Each run of name
// characters after a "twp_" is looked at once, so the search is linear.
func (st *Store) staleIn(b []byte) (string, bool) {
	for i := 0; i < len(b); {
		k := indexPrefixFold(b[i:])
		if k < 0 {
			return "", false
		}
		start := i + k + len(PlaceholderPrefix)
		end := start
		for end < len(b) && isNameByte(b[end]) {
			end++
		}
		i = end
		name, token, ok := splitPlaceholder(b[start:end])
		if !ok {
			continue
		}
		if s := st.getFold(name); s != nil {
			if strings.EqualFold(s.token, token) {
				continue
			}
			name = s.Name
		}
		return name, true
	}
	return "", false
}

// splitPlaceholder splits run, the name characters after "twp_", into a
// name and the 32 hex digits after its first "_" that has them.
func splitPlaceholder(run []byte) (name, token string, ok bool) {
	for j := 1; j+1+tokenHexLen <= len(run); j++ {
		if run[j] != '_' {
			continue
		}
		t := run[j+1 : j+1+tokenHexLen]
		if allHex(t) {
			return string(run[:j]), string(t), true
		}
	}
	return "", "", false
}

func allHex(b []byte) bool {
	for _, c := range b {
		if !sniff.IsHex(c) {
			return false
		}
	}
	return true
}

func isNameByte(c byte) bool {
	return c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_'
}

// getFold returns the secret whose name is name in any letter case.
func (st *Store) getFold(name string) *Secret {
	if s, ok := st.Get(name); ok {
		return s
	}
	for _, s := range st.All() {
		if strings.EqualFold(s.Name, name) {
			return s
		}
	}
	return nil
}

// indexPrefixFold returns the index of the first "twp_" in b, in any
// letter case, or -1.
func indexPrefixFold(b []byte) int {
	for i := 0; i < len(b); {
		j := bytes.IndexByte(b[i:], '_')
		if j < 0 {
			return -1
		}
		i += j
		if i >= 3 && (b[i-3]|0x20) == 't' && (b[i-2]|0x20) == 'w' && (b[i-1]|0x20) == 'p' {
			return i - 3
		}
		i++
	}
	return -1
}

// percentDecode decodes every well-formed %XX and '+' (as a form would);
// anything else stays as it is.
func percentDecode(b []byte) []byte {
	out := make([]byte, 0, len(b))
	for i := 0; i < len(b); i++ {
		c := b[i]
		if c == '%' && i+2 < len(b) && sniff.IsHex(b[i+1]) && sniff.IsHex(b[i+2]) {
			out = append(out, sniff.Unhex(b[i+1])<<4|sniff.Unhex(b[i+2]))
			i += 2
			continue
		}
		out = append(out, c)
	}
	return out
}

func isB64(c byte) bool {
	return c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '+' || c == '/' || c == '-' || c == '_'
}

// forB64Runs decodes every maximal run of base64 characters at least
// minB64Run long (padding dropped, either alphabet) and calls fn with the
// bytes, until fn returns false.
func forB64Runs(b []byte, fn func([]byte) bool) {
	var buf []byte
	for i := 0; i < len(b); {
		if !isB64(b[i]) {
			i++
			continue
		}
		j := i
		for j < len(b) && isB64(b[j]) {
			j++
		}
		run := b[i:j]
		i = j
		for i < len(b) && b[i] == '=' {
			i++
		}
		if len(run) < minB64Run {
			continue
		}
		if len(run)%4 == 1 {
			run = run[:len(run)-1]
		}
		enc := base64.RawStdEncoding
		if bytes.ContainsAny(run, "-_") {
			enc = base64.RawURLEncoding
		}
		if cap(buf) < enc.DecodedLen(len(run)) {
			buf = make([]byte, enc.DecodedLen(len(run)))
		}
		n, err := enc.Decode(buf[:enc.DecodedLen(len(run))], run)
		if err != nil {
			continue
		}
		if !fn(buf[:n]) {
			return
		}
	}
}

// ReplaceIn returns v with every occurrence of s's placeholder replaced by
// s's value, also inside base64 tokens whose decoded text holds it (Basic
// credentials: "Basic base64(user:placeholder)"), which are re-encoded the
// same way. It reports whether anything was replaced.
func (s *Secret) ReplaceIn(v string) (string, bool) {
	out := v
	did := false
	if strings.Contains(out, s.Placeholder) {
		out = strings.ReplaceAll(out, s.Placeholder, s.value.str())
		did = true
	}
	if len(out) < minB64Run {
		return out, did
	}
	// Base64 tokens, each re-encoded in its own alphabet and padding.
	var b strings.Builder
	last := 0
	for i := 0; i < len(out); {
		if !isB64(out[i]) {
			i++
			continue
		}
		j := i
		for j < len(out) && isB64(out[j]) {
			j++
		}
		k := j
		for k < len(out) && out[k] == '=' {
			k++
		}
		start := i
		i = k
		if j-start < minB64Run {
			continue
		}
		tok := out[start:k]
		for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding} {
			dec, err := enc.DecodeString(tok)
			if err != nil || !strings.Contains(string(dec), s.Placeholder) {
				continue
			}
			b.WriteString(out[last:start])
			b.WriteString(enc.EncodeToString([]byte(strings.ReplaceAll(string(dec), s.Placeholder, s.value.str()))))
			last = k
			did = true
			break
		}
	}
	if last == 0 {
		return out, did
	}
	b.WriteString(out[last:])
	return b.String(), did
}
