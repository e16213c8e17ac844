package main

import (
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"
	"software.sslmate.com/src/go-pkcs12"

	"github.com/tunwall/tunwall/internal/sandbox"
	"github.com/tunwall/tunwall/internal/session"
	"github.com/tunwall/tunwall/policy"
)

// secretFlags collects repeatable --secret values.
type secretFlags []string

func (s *secretFlags) String() string     { return strings.Join(*s, ",") }
func (s *secretFlags) Set(v string) error { *s = append(*s, v); return nil }

// credentials are a run's secrets and, when some rule terminates flows
// (http or inject), its CA and what the terminator verifies servers with.
// They are made once per run, before the sandbox starts: its environment
// and files depend on them.
type credentials struct {
	creds   *session.Credentials // the secrets, and the CA when a rule terminates
	roots   *x509.CertPool
	caRoots map[string]*x509.CertPool
	dir     string   // holds the CA certificate, the bundle and an empty file; "" if none is needed
	lock    *os.File // dir, flocked while tunwall lives
	caFile  string
	bundle  string
	empty   string
	// own are the user's own CA files with the run's CA added, javaStore
	// the Java trust store (creds.go's ownBundles, writeJavaStore).
	own       []sandbox.OwnBundle
	javaStore string
}

// credentials loads the run's credentials once (c.creds caches them).
func (c *commonFlags) credentials(stderr io.Writer) (*credentials, error) {
	if c.creds != nil {
		return c.creds, nil
	}
	p, rs, _, err := c.loadRules()
	if err != nil {
		return nil, err
	}
	all, err := c.everyPhase(p, rs)
	if err != nil {
		return nil, err
	}
	cr, err := loadCredentials(c, p, rs, all, stderr)
	if err != nil {
		return nil, err
	}
	c.creds = cr
	return cr, nil
}

// injectFlags collects repeatable --inject values.
type injectFlags []string

func (s *injectFlags) String() string     { return strings.Join(*s, ",") }
func (s *injectFlags) Set(v string) error { *s = append(*s, v); return nil }
func (*injectFlags) repeatable()          {}

// secretSources merges the policy's secrets and the --secret flags; a name
// declared twice is an error. A secret an --inject flag names and nothing
// declares is read from tunwall's variable of its own name.
func secretSources(c *commonFlags, p *policy.Policy) ([]policy.SecretSource, error) {
	srcs, err := declaredSecrets(c.secrets, p)
	if err != nil {
		return nil, err
	}
	for _, v := range c.inject {
		r, err := policy.ParseInject(v)
		if err != nil {
			return nil, err
		}
		name := r.Inject[0].Secret
		if !slices.ContainsFunc(srcs, func(s policy.SecretSource) bool { return s.Name == name }) {
			srcs = append(srcs, policy.SecretSource{Name: name, Env: name, Source: "--inject " + v})
		}
	}
	return srcs, nil
}

// checkSecretsDeclared is run's and policy check's one check that every
// inject of rs names a declared secret.
func checkSecretsDeclared(rs *policy.RuleSet, srcs []policy.SecretSource) error {
	declared := map[string]bool{}
	for _, s := range srcs {
		declared[s.Name] = true
	}
	return rs.CheckSecrets(func(n string) bool { return declared[n] })
}

// uninjected returns the declared secrets no rule injects (in any phase
// of p, or in rs, which holds the flags' rules): their placeholders work
// nowhere.
func uninjected(p *policy.Policy, rs *policy.RuleSet, srcs []policy.SecretSource) []policy.SecretSource {
	var out []policy.SecretSource
	for _, s := range srcs {
		if !p.Injects(s.Name) && (rs == nil || len(rs.InjectHosts(s.Name)) == 0) {
			out = append(out, s)
		}
	}
	return out
}

// uninjectedWarning says that a declared secret reaches no host.
func uninjectedWarning(s policy.SecretSource) string {
	return fmt.Sprintf("secret %s is declared but no rule injects it; the sandbox gets its placeholder, which works nowhere (%s: add it to a rule's inject, or drop it)", s.Name, s.Source)
}

// declaredSecrets merges the policy's secrets and the --secret flags.
func declaredSecrets(flags secretFlags, p *policy.Policy) ([]policy.SecretSource, error) {
	srcs := p.Secrets()
	for _, f := range flags {
		s, err := policy.ParseSecret(f)
		if err != nil {
			return nil, err
		}
		for _, prev := range srcs {
			if prev.Name == s.Name {
				return nil, fmt.Errorf("secret %s is declared twice (%s and %s)", s.Name, prev.Source, s.Source)
			}
		}
		srcs = append(srcs, s)
	}
	return srcs, nil
}

