package node

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/tunwall/tunwall/internal/audit"
	"github.com/tunwall/tunwall/internal/control"
	"github.com/tunwall/tunwall/internal/nodeapi"
	"github.com/tunwall/tunwall/internal/sandbox"
	"github.com/tunwall/tunwall/internal/session"
	"github.com/tunwall/tunwall/policy"
	"github.com/tunwall/tunwall/tun"
)

// DefaultSocket is where the agent listens unless told otherwise.
const DefaultSocket = nodeapi.DefaultSocket

// MetricsHandler serves the node's metrics, per pod (--metrics-listen).
func (a *Agent) MetricsHandler() http.Handler { return control.NodeMetricsHandler(a) }

// DefaultMaxNamespaces is Config.MaxNamespaces' zero value.
const DefaultMaxNamespaces = 64

// Config configures an Agent. New copies it.
type Config struct {
	// PolicyDir holds the policies, NAME.yaml each. Required.
	PolicyDir string
	// AuditDir receives one log per pod, NAMESPACE_POD_CONTAINERID.jsonl;
	// or, when AuditStdout is set, every pod's lines go there, whole
	// lines interleaved. Exactly one is required.
	AuditDir    string
	AuditStdout io.Writer
	// MaxNamespaces bounds the pods served at once; 0 means
	// DefaultMaxNamespaces. An ADD past it is refused (try again later).
	MaxNamespaces int
	// Node names the machine on every record (the "node" label).
	Node string
	// Session is the template of every pod's session: DNS, limits, MTU,
	// audit bounds, version, argv. Rules, Audit.Path, Audit.File,
	// Audit.Labels, DiagFD, NetNS and the policy fields are the agent's
	// to fill. DNS.Upstream may be empty when every policy names its
	// dns.upstream.
	Session session.Options
	// Net is the template of every pod's TUN (sandbox.NetConfig); the
	// name is the runtime's (CNI_IFNAME).
	Net sandbox.NetConfig
	// ControlDir, when set, gets a control socket per pod
	// (control.SocketPath(ControlDir, RUN)): tunwall ctl ls lists the pods,
	// ctl status, flows and metrics ask one. Only root of the host may use
	// them, never the pod (the session's control checks).
	ControlDir string
	// Poll is how often the policies in use are looked at; 0 means 1s.
	Poll time.Duration
	// Stderr receives what the agent says (pods served and dropped, policy
	// reloads and their errors); nil discards.
	Stderr io.Writer
	// Logger is the operational log; nil discards.
	Logger *slog.Logger
}

// Agent serves pods' namespaces. Its methods are safe for concurrent use.
type Agent struct {
	cfg      Config
	policies *policies
	stream   *audit.Stream // --audit-stdout: every pod's run on it
	// resolvers are the upstream resolvers pods share, within a
	// Kubernetes namespace and policy only.
	resolvers resolvers

	opMu sync.Mutex // one ADD, DEL, CHECK or GC at a time

	mu      sync.Mutex
	pods    map[string]*pod // by container id
	refused map[string]uint64
	closed  bool
	adding  uint64 // the namespace an ADD in progress serves (0 none)

	stop     chan struct{}
	pollDone chan struct{}
}

// pod is one served namespace.
type pod struct {
	id, network, ifname string
	namespace, name     string
	policy, phase, from string
	netns               uint64
	sess                *session.Session
	watch               *tun.Watcher
	rules               *policy.RuleSet // when it was added
	version             *version        // its policy's version in effect; guarded by Agent.mu
	resolver            string          // the key of the shared resolver it holds (Agent.resolvers)
	stopped             chan struct{}   // closed to stop watching
	done                chan struct{}   // closed once it is no longer served
	once                sync.Once
}

