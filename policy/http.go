package policy

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"

	"github.com/tunwall/tunwall/flow"
)

// The HTTP layer of a rule (README: "Keeping credentials out of the
// sandbox"). A host rule with http or inject has its flows terminated by
// tunwall's terminator: every request on them is decided by DecideRequest, and
// the secrets named by inject are put into the requests to that host. The
// policy holds secret names and where their values come from, never a value.

// HTTPRule is one entry of a rule's http list: a request is allowed by it
// when its method is one of Methods and its path matches one of Paths.
type HTTPRule struct {
	// Methods are upper-case method tokens; "*" matches any method.
	Methods []string
	// Paths are patterns of "/"-separated segments: a segment "*" matches
	// exactly one non-empty segment, "**" any number of segments (none
	// included), anything else itself (case-sensitively). A pattern ending
	// in "/" matches only paths ending in "/".
	Paths []string
}

// String returns the entry as it is written in a policy file, such as
// `{methods: [GET, HEAD], paths: ["/repos/acme/**"]}`.
func (h HTTPRule) String() string {
	q := make([]string, len(h.Paths))
	for i, p := range h.Paths {
		q[i] = `"` + p + `"`
	}
	return "{methods: [" + strings.Join(h.Methods, ", ") + "], paths: [" + strings.Join(q, ", ") + "]}"
}

// Injection is one entry of a rule's inject list.
type Injection struct {
	// Secret names the secret (a key of the policy's secrets, or a
	// --secret flag).
	Secret string
	// Header, when set, is the header the secret is written into, whether
	// or not the client sent it (explicit form). "" is the plain form:
	// every occurrence of the secret's placeholder in the request's
	// headers is replaced by its value.
	Header string
	// Value is the explicit form's header value, "{}" standing for the
	// secret's value (e.g. "Bearer {}"). "" in the plain form.
	Value string
}

// SecretSource says where tunwall reads one secret's value when it starts:
// the environment variable Env of tunwall's own environment, or the file
// File ("~/" meaning the user's home). Exactly one is set.
type SecretSource struct {
	Name   string
	Env    string
	File   string
	Source string // "agent.yaml:3" or "--secret NAME=..."
}

// String returns "env:VAR" or "file:PATH".
func (s SecretSource) String() string {
	if s.Env != "" {
		return "env:" + s.Env
	}
	return "file:" + s.File
}

// maxSecretName bounds a secret's name.
const maxSecretName = 64

// ValidSecretName reports whether s can name a secret: an environment
// variable name (letters, digits and '_', not starting with a digit), since
// `tunwall run` sets a variable of that name to the secret's placeholder.
func ValidSecretName(s string) bool {
	if s == "" || len(s) > maxSecretName {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'A' && c <= 'Z', c >= 'a' && c <= 'z', c == '_':
		case c >= '0' && c <= '9' && i > 0:
		default:
			return false
		}
	}
	return true
}

// ParseSecret parses one --secret flag value, NAME=env:VAR or
// NAME=file:PATH.
func ParseSecret(s string) (SecretSource, error) {
	name, src, ok := strings.Cut(s, "=")
	if !ok {
		return SecretSource{}, fmt.Errorf("--secret %q: want NAME=env:VAR or NAME=file:PATH", s)
	}
	if !ValidSecretName(name) {
		return SecretSource{}, fmt.Errorf("--secret %q: %q is not a secret name (letters, digits and _, not starting with a digit, at most %d)", s, name, maxSecretName)
	}
	out := SecretSource{Name: name, Source: "--secret " + name}
	kind, val, ok := strings.Cut(src, ":")
	switch {
	case !ok:
		return SecretSource{}, fmt.Errorf("--secret %q: want NAME=env:VAR or NAME=file:PATH", s)
	case kind == "env":
		if !ValidSecretName(val) {
			return SecretSource{}, fmt.Errorf("--secret %q: %q is not an environment variable name", s, val)
		}
		out.Env = val
	case kind == "file":
		if err := checkSecretPath(val); err != nil {
			return SecretSource{}, fmt.Errorf("--secret %q: %w", s, err)
		}
		out.File = val
	default:
		return SecretSource{}, fmt.Errorf("--secret %q: unknown source %q (want env:VAR or file:PATH)", s, kind)
	}
	return out, nil
}

func checkSecretPath(p string) error {
	switch {
	case p == "":
		return errors.New("empty file path")
	case strings.ContainsAny(p, "\x00\n\r"):
		return errors.New("the file path contains a NUL or line break")
	}
	return nil
}