// all are the rules of every phase of p (rs among them): the CA may sign
// for, and the sandbox trusts it for, the hosts any phase terminates, so
// that a switch to another phase (tunwall ctl phase) finds them ready.
func loadCredentials(c *commonFlags, p *policy.Policy, rs *policy.RuleSet, all []*policy.RuleSet, stderr io.Writer) (cr *credentials, err error) {
	srcs, err := secretSources(c, p)
	if err != nil {
		return nil, err
	}
	for _, rs := range all {
		if err := checkSecretsDeclared(rs, srcs); err != nil {
			return nil, err
		}
	}
	hasHTTP := slices.ContainsFunc(all, (*policy.RuleSet).HasHTTP)
	for _, s := range uninjected(p, rs, srcs) {
		fmt.Fprintf(stderr, "tunwall: WARNING: %s\n", uninjectedWarning(s))
	}
	cr = &credentials{}
	defer func() {
		if err != nil {
			cr.close()
		}
	}()
	opts := session.CredentialsOptions{
		Secrets: srcs,
		Warn:    func(s string) { fmt.Fprintf(stderr, "tunwall: WARNING: %s\n", s) },
	}
	if c.stablePlaceholders && len(srcs) > 0 {
		if opts.PlaceholderKey, err = session.PlaceholderKey(); err != nil {
			return nil, fmt.Errorf("--stable-placeholders: %w", err)
		}
	}
	opts.Terminate = terminatedHosts(all)
	// The secrets are read, and the CA (for the hosts rules terminate)
	// made, here.
	if cr.creds, err = session.NewCredentials(opts); err != nil {
		return nil, err
	}
	if cr.creds.Len() == 0 && !hasHTTP {
		return cr, nil // nothing to write: no directory
	}
	if err := cr.makeDir(); err != nil {
		return nil, err
	}
	if cr.creds.Len() > 0 {
		cr.empty = filepath.Join(cr.dir, "empty")
		if err := os.WriteFile(cr.empty, nil, 0o444); err != nil {
			return nil, err
		}
	}
	if !hasHTTP {
		return cr, nil
	}
	// Go's own roots come from SSL_CERT_FILE when it is set: a FIFO or a
	// device there would hang the start reading it.
	if f := os.Getenv("SSL_CERT_FILE"); f != "" {
		if _, ferr := readCAFile(f); ferr != nil {
			fmt.Fprintf(stderr, "tunwall: WARNING: SSL_CERT_FILE=%s cannot be used (%v): tunwall and the sandbox use the host's bundle instead\n", f, ferr)
			os.Unsetenv("SSL_CERT_FILE")
		}
	}
	// And from each file of SSL_CERT_DIR's directories, read whole.
	if d := os.Getenv("SSL_CERT_DIR"); d != "" {
		if derr := checkCertDirs(d); derr != nil {
			fmt.Fprintf(stderr, "tunwall: WARNING: SSL_CERT_DIR=%s cannot be used (%v): tunwall uses the host's certificate directories instead\n", d, derr)
			os.Unsetenv("SSL_CERT_DIR")
		}
	}
	if cr.roots, err = x509.SystemCertPool(); err != nil {
		cr.roots = x509.NewCertPool() // no host roots: only rules' ca files verify anything
	}
	cr.caRoots = map[string]*x509.CertPool{}
	for _, f := range caFiles(all) {
		path := caPath(c.policyFile, f)
		b, err := readCAFile(path)
		if err != nil {
			return nil, fmt.Errorf("%sca %s: %w", caRuleSource(rs, f), f, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(b) {
			return nil, fmt.Errorf("ca %s: no PEM certificate in %s", f, path)
		}
		cr.caRoots[f] = pool
	}
	cr.caFile = filepath.Join(cr.dir, "tunwall-run-ca.pem")
	if err := os.WriteFile(cr.caFile, cr.creds.CACertPEM(), 0o644); err != nil {
		return nil, err
	}
	host, err := hostRootsPEM()
	if err != nil {
		fmt.Fprintf(stderr, "tunwall: WARNING: the host's CA bundle could not be read (%v): the sandbox trusts only the run's CA\n", err)
	}
	cr.bundle = filepath.Join(cr.dir, "ca-bundle.pem")
	bundle := append(certsOnly(host), cr.creds.CACertPEM()...)
	if err := os.WriteFile(cr.bundle, bundle, 0o644); err != nil {
		return nil, err
	}
	warn := func(s string) { fmt.Fprintf(stderr, "tunwall: WARNING: %s\n", s) }
	if cr.own, err = ownBundles(cr.dir, cr.creds.CACertPEM(), os.LookupEnv, warn); err != nil {
		return nil, err
	}
	if cr.javaStore, err = writeJavaStore(cr.dir, bundle, warn); err != nil {
		return nil, err
	}
	return cr, nil
}

// ownBundles writes, for each bundle variable the user's environment
// (lookup) sets to a file, that file's certificates followed by the
// run's CA (caPEM), world-readable in dir: the sandbox's variable names
// it, so that a corporate CA keeps working. A file tunwall cannot read
// (or not a regular file) is a warning: that variable names the shared
// bundle.
func ownBundles(dir string, caPEM []byte, lookup func(string) (string, bool), warn func(string)) ([]sandbox.OwnBundle, error) {
	var out []sandbox.OwnBundle
	for _, k := range sandbox.BundleEnv {
		v, ok := lookup(k)
		if !ok || v == "" {
			continue
		}
		user, err := filepath.Abs(v)
		var b []byte
		if err == nil {
			b, err = readCAFile(user)
		}
		if err == nil {
			// Only its certificates: the sandbox reads the copy, and the
			// file may hold more (a key beside its certificate).
			if b = certsOnly(b); len(b) == 0 {
				err = errors.New("it holds no PEM certificate")
			}
		}
		if err != nil {
			warn(fmt.Sprintf("%s=%s cannot be used (%v): the sandbox's %s names the host's roots and the run's CA instead, without it", k, v, err, k))
			continue
		}
		f := filepath.Join(dir, "own-"+k+".pem")
		if err := os.WriteFile(f, append(b, caPEM...), 0o644); err != nil {
			return nil, err
		}
		out = append(out, sandbox.OwnBundle{Var: k, User: user, File: f})
	}
	return out, nil
}

// maxCAFile bounds a user's CA file.
const maxCAFile = 16 << 20

// readCAFile reads a CA file of the user's or of a rule: a regular file
// of at most maxCAFile bytes. It is opened without blocking, so that a
// FIFO or a device named there is refused at once instead of hanging the
// start.
func readCAFile(path string) ([]byte, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file (%s)", path, st.Mode().Type())
	}
	if st.Size() > maxCAFile {
		return nil, fmt.Errorf("%s is larger than %d MiB", path, maxCAFile>>20)
	}
	b, err := io.ReadAll(io.LimitReader(f, maxCAFile+1))
	if err == nil && len(b) > maxCAFile {
		err = fmt.Errorf("%s is larger than %d MiB", path, maxCAFile>>20)
	}
	return b, err
}

// caRuleSource is "FILE:LINE: " of the first rule whose ca is f, or ""
// when no rule says where it came from.
func caRuleSource(rs *policy.RuleSet, f string) string {
	for _, r := range rs.Rules() {
		if r.CA == f && r.Source != "" {
			return r.Source + ": "
		}
	}
	return ""
}

// checkCertDirs refuses an SSL_CERT_DIR (directories separated by ':', as
// Go reads it) with an entry Go's system pool would read that is not a
// regular file of at most maxCAFile bytes (or a directory, which it
// passes over): it reads each whole, so a FIFO or a device there would
// hang the start or fill memory. A directory of more than
// maxCertDirEntries entries is refused too (bounded work); one that cannot
// be listed is passed over, as Go does.
func checkCertDirs(list string) error {
	for _, dir := range filepath.SplitList(list) {
		f, err := os.Open(dir)
		if err != nil {
			continue
		}
		names, err := f.Readdirnames(maxCertDirEntries + 1)
		f.Close()
		if err != nil && !errors.Is(err, io.EOF) {
			continue
		}
		if len(names) > maxCertDirEntries {
			return fmt.Errorf("%s has more than %d entries", dir, maxCertDirEntries)
		}
		for _, n := range names {
			p := filepath.Join(dir, n)
			st, err := os.Stat(p)
			if err != nil || st.IsDir() {
				continue
			}
			if !st.Mode().IsRegular() {
				return fmt.Errorf("%s is not a regular file (%s)", p, st.Mode().Type())
			}
			if st.Size() > maxCAFile {
				return fmt.Errorf("%s is larger than %d MiB", p, maxCAFile>>20)
			}
		}
	}
	return nil
}

// maxCertDirEntries bounds the entries of an SSL_CERT_DIR directory
// (a distribution's /etc/ssl/certs holds a few hundred).
const maxCertDirEntries = 10000

// certsOnly returns the certificates of a PEM file that parse as X.509,
// re-encoded, and nothing else of it: no key, no text between blocks.
func certsOnly(b []byte) []byte {
	var out []byte
	for rest := b; ; {
		var blk *pem.Block
		blk, rest = pem.Decode(rest)
		if blk == nil {
			return out
		}
		if blk.Type != "CERTIFICATE" {
			continue
		}
		if _, err := x509.ParseCertificate(blk.Bytes); err != nil {
			continue
		}
		out = append(out, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: blk.Bytes})...)
	}
}

