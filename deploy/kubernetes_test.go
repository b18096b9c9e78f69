package deploy

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/nftredir/nftredir/internal/defaults"
)

const (
	kubeDir   = "kubernetes"
	namespace = "nftredir-system"
	// rbacFile is the Kubernetes mode's ServiceAccount and ClusterRole.
	rbacFile = "rbac.yaml"
)

type kustomization struct {
	APIVersion string   `json:"apiVersion"`
	Kind       string   `json:"kind"`
	Resources  []string `json:"resources"`
	Images     []struct {
		Name    string `json:"name"`
		NewName string `json:"newName"`
		NewTag  string `json:"newTag"`
	} `json:"images"`
}

// manifests are the objects of the kustomization, decoded strictly into
// their API types: an unknown or misspelt field is an error.
type manifests struct {
	kust       kustomization
	namespaces []corev1.Namespace
	configMaps []corev1.ConfigMap
	daemonSets []appsv1.DaemonSet
	accounts   []corev1.ServiceAccount
	roles      []rbacv1.ClusterRole
	bindings   []rbacv1.ClusterRoleBinding
	nsRoles    []rbacv1.Role
	nsBindings []rbacv1.RoleBinding
	haveRBAC   bool
}

var docSep = regexp.MustCompile(`(?m)^---\s*$`)

func strict[T any](t *testing.T, file string, doc []byte) T {
	t.Helper()
	var v T
	if err := yaml.UnmarshalStrict(doc, &v); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	return v
}

func loadManifests(t *testing.T) *manifests {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(kubeDir, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	m := &manifests{kust: strict[kustomization](t, "kustomization.yaml", raw)}
	if m.kust.Kind != "Kustomization" || m.kust.APIVersion != "kustomize.config.k8s.io/v1beta1" {
		t.Errorf("kustomization kind %q apiVersion %q", m.kust.Kind, m.kust.APIVersion)
	}
	for _, res := range m.kust.Resources {
		raw, err := os.ReadFile(filepath.Join(kubeDir, res))
		if err != nil {
			t.Fatalf("kustomization resource: %v", err)
		}
		m.haveRBAC = m.haveRBAC || res == rbacFile
		for _, doc := range docSep.Split(string(raw), -1) {
			if strings.TrimSpace(stripComments(doc)) == "" {
				continue
			}
			var tm metav1.TypeMeta
			if err := yaml.Unmarshal([]byte(doc), &tm); err != nil {
				t.Fatalf("%s: %v", res, err)
			}
			switch tm.APIVersion + " " + tm.Kind {
			case "v1 Namespace":
				m.namespaces = append(m.namespaces, strict[corev1.Namespace](t, res, []byte(doc)))
			case "v1 ConfigMap":
				m.configMaps = append(m.configMaps, strict[corev1.ConfigMap](t, res, []byte(doc)))
			case "apps/v1 DaemonSet":
				m.daemonSets = append(m.daemonSets, strict[appsv1.DaemonSet](t, res, []byte(doc)))
			case "v1 ServiceAccount":
				m.accounts = append(m.accounts, strict[corev1.ServiceAccount](t, res, []byte(doc)))
			case "rbac.authorization.k8s.io/v1 ClusterRole":
				m.roles = append(m.roles, strict[rbacv1.ClusterRole](t, res, []byte(doc)))
			case "rbac.authorization.k8s.io/v1 ClusterRoleBinding":
				m.bindings = append(m.bindings, strict[rbacv1.ClusterRoleBinding](t, res, []byte(doc)))
			case "rbac.authorization.k8s.io/v1 Role":
				m.nsRoles = append(m.nsRoles, strict[rbacv1.Role](t, res, []byte(doc)))
			case "rbac.authorization.k8s.io/v1 RoleBinding":
				m.nsBindings = append(m.nsBindings, strict[rbacv1.RoleBinding](t, res, []byte(doc)))
			default:
				t.Errorf("%s: unexpected object %s %s", res, tm.APIVersion, tm.Kind)
			}
		}
	}
	return m
}

func stripComments(doc string) string {
	var b strings.Builder
	for line := range strings.SplitSeq(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "#") {
			b.WriteString(line + "\n")
		}
	}
	return b.String()
}

