package testworld

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha1"
	"crypto/sha256"
	"crypto/sha512"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"log"
	"math/big"
	"net/http"
	"net/http/cgi"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// The credentials world (README: "Keeping credentials out of the
// sandbox"): servers that demand a token, so a test can show that the
// sandbox's requests carry the real one while the sandbox holds only a
// placeholder.
var (
	CredsAPI4       = netip.MustParseAddr("192.0.2.40") // api.creds.test: records every Authorization; /echo reflects the request; /profile stores headers and shows them later
	CredsGit4       = netip.MustParseAddr("192.0.2.41") // git.creds.test: git http-backend, Basic auth with the token as password
	CredsNPM4       = netip.MustParseAddr("192.0.2.42") // npm.creds.test: an npm registry demanding a bearer token
	CredsUntrusted4 = netip.MustParseAddr("192.0.2.43") // untrusted.creds.test: a certificate from a CA nobody trusts
	CredsMTLS4      = netip.MustParseAddr("192.0.2.44") // mtls.creds.test: requires a client certificate of the world's CA
	CredsPaste4     = netip.MustParseAddr("192.0.2.45") // paste.creds.test: accepts anything, records what it got
)

// Names of the credentials world, and the package the registry serves.
const (
	CredsAPIName       = "api.creds.test"
	CredsGitName       = "git.creds.test"
	CredsNPMName       = "npm.creds.test"
	CredsUntrustedName = "untrusted.creds.test"
	CredsMTLSName      = "mtls.creds.test"
	CredsPasteName     = "paste.creds.test"
	CredsPlainName     = "plain.creds.test" // the paste server too, under a name no rule terminates
	CredsPackage       = "tw-creds-pkg"
	// CredsScopedPackage is the registry's scoped package: npm asks for
	// it as /@tw-scope%2fcreds-pkg.
	CredsScopedPackage = "@tw-scope/creds-pkg"
)

// CredsOptions configures StartCreds.
type CredsOptions struct {
	// Token is the credential the servers demand (API and git: as
	// Authorization "Bearer"/"token" or Basic password; npm: Bearer).
	Token string
	// NPMToken is the npm registry's bearer token; "" means Token.
	NPMToken string
	// RepoDir is where the git repository is made (a bare repo with one
	// commit, push enabled).
	RepoDir string
}

// Creds is the running credentials world.
type Creds struct {
	mu    sync.Mutex
	auths map[string][]string // server -> Authorization values received, in order
	got   map[string][]string // server -> request lines and bodies received (paste, api)
	// profile is what api.creds.test/profile stored of its requests'
	// User-Agent, Referer, Cookie and X- headers, and shows to later ones.
	profile []string
	// Repo is the bare repository's path; Clone URL is https://git.creds.test/repo.git.
	Repo string
	// MTLSClients are the client certificate common names mtls.creds.test saw.
	MTLSClients []string
}

// Auths returns the Authorization values server ("api", "git", "npm") got.
func (c *Creds) Auths(server string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.auths[server]...)
}

// Got returns what server recorded of each request (method, path, query
// and body).
func (c *Creds) Got(server string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.got[server]...)
}

func (c *Creds) note(server, auth, what string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.auths[server] = append(c.auths[server], auth)
	c.got[server] = append(c.got[server], what)
}

