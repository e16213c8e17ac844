package sandbox

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// Credentials in the sandbox (README: "Keeping credentials out of the
// sandbox"): the command's environment holds placeholders instead of
// secret values, the files secrets were read from are covered with an
// empty file, and, when tunwall terminates TLS for some host, a bundle of
// the host's roots plus the run's CA is bound read-only over the
// distribution's bundle paths and named by the variables TLS libraries
// read.

// Creds is what a run or bwrap sandbox gets of the run's credentials.
type Creds struct {
	// Env is the environment of everything started in the sandbox (the
	// sandbox's own init included): placeholders, never values. nil
	// means tunwall's own.
	Env []string
	// Bundle is a PEM file of the host's roots and the run's CA; "" when
	// no rule terminates TLS.
	Bundle string
	// Hide lists host files the sandbox must not read (secret files).
	Hide []string
	// Empty is an empty, world-readable file to put over Hide.
	Empty string
	// Own lists the bundle variables the user's environment sets to a
	// CA file of their own (a corporate CA): the sandbox's variable names
	// a file of that CA plus the run's, never the shared Bundle. Only
	// with a Bundle.
	Own []OwnBundle
	// JavaStore is a world-readable PKCS#12 trust store of the host's
	// roots and the run's CA, and JavaPassword its password: the
	// sandbox's JAVA_TOOL_OPTIONS names it (after the user's own
	// options), so that Java trusts the run's CA with no flags. "" when
	// there is none.
	JavaStore, JavaPassword string
}

// OwnBundle is a bundle variable the user set to a CA file of their own.
type OwnBundle struct {
	Var  string // SSL_CERT_FILE, NODE_EXTRA_CA_CERTS, ...
	User string // the user's file (absolute)
	File string // the user's certificates and the run's CA, world-readable
}

// JavaOptions is the JVM options naming a PKCS#12 trust store at path.
func JavaOptions(path, password string) string {
	return "-Djavax.net.ssl.trustStore=" + path + " -Djavax.net.ssl.trustStoreType=PKCS12 -Djavax.net.ssl.trustStorePassword=" + password
}

// BundlePaths are where distributions keep their CA bundle: Debian and
// Ubuntu, Fedora and RHEL (two), openSUSE, Alpine and the BSD-style
// cert.pem. Those that exist (as regular files, in the sandbox's view) are
// covered with the run's bundle.
var BundlePaths = []string{
	"/etc/ssl/certs/ca-certificates.crt",
	"/etc/pki/tls/certs/ca-bundle.crt",
	"/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
	"/etc/ssl/ca-bundle.pem",
	"/etc/ssl/cert.pem",
}

// BundleEnv are the variables set to the bundle's path in the sandbox.
var BundleEnv = []string{
	"SSL_CERT_FILE", "NODE_EXTRA_CA_CERTS", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE",
	"GIT_SSL_CAINFO", "PIP_CERT", "AWS_CA_BUNDLE", "DENO_CERT",
}

// fileBind is a read-only bind of a host file over a path in the sandbox.
type fileBind struct {
	Src string `json:"src"`
	Dst string `json:"dst"`
	// IfReadable binds only if the sandbox's user could read Dst: a
	// secret file it cannot read needs no cover (and its directory may
	// not even be searchable, which would fail the bind).
	IfReadable bool `json:"if_readable,omitempty"`
}

// environ returns the sandbox's environment as `run` gives it: each
// bundle variable set to at (when there is a bundle), or, for those the
// user set, to their own file with the run's CA; JAVA_TOOL_OPTIONS naming
// the trust store. run's sandbox sees tunwall's files where they are.
func (c *Creds) environ(at string) []string {
	if c == nil {
		return nil
	}
	own := map[string]string{}
	for _, o := range c.Own {
		own[o.Var] = o.File
	}
	return c.environWith(at, own, c.JavaStore)
}

