package node

import (
	"fmt"
	"strings"
	"sync"

	"github.com/tunwall/tunwall/dnsintercept"
	"github.com/tunwall/tunwall/internal/session"
)

// resolvers are the upstream resolvers the agent's pods share, one per
// trust boundary: a Kubernetes namespace, a policy name and an upstream
// config. Only pods with the same key share one (and its answer cache):
// a cache shared across tenants would tell one, by timing, which names
// another looked up. An entry goes with the last pod using it, so there
// are never more than the pods served (--max-namespaces). Safe for
// concurrent use.
type resolvers struct {
	mu sync.Mutex
	m  map[string]*sharedResolver
}

type sharedResolver struct {
	r    *dnsintercept.Resolver
	refs int
}

// resolverKey is the trust boundary and config a resolver serves: the
// pod's Kubernetes namespace and policy name, and every setting of dns
// that the resolver is built from.
func resolverKey(namespace, policyName string, dns session.DNSOptions) string {
	servers := make([]string, len(dns.Upstream))
	for i, s := range dns.Upstream {
		servers[i] = s.String()
	}
	// \x00 cannot appear in any of the parts (names, paths, addresses).
	return strings.Join([]string{namespace, policyName, strings.Join(servers, ","), dns.ServerTimeout.String(),
		dns.HostsFile, strings.Join(dns.Search, ",")}, "\x00")
}

// acquire returns the resolver for key, built from dns if no pod holds
// one, and counts one more user of it. Each acquire is matched by one
// release.
func (rs *resolvers) acquire(key string, dns session.DNSOptions) (*dnsintercept.Resolver, error) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if e := rs.m[key]; e != nil {
		e.refs++
		return e.r, nil
	}
	r, err := dnsintercept.NewResolver(dnsintercept.ResolverConfig{
		Servers:       dns.Upstream,
		HostsFile:     dns.HostsFile,
		Search:        dns.Search,
		ServerTimeout: dns.ServerTimeout,
	})
	if err != nil {
		return nil, err
	}
	if rs.m == nil {
		rs.m = map[string]*sharedResolver{}
	}
	rs.m[key] = &sharedResolver{r: r, refs: 1}
	return r, nil
}

// release drops one user of key's resolver; the last one drops it.
func (rs *resolvers) release(key string) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	e := rs.m[key]
	if e == nil {
		panic(fmt.Sprintf("node: release of a resolver not held (%q)", key))
	}
	if e.refs--; e.refs == 0 {
		delete(rs.m, key)
	}
}

// len is how many resolvers are held.
func (rs *resolvers) len() int {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return len(rs.m)
}
