package inspect

// searchExpands reports whether short, a name a client sent in its TLS SNI
// or HTTP Host, is fqdn written short: short plus one of the host's search
// domains (the sandbox's resolver library applied that list and asked
// tunwall for fqdn, so `curl http://intra/` with `search corp.test`
// connects to intra.corp.test's fake address and sends Host: intra). Only
// that exact expansion is accepted: it names the server the connection is
// already for, so it fronts for nothing.
func searchExpands(search []string, short, fqdn string) bool {
	if len(short) >= len(fqdn) {
		return false
	}
	for _, d := range search {
		if len(short)+1+len(d) == len(fqdn) && fqdn[:len(short)] == short && fqdn[len(short)] == '.' && fqdn[len(short)+1:] == d {
			return true
		}
	}
	return false
}