// javaStorePassword is the Java trust store's password: the one Java's
// own stores use. The store holds only public certificates.
const javaStorePassword = pkcs12.DefaultPassword

// writeJavaStore writes a PKCS#12 trust store of the certificates of
// bundle (the host's roots and the run's CA) into dir, for the sandbox's
// JAVA_TOOL_OPTIONS (Java reads no PEM bundle). "" when no store can be
// named there (a path with a space cannot go into JAVA_TOOL_OPTIONS).
func writeJavaStore(dir string, bundle []byte, warn func(string)) (string, error) {
	path := filepath.Join(dir, "java-truststore.p12")
	if strings.ContainsAny(path, " \t") {
		warn(fmt.Sprintf("the run's directory %s has white space in its path, which JAVA_TOOL_OPTIONS cannot hold: Java in the sandbox does not trust the run's CA", dir))
		return "", nil
	}
	if o := os.Getenv("JAVA_TOOL_OPTIONS"); strings.Contains(o, "javax.net.ssl.trustStore=") {
		warn("JAVA_TOOL_OPTIONS names a trust store of yours: in the sandbox, Java uses the run's (the host's roots and the run's CA) instead, named after your options")
	}
	var entries []pkcs12.TrustStoreEntry
	for rest := bundle; ; {
		var blk *pem.Block
		blk, rest = pem.Decode(rest)
		if blk == nil {
			break
		}
		if blk.Type != "CERTIFICATE" {
			continue
		}
		cert, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			continue // Java would not take it either
		}
		entries = append(entries, pkcs12.TrustStoreEntry{Cert: cert, FriendlyName: fmt.Sprintf("tunwall-%d", len(entries))})
	}
	b, err := pkcs12.Modern2023.EncodeTrustStoreEntries(entries, javaStorePassword)
	if err != nil {
		return "", fmt.Errorf("java trust store: %w", err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return "", err
	}
	return path, nil
}