func TestManifestsDecode(t *testing.T) {
	m := loadManifests(t)
	if len(m.namespaces) != 1 || m.namespaces[0].Name != namespace {
		t.Errorf("namespaces %v", m.namespaces)
	}
	if len(m.configMaps) != 1 || len(m.daemonSets) != 1 {
		t.Fatalf("%d ConfigMaps, %d DaemonSets; want one each", len(m.configMaps), len(m.daemonSets))
	}
	for _, o := range []metav1.ObjectMeta{m.configMaps[0].ObjectMeta, m.daemonSets[0].ObjectMeta} {
		if o.Namespace != namespace {
			t.Errorf("%s in namespace %q", o.Name, o.Namespace)
		}
	}
	if len(m.kust.Images) != 1 || m.kust.Images[0].Name != "nftredir" || m.kust.Images[0].NewTag != "dev" {
		t.Errorf("kustomization images %+v", m.kust.Images)
	}
	if !m.haveRBAC {
		t.Errorf("the kustomization does not list %s", rbacFile)
	}
	sa := m.daemonSets[0].Spec.Template.Spec.ServiceAccountName
	if !slices.ContainsFunc(m.accounts, func(a corev1.ServiceAccount) bool { return a.Name == sa && a.Namespace == namespace }) {
		t.Errorf("the DaemonSet's service account %s/%s is not in %s", namespace, sa, rbacFile)
	}
}

func container(t *testing.T, ds *appsv1.DaemonSet, name string) *corev1.Container {
	t.Helper()
	for i := range ds.Spec.Template.Spec.Containers {
		if c := &ds.Spec.Template.Spec.Containers[i]; c.Name == name {
			return c
		}
	}
	t.Fatalf("no container %s", name)
	return nil
}