// StartCreds adds the credentials world's addresses, names and servers.
func (w *World) StartCreds(o CredsOptions) (*Creds, error) {
	if o.NPMToken == "" {
		o.NPMToken = o.Token
	}
	c := &Creds{auths: map[string][]string{}, got: map[string][]string{}}
	var steps [][]string
	for _, ip := range []netip.Addr{CredsAPI4, CredsGit4, CredsNPM4, CredsUntrusted4, CredsMTLS4, CredsPaste4} {
		steps = append(steps, []string{"ip", "-n", w.WorldNS, "addr", "add", ip.String() + "/32", "dev", "lo"})
	}
	if err := w.runAll(steps); err != nil {
		return nil, err
	}
	for name, ip := range map[string]netip.Addr{
		CredsAPIName: CredsAPI4, CredsGitName: CredsGit4, CredsNPMName: CredsNPM4,
		CredsUntrustedName: CredsUntrusted4, CredsMTLSName: CredsMTLS4, CredsPasteName: CredsPaste4,
		CredsPlainName: CredsPaste4,
	} {
		w.DNS.Set(name, ip)
	}

	// api: records the Authorization; /echo and /reflect/ reflect the request.
	api := c.apiHandler(o.Token)
	if err := w.serveCredsTLS(CredsAPI4, api, w.CA.GetCertificate, true, nil); err != nil {
		return nil, err
	}
	if err := w.serveCredsPlain(CredsAPI4, api); err != nil {
		return nil, err
	}

	// paste: takes anything, records it (the place a token must never reach).
	paste := c.pasteHandler()
	if err := w.serveCredsTLS(CredsPaste4, paste, w.CA.GetCertificate, true, nil); err != nil {
		return nil, err
	}
	if err := w.serveCredsPlain(CredsPaste4, paste); err != nil {
		return nil, err
	}

	// git: git http-backend over a bare repository, Basic auth.
	repo, err := makeRepo(o.RepoDir)
	if err != nil {
		return nil, err
	}
	c.Repo = repo
	git := c.gitHandler(repo, o.Token)
	if err := w.serveCredsTLS(CredsGit4, git, w.CA.GetCertificate, true, nil); err != nil {
		return nil, err
	}

	// npm: a registry of one package, bearer token required.
	npm, err := c.npmHandler(o.NPMToken)
	if err != nil {
		return nil, err
	}
	if err := w.serveCredsTLS(CredsNPM4, npm, w.CA.GetCertificate, true, nil); err != nil {
		return nil, err
	}

	// untrusted: a certificate of a CA no one trusts.
	rogue, err := NewCA()
	if err != nil {
		return nil, err
	}
	if err := w.serveCredsTLS(CredsUntrusted4, api, rogue.GetCertificate, true, nil); err != nil {
		return nil, err
	}

	// mtls: a client certificate of the world's CA is required.
	mtls := c.mtlsHandler()
	if err := w.serveCredsTLS(CredsMTLS4, mtls, w.CA.GetCertificate, false, w.CA.Pool()); err != nil {
		return nil, err
	}
	return c, nil
}

// apiHandler is api.creds.test: it records every Authorization, demands
// token as Bearer or "token", and reflects the request on /echo.
func (c *Creds) apiHandler(token string) http.Handler {
	api := http.NewServeMux()
	api.HandleFunc("/echo", func(rw http.ResponseWriter, r *http.Request) {
		rw.Header().Set("X-Echo-Authorization", r.Header.Get("Authorization"))
		for k, v := range r.Header {
			fmt.Fprintf(rw, "%s: %s\n", k, strings.Join(v, ","))
		}
	})
	// /profile stores the User-Agent, Referer, Cookie and X- headers of
	// every request (a profile page, a log viewer, an issue body) and
	// shows what it stored, to a later request that carries no secret.
	api.HandleFunc("/profile", func(rw http.ResponseWriter, r *http.Request) {
		c.mu.Lock()
		c.got["profile"] = append(c.got["profile"], r.Method+" "+r.URL.RequestURI()+" "+fmt.Sprint(r.Header))
		for k, vs := range r.Header {
			if k == "User-Agent" || k == "Referer" || k == "Cookie" || strings.HasPrefix(k, "X-") {
				for _, v := range vs {
					c.profile = append(c.profile, k+": "+v)
				}
			}
		}
		if len(c.profile) > 64 {
			c.profile = c.profile[len(c.profile)-64:]
		}
		shown := strings.Join(c.profile, "\n")
		c.mu.Unlock()
		fmt.Fprintf(rw, "profile:\n%s\n", shown)
	})
	api.HandleFunc("/reflect/", reflectHandler)
	api.HandleFunc("/", func(rw http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		auth := r.Header.Get("Authorization")
		c.note("api", auth, r.Method+" "+r.URL.RequestURI()+" "+string(b))
		if auth != "Bearer "+token && auth != "token "+token {
			rw.Header().Set("WWW-Authenticate", `Bearer realm="api"`)
			http.Error(rw, "api: bad credentials", http.StatusUnauthorized)
			return
		}
		fmt.Fprintf(rw, "api: hello %s %s %s\n", r.Proto, r.Method, r.URL.Path)
	})
	return api
}