// caPath resolves a rule's ca: "~/" is the user's home, a relative path is
// relative to the policy file's directory.
func caPath(policyFile, f string) string {
	if strings.HasPrefix(f, "~/") {
		if home, err := os.UserHomeDir(); err == nil {
			return filepath.Join(home, f[2:])
		}
	}
	if !filepath.IsAbs(f) && policyFile != "" {
		return filepath.Join(filepath.Dir(policyFile), f)
	}
	return f
}

// hostRootsPEM returns the roots tunwall itself trusts, as PEM: the file
// SSL_CERT_FILE names, or else the first distribution bundle.
func hostRootsPEM() ([]byte, error) {
	if f := os.Getenv("SSL_CERT_FILE"); f != "" {
		return readCAFile(f)
	}
	for _, p := range sandbox.BundlePaths {
		if b, err := readCAFile(p); err == nil {
			return b, nil
		}
	}
	return nil, errors.New("no CA bundle at any of " + strings.Join(sandbox.BundlePaths, ", "))
}

// sandboxCreds is what a run or bwrap sandbox gets: placeholders in its
// environment, secret files covered, the bundle over the distribution's.
func (cr *credentials) sandboxCreds() *sandbox.Creds {
	if cr == nil || (cr.creds.Len() == 0 && cr.creds.CACertPEM() == nil) {
		return nil
	}
	sc := &sandbox.Creds{Env: cr.creds.Environ(os.Environ()), Hide: cr.creds.Files(), Empty: cr.empty}
	if cr.creds.CACertPEM() != nil {
		sc.Bundle = cr.bundle
		sc.Own = cr.own
		if cr.javaStore != "" {
			sc.JavaStore, sc.JavaPassword = cr.javaStore, javaStorePassword
		}
	}
	return sc
}

