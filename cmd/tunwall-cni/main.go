// Command tunwall-cni is a CNI plugin (spec 1.0/1.1: ADD, DEL, CHECK,
// VERSION, STATUS, GC) that gives a pod a tunwall-only network: it asks
// the node agent (tunwall node) to serve the pod's network namespace,
// passing the namespace as a descriptor over the agent's unix socket. The
// agent makes the TUN there (the namespace's only interface besides lo)
// and serves it under the pod's policy. The plugin holds no state: the
// agent does, and what it serves dies with it (fail closed).
//
// Network config keys (besides cniVersion, name and type "tunwall-cni"):
//
//	"socket"  the agent's socket (default /run/tunwall/node.sock)
//	"policy"  the default policy name, when the pod has no annotation and
//	          its namespace no policy of its own
//	"phase"   the policy's phase (needed when it has more than one)
//
// The pod's annotation tunwall.dev/policy arrives in runtimeConfig through
// the runtime's io.kubernetes.cri.pod-annotations capability.
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/tunwall/tunwall/internal/nodeapi"
)

// buildVersion is set at build time (-ldflags "-X main.buildVersion=...").
var buildVersion = "dev"

// netConf is the plugin's network config.
type netConf struct {
	types.PluginConf
	Socket        string `json:"socket,omitempty"`
	Policy        string `json:"policy,omitempty"`
	Phase         string `json:"phase,omitempty"`
	RuntimeConfig struct {
		PodAnnotations map[string]string `json:"io.kubernetes.cri.pod-annotations,omitempty"`
	} `json:"runtimeConfig"`
}

// k8sArgs are the CNI_ARGS a Kubernetes runtime passes.
type k8sArgs struct {
	types.CommonArgs
	K8S_POD_NAMESPACE          types.UnmarshallableString //nolint:revive // the runtime's names
	K8S_POD_NAME               types.UnmarshallableString
	K8S_POD_INFRA_CONTAINER_ID types.UnmarshallableString
	K8S_POD_UID                types.UnmarshallableString
}

func main() {
	skel.PluginMainFuncs(skel.CNIFuncs{Add: cmdAdd, Del: cmdDel, Check: cmdCheck, GC: cmdGC, Status: cmdStatus},
		version.PluginSupports("0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"),
		"tunwall-cni "+buildVersion+": a tunwall-only network for a pod, served by the tunwall node agent")
}

func parseConf(stdin []byte) (*netConf, error) {
	var c netConf
	if err := json.Unmarshal(stdin, &c); err != nil {
		return nil, types.NewError(types.ErrDecodingFailure, "tunwall-cni: cannot decode the network config", err.Error())
	}
	if err := version.ParsePrevResult(&c.PluginConf); err != nil {
		return nil, types.NewError(types.ErrDecodingFailure, "tunwall-cni: cannot decode prevResult", err.Error())
	}
	if c.Socket == "" {
		c.Socket = nodeapi.DefaultSocket
	}
	if c.Policy != "" {
		if err := nodeapi.CheckPolicyName(c.Policy); err != nil {
			return nil, types.NewError(types.ErrInvalidNetworkConfig, "tunwall-cni: \"policy\"", err.Error())
		}
	}
	return &c, nil
}

// request is the agent request of a CNI call.
func request(op string, args *skel.CmdArgs, c *netConf) (nodeapi.Request, error) {
	var ka k8sArgs
	ka.IgnoreUnknown = true
	if err := types.LoadArgs(args.Args, &ka); err != nil {
		return nodeapi.Request{}, types.NewError(types.ErrInvalidEnvironmentVariables, "tunwall-cni: CNI_ARGS", err.Error())
	}
	return nodeapi.Request{
		Op:            op,
		Network:       c.Name,
		ContainerID:   args.ContainerID,
		IfName:        args.IfName,
		NetNS:         args.Netns,
		K8sNamespace:  string(ka.K8S_POD_NAMESPACE),
		K8sPod:        string(ka.K8S_POD_NAME),
		Annotation:    c.RuntimeConfig.PodAnnotations[nodeapi.PolicyAnnotation],
		DefaultPolicy: c.Policy,
		Phase:         c.Phase,
	}, nil
}

// call asks the agent, passing the namespace netns (a path; "" none) as a
// descriptor.
func call(c *netConf, req nodeapi.Request, netns string) (nodeapi.Response, error) {
	var fds []int
	if netns != "" {
		f, err := os.Open(netns)
		if err != nil {
			return nodeapi.Response{}, types.NewError(types.ErrInvalidNetNS, "tunwall-cni: cannot open the network namespace", err.Error())
		}
		defer f.Close()
		fds = []int{int(f.Fd())}
	}
	r, err := nodeapi.Call(c.Socket, req, fds...)
	if err != nil {
		code := types.ErrInternal
		if errors.Is(err, nodeapi.ErrUnreachable) {
			code = types.ErrTryAgainLater
		}
		return r, types.NewError(code, "tunwall-cni: "+err.Error(), "")
	}
	if !r.OK {
		code := r.Code
		if code == 0 {
			code = types.ErrInternal
		}
		return r, types.NewError(code, "tunwall node agent: "+r.Error, "")
	}
	return r, nil
}