// environWith is environ with the sandbox's paths of the user's own
// bundles (own, by variable) and of the Java trust store ("" for none).
func (c *Creds) environWith(at string, own map[string]string, javaStore string) []string {
	env := c.Env
	if env == nil {
		env = os.Environ()
	}
	if c.Bundle == "" {
		return env
	}
	out := make([]string, 0, len(env)+len(BundleEnv)+1)
	javaOpts := ""
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		if k == javaToolOptions && javaStore != "" {
			javaOpts = v
			continue
		}
		if !contains(BundleEnv, k) {
			out = append(out, kv)
		}
	}
	for _, k := range BundleEnv {
		if p, ok := own[k]; ok {
			out = append(out, k+"="+p)
		} else {
			out = append(out, k+"="+at)
		}
	}
	if javaStore != "" {
		// After the user's options: the last -D of a property wins.
		out = append(out, javaToolOptions+"="+strings.TrimSpace(javaOpts+" "+JavaOptions(javaStore, c.JavaPassword)))
	}
	return out
}

// envOf returns the value of k in env.
func envOf(env []string, k string) (string, bool) {
	for _, kv := range env {
		if key, v, _ := strings.Cut(kv, "="); key == k {
			return v, true
		}
	}
	return "", false
}

// javaToolOptions is the variable every JVM reads its extra options from.
const javaToolOptions = "JAVA_TOOL_OPTIONS"

// JavaStorePaths are where distributions keep Java's default trust store
// (Debian and Ubuntu; Fedora and RHEL). `bwrap` binds the run's store
// over one the sandbox sees when it cannot see tunwall's file itself.
var JavaStorePaths = []string{
	"/etc/ssl/certs/java/cacerts",
	"/etc/pki/ca-trust/extracted/java/cacerts",
}

