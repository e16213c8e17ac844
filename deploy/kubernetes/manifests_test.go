// Package kubernetes_test checks the deployment files of this directory:
// every manifest decodes strictly into the Kubernetes API types (a typo,
// an unknown field, fails), and what must hold between them holds.
package kubernetes_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/tunwall/tunwall/policy"
)

// object is one decoded manifest, with the file it came from.
type object struct {
	file string
	obj  any
}

// newObject returns a new value of the API type of apiVersion and kind.
func newObject(apiVersion, kind string) (any, bool) {
	switch apiVersion + " " + kind {
	case "v1 Namespace":
		return &corev1.Namespace{}, true
	case "v1 ConfigMap":
		return &corev1.ConfigMap{}, true
	case "apps/v1 DaemonSet":
		return &appsv1.DaemonSet{}, true
	case "node.k8s.io/v1 RuntimeClass":
		return &nodev1.RuntimeClass{}, true
	case "admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy":
		return &admissionv1.ValidatingAdmissionPolicy{}, true
	case "admissionregistration.k8s.io/v1 ValidatingAdmissionPolicyBinding":
		return &admissionv1.ValidatingAdmissionPolicyBinding{}, true
	}
	return nil, false
}

// docs splits a YAML stream into its documents.
func docs(b []byte) [][]byte {
	var out [][]byte
	var cur []byte
	for _, line := range bytes.SplitAfter(b, []byte("\n")) {
		if string(bytes.TrimRight(line, "\r\n")) == "---" {
			out = append(out, cur)
			cur = nil
			continue
		}
		cur = append(cur, line...)
	}
	return append(out, cur)
}

// decodeAll decodes every manifest of dir strictly: unknown fields and
// duplicate keys fail, and so does a kind this test does not know.
func decodeAll(t *testing.T, dir string) []object {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatalf("no manifests in %s", dir)
	}
	var objs []object
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, d := range docs(b) {
			if len(bytes.TrimSpace(stripComments(d))) == 0 {
				continue
			}
			name := fmt.Sprintf("%s (document %d)", filepath.Base(f), i+1)
			var tm metav1.TypeMeta
			if err := yaml.Unmarshal(d, &tm); err != nil {
				t.Errorf("%s: %v", name, err)
				continue
			}
			obj, ok := newObject(tm.APIVersion, tm.Kind)
			if !ok {
				t.Errorf("%s: apiVersion %q kind %q: not a type this test decodes (add it to newObject)", name, tm.APIVersion, tm.Kind)
				continue
			}
			if err := yaml.UnmarshalStrict(d, obj); err != nil {
				t.Errorf("%s: %s does not decode strictly: %v", name, tm.Kind, err)
				continue
			}
			objs = append(objs, object{file: filepath.Base(f), obj: obj})
		}
	}
	return objs
}

// stripComments drops comment-only lines, so that a document of comments
// alone counts as empty.
func stripComments(b []byte) []byte {
	var out []byte
	for _, line := range bytes.SplitAfter(b, []byte("\n")) {
		if !bytes.HasPrefix(bytes.TrimSpace(line), []byte("#")) {
			out = append(out, line...)
		}
	}
	return out
}

// manifests are this directory's objects, by kind.
type manifests struct {
	daemonSet      *appsv1.DaemonSet
	configMaps     map[string]*corev1.ConfigMap // by name
	runtimeClass   *nodev1.RuntimeClass
	namespaces     []*corev1.Namespace
	admission      []*admissionv1.ValidatingAdmissionPolicy
	bindings       []*admissionv1.ValidatingAdmissionPolicyBinding
	containerdTOML string
}

func load(t *testing.T) manifests {
	t.Helper()
	m := manifests{configMaps: map[string]*corev1.ConfigMap{}}
	objs := decodeAll(t, ".")
	if t.Failed() {
		t.FailNow()
	}
	for _, o := range objs {
		switch v := o.obj.(type) {
		case *appsv1.DaemonSet:
			if m.daemonSet != nil {
				t.Fatalf("%s: a second DaemonSet", o.file)
			}
			m.daemonSet = v
		case *corev1.ConfigMap:
			m.configMaps[v.Name] = v
		case *nodev1.RuntimeClass:
			m.runtimeClass = v
		case *corev1.Namespace:
			m.namespaces = append(m.namespaces, v)
		case *admissionv1.ValidatingAdmissionPolicy:
			m.admission = append(m.admission, v)
		case *admissionv1.ValidatingAdmissionPolicyBinding:
			m.bindings = append(m.bindings, v)
		}
	}
	if m.daemonSet == nil || m.runtimeClass == nil || len(m.namespaces) == 0 {
		t.Fatalf("want a DaemonSet, a RuntimeClass and a Namespace; have %v, %v, %d", m.daemonSet != nil, m.runtimeClass != nil, len(m.namespaces))
	}
	b, err := os.ReadFile("containerd-tunwall.toml")
	if err != nil {
		t.Fatal(err)
	}
	m.containerdTOML = string(b)
	return m
}