// reflectHandler is api.creds.test's /reflect/WHERE: it hands the
// request's Authorization back in the place WHERE names, other than the
// body and headers /echo uses: "trailer" (declared), "undeclared" (a
// trailer announced nowhere), "early-hints" (a 103 before the answer),
// "stream" (the request body echoed, then the response held open), "range" (the Authorization as a document served with Range support),
// "lower" (the Authorization lower- and upper-cased), "gzip" (the
// Authorization gzip-compressed whatever the request accepts), "header-name" (the credential, without its scheme, in a header's name)
// and "upgrade" (a WebSocket upgrade answered 101 with the value in the
// reason phrase and a header, and in the bytes after it).
func reflectHandler(rw http.ResponseWriter, r *http.Request) {
	auth := r.Header.Get("Authorization")
	_, cred, _ := strings.Cut(auth, " ")
	switch strings.TrimPrefix(r.URL.Path, "/reflect/") {
	case "trailer":
		rw.Header().Set("Trailer", "X-Echo-Trailer")
		fmt.Fprintf(rw, "reflect: %s body\n", r.Proto)
		http.NewResponseController(rw).Flush() // no Content-Length: chunked
		rw.Header().Set("X-Echo-Trailer", auth)
	case "undeclared":
		fmt.Fprintf(rw, "reflect: %s body\n", r.Proto)
		http.NewResponseController(rw).Flush()
		rw.Header().Set(http.TrailerPrefix+"X-Echo-Undeclared", auth)
	case "early-hints":
		rw.Header().Set("Link", "</style.css?t="+cred+">; rel=preload")
		rw.Header().Set("X-Echo-Hint", auth)
		rw.WriteHeader(http.StatusEarlyHints)
		clear(rw.Header())
		fmt.Fprintf(rw, "reflect: %s final\n", r.Proto)
	case "stream":
		// Echoes the request body, flushed, then keeps the response open
		// (a stream, long-poll or event source that quotes its request)
		// for two seconds, or until the client goes away.
		b, _ := io.ReadAll(io.LimitReader(r.Body, 4096))
		rw.WriteHeader(http.StatusOK)
		rw.Write(b)
		http.NewResponseController(rw).Flush()
		select {
		case <-r.Context().Done():
		case <-time.After(2 * time.Second):
		}
	case "range":
		// The request's Authorization as a document that honours Range
		// (http.ServeContent): a slice of it is a slice of the value.
		http.ServeContent(rw, r, "", time.Time{}, strings.NewReader("reflect: "+auth+"\n"))
	case "lower":
		// The Authorization in another letter case (a server that
		// normalizes what it quotes), lower, then upper.
		fmt.Fprintf(rw, "reflect: %s\nREFLECT: %s\n", strings.ToLower(auth), strings.ToUpper(auth))
	case "gzip":
		// The Authorization gzip-compressed whatever the request accepts
		// (a server that compresses regardless).
		rw.Header().Set("Content-Encoding", "gzip")
		zw := gzip.NewWriter(rw)
		fmt.Fprintf(zw, "reflect: %s\n", auth)
		zw.Close()
	case "header-name":
		rw.Header().Set("X-"+cred, "reflected")
		fmt.Fprintf(rw, "reflect: %s body\n", r.Proto)
	case "upgrade":
		if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
			http.Error(rw, "reflect: upgrade wanted", http.StatusUpgradeRequired)
			return
		}
		conn, brw, err := http.NewResponseController(rw).Hijack()
		if err != nil {
			http.Error(rw, "reflect: "+err.Error(), http.StatusInternalServerError)
			return
		}
		defer conn.Close()
		fmt.Fprintf(brw, "HTTP/1.1 101 %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nX-Echo-Upgrade: %s\r\n\r\n", cred, auth)
		fmt.Fprintf(brw, "after the upgrade: %s\n", auth)
		brw.Flush()
	default:
		http.NotFound(rw, r)
	}
}

// pasteHandler is paste.creds.test: it takes anything and records it
// (the place a token must never reach).
func (c *Creds) pasteHandler() http.Handler {
	return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		c.note("paste", r.Header.Get("Authorization"), r.Method+" "+r.URL.RequestURI()+" "+fmt.Sprint(r.Header)+" "+string(b))
		fmt.Fprintln(rw, "paste: stored")
	})
}