// New validates cfg and returns an Agent, polling its policies.
func New(cfg Config) (*Agent, error) {
	switch {
	case cfg.PolicyDir == "":
		return nil, errors.New("node: a policy directory is required")
	case (cfg.AuditDir == "") == (cfg.AuditStdout == nil):
		return nil, errors.New("node: give exactly one of an audit directory or audit on stdout")
	case cfg.MaxNamespaces < 0:
		return nil, fmt.Errorf("node: MaxNamespaces %d is negative", cfg.MaxNamespaces)
	}
	if st, err := os.Stat(cfg.PolicyDir); err != nil || !st.IsDir() {
		return nil, fmt.Errorf("node: policy directory %s: not a directory (%v)", cfg.PolicyDir, err)
	}
	if cfg.MaxNamespaces == 0 {
		cfg.MaxNamespaces = DefaultMaxNamespaces
	}
	if cfg.Poll <= 0 {
		cfg.Poll = time.Second
	}
	if cfg.Stderr == nil {
		cfg.Stderr = io.Discard
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.ControlDir != "" {
		if err := control.EnsureDir(cfg.ControlDir); err != nil {
			return nil, fmt.Errorf("node: %w", err)
		}
		control.PruneDead(cfg.ControlDir) // what a killed agent left
	}
	if cfg.AuditDir != "" {
		if err := os.MkdirAll(cfg.AuditDir, 0o700); err != nil {
			return nil, fmt.Errorf("node: audit directory: %w", err)
		}
	}
	a := &Agent{
		cfg:      cfg,
		policies: newPolicies(cfg.PolicyDir),
		pods:     map[string]*pod{},
		refused:  map[string]uint64{},
		stop:     make(chan struct{}),
		pollDone: make(chan struct{}),
	}
	if cfg.AuditStdout != nil {
		a.stream = audit.NewStream(cfg.AuditStdout)
	}
	go a.runPoll()
	return a, nil
}

// refusal is an ADD refused, with the CNI code to answer and the reason
// it is counted under.
type refusal struct {
	code   uint
	reason string
	err    error
}

func (r *refusal) Error() string { return r.err.Error() }

func (a *Agent) refuse(code uint, reason string, err error) *refusal {
	a.mu.Lock()
	a.refused[reason]++
	a.mu.Unlock()
	return &refusal{code: code, reason: reason, err: err}
}

// Add serves the namespace nsFile (the caller keeps it) for req, or says
// why not (a *refusal). A container already served in that namespace is
// answered again, as served.
func (a *Agent) Add(req nodeapi.Request, nsFile *os.File) (nodeapi.Response, error) {
	a.opMu.Lock()
	defer a.opMu.Unlock()
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return nodeapi.Response{}, a.refuse(nodeapi.CodeTryAgainLater, "closing", errors.New("the agent is stopping"))
	}
	if p := a.pods[req.ContainerID]; p != nil {
		a.mu.Unlock()
		if ino, err := nsInode(nsFile); err == nil && ino == p.netns && req.IfName == p.ifname {
			return a.response(p), nil
		}
		return nodeapi.Response{}, a.refuse(nodeapi.CodeInternal, "duplicate", fmt.Errorf("container %s is served already, in another namespace or as another interface", req.ContainerID))
	}
	if len(a.pods) >= a.cfg.MaxNamespaces {
		a.mu.Unlock()
		return nodeapi.Response{}, a.refuse(nodeapi.CodeTryAgainLater, "max-namespaces",
			fmt.Errorf("the agent serves %d namespaces, its bound (--max-namespaces)", a.cfg.MaxNamespaces))
	}
	a.mu.Unlock()

	name, from, err := nodeapi.ChoosePolicy(req, a.policies.exists)
	if err != nil {
		return nodeapi.Response{}, a.refuse(nodeapi.CodeInvalidConfig, "no-policy", err)
	}
	v, err := a.policies.get(name)
	if err != nil {
		return nodeapi.Response{}, a.refuse(nodeapi.CodeInvalidConfig, "bad-policy", err)
	}
	rules, err := selectRules(v, req.Phase)
	if err != nil {
		return nodeapi.Response{}, a.refuse(nodeapi.CodeInvalidConfig, "bad-policy", err)
	}
	p := &pod{
		id: req.ContainerID, network: req.Network, ifname: req.IfName,
		namespace: req.K8sNamespace, name: req.K8sPod,
		policy: name, phase: req.Phase, from: from, rules: rules, version: v,
		stopped: make(chan struct{}), done: make(chan struct{}),
	}
	ino, err := nsInode(nsFile)
	if err != nil {
		return nodeapi.Response{}, a.refuse(nodeapi.CodeInvalidNetNS, "attach", err)
	}
	a.setAdding(ino)
	defer a.setAdding(0)
	if err := a.serve(p, req, nsFile); err != nil {
		a.forgetPolicyIfUnused(name)
		var r *refusal
		if errors.As(err, &r) {
			return nodeapi.Response{}, err
		}
		return nodeapi.Response{}, a.refuse(nodeapi.CodeInternal, "attach", err)
	}
	fmt.Fprintf(a.cfg.Stderr, "tunwall node: serving %s (container %s) under policy %s (from its %s), run %s\n",
		p.who(), p.id, name, from, p.sess.Run())
	return a.response(p), nil
}