func TestEveryManifestDecodesStrictlyIntoTheKubernetesTypes(t *testing.T) {
	m := load(t)
	for _, ns := range m.namespaces {
		if ns.Name != m.daemonSet.Namespace {
			continue
		}
		// The agent's pods need hostPath and capabilities beyond baseline.
		if got := ns.Labels["pod-security.kubernetes.io/enforce"]; got != "privileged" {
			t.Errorf("namespace %s enforces Pod Security %q: the agent's pod would be refused", ns.Name, got)
		}
		return
	}
	t.Errorf("the DaemonSet's namespace %q is not among the manifests", m.daemonSet.Namespace)
}

func TestATypoInAManifestFailsTheStrictDecode(t *testing.T) {
	b, err := os.ReadFile("daemonset.yaml")
	if err != nil {
		t.Fatal(err)
	}
	bad := bytes.Replace(b, []byte("readOnlyRootFilesystem:"), []byte("readOnlyRootFilesytem:"), 1)
	if bytes.Equal(bad, b) {
		t.Fatal("daemonset.yaml has no readOnlyRootFilesystem to misspell")
	}
	err = yaml.UnmarshalStrict(bad, &appsv1.DaemonSet{})
	if err == nil || !strings.Contains(err.Error(), "readOnlyRootFilesytem") {
		t.Errorf("a misspelt field decoded without an error naming it: %v", err)
	}
}

// agentFlags are the flags of `tunwall node` as its --help has them
// (docs/flags.md, which a test of cmd/tunwall keeps equal to the help):
// name, and whether it takes a value.
func agentFlags(t *testing.T) map[string]bool {
	t.Helper()
	b, err := os.ReadFile("../../docs/flags.md")
	if err != nil {
		t.Fatal(err)
	}
	_, sec, ok := strings.Cut(string(b), "\n## tunwall node\n")
	if !ok {
		t.Fatal("docs/flags.md has no section for tunwall node")
	}
	sec, _, _ = strings.Cut(sec, "\n## ")
	flags := map[string]bool{}
	for _, l := range strings.Split(sec, "\n") {
		if !strings.HasPrefix(l, "  -") {
			continue
		}
		f := strings.Fields(strings.TrimLeft(l, " -"))
		flags[f[0]] = len(f) > 1
	}
	if len(flags) < 5 {
		t.Fatalf("docs/flags.md lists %d flags of tunwall node", len(flags))
	}
	return flags
}

// parseArgs reads `node --flag=value --flag value --bool` into a map.
func parseArgs(t *testing.T, args []string) map[string]string {
	t.Helper()
	if len(args) == 0 || args[0] != "node" {
		t.Fatalf("the agent's args %q do not start with the subcommand node", args)
	}
	known := agentFlags(t)
	flags := map[string]string{}
	for i := 1; i < len(args); i++ {
		a := args[i]
		if !strings.HasPrefix(a, "-") {
			t.Fatalf("the agent's arg %q is not a flag", a)
		}
		name, value, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		takes, ok := known[name]
		if !ok {
			t.Fatalf("the agent's flag --%s is not a flag of tunwall node", name)
		}
		if _, dup := flags[name]; dup {
			t.Fatalf("the agent's flag --%s is given twice", name)
		}
		if takes && !hasValue {
			if i+1 >= len(args) {
				t.Fatalf("the agent's flag --%s has no value", name)
			}
			i++
			value = args[i]
		}
		if !takes && hasValue && value != "true" {
			t.Fatalf("the agent's flag --%s=%s: a boolean that is not true", name, value)
		}
		flags[name] = value
	}
	return flags
}

// container returns the pod spec's container (or init container) named name.
func container(t *testing.T, spec *corev1.PodSpec, init bool, name string) *corev1.Container {
	t.Helper()
	list := spec.Containers
	if init {
		list = spec.InitContainers
	}
	for i := range list {
		if list[i].Name == name {
			return &list[i]
		}
	}
	t.Fatalf("no container %q (init %v)", name, init)
	return nil
}

