package policy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"regexp"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// maxFileSize bounds what ParseFile reads; a real policy is a few KiB.
const maxFileSize = 4 << 20

// ParseError is the error Parse and ParseFile return for a policy file that
// is not valid: bad YAML, an unknown key, a wrong type or a bad value. Line and
// Col are 1-based and point at the offending key or value.
type ParseError struct {
	File      string
	Line, Col int
	Msg       string
}

// Error returns "file:line:col: msg".
func (e *ParseError) Error() string {
	return fmt.Sprintf("%s:%d:%d: %s", e.File, e.Line, e.Col, e.Msg)
}

// Policy is a parsed policy file: its phases in file order and the optional
// DNS upstream. A Policy is immutable and safe for concurrent use.
type Policy struct {
	file     string
	phases   []phase
	upstream netip.AddrPort
	secrets  []SecretSource
}

type phase struct {
	name  string
	rules []Rule // allow rules
	deny  []Rule // deny rules: they win over any allow
	open  bool   // default: public (instead of the implicit default deny)
}

// ParseFile reads the policy file at path and parses it. Read failures are
// returned wrapped (errors.Is(err, fs.ErrNotExist) works); parse failures are
// *ParseError.
func ParseFile(path string) (*Policy, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("policy: %w", err)
	}
	defer f.Close()
	src, err := io.ReadAll(io.LimitReader(f, maxFileSize+1))
	if err != nil {
		return nil, fmt.Errorf("policy: read %s: %w", path, err)
	}
	if len(src) > maxFileSize {
		return nil, &ParseError{File: path, Line: 1, Col: 1, Msg: "file is larger than 4 MiB"}
	}
	return Parse(path, src)
}

// Parse parses a version 1 policy file. file names the source in errors and
// in each rule's Source ("file:line"). Every error is a *ParseError, or
// several joined (errors.Join; errors.As finds the first), one per bad rule
// or phase.
func Parse(file string, src []byte) (*Policy, error) {
	if file == "" {
		file = "<policy>"
	}
	ps := &parser{file: file}
	dec := yaml.NewDecoder(bytes.NewReader(src))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, ps.errf(nil, "empty file (want a mapping with version: 1 and phases)")
		}
		return nil, ps.syntaxError(err, src)
	}
	var next yaml.Node
	if err := dec.Decode(&next); err == nil {
		return nil, ps.errf(&next, "more than one YAML document (remove the second ---)")
	} else if !errors.Is(err, io.EOF) {
		return nil, ps.syntaxError(err, src)
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) != 1 {
		return nil, ps.errf(&doc, "empty file (want a mapping with version: 1 and phases)")
	}
	root := doc.Content[0]
	if isNull(root) {
		return nil, ps.errf(&doc, "empty file (want a mapping with version: 1 and phases)")
	}
	return ps.policy(root)
}

type parser struct{ file string }

// entry is one key: value pair of a YAML mapping.
type entry struct{ key, val *yaml.Node }

func (ps *parser) errf(n *yaml.Node, format string, args ...any) *ParseError {
	e := &ParseError{File: ps.file, Line: 1, Col: 1, Msg: fmt.Sprintf(format, args...)}
	if n != nil && n.Line > 0 {
		e.Line, e.Col = n.Line, max(n.Column, 1)
	}
	return e
}

var (
	yamlLineRE   = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)
	yamlAnchorRE = regexp.MustCompile(`^yaml: unknown anchor '(.*)' referenced$`)
)

// yamlParserProblems are the problems yaml.v3 raises from its parser (as
// opposed to its scanner). For those it reports a 0-based line number, for
// scanner problems a 1-based one; syntaxError corrects the former.
var yamlParserProblems = map[string]bool{
	"did not find expected <stream-start>":   true,
	"did not find expected <document start>": true,
	"did not find expected node content":     true,
	"did not find expected '-' indicator":    true,
	"did not find expected key":              true,
	"did not find expected ',' or ']'":       true,
	"did not find expected ',' or '}'":       true,
	"found undefined tag handle":             true,
	"found duplicate %YAML directive":        true,
	"found incompatible YAML document":       true,
	"found duplicate %TAG directive":         true,
}