// visibleAt returns a path in the sandbox that shows host file h through
// the user's binds, if any does.
func visibleAt(binds []bwrapBind, h string) (string, bool) {
	for i := len(binds) - 1; i >= 0; i-- {
		b := binds[i]
		if b.src == "" || !under(h, b.src) {
			continue
		}
		p := filepath.Join(b.dst, strings.TrimPrefix(h, b.src))
		if b.src == "/" {
			p = filepath.Join(b.dst, h)
		}
		if hp, ok := hostPathOf(binds, p); ok && hp == h {
			return p, true
		}
	}
	return "", false
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// isRegular reports whether p is a regular file (not following a final
// symlink: a symlink's target is covered where it is).
func isRegular(p string) bool {
	fi, err := os.Lstat(p)
	return err == nil && fi.Mode().IsRegular()
}

// runBinds are the binds `tunwall run` makes (the sandbox sees the host's
// files), and where the bundle variables point.
func (c *Creds) runBinds() ([]fileBind, string) {
	if c == nil {
		return nil, ""
	}
	var binds []fileBind
	for _, h := range c.Hide {
		binds = append(binds, fileBind{Src: c.Empty, Dst: h, IfReadable: true})
	}
	at := ""
	if c.Bundle != "" {
		for _, p := range BundlePaths {
			if isRegular(p) {
				binds = append(binds, fileBind{Src: c.Bundle, Dst: p})
				if at == "" {
					at = p
				}
			}
		}
		if at == "" {
			at = c.Bundle // no distribution bundle: the file itself (run shares the host's files)
		}
	}
	return binds, at
}

// bwrapBind is one of the user's bind options: host src shown at dst
// (src "" for a mount that shows no host file, such as --tmpfs).
type bwrapBind struct{ src, dst string }

// userBinds lists the user's file-system binds in order.
func userBinds(opts []string) []bwrapBind {
	var out []bwrapBind
	for i := 0; i < len(opts); i++ {
		a := opts[i]
		n, known := bwrapArity[a]
		if !known {
			break
		}
		switch a {
		case "--bind", "--bind-try", "--ro-bind", "--ro-bind-try", "--dev-bind", "--dev-bind-try":
			out = append(out, bwrapBind{src: filepath.Clean(opts[i+1]), dst: filepath.Clean(opts[i+2])})
		case "--tmpfs", "--dev", "--proc", "--dir", "--mqueue":
			// A new, empty mount: it shows no host file (src "").
			out = append(out, bwrapBind{dst: filepath.Clean(opts[i+1])})
		}
		i += n
	}
	return out
}

// under reports whether p is d or below it.
func under(p, d string) bool {
	return p == d || d == "/" || strings.HasPrefix(p, d+"/")
}

// hostPathOf returns the host file shown at sandbox path p by the last
// bind covering it.
func hostPathOf(binds []bwrapBind, p string) (string, bool) {
	for i := len(binds) - 1; i >= 0; i-- {
		b := binds[i]
		if under(p, b.dst) {
			if b.src == "" {
				return "", false
			}
			rest := strings.TrimPrefix(p, b.dst)
			if b.dst == "/" {
				rest = p
			}
			return filepath.Join(b.src, rest), true
		}
	}
	return "", false
}

// bwrapExtra returns the options `tunwall bwrap` adds after the user's
// (binds over the secret files and bundle paths the sandbox would see,
// and --setenv of the placeholders and bundle variables, which outlast a
// --clearenv), and where the bundle variables point.
func (c *Creds) bwrapExtra(userOpts []string, as HostUser) []string {
	if c == nil {
		return nil
	}
	binds := userBinds(userOpts)
	var out []string
	for _, h := range c.Hide {
		// Every sandbox path whose last covering bind shows h.
		for _, b := range binds {
			if b.src == "" || !under(h, b.src) {
				continue
			}
			p := filepath.Join(b.dst, strings.TrimPrefix(h, b.src))
			if b.src == "/" {
				p = filepath.Join(b.dst, h)
			}
			if hp, ok := hostPathOf(binds, p); ok && hp == h && sandboxMayRead(h, as) {
				out = append(out, "--ro-bind", c.Empty, p)
			}
		}
	}
	at := ""
	if c.Bundle != "" {
		for _, p := range BundlePaths {
			if hp, ok := hostPathOf(binds, p); ok && isRegular(hp) {
				out = append(out, "--ro-bind", c.Bundle, p)
				if at == "" {
					at = p
				}
			}
		}
		if at == "" {
			// The sandbox sees no distribution bundle: give it one where
			// Debian's is (bwrap makes the directories on its own root).
			at = BundlePaths[0]
			out = append(out, "--ro-bind", c.Bundle, at)
		}
	}
	// The user's own CA files, where the sandbox can see the merged file
	// or the user's file (covered with the merged one); else the shared
	// bundle (the sandbox did not see the user's file anyway).
	own := map[string]string{}
	if c.Bundle != "" {
		for _, o := range c.Own {
			if p, ok := visibleAt(binds, o.File); ok {
				own[o.Var] = p
			} else if hp, ok := hostPathOf(binds, o.User); ok && hp == o.User && isRegular(o.User) {
				out = append(out, "--ro-bind", o.File, o.User)
				own[o.Var] = o.User
			}
		}
	}
	javaAt := ""
	if c.JavaStore != "" {
		if p, ok := visibleAt(binds, c.JavaStore); ok {
			javaAt = p
		} else {
			for _, p := range JavaStorePaths {
				if hp, ok := hostPathOf(binds, p); ok && isRegular(hp) {
					out = append(out, "--ro-bind", c.JavaStore, p)
					javaAt = p
					break
				}
			}
		}
	}
	env := c.environWith(at, own, javaAt)
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		if contains(BundleEnv, k) || strings.HasPrefix(v, "twp_") || k == javaToolOptions && c.JavaStore != "" {
			out = append(out, "--setenv", k, v)
		}
	}
	if _, ok := envOf(env, javaToolOptions); c.JavaStore != "" && !ok {
		// bwrap's own environment names the store where the sandbox
		// cannot see it: the command must not inherit that.
		out = append(out, "--unsetenv", javaToolOptions)
	}
	return out
}

// sandboxMayRead reports whether the sandbox's user may read the host file
// p. Rootless, that user is tunwall's, which read it. As root, it is as:
// judged by the mode bits of p and of the directories above it
// (ACLs are not read: a file readable only through an ACL is not covered).
func sandboxMayRead(p string, as HostUser) bool {
	if os.Geteuid() != 0 {
		return true
	}
	uid, gid := as.UID, as.GID
	may := func(fi os.FileInfo, bit uint32) bool {
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			return true
		}
		m := uint32(fi.Mode().Perm())
		switch {
		case int(st.Uid) == uid:
			return m&(bit<<6) != 0
		case int(st.Gid) == gid:
			return m&(bit<<3) != 0
		}
		return m&bit != 0
	}
	dir := filepath.Dir(p)
	for {
		fi, err := os.Stat(dir)
		if err != nil || !may(fi, 1) {
			return false
		}
		if dir == "/" {
			break
		}
		dir = filepath.Dir(dir)
	}
	fi, err := os.Stat(p)
	return err == nil && may(fi, 4)
}
