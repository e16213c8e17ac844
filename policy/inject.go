package policy

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
)

// ParseInject parses one --inject flag value, HOST[:PORT]=SECRET, into a
// rule allowing HOST (port 443 unless given) over TCP that injects SECRET
// in the plain form (its placeholder is replaced in the request's
// headers). HOST is a name or *.SUFFIX, never an address: tunwall
// terminates TLS for it with a certificate for that name.
func ParseInject(s string) (Rule, error) {
	target, secret, ok := strings.Cut(s, "=")
	if !ok || target == "" || secret == "" {
		return Rule{}, fmt.Errorf("--inject %q: want HOST[:PORT]=SECRET (e.g. api.github.com=GITHUB_TOKEN)", s)
	}
	if !ValidSecretName(secret) {
		return Rule{}, fmt.Errorf("--inject %q: %q is not a secret name (letters, digits and _, not starting with a digit, at most %d)", s, secret, maxSecretName)
	}
	r, err := parseAllow(target)
	if err == nil && r.Host == "" {
		err = errors.New("inject needs a host name, not an address")
	}
	if err == nil && r.Proto != TCP {
		err = errors.New("inject is for HTTP over TCP; drop /udp")
	}
	if err != nil {
		return Rule{}, fmt.Errorf("--inject %q: %w", s, err)
	}
	r.Inject = []Injection{{Secret: secret}}
	r.Source = "--inject " + s
	return r, nil
}

// Injects reports whether a rule of any phase of p injects the named
// secret.
func (p *Policy) Injects(secret string) bool {
	if p == nil {
		return false
	}
	for _, ph := range p.phases {
		for _, r := range ph.rules {
			for _, in := range r.Inject {
				if in.Secret == secret {
					return true
				}
			}
		}
	}
	return false
}

// secretListItem starts one item of a secret list: NAME=env: or NAME=file:.
var secretListItem = regexp.MustCompile(`(?:^| )([A-Za-z_][A-Za-z0-9_]*)=(?:env|file):`)

// ParseSecretList parses the secrets of an audit header's config, the
// space-separated NAME=env:VAR and NAME=file:PATH items a run records (a
// path may hold spaces: an item ends where the next NAME=env: or
// NAME=file: begins). source says where the list was read, for the
// SecretSources' Source.
func ParseSecretList(list, source string) ([]SecretSource, error) {
	list = strings.TrimSpace(list)
	if list == "" {
		return nil, nil
	}
	idx := secretListItem.FindAllStringIndex(list, -1)
	if len(idx) == 0 || idx[0][0] != 0 {
		return nil, fmt.Errorf("%s: bad secret list %q", source, list)
	}
	var out []SecretSource
	for i, m := range idx {
		start, end := m[0], len(list)
		if i+1 < len(idx) {
			end = idx[i+1][0]
		}
		item := strings.TrimPrefix(list[start:end], " ")
		s, err := ParseSecret(item)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", source, err)
		}
		s.Source = source
		out = append(out, s)
	}
	return out, nil
}
