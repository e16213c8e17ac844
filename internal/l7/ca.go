package l7

import (
	"container/list"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"strings"
	"sync"
	"time"
)

// Validity of the run's CA and of the leaves it mints. The CA's key lives
// only in tunwall's memory and dies with the run; the validity only has to
// outlast the run. Leaves are minted again a day before they expire.
const (
	caValidity     = 365 * 24 * time.Hour
	leafValidity   = 7 * 24 * time.Hour
	leafRenewAhead = 24 * time.Hour
	backdate       = time.Hour // clock skew between tunwall and the sandbox's clients
	// DefaultMaxLeaves bounds the minted leaves kept; the least recently
	// used is dropped (and minted again when asked for).
	DefaultMaxLeaves = 1024
)

// CA is one run's certificate authority: an ECDSA P-256 key generated in
// memory (never written anywhere) and a self-signed certificate whose name
// constraints permit only the names the run terminates. It mints a leaf per
// name on first use and caches it.
type CA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
	max  int
	now  func() time.Time

	mu     sync.Mutex
	leaves map[string]*list.Element // name -> *leafEntry
	lru    list.List                // front: most recently used
}

type leafEntry struct {
	name string
	cert *tls.Certificate
	exp  time.Time
}

// CAOptions configures NewCA.
type CAOptions struct {
	// Permitted are the DNS names (and, as "*.suffix", subtrees) the CA
	// may certify: its name constraints. Required: a CA that may certify
	// any name is not made.
	Permitted []string
	// MaxLeaves bounds the leaf cache; 0 means DefaultMaxLeaves.
	MaxLeaves int
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// NewCA makes a run's CA.
func NewCA(opts CAOptions) (*CA, error) {
	if len(opts.Permitted) == 0 {
		return nil, errors.New("l7: the CA needs the names it may certify")
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.MaxLeaves <= 0 {
		opts.MaxLeaves = DefaultMaxLeaves
	}
	var permitted []string
	for _, p := range opts.Permitted {
		// A constraint "example.com" permits example.com and every name
		// below it; "*.example.com" needs exactly that subtree.
		d := strings.TrimPrefix(p, "*.")
		if !contains(permitted, d) {
			permitted = append(permitted, d)
		}
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("l7: CA key: %w", err)
	}
	serial, err := randSerial()
	if err != nil {
		return nil, err
	}
	now := opts.Now()
	tmpl := &x509.Certificate{
		SerialNumber:                serial,
		Subject:                     pkix.Name{CommonName: "tunwall run CA " + now.UTC().Format("2006-01-02T15:04:05Z"), Organization: []string{"tunwall (per-run, key in memory only)"}},
		NotBefore:                   now.Add(-backdate),
		NotAfter:                    now.Add(caValidity),
		IsCA:                        true,
		BasicConstraintsValid:       true,
		MaxPathLenZero:              true,
		KeyUsage:                    x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		PermittedDNSDomainsCritical: true,
		PermittedDNSDomains:         permitted,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("l7: CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("l7: CA certificate: %w", err)
	}
	return &CA{
		cert:   cert,
		key:    key,
		pem:    pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		max:    opts.MaxLeaves,
		now:    opts.Now,
		leaves: map[string]*list.Element{},
	}, nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func randSerial() (*big.Int, error) {
	s, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("l7: serial: %w", err)
	}
	return s.Add(s, big.NewInt(1)), nil
}

// CertPEM returns the CA certificate (never its key) in PEM.
func (ca *CA) CertPEM() []byte { return append([]byte(nil), ca.pem...) }

// Cert returns the parsed CA certificate.
func (ca *CA) Cert() *x509.Certificate { return ca.cert }

// Leaf returns a certificate for name, minting it on first use (and again
// when it nears expiry). name must be a name the flow was allowed for.
func (ca *CA) Leaf(name string) (*tls.Certificate, error) {
	now := ca.now()
	ca.mu.Lock()
	if el, ok := ca.leaves[name]; ok {
		e := el.Value.(*leafEntry)
		if now.Add(leafRenewAhead).Before(e.exp) {
			ca.lru.MoveToFront(el)
			ca.mu.Unlock()
			return e.cert, nil
		}
		ca.lru.Remove(el)
		delete(ca.leaves, name)
	}
	ca.mu.Unlock()

	c, exp, err := ca.mint(name, now)
	if err != nil {
		return nil, err
	}
	ca.mu.Lock()
	defer ca.mu.Unlock()
	if el, ok := ca.leaves[name]; ok { // minted meanwhile by another flow
		return el.Value.(*leafEntry).cert, nil
	}
	ca.leaves[name] = ca.lru.PushFront(&leafEntry{name: name, cert: c, exp: exp})
	for ca.lru.Len() > ca.max {
		old := ca.lru.Back()
		ca.lru.Remove(old)
		delete(ca.leaves, old.Value.(*leafEntry).name)
	}
	return c, nil
}

// Leaves returns how many leaves are cached.
func (ca *CA) Leaves() int {
	ca.mu.Lock()
	defer ca.mu.Unlock()
	return ca.lru.Len()
}

func (ca *CA) mint(name string, now time.Time) (*tls.Certificate, time.Time, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("l7: leaf key: %w", err)
	}
	serial, err := randSerial()
	if err != nil {
		return nil, time.Time{}, err
	}
	exp := now.Add(leafValidity)
	if exp.After(ca.cert.NotAfter) {
		exp = ca.cert.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: name},
		DNSNames:     []string{name},
		NotBefore:    now.Add(-backdate),
		NotAfter:     exp,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("l7: leaf for %s: %w", name, err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, time.Time{}, err
	}
	return &tls.Certificate{Certificate: [][]byte{der, ca.cert.Raw}, PrivateKey: key, Leaf: leaf}, exp, nil
}