// HTTPView is what applies to the requests of a flow to one host and port:
// whether tunwall terminates it, the secrets its requests receive, and the
// roots its server is verified against.
type HTTPView struct {
	// Terminate is true when a rule matching the host and port has http
	// or inject.
	Terminate bool
	// Inject lists the injections of every matching rule, in rule order.
	Inject []Injection
	// CA is the ca of the first matching rule that names one; "" means
	// the host's roots.
	CA string
	// Restricted is true when a matching rule has http: then only
	// requests an http entry allows pass.
	Restricted bool
}

// Injects reports whether secret is injected on this host.
func (v HTTPView) Injects(secret string) bool {
	for _, in := range v.Inject {
		if in.Secret == secret {
			return true
		}
	}
	return false
}

// terminates reports whether r has its flows terminated.
func (r *Rule) terminates() bool { return r.HTTP != nil || len(r.Inject) > 0 }

// matchingTCP returns the indices of the host rules that match host and
// port over TCP, lowest first, or nil for an invalid name.
func (rs *RuleSet) matchingTCP(host string, port uint16) []int {
	var buf nameBuf
	n, bad := canonName(&buf, host, flow.Hostname)
	if bad != "" {
		return nil
	}
	name := buf[:n]
	var out []int
	add := func(idx []int) {
		for _, i := range idx {
			if rs.rules[i].allows(port, TCP) {
				out = append(out, i)
			}
		}
	}
	add(rs.exact[string(name)])
	for i := 0; i < len(name); i++ {
		if name[i] == '.' {
			add(rs.wild[string(name[i+1:])])
		}
	}
	sortInts(out)
	return out
}

func sortInts(a []int) {
	for i := 1; i < len(a); i++ {
		for j := i; j > 0 && a[j] < a[j-1]; j-- {
			a[j], a[j-1] = a[j-1], a[j]
		}
	}
}

// HasHTTP reports whether any rule of the set terminates flows (has http or
// inject); without one, tunwall never decrypts anything.
func (rs *RuleSet) HasHTTP() bool {
	for i := range rs.rules {
		if rs.rules[i].terminates() {
			return true
		}
	}
	return false
}

// HTTPFor returns what applies to requests to host on port (TCP): a host
// is terminated when any rule matching it and the port has http or inject.
func (rs *RuleSet) HTTPFor(host string, port uint16) HTTPView {
	var v HTTPView
	for _, i := range rs.matchingTCP(host, port) {
		r := &rs.rules[i]
		if !r.terminates() {
			continue
		}
		v.Terminate = true
		v.Inject = append(v.Inject, r.Inject...)
		if v.CA == "" {
			v.CA = r.CA
		}
		if r.HTTP != nil {
			v.Restricted = true
		}
	}
	return v
}

// InjectedSecrets returns the names of the secrets some rule injects, each
// once, in rule order.
func (rs *RuleSet) InjectedSecrets() []string {
	var out []string
	for i := range rs.rules {
		for _, in := range rs.rules[i].Inject {
			if !containsString(out, in.Secret) {
				out = append(out, in.Secret)
			}
		}
	}
	return out
}

// CheckSecrets reports an inject entry naming a secret that declared does
// not know (neither the policy's secrets nor a --secret flag declares it).
func (rs *RuleSet) CheckSecrets(declared func(name string) bool) error {
	for i := range rs.rules {
		for _, in := range rs.rules[i].Inject {
			if !declared(in.Secret) {
				return fmt.Errorf("policy: rule %s (%s) injects secret %s, which is not declared (add it under secrets: or give --secret %s=env:VAR)",
					rs.rules[i].String(), rs.rules[i].Source, in.Secret, in.Secret)
			}
		}
	}
	return nil
}

// InjectHosts returns the hosts of the rules that inject secret, each once.
func (rs *RuleSet) InjectHosts(secret string) []string {
	var out []string
	for i := range rs.rules {
		for _, in := range rs.rules[i].Inject {
			if in.Secret == secret && !containsString(out, rs.rules[i].Host) {
				out = append(out, rs.rules[i].Host)
			}
		}
	}
	return out
}

// CAFiles returns the distinct ca files of the rules, in rule order.
func (rs *RuleSet) CAFiles() []string {
	var out []string
	for i := range rs.rules {
		if c := rs.rules[i].CA; c != "" && !containsString(out, c) {
			out = append(out, c)
		}
	}
	return out
}