func TestDaemonSet(t *testing.T) {
	m := loadManifests(t)
	ds := &m.daemonSets[0]
	pod := ds.Spec.Template.Spec
	if pod.PriorityClassName != "system-node-critical" || !pod.HostNetwork || pod.HostPID || pod.DNSPolicy != corev1.DNSClusterFirstWithHostNet {
		t.Errorf("pod: priority %q hostNetwork %v hostPID %v dns %q", pod.PriorityClassName, pod.HostNetwork, pod.HostPID, pod.DNSPolicy)
	}
	if ds.Spec.UpdateStrategy.Type != appsv1.RollingUpdateDaemonSetStrategyType || ds.Spec.UpdateStrategy.RollingUpdate == nil ||
		ds.Spec.UpdateStrategy.RollingUpdate.MaxUnavailable.IntValue() != 1 {
		t.Errorf("update strategy %+v", ds.Spec.UpdateStrategy)
	}
	if !labelsMatch(ds.Spec.Selector.MatchLabels, ds.Spec.Template.Labels) {
		t.Errorf("selector %v does not select the template's labels %v", ds.Spec.Selector.MatchLabels, ds.Spec.Template.Labels)
	}
	d := container(t, ds, "nftredird")
	in := container(t, ds, "install-cni")
	for _, c := range []*corev1.Container{d, in} {
		if c.Image != "nftredir:dev" {
			t.Errorf("%s: image %q", c.Name, c.Image)
		}
		sc := c.SecurityContext
		if sc == nil || sc.Privileged == nil || *sc.Privileged || sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
			t.Errorf("%s: security context %+v", c.Name, sc)
		}
		if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
			t.Errorf("%s: resources %+v", c.Name, c.Resources)
		}
	}
	if got := d.SecurityContext.Capabilities.Add; !slices.Equal(got, []corev1.Capability{"NET_ADMIN", "SYS_ADMIN"}) {
		t.Errorf("daemon capabilities %v", got)
	}
	// Kubernetes refuses allowPrivilegeEscalation=false with SYS_ADMIN.
	if ape := d.SecurityContext.AllowPrivilegeEscalation; ape != nil && !*ape {
		t.Error("allowPrivilegeEscalation: false with CAP_SYS_ADMIN does not validate")
	}
	if len(in.SecurityContext.Capabilities.Add) != 0 {
		t.Errorf("installer capabilities %v", in.SecurityContext.Capabilities.Add)
	}
	probe := func(p *corev1.Probe, path string) {
		t.Helper()
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != path || p.HTTPGet.Port.IntValue() != int(defaults.MetricsPort) {
			t.Errorf("probe %s: %+v", path, p)
		}
	}
	probe(d.LivenessProbe, "/healthz")
	probe(d.ReadinessProbe, "/readyz")
	if in.ReadinessProbe == nil || in.ReadinessProbe.Exec == nil || !slices.Equal(in.ReadinessProbe.Exec.Command, []string{"/usr/local/bin/nftredir-cni", "install", "--check"}) {
		t.Errorf("installer readiness %+v", in.ReadinessProbe)
	}
	nodeName := false
	for _, e := range d.Env {
		if e.Name == "NODE_NAME" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "spec.nodeName" {
			nodeName = true
		}
	}
	if !nodeName {
		t.Error("NODE_NAME is not the pod's spec.nodeName")
	}

	// Every mount has its volume; the host paths are the ones the brief
	// of each container needs.
	hostPaths := map[string]string{}
	for _, v := range pod.Volumes {
		if v.HostPath == nil {
			t.Errorf("volume %s is not a hostPath", v.Name)
			continue
		}
		hostPaths[v.Name] = v.HostPath.Path
	}
	mounts := map[string]string{}
	for _, c := range []*corev1.Container{d, in} {
		for _, vm := range c.VolumeMounts {
			hp, ok := hostPaths[vm.Name]
			if !ok {
				t.Errorf("%s mounts unknown volume %s", c.Name, vm.Name)
			}
			mounts[c.Name+":"+hp] = vm.MountPath
			if hp == "/run/netns" && (vm.MountPropagation == nil || *vm.MountPropagation != corev1.MountPropagationHostToContainer) {
				t.Errorf("/run/netns without HostToContainer propagation: namespaces created later would not appear")
			}
		}
	}
	for _, want := range []string{"nftredird:/run/netns", "nftredird:/run/nftredir", "nftredird:/var/run/ztunnel",
		"install-cni:/opt/cni/bin", "install-cni:/usr/lib/cni", "install-cni:/etc/cni/net.d"} {
		if _, ok := mounts[want]; !ok {
			t.Errorf("no mount %s", want)
		}
	}
	// The daemon's sockets and records sit where its defaults put them.
	// Pods' namespaces by the paths the runtime passes (containerd:
	// /var/run/netns/cni-<id>).
	if mounts["nftredird:/run/netns"] != "/var/run/netns" {
		t.Errorf("the node's /run/netns is mounted at %q; want /var/run/netns", mounts["nftredird:/run/netns"])
	}
	if mounts["nftredird:/run/nftredir"] != "/run/nftredir" || mounts["nftredird:/var/run/ztunnel"] != "/var/run/ztunnel" {
		t.Errorf("daemon mounts %v", mounts)
	}

	// configMapKeyRefs name keys that exist.
	cm := m.configMaps[0]
	for _, c := range []*corev1.Container{d, in} {
		for _, e := range c.Env {
			if r := e.ValueFrom; r != nil && r.ConfigMapKeyRef != nil {
				if _, ok := cm.Data[r.ConfigMapKeyRef.Key]; !ok || r.ConfigMapKeyRef.Name != cm.Name {
					t.Errorf("%s: env %s from missing key %s/%s", c.Name, e.Name, r.ConfigMapKeyRef.Name, r.ConfigMapKeyRef.Key)
				}
			}
		}
		for _, ef := range c.EnvFrom {
			if ef.ConfigMapRef == nil || ef.ConfigMapRef.Name != cm.Name {
				t.Errorf("%s: envFrom %+v", c.Name, ef)
			}
		}
	}
}

func labelsMatch(sel, labels map[string]string) bool {
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return len(sel) > 0
}

var envInHelp = regexp.MustCompile(`\(env (NFTREDIR_[A-Z0-9_]+)`)

func helpEnv(t *testing.T, bin string, args ...string) []string {
	t.Helper()
	out, err := exec.Command(bin, append(args, "--help")...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s --help: %v\n%s", bin, err, out)
	}
	var names []string
	for _, m := range envInHelp.FindAllStringSubmatch(string(out), -1) {
		names = append(names, m[1])
	}
	if len(names) == 0 {
		t.Fatalf("%s --help names no environment variable:\n%s", bin, out)
	}
	return names
}

// TestConfigMapNamesRealFlags: every variable the DaemonSet sets is the
// twin of a flag of the program it reaches, so no setting is silently
// ignored.
func TestConfigMapNamesRealFlags(t *testing.T) {
	m := loadManifests(t)
	known := map[string]bool{}
	for _, n := range helpEnv(t, buildDaemon(t)) {
		known[n] = true
	}
	for _, n := range helpEnv(t, buildCNI(t), "install") {
		known[n] = true
	}
	check := func(where, name string) {
		if !strings.HasPrefix(name, "NFTREDIR_") || known[name] {
			return
		}
		t.Errorf("%s: %s is no flag's twin (see nftredird --help, nftredir-cni install --help)", where, name)
	}
	for k := range m.configMaps[0].Data {
		check("ConfigMap", k)
	}
	for _, c := range m.daemonSets[0].Spec.Template.Spec.Containers {
		for _, e := range c.Env {
			check(c.Name, e.Name)
		}
	}
}