// gitHandler is git.creds.test: git http-backend over the bare
// repository repo, with token as the Basic auth password.
func (c *Creds) gitHandler(repo, token string) http.Handler {
	backend := &cgi.Handler{
		Path: "/usr/lib/git-core/git-http-backend",
		Env:  []string{"GIT_PROJECT_ROOT=" + filepath.Dir(repo), "GIT_HTTP_EXPORT_ALL=1", "REMOTE_USER=tester"},
	}
	git := http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		auth := r.Header.Get("Authorization")
		c.note("git", auth, r.Method+" "+r.URL.RequestURI())
		_, pass, ok := r.BasicAuth()
		if !ok || pass != token {
			rw.Header().Set("WWW-Authenticate", `Basic realm="git"`)
			http.Error(rw, "git: authentication required", http.StatusUnauthorized)
			return
		}
		backend.ServeHTTP(rw, r)
	})
	return git
}

// npmHandler is npm.creds.test: a registry of one package, CredsPackage,
// demanding token as a bearer token.
func (c *Creds) npmHandler(token string) (http.Handler, error) {
	// Each package's packument and tarball, by the decoded path npm asks
	// for them by ("/@scope%2fname" decodes to "/@scope/name").
	files := map[string][]byte{}
	for _, name := range []string{CredsPackage, CredsScopedPackage} {
		tgz, err := packageTarball(name)
		if err != nil {
			return nil, err
		}
		sha1sum := sha1.Sum(tgz)
		sha512sum := sha512.Sum512(tgz)
		base := name[strings.LastIndexByte(name, '/')+1:]
		tarPath := "/" + name + "/-/" + base + "-1.0.0.tgz"
		packument, _ := json.Marshal(map[string]any{
			"name":      name,
			"dist-tags": map[string]string{"latest": "1.0.0"},
			"versions": map[string]any{"1.0.0": map[string]any{
				"name": name, "version": "1.0.0", "main": "index.js",
				"dist": map[string]string{
					"tarball":   "https://" + CredsNPMName + tarPath,
					"shasum":    hex.EncodeToString(sha1sum[:]),
					"integrity": "sha512-" + base64.StdEncoding.EncodeToString(sha512sum[:]),
				},
			}},
		})
		files["/"+name] = packument
		files[tarPath] = tgz
	}
	npm := http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		auth := r.Header.Get("Authorization")
		c.note("npm", auth, r.Method+" "+r.URL.RequestURI())
		if auth != "Bearer "+token {
			rw.Header().Set("WWW-Authenticate", `Bearer realm="npm"`)
			rw.Header().Set("Content-Type", "application/json")
			rw.WriteHeader(http.StatusUnauthorized)
			io.WriteString(rw, `{"error":"npm: a bearer token is required"}`)
			return
		}
		b, ok := files[r.URL.Path]
		switch {
		case !ok:
			http.NotFound(rw, r)
		case strings.HasSuffix(r.URL.Path, ".tgz"):
			rw.Header().Set("Content-Type", "application/octet-stream")
			rw.Write(b)
		default:
			rw.Header().Set("Content-Type", "application/json")
			rw.Write(b)
		}
	})
	return npm, nil
}

// mtlsHandler is mtls.creds.test: it records the common name of each
// client certificate.
func (c *Creds) mtlsHandler() http.Handler {
	return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		cn := ""
		if r.TLS != nil && len(r.TLS.PeerCertificates) > 0 {
			cn = r.TLS.PeerCertificates[0].Subject.CommonName
		}
		c.mu.Lock()
		c.MTLSClients = append(c.MTLSClients, cn)
		c.mu.Unlock()
		fmt.Fprintf(rw, "mtls: hello %s\n", cn)
	})
}