// RequestDecision is the verdict on one request of a terminated flow.
type RequestDecision struct {
	Verdict Verdict
	// Rule is the rule (and http entry) that allowed the request, or the
	// rule or "default-deny" for a denial.
	Rule string
	// Reason says why, in words, e.g. "no http rule of api.github.com
	// allows POST /gists".
	Reason string
	// Hint, on a denial, says what would allow it: the requests the host's
	// rules allow, and the http entry to add.
	Hint string
}

// Allowed reports whether the verdict is Allow.
func (d RequestDecision) Allowed() bool { return d.Verdict == Allow }

// maxHintEntries bounds the http entries a denial's hint lists.
const maxHintEntries = 6

// DecideRequest decides one request of a flow to host on port: method as
// sent, path in its escaped form as sent (without the query). The flow
// itself must have been allowed by DecideName. A request is allowed when a
// matching rule with http has an entry matching it, or when no matching
// rule has http (inject alone restricts nothing). A path that is not in
// canonical form (a "." or ".." segment, an empty segment, an encoded "/",
// "\" or ".", a control character) is denied whatever the rules say: a
// server could read it as another path than the one checked. The one
// encoded "/" read as a separator is npm's scoped package, a first
// segment "@scope%2fname", decided as /@scope/name (splitScope).
func (rs *RuleSet) DecideRequest(host string, port uint16, method, path string) RequestDecision {
	var buf nameBuf
	if n, bad := canonName(&buf, host, flow.Hostname); bad == "" {
		if d := rs.denyName(buf[:n], port, TCP); d >= 0 {
			v := rs.denied(d, -1)
			return RequestDecision{Verdict: Deny, Rule: v.Rule, Reason: v.Reason}
		}
	}
	idx := rs.matchingTCP(host, port)
	if len(idx) == 0 {
		return RequestDecision{Verdict: Deny, Rule: RuleDefaultDeny, Reason: "no rule allows " + host}
	}
	if !validMethod(method) {
		return RequestDecision{Verdict: Deny, Rule: RuleDefaultDeny, Reason: fmt.Sprintf("method %q is not a token", clip(method))}
	}
	segs, bad := pathSegments(path)
	if bad != "" {
		return RequestDecision{Verdict: Deny, Rule: RuleDefaultDeny, Reason: fmt.Sprintf("path %q refused: %s", clip(path), bad)}
	}
	first, restricted := -1, false
	for _, i := range idx {
		r := &rs.rules[i]
		if first < 0 && r.terminates() {
			first = i
		}
		if r.HTTP == nil {
			continue
		}
		restricted = true
		for _, h := range r.HTTP {
			if h.matches(method, segs) {
				return RequestDecision{Verdict: Allow, Rule: rs.labels[i] + " http " + h.String(), Reason: reasonAllowed}
			}
		}
	}
	if first < 0 {
		first = idx[0]
	}
	if !restricted {
		return RequestDecision{Verdict: Allow, Rule: rs.labels[first], Reason: reasonAllowed + " (no http list restricts its requests)"}
	}
	// Denied: say what is allowed, and what to add.
	var allowed []string
	target := -1
	for _, i := range idx {
		for _, h := range rs.rules[i].HTTP {
			if target < 0 {
				target = i
			}
			if len(allowed) < maxHintEntries {
				allowed = append(allowed, strings.Join(h.Methods, ", ")+" "+strings.Join(h.Paths, " "))
			} else if len(allowed) == maxHintEntries {
				allowed = append(allowed, "...")
			}
		}
	}
	m := strings.ToUpper(method)
	hint := "allowed: " + strings.Join(allowed, "; ") +
		fmt.Sprintf("; to allow it, add %s to the http list of rule %s (%s)",
			HTTPRule{Methods: []string{m}, Paths: []string{clip(path)}}.String(), rs.rules[target].Host, rs.rules[target].Source)
	return RequestDecision{
		Verdict: Deny,
		Rule:    rs.labels[target],
		Reason:  fmt.Sprintf("no http rule of %s allows %s %s", rs.rules[target].Host, m, clip(path)),
		Hint:    hint,
	}
}

// clip bounds a client-chosen string quoted in a reason.
func clip(s string) string {
	if len(s) > 200 {
		return s[:200] + "..."
	}
	return s
}

