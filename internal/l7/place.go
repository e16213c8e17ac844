package l7

import (
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/tunwall/tunwall/internal/secrets"
)

// Where a secret may go. A placeholder of a secret goes on only in the
// places the host's rules inject that secret into, and only on a flow
// tunwall sends over TLS it verified: the plain form covers the credential
// headers (Authorization, Basic credentials included, and
// Proxy-Authorization, which is for the proxy and never sent on), the
// explicit form the header it names. Anywhere else (another
// header, a header name, the URL, the body), to a host whose rules do not
// inject the secret, or on plain HTTP, the request is refused: the value
// put into a header a server stores and shows (User-Agent, Referer, X-...)
// would come back to a later request unmasked, and on plain HTTP it would
// cross the network in cleartext. A placeholder of an earlier run is
// refused too, and said to be one.

// credentialHeaders are the headers the plain form injects into.
var credentialHeaders = []string{"Authorization", "Proxy-Authorization"}

// stray is a refusal of a request that carries a placeholder where it
// must not go.
type stray struct{ reason, hint string }

func (x *stray) Error() string { return x.reason }

// strayInHead finds a placeholder in the request target or a header that
// must not go on.
func (rq *request) strayInHead() *stray {
	if rq.fs.tm.cfg.Secrets.Len() == 0 {
		return nil
	}
	if x := rq.strayIn(rq.r.RequestURI, "the URL", ""); x != nil {
		return x
	}
	if x := rq.strayIn(rq.r.URL.String(), "the URL", ""); x != nil {
		return x
	}
	for k, vs := range rq.r.Header {
		if x := rq.strayIn(k, "a header name", ""); x != nil {
			return x
		}
		for _, v := range vs {
			if x := rq.strayIn(v, "the "+k+" header", k); x != nil {
				return x
			}
		}
	}
	return nil
}

// strayIn checks v, found in where: header is the header's name when v
// is a header's value, "" otherwise.
func (rq *request) strayIn(v, where, header string) *stray {
	found, name, stale := rq.fs.tm.cfg.Secrets.InspectString(v)
	if stale {
		return rq.stale(name, where)
	}
	for _, s := range found {
		if x := rq.misplaced(s, where, header); x != nil {
			return x
		}
	}
	return nil
}

// misplaced says why s's placeholder, found in where (in header, or
// outside the headers when header is ""), must not go on, or returns nil
// when it may.
func (rq *request) misplaced(s *secrets.Secret, where, header string) *stray {
	fs := rq.fs
	host := fs.f.Host
	switch {
	case !fs.view.Injects(s.Name):
		x := &stray{reason: fmt.Sprintf("credential placeholder %s sent to %s (in %s)", s.Name, host, where)}
		if hosts := fs.tm.rules().InjectHosts(s.Name); len(hosts) > 0 {
			x.hint = s.Name + " is injected only for " + strings.Join(hosts, ", ")
		}
		return x
	case !fs.f.TLS:
		return &stray{
			reason: fmt.Sprintf("credential placeholder %s in a plain HTTP request to %s (in %s): tunwall injects secrets only over TLS it verified, never in cleartext", s.Name, host, where),
			hint:   "send it over https://" + host + "/",
		}
	case header != "" && fs.covers(s.Name, header):
		return nil
	}
	x := &stray{reason: fmt.Sprintf("credential placeholder %s in %s of a request to %s, where its rule does not inject it", s.Name, where, host)}
	if header != "" {
		x.hint = fmt.Sprintf("inject: [%s] injects only into Authorization; if %s must carry it (and the server never stores or shows that header), name it: inject: [{secret: %s, header: %s, value: \"{}\"}]", s.Name, header, s.Name, header)
	} else {
		x.hint = "tunwall injects a secret only into a header: the plain form into Authorization, the explicit form {secret, header, value} into the header it names"
	}
	return x
}

// covers reports whether the host's rules inject secret into header.
func (fs *flowServer) covers(secret, header string) bool {
	for _, in := range fs.view.Inject {
		if in.Secret != secret {
			continue
		}
		if in.Header == "" {
			for _, c := range credentialHeaders {
				if strings.EqualFold(c, header) {
					return true
				}
			}
		} else if strings.EqualFold(in.Header, header) {
			return true
		}
	}
	return false
}

// stale refuses a placeholder of an earlier run: it is not this run's,
// so it stands for nothing, and it is where a saved URL or file went
// stale.
func (rq *request) stale(name, where string) *stray {
	x := &stray{reason: fmt.Sprintf("credential placeholder of %s from an earlier run, sent to %s (in %s)", name, rq.fs.f.Host, where)}
	if rq.fs.tm.cfg.Secrets.Has(name) {
		x.hint = "placeholders change every run: this run's placeholder of " + name + " is in $" + name + "; update the URL or file that saved the old one"
	} else {
		x.hint = "this run has no secret " + name
	}
	return x
}

// refuseStray refuses a request that carries a placeholder where it must
// not go: an attempt to send the credential where its rule does not.
func (rq *request) refuseStray(x *stray) {
	rq.refuse(http.StatusForbidden, "credential-placeholder", x.reason, x.hint)
}

// notInjected notes in the record of a plain HTTP request the secrets an
// explicit-form rule would have set over TLS.
func (rq *request) notInjected() {
	var names []string
	for _, in := range rq.fs.view.Inject {
		if in.Header != "" && !slices.Contains(names, in.Secret) {
			names = append(names, in.Secret)
		}
	}
	if len(names) > 0 {
		rq.rec.Reason += "; " + strings.Join(names, ", ") + " not injected: plain HTTP (tunwall injects secrets only over TLS it verified)"
	}
}