// syntaxError turns a YAML decoder error into a ParseError at the line the
// decoder reports, made 1-based. Problems it reports without a line are on
// the first line, except an unknown alias, which is looked up in src.
func (ps *parser) syntaxError(err error, src []byte) *ParseError {
	msg := err.Error()
	line := 1
	if m := yamlLineRE.FindStringSubmatch(msg); m != nil {
		msg = m[2]
		if n, convErr := strconv.Atoi(m[1]); convErr == nil && n > 0 {
			line = n
			if yamlParserProblems[msg] {
				line++
			}
		}
	} else if m := yamlAnchorRE.FindStringSubmatch(msg); m != nil {
		if i := bytes.Index(src, []byte("*"+m[1])); i >= 0 {
			line = 1 + bytes.Count(src[:i], []byte("\n"))
		}
		msg = strings.TrimPrefix(msg, "yaml: ")
	} else {
		msg = strings.TrimPrefix(msg, "yaml: ")
	}
	return &ParseError{File: ps.file, Line: line, Col: 1, Msg: "bad YAML: " + msg}
}

// noAliases rejects anchors and aliases: a policy is read by humans, and
// aliases would let one rule silently appear in several places.
func (ps *parser) noAliases(n *yaml.Node) error {
	if n.Kind == yaml.AliasNode {
		return ps.errf(n, "YAML aliases (*%s) are not supported; write the rule out", n.Value)
	}
	if n.Anchor != "" {
		return ps.errf(n, "YAML anchors (&%s) are not supported", n.Anchor)
	}
	return nil
}

// entries checks that n is a mapping with distinct scalar keys, all in known
// (when known is not nil), and returns its pairs in file order. where is
// the phrase used in messages, such as "in rule".
func (ps *parser) entries(n *yaml.Node, what, where string, known []string) ([]entry, error) {
	if err := ps.noAliases(n); err != nil {
		return nil, err
	}
	if n.Kind != yaml.MappingNode {
		return nil, ps.errf(n, "%s must be a mapping, got %s", what, describe(n))
	}
	out := make([]entry, 0, len(n.Content)/2)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if err := ps.noAliases(k); err != nil {
			return nil, err
		}
		if err := ps.noAliases(v); err != nil {
			return nil, err
		}
		if k.Kind != yaml.ScalarNode {
			return nil, ps.errf(k, "keys %s must be plain names, got %s", where, describe(k))
		}
		if known != nil && !containsString(known, k.Value) {
			return nil, ps.errf(k, "unknown key %q %s (known: %s)", k.Value, where, strings.Join(known, ", "))
		}
		for _, prev := range out {
			if prev.key.Value == k.Value {
				return nil, ps.errf(k, "duplicate key %q %s (first at line %d)", k.Value, where, prev.key.Line)
			}
		}
		out = append(out, entry{k, v})
	}
	return out, nil
}

func lookup(es []entry, key string) (entry, bool) {
	for _, e := range es {
		if e.key.Value == key {
			return e, true
		}
	}
	return entry{}, false
}

func containsString(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func isNull(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null"
}

// describe names a node's YAML type for "must be X, got Y" messages.
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.AliasNode:
		return "an alias"
	case yaml.DocumentNode:
		return "a document"
	}
	switch n.ShortTag() {
	case "!!str":
		return fmt.Sprintf("the string %q", n.Value)
	case "!!int":
		return "the integer " + n.Value
	case "!!float":
		return "the number " + n.Value
	case "!!bool":
		return "the boolean " + n.Value
	case "!!null":
		return "nothing (null)"
	}
	return "a value tagged " + n.ShortTag()
}

// str returns the value of a string scalar.
func (ps *parser) str(n *yaml.Node, what string) (string, error) {
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!str" {
		return "", ps.errf(n, "%s must be a string, got %s", what, describe(n))
	}
	return n.Value, nil
}