// announceCA tells an attach or socks user where the run's CA is (clients
// in the namespace, or of the proxy, must trust it for terminated hosts)
// and what the placeholders are (placeholders are not secret; clients use
// them where they would use the secrets): both written to files too.
func (cr *credentials) announceCA(w io.Writer) {
	if cr == nil {
		return
	}
	if cr.creds.CACertPEM() != nil {
		fmt.Fprintf(w, "tunwall: hosts with http or inject rules are served with certificates of this run's CA, written to %s; their clients must trust it (SSL_CERT_FILE, NODE_EXTRA_CA_CERTS, curl --cacert, ...)\n", cr.caFile)
	}
	if cr.creds.Len() == 0 {
		return
	}
	var env strings.Builder
	for _, s := range cr.creds.Secrets() {
		fmt.Fprintf(&env, "%s=%s\n", s.Name, s.Placeholder)
	}
	path := filepath.Join(cr.dir, "placeholders.env")
	if err := os.WriteFile(path, []byte(env.String()), 0o644); err != nil {
		fmt.Fprintf(w, "tunwall: cannot write %s: %v\n", path, err)
	}
	fmt.Fprintf(w, "tunwall: clients use placeholders instead of secrets (%s):\n", path)
	for _, s := range cr.creds.Secrets() {
		fmt.Fprintf(w, "tunwall:   %s=%s\n", s.Name, s.Placeholder)
	}
}

// credsDirPrefix names the run's directory in $TMPDIR.
const credsDirPrefix = "tunwall-creds-"

// staleAfter is how long a directory stays untouched before a sweep may
// take it: makeDir locks its new directory microseconds after making it.
const staleAfter = 5 * time.Second

// makeDir makes the run's directory (readable by the sandbox's user, which
// reads the bundle and the empty file) and holds an exclusive flock on it
// for as long as tunwall lives: a directory whose lock can be taken was
// left by a tunwall that was killed, and the next run removes it
// (sweepStaleDirs).
func (cr *credentials) makeDir() error {
	sweepStaleDirs(os.TempDir(), credsDirPrefix, staleAfter)
	dir, err := os.MkdirTemp("", credsDirPrefix)
	if err != nil {
		return err
	}
	f, err := os.Open(dir)
	if err == nil {
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
	}
	if err != nil {
		if f != nil {
			f.Close()
		}
		os.Remove(dir)
		return fmt.Errorf("lock %s: %w", dir, err)
	}
	os.Chmod(dir, 0o755)
	cr.dir, cr.lock = dir, f
	return nil
}

// sweepStaleDirs removes the directories named prefix* in dir that are
// ours (same uid), not symlinks, untouched for at least minAge (one being
// set up is younger) and not locked (their tunwall is gone). It never
// follows a symlink: the entry is opened with O_NOFOLLOW and checked
// through that descriptor, and os.RemoveAll removes links, not what they
// point at. Errors are ignored: sweeping is a courtesy.
func sweepStaleDirs(dir, prefix string, minAge time.Duration) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), prefix) || !e.IsDir() {
			continue
		}
		p := filepath.Join(dir, e.Name())
		fd, err := unix.Open(p, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			continue
		}
		var st unix.Stat_t
		stale := unix.Fstat(fd, &st) == nil && st.Uid == uint32(os.Geteuid()) &&
			time.Since(time.Unix(st.Mtim.Unix())) >= minAge &&
			unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB) == nil
		if stale {
			os.RemoveAll(p) // while we hold its lock: no tunwall can take it over
		}
		unix.Close(fd)
	}
}

// close removes the run's files (the CA is worthless once tunwall exits).
func (cr *credentials) close() {
	if cr != nil && cr.dir != "" {
		os.RemoveAll(cr.dir)
		cr.lock.Close()
		cr.dir, cr.lock = "", nil
	}
}

func (*secretFlags) repeatable() {}

// terminatedHosts are the hosts whose flows the rules of any of all
// terminate, each once, in order.
func terminatedHosts(all []*policy.RuleSet) []string {
	var out []string
	for _, rs := range all {
		for _, r := range rs.Rules() {
			if (r.HTTP != nil || len(r.Inject) > 0) && !slices.Contains(out, r.Host) {
				out = append(out, r.Host)
			}
		}
	}
	return out
}

// caFiles are the ca files the rules of any of all name, each once.
func caFiles(all []*policy.RuleSet) []string {
	var out []string
	for _, rs := range all {
		for _, f := range rs.CAFiles() {
			if !slices.Contains(out, f) {
				out = append(out, f)
			}
		}
	}
	return out
}
