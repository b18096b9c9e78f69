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
	"sync"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"

	"github.com/nftredir/nftredir/internal/defaults"
	"github.com/nftredir/nftredir/internal/testkit/golden"
	"github.com/nftredir/nftredir/internal/testkit/helmbin"
	"github.com/nftredir/nftredir/internal/testkit/testenv"
	"github.com/nftredir/nftredir/kube"
)

const (
	chartDir  = "../charts/nftredir"
	namespace = "nftredir-system"
	release   = "nftredir"
)

// platforms are the chart's platform profiles; "" is the default.
var platforms = []string{"", "gke", "k3s", "k3d", "microk8s", "minikube", "openshift"}

var (
	helmOnce sync.Once
	helmPath string
	helmErr  error
)

func helm(t *testing.T) string {
	t.Helper()
	helmOnce.Do(func() { helmPath, helmErr = helmbin.Path() })
	if helmErr != nil {
		testenv.Missing(t, "%v", helmErr)
	}
	return helmPath
}

// runHelm runs helm and returns its stdout, stderr and error.
func runHelm(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	cmd := exec.Command(helm(t), args...)
	// No user config, cache or repositories of the machine's.
	home := t.TempDir()
	cmd.Env = append(os.Environ(), "HELM_CONFIG_HOME="+home, "HELM_CACHE_HOME="+home, "HELM_DATA_HOME="+home)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	return stdout.String(), stderr.String(), err
}

// render is `helm template` of the chart as `helm install -n
// nftredir-system nftredir charts/nftredir` would apply it, with more
// arguments (--set, -f) after.
func render(t *testing.T, args ...string) string {
	t.Helper()
	out, stderr, err := runHelm(t, append([]string{"template", release, chartDir, "--namespace", namespace}, args...)...)
	if err != nil {
		t.Fatalf("helm template %q: %v\n%s", args, err, stderr)
	}
	return out
}

func platformArgs(p string) []string {
	if p == "" {
		return nil
	}
	return []string{"--set", "platform=" + p}
}

func platformName(p string) string {
	if p == "" {
		return "default"
	}
	return p
}

// manifests are the rendered objects, decoded strictly into their API
// types: an unknown or misspelt field is an error.
type manifests struct {
	configMaps   []corev1.ConfigMap
	daemonSets   []appsv1.DaemonSet
	accounts     []corev1.ServiceAccount
	roles        []rbacv1.ClusterRole
	bindings     []rbacv1.ClusterRoleBinding
	nsRoles      []rbacv1.Role
	roleBindings []rbacv1.RoleBinding
	quotas       []corev1.ResourceQuota
	// hook is the objects of the uninstall hook (helm.sh/hook), kept
	// apart: helm makes them only on uninstall.
	hook hookObjects
}

type hookObjects struct {
	accounts     []corev1.ServiceAccount
	roles        []rbacv1.Role
	roleBindings []rbacv1.RoleBinding
	jobs         []batchv1.Job
}

var docSep = regexp.MustCompile(`(?m)^---\s*$`)

func strict[T any](t *testing.T, doc []byte) T {
	t.Helper()
	var v T
	if err := yaml.UnmarshalStrict(doc, &v); err != nil {
		t.Fatalf("%v in:\n%s", err, doc)
	}
	return v
}