func (ps *parser) policy(root *yaml.Node) (*Policy, error) {
	top, err := ps.entries(root, "the top level", "at top level", []string{"version", "phases", "dns", "secrets"})
	if err != nil {
		return nil, err
	}
	v, ok := lookup(top, "version")
	if !ok {
		return nil, ps.errf(root, "missing \"version\" (version must be 1)")
	}
	if err := ps.version(v.val); err != nil {
		return nil, err
	}
	p := &Policy{file: ps.file}
	ph, ok := lookup(top, "phases")
	if !ok {
		return nil, ps.errf(root, "missing \"phases\" (want phases: {NAME: {allow: [...]}})")
	}
	if p.phases, err = ps.phases(ph); err != nil {
		return nil, err
	}
	if d, ok := lookup(top, "dns"); ok {
		if p.upstream, err = ps.dns(d.val); err != nil {
			return nil, err
		}
	}
	if sec, ok := lookup(top, "secrets"); ok {
		if p.secrets, err = ps.secrets(sec.val); err != nil {
			return nil, err
		}
	}
	return p, nil
}

func (ps *parser) version(n *yaml.Node) error {
	var v int64
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!int" || n.Decode(&v) != nil || v != 1 {
		return ps.errf(n, "version must be 1, got %s", describe(n))
	}
	return nil
}

func (ps *parser) phases(ph entry) ([]phase, error) {
	if isNull(ph.val) {
		return nil, ps.errf(ph.key, "phases is empty (want at least one phase with an allow list)")
	}
	es, err := ps.entries(ph.val, "phases", "in phases", nil)
	if err != nil {
		return nil, err
	}
	if len(es) == 0 {
		return nil, ps.errf(ph.val, "phases is empty (want at least one phase with an allow list)")
	}
	// Every phase and rule is checked, and every error reported (joined,
	// in file order), not only the first.
	out := make([]phase, 0, len(es))
	var errs []error
	for _, e := range es {
		name := e.key.Value
		if !validPhaseName(name) {
			errs = append(errs, ps.errf(e.key, "bad phase name %q (use 1-64 letters, digits, '-', '_' or '.')", name))
			continue
		}
		ph, err := ps.phase(name, e)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out = append(out, ph)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return out, nil
}

// validPhaseName reports whether s can name a phase (and a --phase flag).
func validPhaseName(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return false
		}
	}
	return true
}

// Values of a phase's default key.
const (
	DefaultDeny   = "deny"   // the implicit default: what no allow rule allows is denied
	DefaultPublic = "public" // any public destination is allowed over TCP (the guard still applies)
)

func (ps *parser) phase(name string, e entry) (phase, error) {
	noRules := func() error {
		return ps.errf(e.key, "phase %q has no rules (want an allow list, or default: public)", name)
	}
	if isNull(e.val) {
		return phase{}, noRules()
	}
	where := fmt.Sprintf("in phase %q", name)
	es, err := ps.entries(e.val, fmt.Sprintf("phase %q", name), where, []string{"allow", "deny", "default"})
	if err != nil {
		return phase{}, err
	}
	ph := phase{name: name}
	var errs []error
	if d, ok := lookup(es, "default"); ok {
		switch s, err := ps.str(d.val, "default"); {
		case err != nil:
			errs = append(errs, err)
		case s == DefaultDeny:
		case s == DefaultPublic:
			ph.open = true
		default:
			errs = append(errs, ps.errf(d.val, "default must be %q (the implicit default) or %q (any public destination over tcp), got %q", DefaultDeny, DefaultPublic, s))
		}
	}
	allow, hasAllow := lookup(es, "allow")
	if hasAllow && !isNull(allow.val) {
		ph.rules, err = ps.ruleList(allow, name, false)
		if err != nil {
			errs = append(errs, err)
		}
	}
	if deny, ok := lookup(es, "deny"); ok {
		if isNull(deny.val) {
			errs = append(errs, ps.errf(deny.key, "deny in phase %q is empty (omit it, or list rules)", name))
		} else if ph.deny, err = ps.ruleList(deny, name, true); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return phase{}, errors.Join(errs...)
	}
	if len(ph.rules) == 0 && !ph.open {
		return phase{}, noRules()
	}
	return ph, nil
}

// ruleList parses an allow or deny list of phase name.
func (ps *parser) ruleList(list entry, name string, deny bool) ([]Rule, error) {
	if list.val.Kind != yaml.SequenceNode {
		return nil, ps.errf(list.val, "%s in phase %q must be a list of rules, got %s", list.key.Value, name, describe(list.val))
	}
	if len(list.val.Content) == 0 {
		if deny {
			return nil, ps.errf(list.val, "deny in phase %q is empty (omit it, or list rules)", name)
		}
		return nil, nil
	}
	rules := make([]Rule, 0, len(list.val.Content))
	var errs []error
	for _, rn := range list.val.Content {
		r, err := ps.rule(rn, deny)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		rules = append(rules, r)
	}
	return rules, errors.Join(errs...)
}