// validMethod reports whether m is an HTTP token of at most 32 bytes.
func validMethod(m string) bool {
	if m == "" || len(m) > 32 {
		return false
	}
	for i := 0; i < len(m); i++ {
		if !isTokenChar(m[i]) {
			return false
		}
	}
	return true
}

func isTokenChar(c byte) bool {
	switch {
	case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

// matches reports whether h allows method on a path of segs.
func (h HTTPRule) matches(method string, segs []string) bool {
	ok := false
	for _, m := range h.Methods {
		if m == "*" || strings.EqualFold(m, method) {
			ok = true
			break
		}
	}
	if !ok {
		return false
	}
	for _, p := range h.Paths {
		if globMatch(patternSegments(p), segs) {
			return true
		}
	}
	return false
}

// maxPathSegments bounds the segments of a path or pattern, which bounds
// matching work.
const maxPathSegments = 128

// pathSegments splits an escaped request path ("/a/b%20c/") into its
// decoded segments (["a", "b c", ""]), or says why the path is refused.
func pathSegments(p string) ([]string, string) {
	if p == "" || p[0] != '/' {
		return nil, "not an absolute path"
	}
	if len(p) > 8<<10 {
		return nil, "longer than 8 KiB"
	}
	raw := strings.Split(p[1:], "/")
	if scope, name, ok := splitScope(raw[0]); ok {
		// npm's /@scope%2fname: the one encoded / tunwall reads as a
		// separator, as the registry does.
		raw = append([]string{scope, name}, raw[1:]...)
	}
	if len(raw) > maxPathSegments {
		return nil, fmt.Sprintf("more than %d segments", maxPathSegments)
	}
	segs := make([]string, len(raw))
	for i, s := range raw {
		d, bad := unescapeSegment(s)
		if bad == "" {
			bad = lookAlike(d)
		}
		if bad != "" {
			return nil, bad
		}
		if d == "" && i != len(raw)-1 {
			return nil, "an empty segment (//)"
		}
		base, _, _ := strings.Cut(d, ";")
		if base == "." || base == ".." {
			return nil, "a dot segment (. or ..)"
		}
		segs[i] = d
	}
	return segs, ""
}

// splitScope splits a first path segment "@scope%2fname" (npm's request
// for a scoped package; %2F too) into "@scope" and "name", still escaped.
// Only there, and only one: any other encoded / is refused by
// unescapeSegment, and each half is checked as a segment of its own (so
// "@scope%2f.." is a dot segment, "@scope%2f" an empty one).
func splitScope(seg string) (string, string, bool) {
	if !strings.HasPrefix(seg, "@") {
		return "", "", false
	}
	for i := 0; i+2 < len(seg); i++ {
		if seg[i] == '%' && seg[i+1] == '2' && (seg[i+2] == 'f' || seg[i+2] == 'F') {
			return seg[:i], seg[i+3:], true
		}
	}
	return "", "", false
}

// unescapeSegment percent-decodes one path segment, refusing encodings of
// what would change the path's structure for some server ("/", "\", ".")
// and control characters in any form.
func unescapeSegment(s string) (string, string) {
	if !strings.ContainsAny(s, "%\\") && !hasControl(s) {
		return s, ""
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '\\':
			return "", "a backslash"
		case c == '%':
			if i+2 >= len(s) || !isHex(s[i+1]) || !isHex(s[i+2]) {
				return "", "a malformed percent escape"
			}
			c = unhex(s[i+1])<<4 | unhex(s[i+2])
			i += 2
			switch c {
			case '/', '\\':
				return "", "an encoded / or \\"
			case '.':
				return "", "an encoded ."
			case '%':
				return "", "an encoded % (double encoding)"
			}
		}
		if c < 0x20 || c == 0x7f {
			return "", "a control character"
		}
		b.WriteByte(c)
	}
	return b.String(), ""
}

// lookAlike says why a decoded segment that is not ASCII could be read by
// a server as another path, or "": bytes that are not UTF-8 (an overlong
// form such as %c0%ae is "." to a lenient decoder), or a character that a
// normalising server (NFKC, and IDNA's dots: fullwidth "．" U+FF0E,
// ideographic "。" U+3002, halfwidth "｡" U+FF61, fullwidth "／") turns
// into ".", "/", "\" or "%".
func lookAlike(d string) string {
	ascii := true
	for i := 0; i < len(d); i++ {
		if d[i] >= 0x80 {
			ascii = false
			break
		}
	}
	if ascii {
		return ""
	}
	if !utf8.ValidString(d) {
		return "bytes that are not UTF-8 (an overlong form of . or / is one to some servers)"
	}
	// IDNA reads the ideographic full stop (what halfwidth "｡" is under
	// NFKC) as a dot too.
	n := strings.ReplaceAll(norm.NFKC.String(d), "\u3002", ".")
	for _, c := range []string{".", "/", "\\", "%"} {
		if strings.Count(n, c) != strings.Count(d, c) {
			return fmt.Sprintf("a character that a normalising server reads as %q", c)
		}
	}
	return ""
}

func hasControl(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] == 0x7f {
			return true
		}
	}
	return false
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case c >= '0' && c <= '9':
		return c - '0'
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10
	}
	return c - 'A' + 10
}