// volume returns the pod spec's volume named name.
func volume(t *testing.T, spec *corev1.PodSpec, name string) *corev1.Volume {
	t.Helper()
	for i := range spec.Volumes {
		if spec.Volumes[i].Name == name {
			return &spec.Volumes[i]
		}
	}
	t.Fatalf("no volume %q", name)
	return nil
}

// mountAt returns the volume mounted at dir in c.
func mountAt(t *testing.T, spec *corev1.PodSpec, c *corev1.Container, dir string) *corev1.Volume {
	t.Helper()
	for _, vm := range c.VolumeMounts {
		if path.Clean(vm.MountPath) == path.Clean(dir) {
			return volume(t, spec, vm.Name)
		}
	}
	t.Fatalf("container %s mounts nothing at %s", c.Name, dir)
	return nil
}

func TestTheNodeAgentHoldsOnlyThePrivilegesItNeeds(t *testing.T) {
	m := load(t)
	spec := &m.daemonSet.Spec.Template.Spec
	if spec.HostNetwork || spec.HostPID || spec.HostIPC {
		t.Errorf("hostNetwork %v, hostPID %v, hostIPC %v: the agent needs none", spec.HostNetwork, spec.HostPID, spec.HostIPC)
	}
	if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
		t.Error("the agent never calls the API server, yet a service account token would be mounted")
	}
	want := map[string][]corev1.Capability{"node": {"NET_ADMIN", "SYS_ADMIN", "SYS_PTRACE"}, "install-cni": nil}
	all := append(slices.Clone(spec.InitContainers), spec.Containers...)
	if len(all) != len(want) {
		t.Errorf("%d containers, want %d (%v)", len(all), len(want), want)
	}
	for _, c := range all {
		sc := c.SecurityContext
		if sc == nil {
			t.Errorf("container %s has no securityContext", c.Name)
			continue
		}
		if sc.Privileged != nil && *sc.Privileged {
			t.Errorf("container %s is privileged", c.Name)
		}
		if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
			t.Errorf("container %s allows privilege escalation", c.Name)
		}
		if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
			t.Errorf("container %s has a writable root file system", c.Name)
		}
		if sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
			t.Errorf("container %s does not drop ALL capabilities first", c.Name)
			continue
		}
		add := slices.Sorted(slices.Values(sc.Capabilities.Add))
		if w, ok := want[c.Name]; !ok || !slices.Equal(add, w) {
			t.Errorf("container %s adds capabilities %v, want %v", c.Name, add, w)
		}
	}
	for _, v := range spec.Volumes {
		if hp := v.HostPath; hp != nil && !slices.Contains([]string{"/run/tunwall", "/dev/net/tun", "/opt/cni/bin", cniConfDir(t, m)}, hp.Path) {
			t.Errorf("volume %s mounts the host's %s, which the agent has no use for", v.Name, hp.Path)
		}
	}
	if m.daemonSet.Spec.UpdateStrategy.Type != appsv1.OnDeleteDaemonSetStrategyType {
		t.Errorf("update strategy %q: an agent replaced under running pods leaves them without a network; upgrade node by node (OnDelete)",
			m.daemonSet.Spec.UpdateStrategy.Type)
	}
}

// cniConfDir is the CNI directory containerd-tunwall.toml gives the
// tunwall runtime handler.
func cniConfDir(t *testing.T, m manifests) string {
	t.Helper()
	re := regexp.MustCompile(`(?m)^\s*cni_conf_dir\s*=\s*"([^"]+)"`)
	sub := re.FindStringSubmatch(m.containerdTOML)
	if sub == nil {
		t.Fatal("containerd-tunwall.toml sets no cni_conf_dir")
	}
	return sub[1]
}

// conflist is the part of a CNI network configuration list this test reads.
type conflist struct {
	CNIVersion string            `json:"cniVersion"`
	Name       string            `json:"name"`
	Plugins    []json.RawMessage `json:"plugins"`
}

// tunwallPlugin is the tunwall-cni entry of the list: every key it may hold.
type tunwallPlugin struct {
	Type         string          `json:"type"`
	Socket       string          `json:"socket"`
	Policy       string          `json:"policy"`
	Phase        string          `json:"phase"`
	Capabilities map[string]bool `json:"capabilities"`
}