// rule parses one rule of an allow list, or, with deny, of a deny list:
// the same forms, but no http, inject or ca (a denied flow never opens),
// and defaults that deny the most: every port and both protocols.
func (ps *parser) rule(n *yaml.Node, deny bool) (Rule, error) {
	if err := ps.noAliases(n); err != nil {
		return Rule{}, err
	}
	if n.Kind != yaml.MappingNode {
		return Rule{}, ps.errf(n, "rule must be a mapping such as {host: example.com}, got %s", describe(n))
	}
	es, err := ps.entries(n, "rule", "in rule", []string{"host", "cidr", "ports", "proto", "http", "inject", "ca"})
	if err != nil {
		return Rule{}, err
	}
	r := Rule{Proto: TCP, Ports: defaultPorts(), Source: ps.file + ":" + strconv.Itoa(n.Line)}
	if deny {
		for _, k := range []string{"http", "inject", "ca"} {
			if e, ok := lookup(es, k); ok {
				return Rule{}, ps.errf(e.key, "a deny rule takes no %s (a denied flow never opens: there is nothing to check or inject)", k)
			}
		}
		r.Proto, r.Ports = AnyProto, []PortRange{{1, 65535}}
	}
	host, hasHost := lookup(es, "host")
	cidr, hasCIDR := lookup(es, "cidr")
	switch {
	case hasHost && hasCIDR:
		return Rule{}, ps.errf(cidr.key, "rule has both host and cidr (use one rule for each)")
	case hasHost:
		s, err := ps.str(host.val, "host")
		if err != nil {
			return Rule{}, err
		}
		if r.Host, err = NormalizeHost(s); err != nil {
			return Rule{}, ps.errf(host.val, "%s", err)
		}
	case hasCIDR:
		s, err := ps.str(cidr.val, "cidr")
		if err != nil {
			return Rule{}, err
		}
		if r.CIDR, err = parseCIDR(s); err != nil {
			return Rule{}, ps.errf(cidr.val, "%s", err)
		}
	default:
		return Rule{}, ps.errf(n, "rule needs host or cidr")
	}
	if e, ok := lookup(es, "ports"); ok {
		if r.Ports, err = ps.ports(e.val); err != nil {
			return Rule{}, err
		}
	}
	if e, ok := lookup(es, "proto"); ok {
		s, err := ps.str(e.val, "proto")
		if err != nil {
			return Rule{}, err
		}
		if r.Proto, err = ParseProto(s); err != nil {
			return Rule{}, ps.errf(e.val, "%s", err)
		}
	}
	if err := ps.httpLayer(&r, es); err != nil {
		return Rule{}, err
	}
	return r, nil
}

func (ps *parser) ports(n *yaml.Node) ([]PortRange, error) {
	if n.Kind != yaml.SequenceNode {
		return nil, ps.errf(n, "ports must be a list such as [443], got %s", describe(n))
	}
	if len(n.Content) == 0 {
		return nil, ps.errf(n, "ports is empty (omit it for the default [443], or use [\"*\"] for every port)")
	}
	out := make([]PortRange, 0, len(n.Content))
	for _, item := range n.Content {
		if err := ps.noAliases(item); err != nil {
			return nil, err
		}
		var pr PortRange
		switch {
		case item.Kind == yaml.ScalarNode && item.ShortTag() == "!!int":
			var v int64
			if err := item.Decode(&v); err != nil || v < 1 || v > 65535 {
				return nil, ps.errf(item, "port %s out of range 1-65535", item.Value)
			}
			pr = PortRange{uint16(v), uint16(v)}
		case item.Kind == yaml.ScalarNode && item.ShortTag() == "!!str":
			var err error
			if pr, err = parsePortSpec(item.Value); err != nil {
				return nil, ps.errf(item, "%s", err)
			}
		default:
			return nil, ps.errf(item, "port must be a number, \"lo-hi\" or \"*\", got %s", describe(item))
		}
		out = append(out, pr)
	}
	return normalizePorts(out), nil
}