// TestInstallContainerEnvironment runs the install step with exactly the
// install container's environment (the ConfigMap, then its own env),
// its host directories moved under a scratch root, on a node with a
// Debian-like layout: /usr/lib/cni only and a bridge network at 1.0.0.
func TestInstallContainerEnvironment(t *testing.T) {
	m := loadManifests(t)
	in := container(t, &m.daemonSets[0], "install-cni")
	root := t.TempDir()
	env := []string{"PATH=/usr/bin:/bin"}
	for k, v := range m.configMaps[0].Data {
		env = append(env, k+"="+v)
	}
	for _, e := range in.Env {
		v := e.Value
		if r := e.ValueFrom; r != nil && r.ConfigMapKeyRef != nil {
			v = m.configMaps[0].Data[r.ConfigMapKeyRef.Key]
		}
		if strings.HasPrefix(e.Name, "NFTREDIR_CNI_") && strings.HasSuffix(e.Name, "_DIR") {
			var parts []string
			for p := range strings.SplitSeq(v, ",") {
				parts = append(parts, filepath.Join(root, p))
			}
			v = strings.Join(parts, ",")
		}
		env = append(env, e.Name+"="+v)
	}
	// What the kubelet gives every pod: the Service address of the API
	// and the service account's projected files (moved under root).
	sa := filepath.Join(root, "var/run/secrets/kubernetes.io/serviceaccount")
	env = append(env, "KUBERNETES_SERVICE_HOST=10.96.0.1", "KUBERNETES_SERVICE_PORT=443",
		"NFTREDIR_CNI_KUBE_TOKEN_FILE="+filepath.Join(sa, "token"), "NFTREDIR_CNI_KUBE_CA_FILE="+filepath.Join(sa, "ca.crt"))
	libCNI := filepath.Join(root, "host/usr/lib/cni")
	netd := filepath.Join(root, "host/etc/cni/net.d")
	for _, d := range []string{libCNI, netd, sa} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	conf := filepath.Join(netd, "10-bridge.conflist")
	if err := os.WriteFile(conf, []byte(`{"cniVersion":"1.0.0","name":"bridge","plugins":[{"type":"bridge","bridge":"cni0","ipam":{"type":"host-local","subnet":"10.85.0.0/16"}},{"type":"portmap","capabilities":{"portMappings":true}}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	for name, content := range map[string]string{"token": "projected-token", "ca.crt": "-----BEGIN CERTIFICATE-----\n"} {
		if err := os.WriteFile(filepath.Join(sa, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	bin := buildCNI(t)
	run := func(args ...string) (int, string) {
		cmd := exec.Command(bin, args...)
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return ee.ExitCode(), string(out)
		}
		if err != nil {
			t.Fatal(err)
		}
		return 0, string(out)
	}
	if code, out := run("install", "--check"); code != 1 {
		t.Errorf("--check before install: exit %d\n%s", code, out)
	}
	if code, out := run("install", "--once"); code != 0 {
		t.Fatalf("install --once: exit %d\n%s", code, out)
	}
	if code, out := run("install", "--check"); code != 0 {
		t.Errorf("--check after install: exit %d\n%s", code, out)
	}
	raw, _ := os.ReadFile(conf)
	var l struct {
		CNIVersion string           `json:"cniVersion"`
		Plugins    []map[string]any `json:"plugins"`
	}
	if err := json.Unmarshal(raw, &l); err != nil {
		t.Fatal(err)
	}
	if l.CNIVersion != "1.0.0" || len(l.Plugins) != 3 {
		t.Fatalf("conflist after install:\n%s", raw)
	}
	entry, _ := json.Marshal(l.Plugins[2])
	// NFTREDIR_KUBERNETES, the daemon's setting, puts the installer in
	// Kubernetes mode too: the entry names the kubeconfig as the host
	// sees it, with the daemon's default policy.
	want := `{"excludeNamespaces":["kube-system"],"kubernetes":{"kubeconfig":"/etc/cni/net.d/nftredir-cni.kubeconfig","modeDisabled":"none","modeEnabled":"ambient","modeLabel":"istio.io/dataplane-mode"},"socket":"/run/nftredir/nftredir.sock","timeout":"10s","type":"nftredir-cni"}`
	if string(entry) != want {
		t.Errorf("entry %s, want %s", entry, want)
	}
	if kc, err := os.ReadFile(filepath.Join(netd, "nftredir-cni.kubeconfig")); err != nil || !bytes.Contains(kc, []byte(`"token": "projected-token"`)) || !bytes.Contains(kc, []byte("https://10.96.0.1:443")) {
		t.Errorf("the plugin's kubeconfig next to the conflist: %v\n%s", err, kc)
	}
	self, _ := os.ReadFile(bin)
	if got, err := os.ReadFile(filepath.Join(libCNI, "nftredir-cni")); err != nil || !bytes.Equal(got, self) {
		t.Errorf("plugin binary in /usr/lib/cni: %v", err)
	}
	if _, err := os.Stat(filepath.Join(root, "host/opt/cni/bin")); !errors.Is(err, os.ErrNotExist) {
		t.Error("a bin dir the node lacks was created")
	}
}

// TestKustomizeBuilds renders the kustomization as kubectl apply -k
// would, when kubectl is installed.
func TestKustomizeBuilds(t *testing.T) {
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		t.Skip("kubectl not installed")
	}
	dir := t.TempDir()
	ents, err := os.ReadDir(kubeDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		raw, err := os.ReadFile(filepath.Join(kubeDir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(dir, e.Name()), raw, 0o644)
	}
	out, err := exec.Command(kubectl, "kustomize", dir).CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl kustomize: %v\n%s", err, out)
	}
	for _, want := range []string{"kind: DaemonSet", "kind: ConfigMap", "kind: Namespace", "image: nftredir:dev"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("rendered kustomization lacks %q", want)
		}
	}
}

// TestUninstallAndTaintRBAC: nodes get and patch (the readiness taint)
// and no more on nodes; the DaemonSet readable by its name only, in the
// namespace, bound to the ServiceAccount.
func TestUninstallAndTaintRBAC(t *testing.T) {
	m := loadManifests(t)
	var nodeVerbs []string
	for _, r := range m.roles {
		for _, rule := range r.Rules {
			if slices.Contains(rule.Resources, "nodes") {
				nodeVerbs = append(nodeVerbs, rule.Verbs...)
			}
		}
	}
	slices.Sort(nodeVerbs)
	if !slices.Equal(nodeVerbs, []string{"get", "patch"}) {
		t.Errorf("ClusterRole verbs on nodes %v; want exactly get and patch", nodeVerbs)
	}
	if len(m.nsRoles) != 1 || len(m.nsBindings) != 1 {
		t.Fatalf("%d Roles, %d RoleBindings; want one each", len(m.nsRoles), len(m.nsBindings))
	}
	r, b, ds := m.nsRoles[0], m.nsBindings[0], m.daemonSets[0]
	if r.Namespace != ds.Namespace || b.Namespace != ds.Namespace || b.RoleRef.Kind != "Role" || b.RoleRef.Name != r.Name {
		t.Errorf("Role %s/%s bound by %s/%s to %v; want the DaemonSet's namespace %s", r.Namespace, r.Name, b.Namespace, b.Name, b.RoleRef, ds.Namespace)
	}
	if len(b.Subjects) != 1 || b.Subjects[0].Name != ds.Spec.Template.Spec.ServiceAccountName {
		t.Errorf("RoleBinding subjects %v; want the DaemonSet's ServiceAccount", b.Subjects)
	}
	if len(r.Rules) != 1 || !slices.Equal(r.Rules[0].Resources, []string{"daemonsets"}) || !slices.Equal(r.Rules[0].ResourceNames, []string{ds.Name}) ||
		!slices.Equal(r.Rules[0].Verbs, []string{"get", "list", "watch"}) {
		t.Errorf("Role rules %+v; want get, list, watch on daemonsets named %s", r.Rules, ds.Name)
	}
	for _, c := range ds.Spec.Template.Spec.Containers {
		var pod []string
		for _, e := range c.Env {
			if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil {
				pod = append(pod, e.Name+"="+e.ValueFrom.FieldRef.FieldPath)
			}
		}
		if !slices.Contains(pod, "POD_NAME=metadata.name") || !slices.Contains(pod, "POD_NAMESPACE=metadata.namespace") {
			t.Errorf("container %s: Downward API env %v; want POD_NAME and POD_NAMESPACE", c.Name, pod)
		}
	}
}