// dnsFor is the resolver config of a pod under version v of its policy:
// the policy's dns.upstream, else the agent's.
func (a *Agent) dnsFor(v *version) session.DNSOptions {
	dns := a.cfg.Session.DNS
	if up := v.pol.DNSUpstream(); up.IsValid() {
		dns.Upstream, dns.UpstreamFrom = []netip.AddrPort{up}, "policy"
	}
	return dns
}

// serve builds p's TUN in nsFile and its session, and starts serving.
func (a *Agent) serve(p *pod, req nodeapi.Request, nsFile *os.File) (err error) {
	dns := a.dnsFor(p.version)
	if len(dns.Upstream) == 0 {
		return a.refuse(nodeapi.CodeInvalidConfig, "bad-policy",
			fmt.Errorf("policy %s names no dns.upstream, and the agent has no resolver (--dns-upstream)", p.policy))
	}
	labels, err := audit.NewLabels(p.labels(a.cfg.Node))
	if err != nil {
		return err
	}
	netCfg := a.cfg.Net
	netCfg.Name = req.IfName
	att, err := sandbox.Attach(context.Background(), sandbox.AttachConfig{NetNSFile: nsFile, Net: netCfg,
		// The pod's network config chains another plugin that gave it an
		// interface: tunwall-cni must be its only one (after loopback).
		NotIsolatedHint: "the pod's network must be tunwall-cni alone (loopback before it is fine): remove the other plugins from this runtime handler's CNI config"})
	if err != nil {
		return a.refuse(nodeapi.CodeInvalidNetNS, "attach", err)
	}
	p.netns = att.NetNS
	o := a.cfg.Session
	o.Rules = p.rules
	o.DNS = dns
	o.Quiet = true
	o.Stderr = a.cfg.Stderr
	o.Logger = a.cfg.Logger.With("pod", p.who(), "container", p.id)
	o.DiagFD = att.Diag
	o.NetNS = att.NetNS
	o.Run = audit.NewRunID()
	o.Control, o.Metrics = nil, nil
	if a.cfg.ControlDir != "" {
		if o.Control, err = control.Listen(control.SocketPath(a.cfg.ControlDir, o.Run)); err != nil {
			closeFD(att.TUN)
			closeFD(att.Watch)
			closeFD(att.Diag)
			return err
		}
	}
	o.PolicyFile, o.PolicySource = p.version.path, p.version.src
	// The policy in effect is the directory's version of it (the agent
	// polls the file): Reload rebuilds the pod's rules from it.
	o.Rebuild = func(phase string) (*policy.RuleSet, []byte, error) {
		v, err := a.policies.get(p.policy)
		if err != nil {
			return nil, nil, err
		}
		rs, err := selectRules(v, phase)
		if err != nil {
			return nil, nil, err
		}
		return rs, v.src, nil
	}
	o.Audit.Off, o.Audit.Labels = false, labels
	if a.stream != nil {
		o.Audit.Stream, o.Audit.Path = a.stream, "<stdout>"
	} else {
		o.Audit.Path = filepath.Join(a.cfg.AuditDir, p.auditName()+".jsonl")
	}
	// The pod's upstream resolver, shared with the pods of its Kubernetes
	// namespace under its policy, with the same config; never wider.
	p.resolver = resolverKey(p.namespace, p.policy, dns)
	if o.DNS.Resolver, err = a.resolvers.acquire(p.resolver, dns); err != nil {
		closeFD(att.TUN)
		closeFD(att.Watch)
		closeFD(att.Diag)
		if o.Control != nil {
			o.Control.Close()
		}
		return err
	}
	defer func() {
		if err != nil {
			a.resolvers.release(p.resolver)
		}
	}()
	s, err := session.New(o)
	if err != nil {
		closeFD(att.TUN)
		closeFD(att.Watch)
		return err
	}
	// Served only while tunwall is the namespace's only way out (as
	// tunwall attach): an interface, address or route that appears stops
	// serving it.
	w, err := tun.NewWatcher(tun.WatchConfig{FD: att.Watch, TUN: att.TUN})
	if err != nil {
		closeFD(att.TUN)
		s.Close()
		return a.refuse(nodeapi.CodeInvalidNetNS, "attach", err)
	}
	if err := s.Start(att.TUN); err != nil {
		w.Close()
		s.Close()
		return err
	}
	p.sess, p.watch = s, w
	a.mu.Lock()
	a.pods[p.id] = p
	a.mu.Unlock()
	go a.runWatch(p)
	return nil
}