func strictJSON(t *testing.T, what string, b []byte, v any) {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

func TestTheAgentsFlagsAgreeWithItsMountsTheCNIConfigAndTheRuntimeClass(t *testing.T) {
	m := load(t)
	ds := m.daemonSet
	spec := &ds.Spec.Template.Spec
	node := container(t, spec, false, "node")
	install := container(t, spec, true, "install-cni")
	if node.Image != install.Image {
		t.Errorf("the agent runs %s but installs the plugin of %s", node.Image, install.Image)
	}
	flags := parseArgs(t, node.Args)
	for _, f := range []string{"policy-dir", "socket", "metrics-listen", "max-namespaces"} {
		if flags[f] == "" {
			t.Errorf("the agent has no --%s", f)
		}
	}
	_, dir := flags["audit-dir"]
	_, out := flags["audit-stdout"]
	if dir == out {
		t.Errorf("the agent needs exactly one of --audit-dir and --audit-stdout (have %v, %v)", dir, out)
	}
	if n, err := strconv.Atoi(flags["max-namespaces"]); err != nil || n < 1 {
		t.Errorf("--max-namespaces %q is not a positive number", flags["max-namespaces"])
	}

	// --policy-dir is the policies ConfigMap, mounted read-only.
	pv := mountAt(t, spec, node, flags["policy-dir"])
	if pv.ConfigMap == nil {
		t.Fatalf("--policy-dir %s is not a ConfigMap", flags["policy-dir"])
	}
	policies := m.configMaps[pv.ConfigMap.Name]
	if policies == nil || policies.Namespace != ds.Namespace {
		t.Fatalf("ConfigMap %s (the policy dir) is not among the manifests in namespace %s", pv.ConfigMap.Name, ds.Namespace)
	}

	// --socket is in a host directory, at the same path on the host, where
	// the plugin (run by the runtime on the host) finds it.
	sock := flags["socket"]
	sv := mountAt(t, spec, node, path.Dir(sock))
	if sv.HostPath == nil || sv.HostPath.Path != path.Dir(sock) {
		t.Errorf("--socket %s: its directory is not the host's %s", sock, path.Dir(sock))
	}

	// --metrics-listen's port is the container's metrics port.
	_, port, err := net.SplitHostPort(flags["metrics-listen"])
	if err != nil {
		t.Fatalf("--metrics-listen %q: %v", flags["metrics-listen"], err)
	}
	if p, _ := strconv.Atoi(port); !slices.ContainsFunc(node.Ports, func(cp corev1.ContainerPort) bool {
		return cp.Name == "metrics" && int(cp.ContainerPort) == p
	}) {
		t.Errorf("--metrics-listen port %s is not the container port named metrics", port)
	}
	// The agent names the node on its records from NODE_NAME.
	if !slices.ContainsFunc(node.Env, func(e corev1.EnvVar) bool {
		return e.Name == "NODE_NAME" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "spec.nodeName"
	}) {
		t.Error("the agent gets no NODE_NAME from spec.nodeName")
	}

	// The conflist: loopback, then tunwall-cni calling that socket.
	confDir := cniConfDir(t, m)
	cv := mountAt(t, spec, install, "/host"+confDir)
	if cv.HostPath == nil || cv.HostPath.Path != confDir {
		t.Errorf("the init container writes the conflist to %v, not the host's %s", cv.HostPath, confDir)
	}
	if bv := mountAt(t, spec, install, "/host/opt/cni/bin"); bv.HostPath == nil || bv.HostPath.Path != "/opt/cni/bin" {
		t.Errorf("the init container installs the plugin to %v, not the host's /opt/cni/bin", bv.HostPath)
	}
	script := strings.Join(append(slices.Clone(install.Command), install.Args...), " ")
	var cm *corev1.ConfigMap
	for _, vm := range install.VolumeMounts {
		v := volume(t, spec, vm.Name)
		if v.ConfigMap == nil {
			continue
		}
		cm = m.configMaps[v.ConfigMap.Name]
		if cm == nil {
			t.Fatalf("ConfigMap %s is not among the manifests", v.ConfigMap.Name)
		}
		for key := range cm.Data {
			if !strings.Contains(script, path.Join(vm.MountPath, key)) || !strings.Contains(script, path.Join("/host"+confDir, key)) {
				t.Errorf("the init container does not install %s to %s", key, confDir)
			}
		}
	}
	if cm == nil || len(cm.Data) != 1 {
		t.Fatalf("want one conflist in a ConfigMap the init container mounts; have %v", cm)
	}
	var list conflist
	for key, data := range cm.Data {
		if !strings.HasSuffix(key, ".conflist") {
			t.Errorf("%s: the runtime reads only .conflist, .conf and .json files as lists", key)
		}
		strictJSON(t, key, []byte(data), &list)
	}
	if list.CNIVersion != "1.0.0" || len(list.Plugins) != 2 {
		t.Fatalf("conflist: cniVersion %q with %d plugins; want 1.0.0, loopback and tunwall-cni", list.CNIVersion, len(list.Plugins))
	}
	var lo struct {
		Type string `json:"type"`
	}
	strictJSON(t, "the conflist's first plugin", list.Plugins[0], &lo)
	if lo.Type != "loopback" {
		t.Errorf("the first plugin is %q, want loopback", lo.Type)
	}
	var tw tunwallPlugin
	strictJSON(t, "the conflist's tunwall-cni plugin", list.Plugins[1], &tw)
	if tw.Type != "tunwall-cni" || tw.Socket != sock || tw.Phase == "" || tw.Policy == "" {
		t.Errorf("tunwall-cni config %+v: want type tunwall-cni, socket %s, a phase and a default policy", tw, sock)
	}
	if !tw.Capabilities["io.kubernetes.cri.pod-annotations"] {
		t.Error("tunwall-cni does not ask for the capability io.kubernetes.cri.pod-annotations: the annotation tunwall.dev/policy would never arrive")
	}
	if _, ok := policies.Data[tw.Policy+".yaml"]; !ok {
		t.Errorf("the default policy %q has no %s.yaml in ConfigMap %s", tw.Policy, tw.Policy, policies.Name)
	}

	// Every policy parses with tunwall's own parser and has the phase pods run.
	nameRE := regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?\.yaml$`)
	for key, data := range policies.Data {
		if !nameRE.MatchString(key) {
			t.Errorf("policy %s: not NAME.yaml with NAME a namespace-like name", key)
			continue
		}
		p, err := policy.Parse(key, []byte(data))
		if err != nil {
			t.Errorf("policy %s does not parse: %v", key, err)
			continue
		}
		if ph := p.Phases(); !slices.Contains(ph, tw.Phase) && len(ph) != 1 {
			t.Errorf("policy %s has phases %v, not the %q pods run", key, ph, tw.Phase)
		}
	}

	// The RuntimeClass's handler is the containerd handler of the toml,
	// and its pods land only where the agent runs.
	rc := m.runtimeClass
	if !strings.Contains(m.containerdTOML, "containerd.runtimes."+rc.Handler+"]") {
		t.Errorf("RuntimeClass %s's handler %q is not defined in containerd-tunwall.toml", rc.Name, rc.Handler)
	}
	if rc.Scheduling == nil || len(rc.Scheduling.NodeSelector) == 0 {
		t.Fatalf("RuntimeClass %s does not keep its pods on prepared nodes", rc.Name)
	}
	for k, v := range rc.Scheduling.NodeSelector {
		if spec.NodeSelector[k] != v {
			t.Errorf("RuntimeClass %s schedules onto %s=%s, where the DaemonSet does not run", rc.Name, k, v)
		}
	}
	if !metav1LabelsMatch(ds.Spec.Selector, ds.Spec.Template.Labels) {
		t.Errorf("the DaemonSet's selector %v does not select its template's labels %v", ds.Spec.Selector, ds.Spec.Template.Labels)
	}

	// The admission policy requires this RuntimeClass, and is bound.
	for _, vap := range m.admission {
		if !slices.ContainsFunc(vap.Spec.Validations, func(v admissionv1.Validation) bool {
			return strings.Contains(v.Expression, "'"+rc.Name+"'")
		}) {
			t.Errorf("ValidatingAdmissionPolicy %s does not require runtimeClassName %s", vap.Name, rc.Name)
		}
		if !slices.ContainsFunc(m.bindings, func(b *admissionv1.ValidatingAdmissionPolicyBinding) bool {
			return b.Spec.PolicyName == vap.Name && slices.Contains(b.Spec.ValidationActions, admissionv1.Deny)
		}) {
			t.Errorf("ValidatingAdmissionPolicy %s has no binding that denies", vap.Name)
		}
	}
}

// metav1LabelsMatch reports whether selector's matchLabels all hold in labels.
func metav1LabelsMatch(selector *metav1.LabelSelector, labels map[string]string) bool {
	if selector == nil || len(selector.MatchLabels) == 0 || len(selector.MatchExpressions) > 0 {
		return false
	}
	for k, v := range selector.MatchLabels {
		if labels[k] != v {
			return false
		}
	}
	return true
}