// serveCredsTLS serves h with TLS on ip:443 (HTTP/2 too when h2); with
// clientCAs, a client certificate of theirs is required.
func (w *World) serveCredsTLS(ip netip.Addr, h http.Handler, cert func(*tls.ClientHelloInfo) (*tls.Certificate, error), h2 bool, clientCAs *x509.CertPool) error {
	l, err := w.Listen("tcp", netip.AddrPortFrom(ip, 443).String())
	if err != nil {
		return err
	}
	cfg := &tls.Config{GetCertificate: cert, NextProtos: []string{"http/1.1"}}
	if h2 {
		cfg.NextProtos = []string{"h2", "http/1.1"}
	}
	if clientCAs != nil {
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
		cfg.ClientCAs = clientCAs
	}
	srv := &http.Server{Handler: h, TLSConfig: cfg, ReadHeaderTimeout: 10 * time.Second, ErrorLog: log.New(io.Discard, "", 0)}
	w.closers = append(w.closers, func() { srv.Close() })
	go srv.ServeTLS(l, "", "")
	return nil
}

// serveCredsPlain serves h over plain HTTP on ip:80.
func (w *World) serveCredsPlain(ip netip.Addr, h http.Handler) error {
	l, err := w.Listen("tcp", netip.AddrPortFrom(ip, 80).String())
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, ErrorLog: log.New(io.Discard, "", 0)}
	w.closers = append(w.closers, func() { srv.Close() })
	go srv.Serve(l)
	return nil
}

// makeRepo makes dir/repo.git, a bare repository with one commit on main
// that accepts pushes.
func makeRepo(dir string) (string, error) {
	if dir == "" {
		return "", fmt.Errorf("testworld: CredsOptions.RepoDir is required")
	}
	work := filepath.Join(dir, "work")
	bare := filepath.Join(dir, "repo.git")
	env := append(os.Environ(), "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example.test", "GIT_COMMITTER_NAME=t",
		"GIT_COMMITTER_EMAIL=t@example.test", "GIT_CONFIG_NOSYSTEM=1", "HOME="+dir)
	if err := os.MkdirAll(work, 0o755); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(work, "README"), []byte("tunwall credentials test repository\n"), 0o644); err != nil {
		return "", err
	}
	for _, args := range [][]string{
		{"init", "-q", "-b", "main", work},
		{"-C", work, "add", "README"},
		{"-C", work, "commit", "-q", "-m", "first"},
		{"clone", "-q", "--bare", work, bare},
		{"-C", bare, "config", "http.receivepack", "true"},
		{"-C", bare, "config", "uploadpack.allowFilter", "true"},
	} {
		cmd := exec.Command("git", args...)
		cmd.Env = env
		if out, err := cmd.CombinedOutput(); err != nil {
			return "", fmt.Errorf("testworld: git %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	// Readable by every user the sandbox's git may run as.
	filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err == nil {
			os.Chmod(p, fi.Mode()|0o755)
		}
		return nil
	})
	return bare, nil
}

// packageTarball is the registry's package name.
func packageTarball(name string) ([]byte, error) {
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	for _, f := range []struct{ name, body string }{
		{"package/package.json", `{"name":"` + name + `","version":"1.0.0","main":"index.js"}` + "\n"},
		{"package/index.js", "module.exports = 'installed from the token-guarded registry: " + name + "';\n"},
	} {
		if err := tw.WriteHeader(&tar.Header{Name: f.name, Mode: 0o644, Size: int64(len(f.body)), ModTime: time.Unix(1700000000, 0)}); err != nil {
			return nil, err
		}
		tw.Write([]byte(f.body))
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	if err := gz.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// ClientCert issues a client certificate of the world's CA for cn and
// writes its certificate and key (PEM) into dir; it returns their paths.
func (ca *CA) ClientCert(dir, cn string) (certPath, keyPath string, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", err
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return "", "", err
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return "", "", err
	}
	certPath, keyPath = filepath.Join(dir, cn+".crt"), filepath.Join(dir, cn+".key")
	if err := os.WriteFile(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		return "", "", err
	}
	return certPath, keyPath, os.WriteFile(keyPath, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o644)
}

// PinFor returns curl's --pinnedpubkey value for the world server's
// certificate for name: "sha256//" + base64 of its public key's SHA-256.
func (ca *CA) PinFor(name string) (string, error) {
	c, err := ca.GetCertificate(&tls.ClientHelloInfo{ServerName: name})
	if err != nil {
		return "", err
	}
	leaf, err := x509.ParseCertificate(c.Certificate[0])
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(leaf.RawSubjectPublicKeyInfo)
	return "sha256//" + base64.StdEncoding.EncodeToString(sum[:]), nil
}
