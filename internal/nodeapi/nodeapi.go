// Package nodeapi is the protocol between the CNI plugin (cmd/tunwall-cni)
// and the node agent (tunwall node, internal/node): one request and one
// answer, each one JSON message on a SOCK_SEQPACKET unix socket, the
// request carrying the pod's network namespace as a descriptor
// (SCM_RIGHTS) when it names one. The agent, not the plugin, creates the
// TUN in that namespace: the plugin then never holds a served TUN, and an
// agent that is down or refuses leaves nothing behind. The protocol is
// tunwall's own, between two binaries of one release; it is not an API.
//
// It owns the names (policy names, container ids) both sides check, and
// the choice of a pod's policy; it imports nothing of tunwall but tun (for
// passing descriptors), so the plugin stays small.
package nodeapi

import (
	"errors"
	"fmt"
	"net"
	"os"
	"regexp"
	"time"

	"github.com/tunwall/tunwall/tun"
)

// DefaultSocket is where the agent listens unless told otherwise
// (--socket, the plugin's "socket" key).
const DefaultSocket = "/run/tunwall/node.sock"

// PolicyAnnotation is the pod annotation naming its policy.
const PolicyAnnotation = "tunwall.dev/policy"

// Ops of a Request.
const (
	OpAdd    = "add"    // serve the namespace (with its descriptor)
	OpDel    = "del"    // stop serving the container; unknown is success
	OpCheck  = "check"  // is the container served, its TUN there (with the namespace's descriptor)
	OpGC     = "gc"     // stop serving the network's containers not in Valid
	OpStatus = "status" // is the agent ready to serve
)

// Request is what the plugin asks.
type Request struct {
	Op string `json:"op"`
	// Network is the CNI network's name; ContainerID and IfName the
	// attachment's (CNI_CONTAINERID, CNI_IFNAME).
	Network     string `json:"network,omitempty"`
	ContainerID string `json:"container_id,omitempty"`
	IfName      string `json:"ifname,omitempty"`
	// NetNS is the namespace's path as the runtime named it (recorded
	// only; the descriptor is what is served).
	NetNS string `json:"netns,omitempty"`
	// K8sNamespace and K8sPod are K8S_POD_NAMESPACE and K8S_POD_NAME of
	// CNI_ARGS ("" outside Kubernetes).
	K8sNamespace string `json:"k8s_namespace,omitempty"`
	K8sPod       string `json:"k8s_pod,omitempty"`
	// Annotation is the pod's tunwall.dev/policy annotation ("" none);
	// DefaultPolicy the network config's "policy" ("" none). ChoosePolicy
	// says which wins.
	Annotation    string `json:"annotation,omitempty"`
	DefaultPolicy string `json:"default_policy,omitempty"`
	// Phase is the network config's "phase" ("" : the policy's only one).
	Phase string `json:"phase,omitempty"`
	// Valid are the container ids still attached to Network (OpGC).
	Valid []string `json:"valid,omitempty"`
}

// Response is the agent's answer. When OK is false, Code is a CNI error
// code and Error says why.
type Response struct {
	OK    bool   `json:"ok"`
	Code  uint   `json:"code,omitempty"`
	Error string `json:"error,omitempty"`
	// The served interface (OpAdd): its name, MTU, addresses (prefixes)
	// and the resolver addresses its resolv.conf should name.
	IfName string   `json:"ifname,omitempty"`
	MTU    int      `json:"mtu,omitempty"`
	IPs    []string `json:"ips,omitempty"`
	DNS    []string `json:"dns,omitempty"`
	Search []string `json:"search,omitempty"`
	// Policy is the policy chosen, Run the audit run id of the pod.
	Policy string `json:"policy,omitempty"`
	Run    string `json:"run,omitempty"`
}

// CNI error codes the agent answers with (the CNI spec's).
const (
	CodeInvalidConfig = 7   // no policy found, or a bad name
	CodeInvalidNetNS  = 8   // not a network namespace, or it has another way out
	CodeTryAgainLater = 11  // a bound reached, or the agent busy
	CodeInternal      = 999 // anything else
)

// ErrUnreachable is wrapped by Call's error when no agent answers at the
// socket (none listening, or no socket).
var ErrUnreachable = errors.New("the tunwall node agent is unreachable")

// callTimeout bounds one call: an ADD builds a TUN and a session.
const callTimeout = 60 * time.Second