// runWatch ends serving p when a way out appears in its namespace, the
// namespace goes, or p is stopped.
func (a *Agent) runWatch(p *pod) {
	escape := make(chan error, 1)
	go func() { escape <- p.watch.Wait() }()
	why := ""
	select {
	case err := <-escape:
		var esc *tun.EscapeError
		if errors.As(err, &esc) {
			why = fmt.Sprintf("%v in its namespace, so tunwall is not its only way out", esc)
		} else if !errors.Is(err, tun.ErrWatchClosed) {
			why = fmt.Sprintf("cannot follow its namespace's interfaces (%v)", err)
		}
	case <-p.sess.PeerGone():
		why = "its TUN or namespace is gone"
	case <-p.stopped:
	}
	if why != "" {
		fmt.Fprintf(a.cfg.Stderr, "tunwall node: stopped serving %s (container %s): %s; its TUN is removed\n", p.who(), p.id, why)
		a.remove(p)
	}
	<-p.stopped
}

// remove stops serving p (once): the table forgets it, its watch and
// session close (the TUN goes with the session), its policy is forgotten
// when no pod uses it.
func (a *Agent) remove(p *pod) {
	p.once.Do(func() {
		a.mu.Lock()
		if a.pods[p.id] == p {
			delete(a.pods, p.id)
		}
		a.mu.Unlock()
		close(p.stopped)
		p.watch.Close()
		if r, err := p.sess.Close(); err != nil || r.AuditErr != nil {
			fmt.Fprintf(a.cfg.Stderr, "tunwall node: %s (container %s): closing its session: %v\n", p.who(), p.id, errors.Join(err, r.AuditErr))
		}
		a.resolvers.release(p.resolver)
		a.forgetPolicyIfUnused(p.policy)
		close(p.done)
	})
	<-p.done
}

func (a *Agent) forgetPolicyIfUnused(name string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, p := range a.pods {
		if p.policy == name {
			return
		}
	}
	a.policies.forget(name)
}

// Del stops serving container id; one not served is success (DEL is
// idempotent).
func (a *Agent) Del(id string) bool {
	a.opMu.Lock()
	defer a.opMu.Unlock()
	a.mu.Lock()
	p := a.pods[id]
	a.mu.Unlock()
	if p == nil {
		return false
	}
	a.remove(p)
	fmt.Fprintf(a.cfg.Stderr, "tunwall node: stopped serving %s (container %s): deleted\n", p.who(), p.id)
	return true
}