func (ps *parser) dns(n *yaml.Node) (netip.AddrPort, error) {
	if isNull(n) {
		return netip.AddrPort{}, nil
	}
	es, err := ps.entries(n, "dns", "in dns", []string{"upstream"})
	if err != nil {
		return netip.AddrPort{}, err
	}
	e, ok := lookup(es, "upstream")
	if !ok {
		return netip.AddrPort{}, nil
	}
	s, err := ps.str(e.val, "dns upstream")
	if err != nil {
		return netip.AddrPort{}, err
	}
	ap, err := parseUpstream(s)
	if err != nil {
		return netip.AddrPort{}, ps.errf(e.val, "%s", err)
	}
	return ap, nil
}

// parseUpstream parses IP, IP:PORT, [IPv6] or [IPv6]:PORT; the port
// defaults to 53.
func parseUpstream(s string) (netip.AddrPort, error) {
	bad := fmt.Errorf("bad dns upstream %q (want IP, IP:PORT or [IPv6]:PORT)", s)
	var ap netip.AddrPort
	if strings.Contains(s, "%") {
		return ap, bad
	}
	if a, err := netip.ParseAddr(strings.TrimSuffix(strings.TrimPrefix(s, "["), "]")); err == nil {
		if strings.HasPrefix(s, "[") != strings.HasSuffix(s, "]") || strings.HasPrefix(s, "[") && a.Is4() {
			return ap, bad
		}
		ap = netip.AddrPortFrom(a, 53)
	} else {
		host, port, ok := cutLast(s, ':')
		if !ok {
			return ap, bad
		}
		if strings.HasPrefix(host, "[") {
			if !strings.HasSuffix(host, "]") {
				return ap, bad
			}
			host = host[1 : len(host)-1]
			if !strings.Contains(host, ":") {
				return ap, bad
			}
		} else if strings.Contains(host, ":") {
			return ap, bad // IPv6 with a port needs brackets
		}
		a, err := netip.ParseAddr(host)
		if err != nil {
			return ap, bad
		}
		p, err := parsePortNumber(port)
		if err != nil {
			return ap, fmt.Errorf("bad dns upstream %q: %w", s, err)
		}
		ap = netip.AddrPortFrom(a, p)
	}
	a := ap.Addr().Unmap()
	if a.IsUnspecified() {
		return netip.AddrPort{}, fmt.Errorf("bad dns upstream %q: the unspecified address", s)
	}
	return netip.AddrPortFrom(a, ap.Port()), nil
}

func cutLast(s string, sep byte) (before, after string, ok bool) {
	if i := strings.LastIndexByte(s, sep); i >= 0 {
		return s[:i], s[i+1:], true
	}
	return s, "", false
}

// Phases returns the phase names in file order.
func (p *Policy) Phases() []string {
	if p == nil {
		return nil
	}
	out := make([]string, len(p.phases))
	for i, ph := range p.phases {
		out[i] = ph.name
	}
	return out
}

// DNSUpstream returns dns.upstream, or the zero AddrPort if the file sets none.
func (p *Policy) DNSUpstream() netip.AddrPort {
	if p == nil {
		return netip.AddrPort{}
	}
	return p.upstream
}

// Rules returns a copy of the rules of phase, in file order, or nil if the
// policy has no such phase.
func (p *Policy) Rules(phase string) []Rule {
	if p == nil {
		return nil
	}
	for _, ph := range p.phases {
		if ph.name == phase {
			out := make([]Rule, len(ph.rules))
			for i, r := range ph.rules {
				out[i] = r.clone()
			}
			return out
		}
	}
	return nil
}

// DenyRules returns a copy of the deny rules of phase, in file order, or
// nil if the policy has no such phase or the phase has none.
func (p *Policy) DenyRules(phase string) []Rule {
	if p == nil {
		return nil
	}
	for _, ph := range p.phases {
		if ph.name == phase {
			var out []Rule
			for _, r := range ph.deny {
				out = append(out, r.clone())
			}
			return out
		}
	}
	return nil
}

// Default returns phase's default: DefaultPublic or DefaultDeny ("" if the
// policy has no such phase).
func (p *Policy) Default(phase string) string {
	if p == nil {
		return ""
	}
	for _, ph := range p.phases {
		if ph.name == phase {
			if ph.open {
				return DefaultPublic
			}
			return DefaultDeny
		}
	}
	return ""
}