func decode(t *testing.T, rendered string) *manifests {
	t.Helper()
	m := &manifests{}
	for _, doc := range docSep.Split(rendered, -1) {
		if strings.TrimSpace(stripComments(doc)) == "" {
			continue
		}
		var tm struct {
			metav1.TypeMeta `json:",inline"`
			Metadata        metav1.ObjectMeta `json:"metadata"`
		}
		if err := yaml.Unmarshal([]byte(doc), &tm); err != nil {
			t.Fatalf("%v in:\n%s", err, doc)
		}
		b := []byte(doc)
		if tm.Metadata.Annotations["helm.sh/hook"] != "" {
			switch tm.APIVersion + " " + tm.Kind {
			case "v1 ServiceAccount":
				m.hook.accounts = append(m.hook.accounts, strict[corev1.ServiceAccount](t, b))
			case "rbac.authorization.k8s.io/v1 Role":
				m.hook.roles = append(m.hook.roles, strict[rbacv1.Role](t, b))
			case "rbac.authorization.k8s.io/v1 RoleBinding":
				m.hook.roleBindings = append(m.hook.roleBindings, strict[rbacv1.RoleBinding](t, b))
			case "batch/v1 Job":
				m.hook.jobs = append(m.hook.jobs, strict[batchv1.Job](t, b))
			default:
				t.Errorf("unexpected hook object %s %s:\n%s", tm.APIVersion, tm.Kind, doc)
			}
			continue
		}
		switch tm.APIVersion + " " + tm.Kind {
		case "v1 ConfigMap":
			m.configMaps = append(m.configMaps, strict[corev1.ConfigMap](t, b))
		case "apps/v1 DaemonSet":
			m.daemonSets = append(m.daemonSets, strict[appsv1.DaemonSet](t, b))
		case "v1 ServiceAccount":
			m.accounts = append(m.accounts, strict[corev1.ServiceAccount](t, b))
		case "rbac.authorization.k8s.io/v1 ClusterRole":
			m.roles = append(m.roles, strict[rbacv1.ClusterRole](t, b))
		case "rbac.authorization.k8s.io/v1 ClusterRoleBinding":
			m.bindings = append(m.bindings, strict[rbacv1.ClusterRoleBinding](t, b))
		case "rbac.authorization.k8s.io/v1 Role":
			m.nsRoles = append(m.nsRoles, strict[rbacv1.Role](t, b))
		case "rbac.authorization.k8s.io/v1 RoleBinding":
			m.roleBindings = append(m.roleBindings, strict[rbacv1.RoleBinding](t, b))
		case "v1 ResourceQuota":
			m.quotas = append(m.quotas, strict[corev1.ResourceQuota](t, b))
		default:
			t.Errorf("unexpected object %s %s:\n%s", tm.APIVersion, tm.Kind, doc)
		}
	}
	if len(m.daemonSets) != 1 {
		t.Fatalf("%d DaemonSets; want one", len(m.daemonSets))
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

// configMap is the one whose name the containers' envFrom gives.
func (m *manifests) configMap(t *testing.T) corev1.ConfigMap {
	t.Helper()
	for _, cm := range m.configMaps {
		if cm.Name == m.daemonSets[0].Name {
			return cm
		}
	}
	t.Fatalf("no ConfigMap %s", m.daemonSets[0].Name)
	return corev1.ConfigMap{}
}

// TestHelmLint: helm lint --strict, with the defaults, each platform, and
// the optional objects rendered.
func TestHelmLint(t *testing.T) {
	cases := [][]string{{"--set", "cni.pluginConfig.logLevel=debug", "--set", "resourceQuota.enabled=true"}}
	for _, p := range platforms {
		cases = append(cases, platformArgs(p))
	}
	for _, more := range cases {
		args := append([]string{"lint", "--strict", chartDir, "--namespace", namespace}, more...)
		out, stderr, err := runHelm(t, args...)
		if err != nil {
			t.Errorf("helm %s: %v\n%s%s", strings.Join(args, " "), err, out, stderr)
		}
	}
}

// TestChartGolden: the rendered chart of each platform profile, as
// helm install with that profile would apply it. Rerun with -update
// after an intended change, and read the diff.
func TestChartGolden(t *testing.T) {
	for _, p := range platforms {
		t.Run(platformName(p), func(t *testing.T) {
			golden.Check(t, "chart-"+platformName(p), render(t, platformArgs(p)...))
		})
	}
}

// TestManifestsDecode: every object decodes strictly, sits in the
// release's namespace (or is cluster-wide RBAC), and the DaemonSet's
// service account and ConfigMap are rendered beside it.
func TestManifestsDecode(t *testing.T) {
	for _, p := range platforms {
		t.Run(platformName(p), func(t *testing.T) {
			m := decode(t, render(t, platformArgs(p)...))
			var metas []metav1.ObjectMeta
			for _, o := range m.configMaps {
				metas = append(metas, o.ObjectMeta)
			}
			for _, o := range m.accounts {
				metas = append(metas, o.ObjectMeta)
			}
			for _, o := range m.roleBindings {
				metas = append(metas, o.ObjectMeta)
			}
			for _, o := range m.quotas {
				metas = append(metas, o.ObjectMeta)
			}
			metas = append(metas, m.daemonSets[0].ObjectMeta)
			for _, o := range metas {
				if o.Namespace != namespace {
					t.Errorf("%s in namespace %q; want the release's %s", o.Name, o.Namespace, namespace)
				}
			}
			ds := m.daemonSets[0]
			sa := ds.Spec.Template.Spec.ServiceAccountName
			if !slices.ContainsFunc(m.accounts, func(a corev1.ServiceAccount) bool { return a.Name == sa && a.Namespace == namespace }) {
				t.Errorf("the DaemonSet's service account %s/%s is not rendered", namespace, sa)
			}
			if len(m.roles) != 1 || len(m.bindings) != 1 || m.bindings[0].RoleRef.Name != m.roles[0].Name ||
				len(m.bindings[0].Subjects) != 1 || m.bindings[0].Subjects[0].Name != sa || m.bindings[0].Subjects[0].Namespace != namespace {
				t.Errorf("ClusterRole %v bound by %+v; want the one role bound to %s/%s", m.roles, m.bindings, namespace, sa)
			}
			m.configMap(t)
		})
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

// checkDaemonSet holds the DaemonSet to what the daemon and the install
// step need, whatever the platform.
func checkDaemonSet(t *testing.T, m *manifests) {
	t.Helper()
	ds := &m.daemonSets[0]
	pod := ds.Spec.Template.Spec
	if pod.PriorityClassName != "system-node-critical" || !pod.HostNetwork || pod.HostPID || pod.DNSPolicy != corev1.DNSClusterFirstWithHostNet {
		t.Errorf("pod: priority %q hostNetwork %v hostPID %v dns %q", pod.PriorityClassName, pod.HostNetwork, pod.HostPID, pod.DNSPolicy)
	}
	if !slices.ContainsFunc(pod.Tolerations, func(tl corev1.Toleration) bool { return tl.Operator == corev1.TolerationOpExists && tl.Key == "" }) {
		t.Errorf("tolerations %v: the agent must tolerate every taint", pod.Tolerations)
	}
	if ds.Spec.UpdateStrategy.Type != appsv1.RollingUpdateDaemonSetStrategyType || ds.Spec.UpdateStrategy.RollingUpdate == nil ||
		ds.Spec.UpdateStrategy.RollingUpdate.MaxUnavailable.IntValue() != 1 {
		t.Errorf("update strategy %+v", ds.Spec.UpdateStrategy)
	}
	if !labelsMatch(ds.Spec.Selector.MatchLabels, ds.Spec.Template.Labels) {
		t.Errorf("selector %v does not select the template's labels %v", ds.Spec.Selector.MatchLabels, ds.Spec.Template.Labels)
	}
	if ds.Spec.Template.Labels["app.kubernetes.io/name"] != "nftredir" {
		t.Errorf("pod labels %v lack app.kubernetes.io/name=nftredir", ds.Spec.Template.Labels)
	}
	d := container(t, ds, "nftredird")
	in := container(t, ds, "install-cni")
	for _, c := range []*corev1.Container{d, in} {
		if c.Image != "nftredir:dev" {
			t.Errorf("%s: image %q", c.Name, c.Image)
		}
		sc := c.SecurityContext
		if sc == nil || sc.Privileged == nil || *sc.Privileged || sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) ||
			sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
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

	// Every mount has its volume, and every volume is a host dir but the
	// plugin's settings.
	volumes := map[string]corev1.Volume{}
	for _, v := range pod.Volumes {
		volumes[v.Name] = v
		if v.HostPath == nil && v.ConfigMap == nil {
			t.Errorf("volume %s is neither a hostPath nor a ConfigMap", v.Name)
		}
		if hp := v.HostPath; hp != nil && hp.Type != nil && *hp.Type == corev1.HostPathDirectoryOrCreate &&
			(hp.Path == "/usr" || strings.HasPrefix(filepath.Clean(hp.Path), "/usr/")) {
			t.Errorf("volume %s: DirectoryOrCreate of %s, on a /usr that is read-only on Bottlerocket, Flatcar, Talos and COS", v.Name, hp.Path)
		}
	}
	for _, c := range []*corev1.Container{d, in} {
		for _, vm := range c.VolumeMounts {
			v, ok := volumes[vm.Name]
			if !ok {
				t.Errorf("%s mounts unknown volume %s", c.Name, vm.Name)
				continue
			}
			if v.HostPath != nil && vm.MountPropagation != nil && *vm.MountPropagation != corev1.MountPropagationHostToContainer {
				t.Errorf("%s: %s propagation %s", c.Name, vm.Name, *vm.MountPropagation)
			}
		}
	}
	// The daemon's sockets and records sit where its defaults put them.
	mountOf := func(c *corev1.Container, path string) *corev1.VolumeMount {
		for i := range c.VolumeMounts {
			if c.VolumeMounts[i].MountPath == path {
				return &c.VolumeMounts[i]
			}
		}
		return nil
	}
	if mountOf(d, filepath.Dir(defaults.Socket)) == nil || mountOf(d, filepath.Dir(defaults.ZDSSocket)) == nil {
		t.Errorf("the daemon mounts nothing at %s or %s: %+v", filepath.Dir(defaults.Socket), filepath.Dir(defaults.ZDSSocket), d.VolumeMounts)
	}
	// Pods' namespaces, by the paths the runtime passes (containerd:
	// /var/run/netns/cni-<id>): every netns mount follows the host's new
	// mounts, read-only.
	netns := 0
	for _, vm := range d.VolumeMounts {
		if strings.HasPrefix(vm.Name, "netns") {
			netns++
			if vm.MountPropagation == nil || *vm.MountPropagation != corev1.MountPropagationHostToContainer || !vm.ReadOnly {
				t.Errorf("netns mount %s at %s without read-only HostToContainer propagation: namespaces created later would not appear", vm.Name, vm.MountPath)
			}
		}
	}
	if netns == 0 {
		t.Error("the daemon mounts no netns dir")
	}

	// configMapKeyRefs name keys that exist.
	cm := m.configMap(t)
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

func TestDaemonSet(t *testing.T) {
	for _, p := range platforms {
		t.Run(platformName(p), func(t *testing.T) { checkDaemonSet(t, decode(t, render(t, platformArgs(p)...))) })
	}
}

// hostLayout is what the rendered DaemonSet mounts from the node.
type hostLayout struct {
	binDirs   []string          // host paths, in NFTREDIR_CNI_BIN_DIR's order
	binTypes  []string          // their hostPath types
	confDir   string            // host path
	netns     map[string]string // host path -> mount path
	seLinux   string            // type, "" for none
	quota     bool
	sccBind   bool
	socketEnv string // NFTREDIR_CNI_SOCKET
}

// layout reads the host layout back from the rendered objects: the
// install container's environment names mount paths, which map to
// volumes, which name host paths.
func layout(t *testing.T, m *manifests) hostLayout {
	t.Helper()
	ds := &m.daemonSets[0]
	vols := map[string]*corev1.HostPathVolumeSource{}
	for _, v := range ds.Spec.Template.Spec.Volumes {
		vols[v.Name] = v.HostPath
	}
	host := func(c *corev1.Container, mountPath string) (string, string) {
		for _, vm := range c.VolumeMounts {
			if vm.MountPath == mountPath {
				hp := vols[vm.Name]
				if hp == nil {
					t.Fatalf("%s is not a hostPath mount", mountPath)
				}
				typ := ""
				if hp.Type != nil {
					typ = string(*hp.Type)
				}
				return hp.Path, typ
			}
		}
		t.Fatalf("%s: nothing mounted at %s", c.Name, mountPath)
		return "", ""
	}
	in := container(t, ds, "install-cni")
	d := container(t, ds, "nftredird")
	l := hostLayout{netns: map[string]string{}}
	for _, e := range in.Env {
		switch e.Name {
		case "NFTREDIR_CNI_BIN_DIR":
			for p := range strings.SplitSeq(e.Value, ",") {
				h, typ := host(in, p)
				l.binDirs = append(l.binDirs, h)
				l.binTypes = append(l.binTypes, typ)
			}
		case "NFTREDIR_CNI_CONF_DIR":
			l.confDir, _ = host(in, e.Value)
		}
	}
	for _, vm := range d.VolumeMounts {
		if strings.HasPrefix(vm.Name, "netns") {
			h, _ := host(d, vm.MountPath)
			l.netns[h] = vm.MountPath
		}
	}
	for _, c := range []*corev1.Container{d, in} {
		se := ""
		if c.SecurityContext.SELinuxOptions != nil {
			se = c.SecurityContext.SELinuxOptions.Type
		}
		if c == d {
			l.seLinux = se
		} else if se != l.seLinux {
			t.Errorf("SELinux type %q in %s, %q in nftredird", se, c.Name, l.seLinux)
		}
	}
	for _, q := range m.quotas {
		sel := q.Spec.ScopeSelector
		if sel != nil && len(sel.MatchExpressions) == 1 && sel.MatchExpressions[0].ScopeName == corev1.ResourceQuotaScopePriorityClass &&
			slices.Equal(sel.MatchExpressions[0].Values, []string{"system-node-critical"}) && !q.Spec.Hard.Pods().IsZero() {
			l.quota = true
		}
	}
	for _, rb := range m.roleBindings {
		if rb.RoleRef.Kind == "ClusterRole" && rb.RoleRef.Name == "system:openshift:scc:privileged" &&
			len(rb.Subjects) == 1 && rb.Subjects[0].Name == ds.Spec.Template.Spec.ServiceAccountName {
			l.sccBind = true
		}
	}
	l.socketEnv = m.configMap(t).Data["NFTREDIR_CNI_SOCKET"]
	// The daemon looks for pins exactly where they are mounted.
	var mounted []string
	for _, p := range l.netns {
		mounted = append(mounted, p)
	}
	slices.Sort(mounted)
	dirs := strings.Split(m.configMap(t).Data["NFTREDIR_NETNS_DIRS"], ",")
	slices.Sort(dirs)
	if !slices.Equal(dirs, mounted) {
		t.Errorf("NFTREDIR_NETNS_DIRS %v; want the netns mounts %v", dirs, mounted)
	}
	return l
}

// TestPlatformPaths: each profile mounts its platform's directories
// (files/platforms.yaml, from the platforms' docs and Istio's profiles),
// and values win over the profile.
func TestPlatformPaths(t *testing.T) {
	std := map[string]string{"/run/netns": "/var/run/netns"}
	k3sConf := "/var/lib/rancher/k3s/agent/etc/cni/net.d"
	for _, tc := range []struct {
		name     string
		args     []string
		binDirs  []string
		binTypes []string
		confDir  string
		netns    map[string]string
		seLinux  string
		quota    bool
		scc      bool
		socket   string
	}{
		{name: "default", binDirs: []string{"/opt/cni/bin"}, confDir: "/etc/cni/net.d", netns: std},
		{name: "gke", args: platformArgs("gke"), binDirs: []string{"/home/kubernetes/bin"}, confDir: "/etc/cni/net.d", netns: std, quota: true},
		{name: "k3s", args: platformArgs("k3s"), binDirs: []string{"/var/lib/rancher/k3s/data/cni"}, confDir: k3sConf, netns: std},
		{name: "k3d", args: platformArgs("k3d"), binDirs: []string{"/var/lib/rancher/k3s/data/cni", "/bin"}, binTypes: []string{"DirectoryOrCreate", "Directory"}, confDir: k3sConf, netns: std},
		{name: "microk8s", args: platformArgs("microk8s"), binDirs: []string{"/var/snap/microk8s/current/opt/cni/bin"}, confDir: "/var/snap/microk8s/current/args/cni-network", netns: std},
		{name: "minikube", args: platformArgs("minikube"), binDirs: []string{"/opt/cni/bin"}, confDir: "/etc/cni/net.d",
			netns: map[string]string{"/run/netns": "/var/run/netns", "/var/run/docker/netns": "/var/run/docker/netns"}},
		{name: "openshift", args: platformArgs("openshift"), binDirs: []string{"/var/lib/cni/bin"}, confDir: "/etc/cni/multus/net.d", netns: std, seLinux: "spc_t", scc: true},
		// Debian's containerd and plugins use /usr/lib/cni: it may be
		// listed, but is never created.
		{name: "debian", args: []string{"--set", "hostPaths.cniBinDirs={/opt/cni/bin,/usr/lib/cni}"},
			binDirs: []string{"/opt/cni/bin", "/usr/lib/cni"}, binTypes: []string{"DirectoryOrCreate", "Directory"}, confDir: "/etc/cni/net.d", netns: std},
		{name: "usr only", args: []string{"--set", "hostPaths.cniBinDirs={/usr/libexec/cni}"},
			binDirs: []string{"/usr/libexec/cni"}, binTypes: []string{"Directory"}, confDir: "/etc/cni/net.d", netns: std},
		// Values win over the profile, key by key.
		{name: "gke with values", args: []string{"--set", "platform=gke", "--set", "hostPaths.cniConfDir=/etc/cni/other", "--set", "resourceQuota.enabled=false",
			"--set", "hostPaths.runDir=/run/other"},
			binDirs: []string{"/home/kubernetes/bin"}, confDir: "/etc/cni/other", netns: std, socket: "/run/other/nftredir.sock"},
		{name: "quota without gke", args: []string{"--set", "resourceQuota.enabled=true"}, binDirs: []string{"/opt/cni/bin"}, confDir: "/etc/cni/net.d", netns: std, quota: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := layout(t, decode(t, render(t, tc.args...)))
			if tc.binTypes == nil {
				tc.binTypes = []string{"DirectoryOrCreate"}
			}
			if tc.socket == "" {
				tc.socket = defaults.Socket
			}
			if !slices.Equal(l.binDirs, tc.binDirs) || !slices.Equal(l.binTypes, tc.binTypes) {
				t.Errorf("CNI bin dirs %v (types %v); want %v (%v)", l.binDirs, l.binTypes, tc.binDirs, tc.binTypes)
			}
			if l.confDir != tc.confDir {
				t.Errorf("CNI conf dir %s; want %s", l.confDir, tc.confDir)
			}
			if len(l.netns) != len(tc.netns) {
				t.Errorf("netns mounts %v; want %v", l.netns, tc.netns)
			}
			for h, p := range tc.netns {
				if l.netns[h] != p {
					t.Errorf("netns mounts %v; want %v", l.netns, tc.netns)
				}
			}
			if l.seLinux != tc.seLinux || l.quota != tc.quota || l.sccBind != tc.scc {
				t.Errorf("SELinux %q, quota %v, SCC binding %v; want %q, %v, %v", l.seLinux, l.quota, l.sccBind, tc.seLinux, tc.quota, tc.scc)
			}
			if l.socketEnv != tc.socket {
				t.Errorf("the plugin's socket %s; want the daemon's as the node sees it, %s", l.socketEnv, tc.socket)
			}
		})
	}
}

// TestBadValues: values the chart cannot honour fail the install with a
// message naming them, instead of rendering something else.
func TestBadValues(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--set", "platform=eks"}, "platform"},
		{[]string{"--set", "captureMode=tproxy"}, "captureMode"},
		{[]string{"--set", "hostPaths.cniBinDirs={opt/cni/bin}"}, "cniBinDirs"},
		{[]string{"--set", "hostPaths.runDir="}, "runDir"},
		{[]string{"--set", "metricsPort=0"}, "metricsPort"},
		{[]string{"--set", "enrolment.enabled="}, "enabled"},
		{[]string{"--set", "dnsCapure=true"}, "dnsCapure"},
		{[]string{"--set", "image.pullPolicy=Sometimes"}, "pullPolicy"},
		{[]string{"--set", "enrolment.via=exec"}, "via"},
	} {
		_, stderr, err := runHelm(t, append([]string{"template", release, chartDir, "--namespace", namespace}, tc.args...)...)
		if err == nil || !strings.Contains(stderr, tc.want) {
			t.Errorf("helm template %q: %v, stderr %q; want an error naming %s", tc.args, err, stderr, tc.want)
		}
	}
}

// TestValues: the values that reach the daemon's and the installer's
// settings, and the pods.
func TestValues(t *testing.T) {
	m := decode(t, render(t,
		"--set", "image.repository=registry.example/nftredir", "--set", "image.tag=v1", "--set", "image.pullPolicy=Always",
		"--set", "enrolment.label=example.com/mesh", "--set", "enrolment.enabled=on", "--set", "enrolment.disabled=off",
		"--set", "enrolment.excludeNamespaces={kube-system,istio-system}",
		"--set", "dnsCapture=true", "--set", "metricsPort=9100", "--set", "logLevel=debug", "--set", "kubeletUID=null",
		"--set", "priorityClassName=", "--set", "nodeSelector.pool=mesh", "--set", "cni.confName=10-calico.conflist",
		"--set", "cni.pluginConfig.logLevel=debug", "--set", "resources.nftredird.limits.memory=512Mi",
		"--set", "readinessTaint=example.com/mesh-not-ready", "--set", "uninstall.releasePods=false",
	))
	ds := &m.daemonSets[0]
	cm := m.configMap(t)
	for k, want := range map[string]string{
		"NFTREDIR_DATAPLANE_MODE_LABEL":    "example.com/mesh",
		"NFTREDIR_DATAPLANE_MODE_ENABLED":  "on",
		"NFTREDIR_DATAPLANE_MODE_DISABLED": "off",
		"NFTREDIR_CNI_EXCLUDE_NAMESPACES":  "kube-system,istio-system",
		"NFTREDIR_DNS_CAPTURE":             "true",
		"NFTREDIR_METRICS_ADDRESS":         ":9100",
		"NFTREDIR_LOG_LEVEL":               "debug",
		"NFTREDIR_CNI_CONF_NAME":           "10-calico.conflist",
		"NFTREDIR_CNI_PLUGIN_CONFIG":       "/etc/nftredir/cni/plugin-config.json",
		"NFTREDIR_READINESS_TAINT":         "example.com/mesh-not-ready",
		"NFTREDIR_UNINSTALL_RELEASE_PODS":  "false",
	} {
		if cm.Data[k] != want {
			t.Errorf("%s = %q; want %q", k, cm.Data[k], want)
		}
	}
	if v, ok := cm.Data["NFTREDIR_KUBELET_UID"]; ok {
		t.Errorf("kubeletUID null still sets NFTREDIR_KUBELET_UID=%q", v)
	}
	d := container(t, ds, "nftredird")
	if d.Image != "registry.example/nftredir:v1" || d.ImagePullPolicy != corev1.PullAlways {
		t.Errorf("image %s %s", d.Image, d.ImagePullPolicy)
	}
	if d.ReadinessProbe.HTTPGet.Port.IntValue() != 9100 || d.LivenessProbe.HTTPGet.Port.IntValue() != 9100 || d.Ports[0].ContainerPort != 9100 {
		t.Errorf("probes and port not on metricsPort 9100: %+v %+v %+v", d.ReadinessProbe, d.LivenessProbe, d.Ports)
	}
	if got := d.Resources.Limits.Memory().String(); got != "512Mi" {
		t.Errorf("memory limit %s", got)
	}
	if ps := ds.Spec.Template.Spec; ps.PriorityClassName != "" || ps.NodeSelector["pool"] != "mesh" {
		t.Errorf("priority %q nodeSelector %v", ps.PriorityClassName, ps.NodeSelector)
	}
	var plugin *corev1.ConfigMap
	for i := range m.configMaps {
		if m.configMaps[i].Name == cm.Name+"-cni-plugin" {
			plugin = &m.configMaps[i]
		}
	}
	if plugin == nil || plugin.Data["plugin-config.json"] != `{"logLevel":"debug","type":"nftredir-cni"}` {
		t.Errorf("plugin config ConfigMap %+v", plugin)
	}
	// The DaemonSet's checksum follows the settings, so helm upgrade
	// rolls the pods when they change.
	a := decode(t, render(t)).daemonSets[0].Spec.Template.Annotations["checksum/config"]
	b := decode(t, render(t, "--set", "cleanupOnExit=true")).daemonSets[0].Spec.Template.Annotations["checksum/config"]
	if a == "" || a == b {
		t.Errorf("checksum/config %q and %q: a setting's change must change it", a, b)
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
	known := map[string]bool{}
	for _, n := range helpEnv(t, buildDaemon(t)) {
		known[n] = true
	}
	for _, n := range helpEnv(t, buildCNI(t), "install") {
		known[n] = true
	}
	// Every optional key rendered.
	m := decode(t, render(t, "--set", "cni.pluginConfig.logLevel=debug"))
	check := func(where, name string) {
		if !strings.HasPrefix(name, "NFTREDIR_") || known[name] {
			return
		}
		t.Errorf("%s: %s is no flag's twin (see nftredird --help, nftredir-cni install --help)", where, name)
	}
	for k := range m.configMap(t).Data {
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
// its mounts moved under a scratch root, on a node with a Debian-like
// layout: /usr/lib/cni only and a bridge network at 1.0.0, the chart
// told about /usr/lib/cni as a Debian user would.
func TestInstallContainerEnvironment(t *testing.T) {
	m := decode(t, render(t, "--set", "hostPaths.cniBinDirs={/opt/cni/bin,/usr/lib/cni}"))
	in := container(t, &m.daemonSets[0], "install-cni")
	cm := m.configMap(t)
	root := t.TempDir()
	// Every directory and file the installer may write (bin and conf
	// dirs, the ready file, the backups of the network's original bytes)
	// is moved under root: the test must not touch the machine's own.
	underRoot := func(name, v string) string {
		if !strings.HasPrefix(name, "NFTREDIR_") || !(strings.HasSuffix(name, "_DIR") || strings.HasSuffix(name, "_FILE")) {
			return v
		}
		var parts []string
		for p := range strings.SplitSeq(v, ",") {
			if filepath.IsAbs(p) {
				p = filepath.Join(root, p)
			}
			parts = append(parts, p)
		}
		return strings.Join(parts, ",")
	}
	env := []string{"PATH=/usr/bin:/bin"}
	for k, v := range cm.Data {
		env = append(env, k+"="+underRoot(k, v))
	}
	for _, e := range in.Env {
		v := e.Value
		if r := e.ValueFrom; r != nil && r.ConfigMapKeyRef != nil {
			v = cm.Data[r.ConfigMapKeyRef.Key]
		}
		env = append(env, e.Name+"="+underRoot(e.Name, v))
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
	if _, err := os.Stat(filepath.Join(libCNI, "nftredir-cni-helper")); err != nil {
		t.Errorf("helper binary in /usr/lib/cni: %v", err)
	}
	if _, err := os.Stat(filepath.Join(root, "host/opt/cni/bin")); !errors.Is(err, os.ErrNotExist) {
		t.Error("a bin dir the node lacks was created")
	}
}

var readmeRow = regexp.MustCompile("(?m)^\\| `([A-Za-z0-9_.]+)` \\|")

// TestValuesDocumented: the chart README's values table has a row for
// every value of values.yaml (a row may cover a map, e.g.
// resources.nftredird), and every row names a value that exists.
func TestValuesDocumented(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(chartDir, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var values map[string]any
	if err := yaml.Unmarshal(raw, &values); err != nil {
		t.Fatal(err)
	}
	var leaves []string
	var walk func(prefix string, v any)
	walk = func(prefix string, v any) {
		m, ok := v.(map[string]any)
		if !ok || len(m) == 0 {
			leaves = append(leaves, prefix)
			return
		}
		for k, sub := range m {
			walk(strings.TrimPrefix(prefix+"."+k, "."), sub)
		}
	}
	walk("", values)
	readme, err := os.ReadFile(filepath.Join(chartDir, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	var rows []string
	for _, m := range readmeRow.FindAllStringSubmatch(string(readme), -1) {
		rows = append(rows, m[1])
	}
	for _, l := range leaves {
		if !slices.ContainsFunc(rows, func(r string) bool { return l == r || strings.HasPrefix(l, r+".") }) {
			t.Errorf("value %s has no row in charts/nftredir/README.md", l)
		}
	}
	for _, r := range rows {
		if slices.Contains(platforms, r) { // the platforms' table
			continue
		}
		if !slices.ContainsFunc(leaves, func(l string) bool { return l == r || strings.HasPrefix(l, r+".") }) {
			t.Errorf("README row %s names no value of values.yaml", r)
		}
	}
}

// TestUninstallAndTaintRBAC: nodes get and patch (the readiness taint)
// and no more on nodes; the DaemonSet readable by its release's name
// only, in the release's namespace, bound to the ServiceAccount; both
// containers know their pod (Downward API), share the run dir, and the
// daemon waits for the install step's ready file.
func TestUninstallAndTaintRBAC(t *testing.T) {
	for _, name := range []string{"", "mesh-agent"} {
		t.Run("nameOverride="+name, func(t *testing.T) {
			m := decode(t, render(t, "--set", "nameOverride="+name))
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
			if len(m.nsRoles) != 1 || len(m.roleBindings) != 1 {
				t.Fatalf("%d Roles, %d RoleBindings; want one each", len(m.nsRoles), len(m.roleBindings))
			}
			r, b, ds := m.nsRoles[0], m.roleBindings[0], m.daemonSets[0]
			if name != "" && ds.Name != name {
				t.Fatalf("DaemonSet %s; want the nameOverride %s", ds.Name, name)
			}
			if r.Namespace != ds.Namespace || b.Namespace != ds.Namespace || b.RoleRef.Kind != "Role" || b.RoleRef.Name != r.Name {
				t.Errorf("Role %s/%s bound by %s/%s to %v; want the DaemonSet's namespace %s", r.Namespace, r.Name, b.Namespace, b.Name, b.RoleRef, ds.Namespace)
			}
			if len(b.Subjects) != 1 || b.Subjects[0].Name != ds.Spec.Template.Spec.ServiceAccountName || b.Subjects[0].Namespace != ds.Namespace {
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
				if !slices.ContainsFunc(c.VolumeMounts, func(v corev1.VolumeMount) bool {
					return v.Name == "run-nftredir" && v.MountPath == "/run/nftredir"
				}) {
					t.Errorf("container %s does not mount the run dir at /run/nftredir: %+v", c.Name, c.VolumeMounts)
				}
			}
			cm := m.configMap(t)
			for k, want := range map[string]string{
				"NFTREDIR_READINESS_TAINT":        kube.DefaultReadinessTaint, // the flag's default, one name
				"NFTREDIR_UNINSTALL_RELEASE_PODS": "true",
				"NFTREDIR_CNI_BACKUP_DIR":         "/run/nftredir/cni-backup",
			} {
				if cm.Data[k] != want {
					t.Errorf("%s = %q; want %q", k, cm.Data[k], want)
				}
			}
			// The daemon is ready only once the file the install step
			// writes exists: the same path, in the shared mount.
			if f := cm.Data["NFTREDIR_CNI_READY_FILE"]; f == "" || f != cm.Data["NFTREDIR_READY_FILE"] || !strings.HasPrefix(f, "/run/nftredir/") {
				t.Errorf("NFTREDIR_CNI_READY_FILE %q, NFTREDIR_READY_FILE %q; want the same file under /run/nftredir", f, cm.Data["NFTREDIR_READY_FILE"])
			}
		})
	}
}

// TestUninstallHook: helm uninstall first runs nftredird remove-daemonset
// against this release's DaemonSet, with an account that may get and
// delete that DaemonSet and nothing else, in a pod the DaemonSet does
// not select, on the node's network (the CNI chain is being taken
// away); uninstall.waitForPods "" leaves the hook out.
func TestUninstallHook(t *testing.T) {
	for _, name := range []string{"", "mesh-agent"} {
		t.Run("nameOverride="+name, func(t *testing.T) {
			m := decode(t, render(t, "--set", "nameOverride="+name))
			ds, h := m.daemonSets[0], m.hook
			if len(h.accounts) != 1 || len(h.roles) != 1 || len(h.roleBindings) != 1 || len(h.jobs) != 1 {
				t.Fatalf("hook objects: %d accounts, %d roles, %d bindings, %d jobs; want one each", len(h.accounts), len(h.roles), len(h.roleBindings), len(h.jobs))
			}
			sa, r, b, job := h.accounts[0], h.roles[0], h.roleBindings[0], h.jobs[0]
			for _, o := range []metav1.ObjectMeta{sa.ObjectMeta, r.ObjectMeta, b.ObjectMeta, job.ObjectMeta} {
				if o.Annotations["helm.sh/hook"] != "pre-delete" || o.Namespace != ds.Namespace {
					t.Errorf("%s: hook %q in %q; want pre-delete in %s", o.Name, o.Annotations["helm.sh/hook"], o.Namespace, ds.Namespace)
				}
			}
			if len(r.Rules) != 1 || !slices.Equal(r.Rules[0].Resources, []string{"daemonsets"}) || !slices.Equal(r.Rules[0].ResourceNames, []string{ds.Name}) ||
				!slices.Equal(r.Rules[0].Verbs, []string{"get", "delete"}) {
				t.Errorf("hook Role rules %+v; want get and delete on the daemonset %s", r.Rules, ds.Name)
			}
			if b.RoleRef.Name != r.Name || len(b.Subjects) != 1 || b.Subjects[0].Name != sa.Name {
				t.Errorf("hook RoleBinding %+v; want %s bound to %s", b, r.Name, sa.Name)
			}
			pod := job.Spec.Template.Spec
			if pod.ServiceAccountName != sa.Name || !pod.HostNetwork || len(pod.Containers) != 1 {
				t.Fatalf("hook pod: account %q, hostNetwork %v, %d containers", pod.ServiceAccountName, pod.HostNetwork, len(pod.Containers))
			}
			want := []string{"/usr/local/bin/nftredird", "remove-daemonset", "--namespace=" + ds.Namespace, "--name=" + ds.Name, "--timeout=2m"}
			if c := pod.Containers[0]; !slices.Equal(c.Command, want) || c.Image != ds.Spec.Template.Spec.Containers[0].Image {
				t.Errorf("hook container %v %v; want %v with the DaemonSet's image", c.Image, c.Command, want)
			}
			sel, err := metav1.LabelSelectorAsSelector(ds.Spec.Selector)
			if err != nil {
				t.Fatal(err)
			}
			if sel.Matches(labels.Set(job.Spec.Template.Labels)) {
				t.Errorf("the DaemonSet's selector %v selects the hook's pod %v", ds.Spec.Selector, job.Spec.Template.Labels)
			}
		})
	}
	if m := decode(t, render(t, "--set", "uninstall.waitForPods=")); len(m.hook.jobs)+len(m.hook.roles)+len(m.hook.accounts)+len(m.hook.roleBindings) != 0 {
		t.Errorf("uninstall.waitForPods empty still renders hook objects: %+v", m.hook)
	}
}

// enrolment.via nri: both containers read it from the ConfigMap, the
// daemon gets the runtime's NRI socket, and its pod carries the
// annotation the runtime's validator is told to accept, so that nftredir
// itself starts while its plugin is not registered. With cni the socket
// is not mounted.
func TestEnrolmentViaNRI(t *testing.T) {
	m := decode(t, render(t, "--set", "enrolment.via=nri", "--set", "hostPaths.nriDir=/run/containerd/nri"))
	if got := m.configMap(t).Data["NFTREDIR_ENROLMENT"]; got != defaults.EnrolmentNRI {
		t.Errorf("NFTREDIR_ENROLMENT = %q", got)
	}
	ds := &m.daemonSets[0]
	if got := ds.Spec.Template.Annotations[defaults.NRITolerateAnnotation]; got != "true" {
		t.Errorf("pod annotation %s = %q; want \"true\"", defaults.NRITolerateAnnotation, got)
	}
	mounted := func(ds *appsv1.DaemonSet) string {
		d := container(t, ds, "nftredird")
		for _, vm := range d.VolumeMounts {
			if vm.MountPath != filepath.Dir(defaults.NRISocket) {
				continue
			}
			for _, v := range ds.Spec.Template.Spec.Volumes {
				if v.Name == vm.Name && v.HostPath != nil {
					return v.HostPath.Path
				}
			}
		}
		return ""
	}
	if got := mounted(ds); got != "/run/containerd/nri" {
		t.Errorf("the daemon's %s is the host's %q; want /run/containerd/nri", filepath.Dir(defaults.NRISocket), got)
	}
	if got := mounted(&decode(t, render(t)).daemonSets[0]); got != "" {
		t.Errorf("with enrolment.via cni the daemon still mounts the host's %s", got)
	}
}
