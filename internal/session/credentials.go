package session

import (
	"os"
	"path/filepath"

	"github.com/tunwall/tunwall/internal/l7"
	"github.com/tunwall/tunwall/internal/secrets"
	"github.com/tunwall/tunwall/policy"
)

// Credentials are a run's secrets and, when some rule terminates flows
// (http or inject), its CA. A front end makes them before the sandbox
// exists, since its environment and files depend on them (placeholders,
// the CA bundle), and gives them to New (Options.Credentials). Immutable
// and safe for concurrent use; the methods of a nil *Credentials say
// there are none.
type Credentials struct {
	store *secrets.Store
	ca    *l7.CA // nil when no rule terminates
}

// CredentialsOptions say which secrets a run reads and which hosts its CA
// may certify.
type CredentialsOptions struct {
	// Secrets are the declared secrets, read from their sources (env:,
	// file:) by NewCredentials.
	Secrets []policy.SecretSource
	// PlaceholderKey, when set, derives each secret's placeholder from it
	// and the secret's name, so that a project's runs hand out the same
	// placeholders (PlaceholderKey); nil makes new random ones.
	PlaceholderKey []byte
	// Terminate are the hosts (names and "*.suffix") whose flows are
	// terminated: a CA permitted to certify them, and nothing else, is
	// made when there is at least one.
	Terminate []string
	// Warn receives one line per warning about a secret (a file others
	// may read, a short value); nil discards.
	Warn func(string)
}

// NewCredentials reads the secrets' values and makes the CA o asks for.
func NewCredentials(o CredentialsOptions) (*Credentials, error) {
	store, err := secrets.Load(o.Secrets, secrets.Options{Warn: o.Warn, PlaceholderKey: o.PlaceholderKey})
	if err != nil {
		return nil, err
	}
	c := &Credentials{store: store}
	if len(o.Terminate) > 0 {
		if c.ca, err = l7.NewCA(l7.CAOptions{Permitted: o.Terminate}); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// Secret is what may be said of a secret: its name, where its value was
// read ("env:VAR", "file:PATH") and what the sandbox holds instead of it.
// Never its value.
type Secret struct{ Name, From, Placeholder string }

// Len is how many secrets there are.
func (c *Credentials) Len() int { return c.secrets().Len() }

// Secrets lists the secrets in declaration order.
func (c *Credentials) Secrets() []Secret {
	var out []Secret
	for _, s := range c.secrets().All() {
		out = append(out, Secret{Name: s.Name, From: s.From, Placeholder: s.Placeholder})
	}
	return out
}

// Files are the absolute paths secrets were read from: the sandbox must
// not see them.
func (c *Credentials) Files() []string { return c.secrets().Files() }

// Environ returns env as the sandbox's command gets it: each secret's
// variable set to its placeholder, the variables values were read from
// removed, and every copy of a value in another variable replaced by its
// placeholder.
func (c *Credentials) Environ(env []string) []string { return c.secrets().Environ(env) }

// CACertPEM is the run's CA certificate, PEM-encoded; nil when no rule
// terminates flows (and there is no CA).
func (c *Credentials) CACertPEM() []byte {
	if c == nil || c.ca == nil {
		return nil
	}
	return c.ca.CertPEM()
}

func (c *Credentials) secrets() *secrets.Store {
	if c == nil {
		return nil
	}
	return c.store
}

func (c *Credentials) caOrNil() *l7.CA {
	if c == nil {
		return nil
	}
	return c.ca
}

// PlaceholderKey returns the placeholder key of the project tunwall was
// started in (its working directory, symbolic links resolved), kept in the
// state directory beside the default audit logs and made on first use.
func PlaceholderKey() ([]byte, error) {
	wd, err := os.Getwd()
	if err != nil {
		return nil, err
	}
	if r, err := filepath.EvalSymlinks(wd); err == nil {
		wd = r
	}
	log, err := DefaultAuditPath("placeholder-key")
	if err != nil {
		return nil, err
	}
	return secrets.ProjectKey(filepath.Dir(log), wd)
}