// Secrets returns the policy's secrets section: each secret's name and
// where its value is read, in file order. Values are never in a policy.
func (p *Policy) Secrets() []SecretSource {
	if p == nil {
		return nil
	}
	return append([]SecretSource(nil), p.secrets...)
}

// secrets parses the secrets section: NAME: {env: VAR} or NAME: {file: PATH}.
func (ps *parser) secrets(n *yaml.Node) ([]SecretSource, error) {
	if isNull(n) {
		return nil, nil
	}
	es, err := ps.entries(n, "secrets", "in secrets", nil)
	if err != nil {
		return nil, err
	}
	out := make([]SecretSource, 0, len(es))
	for _, e := range es {
		name := e.key.Value
		if !ValidSecretName(name) {
			return nil, ps.errf(e.key, "bad secret name %q (letters, digits and _, not starting with a digit, at most %d; run sets an environment variable of that name)", name, maxSecretName)
		}
		src, err := ps.entries(e.val, "secret "+name, "in secret "+name, []string{"env", "file"})
		if err != nil {
			return nil, err
		}
		s := SecretSource{Name: name, Source: ps.file + ":" + strconv.Itoa(e.key.Line)}
		env, hasEnv := lookup(src, "env")
		file, hasFile := lookup(src, "file")
		switch {
		case hasEnv && hasFile:
			return nil, ps.errf(file.key, "secret %s has both env and file (give one)", name)
		case hasEnv:
			v, err := ps.str(env.val, "env")
			if err != nil {
				return nil, err
			}
			if !ValidSecretName(v) {
				return nil, ps.errf(env.val, "%q is not an environment variable name", v)
			}
			s.Env = v
		case hasFile:
			v, err := ps.str(file.val, "file")
			if err != nil {
				return nil, err
			}
			if err := checkSecretPath(v); err != nil {
				return nil, ps.errf(file.val, "%s", err)
			}
			s.File = v
		default:
			return nil, ps.errf(e.val, "secret %s needs env: VAR or file: PATH", name)
		}
		out = append(out, s)
	}
	return out, nil
}

// httpLayer parses a rule's http, inject and ca keys into r.
func (ps *parser) httpLayer(r *Rule, es []entry) error {
	h, hasHTTP := lookup(es, "http")
	in, hasInject := lookup(es, "inject")
	ca, hasCA := lookup(es, "ca")
	if !hasHTTP && !hasInject && !hasCA {
		return nil
	}
	for _, e := range []struct {
		has bool
		e   entry
	}{{hasHTTP, h}, {hasInject, in}, {hasCA, ca}} {
		if !e.has {
			continue
		}
		if r.Host == "" {
			return ps.errf(e.e.key, "%s needs a host rule (tunwall terminates TLS for a name, never for an address)", e.e.key.Value)
		}
		if r.Proto != TCP {
			return ps.errf(e.e.key, "%s needs proto tcp", e.e.key.Value)
		}
	}
	if hasHTTP {
		if h.val.Kind != yaml.SequenceNode || len(h.val.Content) == 0 {
			return ps.errf(h.val, "http must be a non-empty list such as [{methods: [GET], paths: [\"/repos/**\"]}], got %s", describe(h.val))
		}
		r.HTTP = make([]HTTPRule, 0, len(h.val.Content))
		for _, item := range h.val.Content {
			hr, err := ps.httpEntry(item)
			if err != nil {
				return err
			}
			r.HTTP = append(r.HTTP, hr)
		}
	}
	if hasInject {
		if in.val.Kind != yaml.SequenceNode || len(in.val.Content) == 0 {
			return ps.errf(in.val, "inject must be a non-empty list such as [GITHUB_TOKEN], got %s", describe(in.val))
		}
		for _, item := range in.val.Content {
			inj, err := ps.injection(item)
			if err != nil {
				return err
			}
			for _, prev := range r.Inject {
				if prev.Secret == inj.Secret {
					return ps.errf(item, "secret %s is injected twice by this rule", inj.Secret)
				}
			}
			r.Inject = append(r.Inject, inj)
		}
	}
	if hasCA {
		s, err := ps.str(ca.val, "ca")
		if err != nil {
			return err
		}
		if err := checkSecretPath(s); err != nil {
			return ps.errf(ca.val, "ca: %s", err)
		}
		r.CA = s
	}
	return nil
}