// Check says why container id is not served as req says (its TUN in
// nsFile, named req.IfName), or nil.
func (a *Agent) Check(req nodeapi.Request, nsFile *os.File) error {
	a.opMu.Lock()
	defer a.opMu.Unlock()
	a.mu.Lock()
	p := a.pods[req.ContainerID]
	a.mu.Unlock()
	if p == nil {
		return fmt.Errorf("container %s is not served (its TUN or session is gone)", req.ContainerID)
	}
	select {
	case <-p.sess.PeerGone():
		return fmt.Errorf("container %s: its TUN is gone", req.ContainerID)
	default:
	}
	if ino, err := nsInode(nsFile); err != nil || ino != p.netns {
		return fmt.Errorf("container %s is served in another network namespace", req.ContainerID)
	}
	if p.ifname != req.IfName {
		return fmt.Errorf("container %s is served as %s, not %s", req.ContainerID, p.ifname, req.IfName)
	}
	var found bool
	err := tun.InNetNS(int(nsFile.Fd()), func() error {
		var err error
		found, err = tunPresent(p.ifname)
		return err
	})
	if err != nil {
		return err
	}
	if !found {
		return fmt.Errorf("container %s: its TUN %s is gone from its namespace", req.ContainerID, p.ifname)
	}
	return nil
}

// GC stops serving network's containers that are not in valid.
func (a *Agent) GC(network string, valid []string) int {
	a.opMu.Lock()
	defer a.opMu.Unlock()
	a.mu.Lock()
	var drop []*pod
	for id, p := range a.pods {
		if p.network == network && !slices.Contains(valid, id) {
			drop = append(drop, p)
		}
	}
	a.mu.Unlock()
	for _, p := range drop {
		a.remove(p)
		fmt.Fprintf(a.cfg.Stderr, "tunwall node: stopped serving %s (container %s): not among the runtime's attachments (GC)\n", p.who(), p.id)
	}
	return len(drop)
}

// Close stops serving every pod (their TUNs go) and the policy poll.
func (a *Agent) Close() {
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return
	}
	a.closed = true
	a.mu.Unlock()
	close(a.stop)
	<-a.pollDone
	a.opMu.Lock()
	defer a.opMu.Unlock()
	for _, p := range a.list() {
		a.remove(p)
	}
}

func (a *Agent) setAdding(ino uint64) {
	a.mu.Lock()
	a.adding = ino
	a.mu.Unlock()
}

// servesNetNS says whether ino is the network namespace of a pod served
// (or being added).
func (a *Agent) servesNetNS(ino uint64) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if ino == a.adding {
		return true
	}
	for _, p := range a.pods {
		if p.netns == ino {
			return true
		}
	}
	return false
}

// list is the pods served now, by container id.
func (a *Agent) list() []*pod {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]*pod, 0, len(a.pods))
	for _, p := range a.pods {
		out = append(out, p)
	}
	slices.SortFunc(out, func(x, y *pod) int {
		switch {
		case x.id < y.id:
			return -1
		case x.id > y.id:
			return 1
		}
		return 0
	})
	return out
}

// response is the answer to an ADD of p.
func (a *Agent) response(p *pod) nodeapi.Response {
	n := a.cfg.Net
	mtu := a.cfg.Session.MTU
	if mtu == 0 {
		mtu = tun.DefaultMTU
	}
	r := nodeapi.Response{OK: true, IfName: p.ifname, MTU: mtu, Policy: p.policy, Run: p.sess.Run(), Search: n.Search}
	for _, pf := range []netip.Prefix{n.Addr4, n.Addr6} {
		if pf.IsValid() {
			r.IPs = append(r.IPs, pf.String())
		}
	}
	for _, ip := range []netip.Addr{n.Resolver4, n.Resolver6} {
		if ip.IsValid() {
			r.DNS = append(r.DNS, ip.String())
		}
	}
	return r
}

// who names p for people: NAMESPACE/POD, or its container id outside
// Kubernetes.
func (p *pod) who() string {
	if p.namespace == "" && p.name == "" {
		return "container " + p.id
	}
	return "pod " + p.namespace + "/" + p.name
}

// labels are p's identity on every record.
func (p *pod) labels(node string) map[string]string {
	m := map[string]string{"container_id": p.id, "policy": p.policy}
	if p.namespace != "" {
		m["k8s_namespace"] = p.namespace
	}
	if p.name != "" {
		m["k8s_pod"] = p.name
	}
	if node != "" {
		m["node"] = node
	}
	return m
}