// Call sends req (with fds) to the agent at socket and returns its answer.
func Call(socket string, req Request, fds ...int) (Response, error) {
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: socket, Net: "unixpacket"})
	if err != nil {
		return Response{}, fmt.Errorf("%w at %s: %v", ErrUnreachable, socket, err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(callTimeout))
	if err := tun.Send(c, req, fds...); err != nil {
		return Response{}, fmt.Errorf("%w at %s: %v", ErrUnreachable, socket, err)
	}
	var r Response
	got, err := tun.Recv(c, &r)
	for _, fd := range got {
		closeFD(fd) // the agent sends none
	}
	if err != nil {
		if errors.Is(err, tun.ErrPeerGone) {
			return Response{}, fmt.Errorf("%w at %s: it closed the connection without an answer", ErrUnreachable, socket)
		}
		return Response{}, fmt.Errorf("tunwall node agent at %s: %w", socket, err)
	}
	return r, nil
}

func closeFD(fd int) { os.NewFile(uintptr(fd), "").Close() }

var (
	policyName = regexp.MustCompile(`^[a-z0-9]([a-z0-9._-]{0,62}[a-z0-9])?$`)
	idChars    = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$`)
	k8sName    = regexp.MustCompile(`^[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?$`)
	ifName     = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,15}$`)
)

// CheckPolicyName says why name cannot name a policy (the file NAME.yaml
// in the policy directory), or nil: 1-64 of a-z, 0-9, '.', '_', '-',
// starting and ending with a letter or digit (so no path, no hidden file).
func CheckPolicyName(name string) error {
	if !policyName.MatchString(name) || name == "." || name == ".." {
		return fmt.Errorf("%q is not a policy name (1-64 of a-z 0-9 . _ -, starting and ending with a letter or digit)", name)
	}
	return nil
}

// CheckRequest says why req cannot be served, or nil: the ids end up in
// file names and labels.
func CheckRequest(req Request) error {
	switch req.Op {
	case OpAdd, OpDel, OpCheck:
		if !idChars.MatchString(req.ContainerID) {
			return fmt.Errorf("container id %q: want 1-128 of A-Z a-z 0-9 _ . -", req.ContainerID)
		}
		if req.Op != OpDel && !ifName.MatchString(req.IfName) {
			return fmt.Errorf("interface name %q: want 1-15 of A-Z a-z 0-9 _ . -", req.IfName)
		}
		for _, n := range []string{req.K8sNamespace, req.K8sPod} {
			if n != "" && !k8sName.MatchString(n) {
				return fmt.Errorf("%q is not a Kubernetes name", n)
			}
		}
	case OpGC:
		for _, id := range req.Valid {
			if !idChars.MatchString(id) {
				return fmt.Errorf("container id %q: want 1-128 of A-Z a-z 0-9 _ . -", id)
			}
		}
	case OpStatus:
	default:
		return fmt.Errorf("unknown op %q", req.Op)
	}
	if len(req.Network) > 256 {
		return errors.New("network name longer than 256 bytes")
	}
	return nil
}

// Where a pod's policy came from (ChoosePolicy).
const (
	FromAnnotation = "annotation"
	FromNamespace  = "namespace"
	FromDefault    = "default"
)

// ChoosePolicy picks the policy of a pod, first match wins: its
// annotation (which must name a policy that exists: a typo never falls
// through to a wider one), a policy named after its Kubernetes namespace,
// the network config's default (which must exist too). None is an error:
// no pod starts without a fence. exists says whether a policy is there.
func ChoosePolicy(req Request, exists func(name string) bool) (name, from string, err error) {
	if a := req.Annotation; a != "" {
		if err := CheckPolicyName(a); err != nil {
			return "", "", fmt.Errorf("annotation %s: %w", PolicyAnnotation, err)
		}
		if !exists(a) {
			return "", "", fmt.Errorf("annotation %s names policy %q, which the policy directory does not hold", PolicyAnnotation, a)
		}
		return a, FromAnnotation, nil
	}
	if ns := req.K8sNamespace; ns != "" && CheckPolicyName(ns) == nil && exists(ns) {
		return ns, FromNamespace, nil
	}
	if d := req.DefaultPolicy; d != "" {
		if err := CheckPolicyName(d); err != nil {
			return "", "", fmt.Errorf("the network config's \"policy\": %w", err)
		}
		if !exists(d) {
			return "", "", fmt.Errorf("the network config's \"policy\" names %q, which the policy directory does not hold", d)
		}
		return d, FromDefault, nil
	}
	return "", "", fmt.Errorf("no policy for the pod: no %s annotation, no policy named after its namespace %q, and no \"policy\" in the network config", PolicyAnnotation, req.K8sNamespace)
}
