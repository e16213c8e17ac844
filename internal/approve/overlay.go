package approve

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/tunwall/tunwall/policy"
)

// OverlayPath is the overlay of the policy file policyFile: next to it,
// its name with ".approved" before the extension (p.yaml:
// p.approved.yaml; p: p.approved.yaml). "" for no file or stdin.
func OverlayPath(policyFile string) string {
	if policyFile == "" || policyFile == "-" {
		return ""
	}
	ext := filepath.Ext(policyFile)
	if ext != ".yaml" && ext != ".yml" {
		return policyFile + ".approved.yaml"
	}
	return strings.TrimSuffix(policyFile, ext) + ".approved" + ext
}

// ReadOverlay reads and parses the overlay at path; a missing file is a
// nil Policy and no error.
func ReadOverlay(path string) (*policy.Policy, error) {
	if path == "" {
		return nil, nil
	}
	p, err := policy.ParseFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	return p, err
}

// Overlay is the file "always" approvals are appended to: a policy file
// of its own (version 1, phases, allow rules) that run, policy check and
// policy explain read along with the policy it sits next to.
type Overlay struct {
	Path string

	mu sync.Mutex
}

// Add appends a rule allowing what r asked for to r's phase: its name on
// the default ports, 443/tcp, for a DNS request; else its name on its
// port and protocol; with a comment saying when and by whom; the result
// must parse as a policy, or the file is left as it was. The file is
// replaced atomically (written beside it, then renamed).
func (o *Overlay) Add(r Request, by string) error {
	phase, host := r.Phase, r.Host
	o.mu.Lock()
	defer o.mu.Unlock()
	src, err := os.ReadFile(o.Path)
	mode := os.FileMode(0o644)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		src = []byte("# Hosts approved with --ask for good (tunwall ctl allow --always, or a\n# decider's scope \"always\"). tunwall reads this file with the policy next\n# to it; edit or delete it as you would the policy.\nversion: 1\nphases: {}\n")
	case err != nil:
		return err
	default:
		if fi, err := os.Stat(o.Path); err == nil {
			mode = fi.Mode().Perm()
		}
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(src, &doc); err != nil || doc.Kind != yaml.DocumentNode || len(doc.Content) != 1 || doc.Content[0].Kind != yaml.MappingNode {
		return fmt.Errorf("%s: not a policy file this can append to", o.Path)
	}
	phases := child(doc.Content[0], "phases", yaml.MappingNode)
	ph := child(phases, phase, yaml.MappingNode)
	allow := child(ph, "allow", yaml.SequenceNode)
	if allow == nil {
		return fmt.Errorf("%s: phases.%s.allow is not a list this can append to", o.Path, phase)
	}
	var ports, proto string
	if r.Proto != ProtoDNS {
		ports = fmt.Sprintf("[%d]", r.Port)
		if r.Proto == ProtoUDP {
			proto = ProtoUDP
		}
	}
	for _, n := range allow.Content {
		if h := value(n, "host"); h != nil && strings.EqualFold(h.Value, host) && flowText(value(n, "ports")) == ports && scalar(value(n, "proto")) == proto {
			return nil // there already
		}
	}
	rule := &yaml.Node{Kind: yaml.MappingNode, Content: []*yaml.Node{
		{Kind: yaml.ScalarNode, Value: "host"},
		{Kind: yaml.ScalarNode, Value: host, LineComment: fmt.Sprintf("approved %s by %s", time.Now().UTC().Format(time.RFC3339), by)},
	}}
	if ports != "" {
		rule.Content = append(rule.Content, &yaml.Node{Kind: yaml.ScalarNode, Value: "ports"},
			&yaml.Node{Kind: yaml.SequenceNode, Style: yaml.FlowStyle, Content: []*yaml.Node{{Kind: yaml.ScalarNode, Tag: "!!int", Value: fmt.Sprint(r.Port)}}})
	}
	if proto != "" {
		rule.Content = append(rule.Content, &yaml.Node{Kind: yaml.ScalarNode, Value: "proto"}, &yaml.Node{Kind: yaml.ScalarNode, Value: proto})
	}
	allow.Content = append(allow.Content, rule)
	allow.Style, phases.Style, ph.Style = 0, 0, 0
	var b bytes.Buffer
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(&doc); err != nil {
		return err
	}
	enc.Close()
	if _, err := policy.Parse(o.Path, b.Bytes()); err != nil {
		return fmt.Errorf("the overlay would not parse: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(o.Path), ".approved-*.yaml")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(b.Bytes()); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), o.Path)
}

// flowText is a ports list as [N, ...], "" for none.
func flowText(n *yaml.Node) string {
	if n == nil || n.Kind != yaml.SequenceNode {
		return ""
	}
	var vs []string
	for _, c := range n.Content {
		vs = append(vs, c.Value)
	}
	return "[" + strings.Join(vs, ", ") + "]"
}

// scalar is a scalar node's value, "" for none.
func scalar(n *yaml.Node) string {
	if n == nil {
		return ""
	}
	return n.Value
}

// child is m's value for key, made (of kind) if missing or null; nil if
// m is nil or the value is something else.
func child(m *yaml.Node, key string, kind yaml.Kind) *yaml.Node {
	if m == nil {
		return nil
	}
	if v := value(m, key); v != nil {
		switch {
		case v.Kind == kind:
			return v
		case v.Kind == yaml.ScalarNode && (v.Tag == "!!null" || v.Value == ""):
			*v = yaml.Node{Kind: kind}
			return v
		}
		return nil
	}
	v := &yaml.Node{Kind: kind}
	m.Content = append(m.Content, &yaml.Node{Kind: yaml.ScalarNode, Value: key}, v)
	return v
}

// value is m's value for key, or nil.
func value(m *yaml.Node, key string) *yaml.Node {
	if m.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return m.Content[i+1]
		}
	}
	return nil
}