func cmdAdd(args *skel.CmdArgs) error {
	c, err := parseConf(args.StdinData)
	if err != nil {
		return err
	}
	if args.Netns == "" {
		return types.NewError(types.ErrInvalidNetNS, "tunwall-cni: no network namespace (CNI_NETNS)", "")
	}
	req, err := request(nodeapi.OpAdd, args, c)
	if err != nil {
		return err
	}
	r, err := call(c, req, args.Netns)
	if err != nil {
		return err
	}
	res, err := result(c, args, r)
	if err != nil {
		// Served, but the runtime will not know: undo, so nothing is left.
		nodeapi.Call(c.Socket, nodeapi.Request{Op: nodeapi.OpDel, Network: c.Name, ContainerID: args.ContainerID})
		return err
	}
	return types.PrintResult(res, c.CNIVersion)
}

// result is prevResult (lo, from the loopback plugin chained before) with
// the served interface, its addresses, default routes and resolvers added.
func result(c *netConf, args *skel.CmdArgs, r nodeapi.Response) (*current.Result, error) {
	res := &current.Result{CNIVersion: current.ImplementedSpecVersion}
	if c.PrevResult != nil {
		prev, err := current.NewResultFromResult(c.PrevResult)
		if err != nil {
			return nil, types.NewError(types.ErrDecodingFailure, "tunwall-cni: prevResult", err.Error())
		}
		res = prev
	}
	idx := len(res.Interfaces)
	res.Interfaces = append(res.Interfaces, &current.Interface{Name: r.IfName, Mtu: r.MTU, Sandbox: args.Netns})
	for _, s := range r.IPs {
		ip, ipn, err := net.ParseCIDR(s)
		if err != nil {
			return nil, types.NewError(types.ErrInternal, "tunwall-cni: the agent answered a bad address", s)
		}
		ipn.IP = ip
		res.IPs = append(res.IPs, &current.IPConfig{Address: *ipn, Interface: current.Int(idx)})
		def := net.IPNet{IP: net.IPv4zero, Mask: net.CIDRMask(0, 32)}
		if ip.To4() == nil {
			def = net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}
		}
		res.Routes = append(res.Routes, &types.Route{Dst: def})
	}
	res.DNS = types.DNS{Nameservers: r.DNS, Search: r.Search}
	return res, nil
}

func cmdDel(args *skel.CmdArgs) error {
	c, err := parseConf(args.StdinData)
	if err != nil {
		return err
	}
	req, err := request(nodeapi.OpDel, args, c)
	if err != nil {
		return err
	}
	_, err = call(c, req, "")
	var te *types.Error
	if errors.As(err, &te) && te.Code == types.ErrTryAgainLater {
		// No agent: nothing is served (what it served died with it).
		return nil
	}
	return err
}

func cmdCheck(args *skel.CmdArgs) error {
	c, err := parseConf(args.StdinData)
	if err != nil {
		return err
	}
	if c.PrevResult == nil {
		return types.NewError(types.ErrInvalidNetworkConfig, "tunwall-cni: CHECK needs prevResult", "")
	}
	prev, err := current.NewResultFromResult(c.PrevResult)
	if err != nil {
		return types.NewError(types.ErrDecodingFailure, "tunwall-cni: prevResult", err.Error())
	}
	found := false
	for _, i := range prev.Interfaces {
		found = found || i.Name == args.IfName
	}
	if !found {
		return types.NewError(types.ErrInvalidNetworkConfig, fmt.Sprintf("tunwall-cni: prevResult has no interface %s", args.IfName), "")
	}
	req, err := request(nodeapi.OpCheck, args, c)
	if err != nil {
		return err
	}
	_, err = call(c, req, args.Netns)
	return err
}

func cmdGC(args *skel.CmdArgs) error {
	c, err := parseConf(args.StdinData)
	if err != nil {
		return err
	}
	req := nodeapi.Request{Op: nodeapi.OpGC, Network: c.Name}
	for _, a := range c.ValidAttachments {
		req.Valid = append(req.Valid, a.ContainerID)
	}
	_, err = call(c, req, "")
	var te *types.Error
	if errors.As(err, &te) && te.Code == types.ErrTryAgainLater {
		return nil // no agent: nothing served to collect
	}
	return err
}

func cmdStatus(args *skel.CmdArgs) error {
	c, err := parseConf(args.StdinData)
	if err != nil {
		return err
	}
	if _, err := call(c, nodeapi.Request{Op: nodeapi.OpStatus}, ""); err != nil {
		return types.NewError(types.ErrPluginNotAvailable, err.Error(), "")
	}
	return nil
}