// auditName is p's audit log's name: NAMESPACE_POD_CONTAINERID ("-" for
// what the runtime did not say).
func (p *pod) auditName() string {
	or := func(s string) string {
		if s == "" {
			return "-"
		}
		return s
	}
	return or(p.namespace) + "_" + or(p.name) + "_" + p.id
}

// selectRules makes the rule set of phase of v, with the guard's ranges
// for this host.
func selectRules(v *version, phase string) (*policy.RuleSet, error) {
	rs, err := policy.Select(v.pol, phase, nil, policy.Guard{Extra: session.HostGuard(session.DefaultPlan)})
	if err != nil {
		return nil, fmt.Errorf("policy %s: %w", v.name, err)
	}
	return rs, nil
}

// runPoll looks at the policies in use every Poll, and swaps each new
// version into the pods using it.
func (a *Agent) runPoll() {
	defer close(a.pollDone)
	t := time.NewTicker(a.cfg.Poll)
	defer t.Stop()
	for {
		select {
		case <-a.stop:
			return
		case <-t.C:
		}
		changed := a.policies.poll(func(msg string) { fmt.Fprintln(a.cfg.Stderr, msg) })
		if len(changed) == 0 {
			continue
		}
		// One at a time with ADD and DEL: no pod is reloaded while it is
		// being removed.
		a.opMu.Lock()
		for _, v := range changed {
			a.reload(v)
		}
		a.opMu.Unlock()
	}
}

// reload puts version v of its policy into effect for every pod using it
// (session.Reload: recorded first as a phase record, then the open flows
// the new rules deny are cut). A pod whose phase the new version lacks
// keeps its rules, and that is said.
func (a *Agent) reload(v *version) {
	n, revoked, upstreamKept := 0, 0, 0
	by := control.Requester{PID: int32(os.Getpid()), Comm: "tunwall", Via: "policy-dir " + v.path}
	for _, p := range a.list() {
		if p.policy != v.name {
			continue
		}
		ch, err := p.sess.Reload(by)
		if err != nil {
			fmt.Fprintf(a.cfg.Stderr, "tunwall node: %s keeps its rules: %v\n", p.who(), err)
			continue
		}
		a.mu.Lock()
		p.version = v
		a.mu.Unlock()
		n++
		revoked += len(ch.Revoked)
		// A live session's resolver cannot change (its cache, its
		// in-flight lookups and the names its pool handed out come from
		// it): the rules above are in effect, the upstream is not.
		if dns := a.dnsFor(v); resolverKey(p.namespace, p.policy, dns) != p.resolver {
			upstreamKept++
			fmt.Fprintf(a.cfg.Stderr, "tunwall node: %s: policy %s now names dns upstream %v, but a served pod's resolver cannot change: it keeps resolving through its old upstream until it is recreated (its new rules are in effect)\n",
				p.who(), v.name, dns.Upstream)
		}
	}
	if upstreamKept > 0 {
		a.policies.countError(v.name) // tunwall_policy_reload_errors_total
	}
	fmt.Fprintf(a.cfg.Stderr, "tunwall node: policy %s changed (sha256 %x): in effect for %d pods, %d open flows it denies cut\n", v.name, v.sum[:6], n, revoked)
}

// Pods, MaxPods, ReloadErrors, Refused and Resolvers make Agent a
// control.NodeSource.
func (a *Agent) Pods() []control.Pod {
	var out []control.Pod
	for _, p := range a.list() {
		out = append(out, control.Pod{Namespace: p.namespace, Pod: p.name, Policy: p.policy, Source: p.sess.Source()})
	}
	return out
}

func (a *Agent) MaxPods() int { return a.cfg.MaxNamespaces }

// Resolvers is how many upstream resolvers the served pods share.
func (a *Agent) Resolvers() int { return a.resolvers.len() }

func (a *Agent) ReloadErrors() map[string]uint64 { return a.policies.reloadErrors() }

func (a *Agent) Refused() map[string]uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make(map[string]uint64, len(a.refused))
	for k, v := range a.refused {
		out[k] = v
	}
	return out
}

func closeFD(fd int) {
	if fd >= 0 {
		os.NewFile(uintptr(fd), "").Close()
	}
}