// patternSegments splits a (validated) pattern into segments.
func patternSegments(p string) []string { return strings.Split(p[1:], "/") }

// globMatch matches path segments against pattern segments: "*" one
// non-empty segment, "**" zero or more segments. It runs in
// O(len(pat)*len(segs)).
func globMatch(pat, segs []string) bool {
	// prev[j]: pat[:i] matches segs[:j].
	prev := make([]bool, len(segs)+1)
	cur := make([]bool, len(segs)+1)
	prev[0] = true
	for i := 1; i <= len(pat); i++ {
		p := pat[i-1]
		cur[0] = prev[0] && p == "**"
		for j := 1; j <= len(segs); j++ {
			switch p {
			case "**":
				cur[j] = prev[j] || cur[j-1]
			case "*":
				cur[j] = prev[j-1] && segs[j-1] != ""
			default:
				cur[j] = prev[j-1] && segs[j-1] == p
			}
		}
		prev, cur = cur, prev
	}
	return prev[len(segs)]
}

// checkPattern validates one http path pattern.
func checkPattern(p string) error {
	if p == "" || p[0] != '/' {
		return fmt.Errorf("path pattern %q must start with /", p)
	}
	segs := patternSegments(p)
	if len(segs) > maxPathSegments {
		return fmt.Errorf("path pattern %q has more than %d segments", p, maxPathSegments)
	}
	for i, s := range segs {
		switch {
		case s == "*" || s == "**":
		case strings.Contains(s, "*"):
			return fmt.Errorf("path pattern %q: * and ** must be whole segments", p)
		case s == "" && i != len(segs)-1:
			return fmt.Errorf("path pattern %q has an empty segment (//)", p)
		case s == "." || s == "..":
			return fmt.Errorf("path pattern %q has a dot segment", p)
		case strings.ContainsAny(s, "%\\?#") || hasControl(s):
			return fmt.Errorf("path pattern %q: write segments decoded, without %%, \\, ?, # or control characters", p)
		}
	}
	return nil
}

// checkMethod validates one method of an http entry and returns it in
// upper case.
func checkMethod(m string) (string, error) {
	if m == "*" {
		return m, nil
	}
	if !validMethod(m) {
		return "", fmt.Errorf("method %q is not an HTTP method token", m)
	}
	return strings.ToUpper(m), nil
}

// forbiddenInjectHeaders may not be set by an explicit injection: they
// frame the request or name its host.
var forbiddenInjectHeaders = []string{"host", "content-length", "transfer-encoding", "connection", "upgrade",
	"te", "trailer", "keep-alive", "proxy-connection", "expect"}

// checkInjectHeader validates an explicit injection's header name.
func checkInjectHeader(h string) error {
	if !validMethod(h) { // a token, at most 32 bytes
		return fmt.Errorf("header %q is not a header name", h)
	}
	if containsString(forbiddenInjectHeaders, strings.ToLower(h)) {
		return fmt.Errorf("header %s cannot be injected (it frames the request or names its host)", h)
	}
	return nil
}

// checkInjectValue validates an explicit injection's value template.
func checkInjectValue(v string) error {
	if !strings.Contains(v, "{}") {
		return fmt.Errorf("value %q must contain {} (where the secret goes)", v)
	}
	if hasControl(v) {
		return fmt.Errorf("value %q contains a control character", v)
	}
	return nil
}

// Equal reports whether v and w terminate, inject and restrict alike.
func (v HTTPView) Equal(w HTTPView) bool {
	return v.Terminate == w.Terminate && v.CA == w.CA && v.Restricted == w.Restricted && slices.Equal(v.Inject, w.Inject)
}