func (ps *parser) stringList(n *yaml.Node, what string) ([]string, error) {
	if err := ps.noAliases(n); err != nil {
		return nil, err
	}
	if n.Kind != yaml.SequenceNode || len(n.Content) == 0 {
		return nil, ps.errf(n, "%s must be a non-empty list, got %s", what, describe(n))
	}
	out := make([]string, 0, len(n.Content))
	for _, item := range n.Content {
		if err := ps.noAliases(item); err != nil {
			return nil, err
		}
		s, err := ps.str(item, what+" item")
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, nil
}

// httpEntry parses {methods: [...], paths: [...]}.
func (ps *parser) httpEntry(n *yaml.Node) (HTTPRule, error) {
	es, err := ps.entries(n, "http entry", "in http entry", []string{"methods", "paths"})
	if err != nil {
		return HTTPRule{}, err
	}
	m, ok := lookup(es, "methods")
	if !ok {
		return HTTPRule{}, ps.errf(n, "http entry needs methods (e.g. [GET, HEAD], or [\"*\"] for any)")
	}
	p, ok := lookup(es, "paths")
	if !ok {
		return HTTPRule{}, ps.errf(n, "http entry needs paths (e.g. [\"/repos/acme/**\"])")
	}
	var hr HTTPRule
	methods, err := ps.stringList(m.val, "methods")
	if err != nil {
		return HTTPRule{}, err
	}
	for i, s := range methods {
		up, err := checkMethod(s)
		if err != nil {
			return HTTPRule{}, ps.errf(m.val.Content[i], "%s", err)
		}
		if !containsString(hr.Methods, up) {
			hr.Methods = append(hr.Methods, up)
		}
	}
	paths, err := ps.stringList(p.val, "paths")
	if err != nil {
		return HTTPRule{}, err
	}
	for i, s := range paths {
		if err := checkPattern(s); err != nil {
			return HTTPRule{}, ps.errf(p.val.Content[i], "%s", err)
		}
		if !containsString(hr.Paths, s) {
			hr.Paths = append(hr.Paths, s)
		}
	}
	return hr, nil
}

// injection parses NAME or {secret: NAME, header: H, value: "Bearer {}"}.
func (ps *parser) injection(n *yaml.Node) (Injection, error) {
	if err := ps.noAliases(n); err != nil {
		return Injection{}, err
	}
	if n.Kind == yaml.ScalarNode {
		s, err := ps.str(n, "inject item")
		if err != nil {
			return Injection{}, err
		}
		if !ValidSecretName(s) {
			return Injection{}, ps.errf(n, "%q is not a secret name", s)
		}
		return Injection{Secret: s}, nil
	}
	es, err := ps.entries(n, "inject item", "in inject item", []string{"secret", "header", "value"})
	if err != nil {
		return Injection{}, err
	}
	sec, ok := lookup(es, "secret")
	if !ok {
		return Injection{}, ps.errf(n, "inject item needs secret: NAME")
	}
	name, err := ps.str(sec.val, "secret")
	if err != nil {
		return Injection{}, err
	}
	if !ValidSecretName(name) {
		return Injection{}, ps.errf(sec.val, "%q is not a secret name", name)
	}
	out := Injection{Secret: name}
	h, hasHeader := lookup(es, "header")
	v, hasValue := lookup(es, "value")
	switch {
	case hasHeader:
		if out.Header, err = ps.str(h.val, "header"); err != nil {
			return Injection{}, err
		}
		if err := checkInjectHeader(out.Header); err != nil {
			return Injection{}, ps.errf(h.val, "%s", err)
		}
		out.Value = "{}"
		if hasValue {
			if out.Value, err = ps.str(v.val, "value"); err != nil {
				return Injection{}, err
			}
			if err := checkInjectValue(out.Value); err != nil {
				return Injection{}, ps.errf(v.val, "%s", err)
			}
		}
	case hasValue:
		return Injection{}, ps.errf(v.key, "value needs header (the header the value is written into)")
	}
	return out, nil
}
