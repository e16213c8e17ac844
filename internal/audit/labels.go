package audit

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Labels is the label set of a run, as the JSON object every line of the
// run carries in its labels field ("" for none): {"model":"m","task":"T-12"},
// keys sorted, compact. It is a string so that Records stay comparable.
// A run gets its labels from --label KEY=VALUE; a node agent gives each
// sandbox's the pod's identity.
type Labels string

// Bounds of a label set.
const (
	MaxLabels        = 16
	MaxLabelKeyLen   = 63
	MaxLabelValueLen = 256
)

// CheckLabelKey reports why key is not a label key: 1 to MaxLabelKeyLen
// bytes of a-z, 0-9, '_', '.' and '-'.
func CheckLabelKey(key string) error {
	if key == "" || len(key) > MaxLabelKeyLen {
		return fmt.Errorf("label key %q must be 1 to %d characters", clipLabel(key), MaxLabelKeyLen)
	}
	for _, c := range key {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == '-') {
			return fmt.Errorf("label key %q may hold only a-z, 0-9, '_', '.' and '-'", clipLabel(key))
		}
	}
	return nil
}

// NewLabels checks m (at most MaxLabels keys, each by CheckLabelKey; values
// of at most MaxLabelValueLen bytes of printable UTF-8) and returns it as
// Labels.
func NewLabels(m map[string]string) (Labels, error) {
	if len(m) == 0 {
		return "", nil
	}
	if len(m) > MaxLabels {
		return "", fmt.Errorf("%d labels: at most %d", len(m), MaxLabels)
	}
	for _, k := range slices.Sorted(maps.Keys(m)) {
		if err := CheckLabelKey(k); err != nil {
			return "", err
		}
		v := m[k]
		if len(v) > MaxLabelValueLen {
			return "", fmt.Errorf("label %s: the value is %d bytes, at most %d", k, len(v), MaxLabelValueLen)
		}
		if !utf8.ValidString(v) || strings.IndexFunc(v, func(r rune) bool { return !unicode.IsPrint(r) }) >= 0 {
			return "", fmt.Errorf("label %s: the value %q holds bytes that are not printable UTF-8", k, clipLabel(v))
		}
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false) // as the log's lines are written
	if err := enc.Encode(m); err != nil {
		return "", err
	}
	return Labels(bytes.TrimSuffix(b.Bytes(), []byte("\n"))), nil
}

// Map returns the labels as a map (nil for none, or for a set that does
// not parse).
func (l Labels) Map() map[string]string {
	if l == "" {
		return nil
	}
	var m map[string]string
	if json.Unmarshal([]byte(l), &m) != nil {
		return nil
	}
	return m
}

// Get returns the value of key, and whether the set has it.
func (l Labels) Get(key string) (string, bool) {
	v, ok := l.Map()[key]
	return v, ok
}

func clipLabel(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}
