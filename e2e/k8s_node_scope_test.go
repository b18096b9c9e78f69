package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/nftredir/nftredir/internal/kubelookup"
	"github.com/nftredir/nftredir/internal/testkit/kcluster"
	"github.com/nftredir/nftredir/internal/testkit/zdstest"
	"github.com/nftredir/nftredir/kube"
)

// nodeScopePolicy is the chart's ValidatingAdmissionPolicy and binding
// (templates/node-scope.yaml), release nftredir.
const nodeScopePolicy = "nftredir-node-scope"

// readerAccount is the chart's read-only ServiceAccount of the plugin's
// kubeconfig on the host.
const readerAccount = "nftredir-cni"

// asToken is a client of the cluster's API that authenticates with a
// bearer token, dialling inside the node namespace as a process on the
// node would.
func asToken(t *testing.T, c *kcluster.Cluster, token string) kubernetes.Interface {
	t.Helper()
	cs, err := kubernetes.NewForConfig(&rest.Config{
		Host:            c.APIServer,
		BearerToken:     token,
		TLSClientConfig: rest.TLSClientConfig{CAData: c.Config().CAData},
		Dial:            c.DialContext,
	})
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// projectedToken is the ServiceAccount token the kubelet projected into
// a pod, read where the kubelet keeps it on the node: what anyone with
// the node's files holds.
func projectedToken(t *testing.T, c *kcluster.Cluster, pod *corev1.Pod) string {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(c.Dir, "kubelet", "pods", string(pod.UID), "volumes", "kubernetes.io~projected", "kube-api-access-*", "token"))
	if err != nil || len(paths) != 1 {
		t.Fatalf("the projected token of pod %s/%s on the node: %v %v", pod.Namespace, pod.Name, paths, err)
	}
	b, err := os.ReadFile(paths[0])
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// whoami is the API's view of the client's credentials.
func whoami(t *testing.T, cs kubernetes.Interface) authenticationv1.UserInfo {
	t.Helper()
	r, err := cs.AuthenticationV1().SelfSubjectReviews().Create(t.Context(), &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("SelfSubjectReview: %v", err)
	}
	return r.Status.UserInfo
}

// refused checks that err is the API's Forbidden and says want.
func refused(t *testing.T, what string, err error, want string) {
	t.Helper()
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), want) {
		t.Errorf("%s: %v; want Forbidden saying %q", what, err, want)
		return
	}
	t.Logf("%s: refused: %v", what, err)
}

func allowed(t *testing.T, what string, err error) {
	t.Helper()
	if err != nil {
		t.Errorf("%s: %v; want it allowed", what, err)
		return
	}
	t.Logf("%s: allowed", what)
}

// TestK8sNodeScope: with the chart installed with its defaults, the
// agent's token (bound to its pod on the node, read from the node) may
// write only to its own Node, and there only remove the readiness taint,
// and only the redirection annotation of pods bound to its node; a token
// of its account not bound to a pod may write nothing; the plugin's
// kubeconfig on the host may only read. What the daemon writes still
// goes through: the readiness taint, the annotation after the proxy's
// ack and at release, helm uninstall.
func TestK8sNodeScope(t *testing.T) {
	taint := kube.DefaultReadinessTaint
	c := startClusterWith(t, kcluster.Options{RegisterWithTaints: []string{taint + ":NoSchedule"}})
	h := newDSHost(t, c)
	ci := installChart(t, c, h, nil)
	ctx := t.Context()
	admin := c.Client

	if _, err := admin.AdmissionregistrationV1().ValidatingAdmissionPolicies().Get(ctx, nodeScopePolicy, metav1.GetOptions{}); err != nil {
		t.Fatalf("helm install with the defaults made no policy %s: %v", nodeScopePolicy, err)
	}
	b, err := admin.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Get(ctx, nodeScopePolicy, metav1.GetOptions{})
	if err != nil || !slices.Equal(b.Spec.ValidationActions, []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny}) {
		t.Fatalf("binding %s: %v %+v; want Deny", nodeScopePolicy, err, b)
	}

	// Another node, with the readiness taint, and a pod bound to it: the
	// objects alone, no kubelet runs them.
	other := "nodescope-other"
	if _, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: other, Labels: map[string]string{"kubernetes.io/hostname": other}},
		Spec:       corev1.NodeSpec{Taints: []corev1.Taint{{Key: taint, Effect: corev1.TaintEffectNoSchedule}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	c.CreateNamespace(t, "plain", nil)
	elsewhere := c.CreatePod(t, c.StandinPod(t, "plain", "elsewhere", 0, other, "app"))
	t.Cleanup(func() {
		// No kubelet will confirm the pod's end: delete it at once,
		// before the cluster's teardown waits for every pod.
		admin.CoreV1().Pods("plain").Delete(t.Context(), "elsewhere", metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
		admin.CoreV1().Nodes().Delete(t.Context(), other, metav1.DeleteOptions{})
	})
	here := c.WaitPodReady(t, "plain", c.CreatePod(t, c.StandinPod(t, "plain", "here", 0, c.NodeName, "app")).Name)

	// The daemon's token as the node has it.
	agentToken := projectedToken(t, c, &ci.Pod)
	agent := asToken(t, c, agentToken)
	me := whoami(t, agent)
	if me.Username != "system:serviceaccount:"+dsNamespace+":nftredir" || !slices.Equal(me.Extra["authentication.kubernetes.io/node-name"], []string{c.NodeName}) {
		t.Fatalf("the daemon pod's token is %s with extra %v; want nftredir's, naming node %s", me.Username, me.Extra, c.NodeName)
	}
	t.Logf("the daemon pod's projected token: %s, node-name %v, pod-name %v", me.Username, me.Extra["authentication.kubernetes.io/node-name"], me.Extra["authentication.kubernetes.io/pod-name"])

	// The policy is in force once the API server has loaded it; a dry
	// run shows it without changing anything.
	labelPatch := []byte(`{"metadata":{"labels":{"example.com/node-scope":"probe"}}}`)
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := agent.CoreV1().Nodes().Patch(ctx, other, types.MergePatchType, labelPatch, metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}})
		if apierrors.IsForbidden(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the policy does not refuse a label on another Node 30s after install: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}

	mergeStatus := func(cs kubernetes.Interface, p *corev1.Pod, patch string) error {
		_, err := cs.CoreV1().Pods(p.Namespace).Patch(ctx, p.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}, "status")
		return err
	}
	jsonNode := func(cs kubernetes.Interface, node, patch string) error {
		_, err := cs.CoreV1().Nodes().Patch(ctx, node, types.JSONPatchType, []byte(patch), metav1.PatchOptions{})
		return err
	}
	redirection := func(value string) string {
		return fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, kube.RedirectionAnnotation, value)
	}
	addTaint := func(key string) {
		t.Helper()
		n, err := admin.CoreV1().Nodes().Get(ctx, c.NodeName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: key, Effect: corev1.TaintEffectNoSchedule})
		if _, err := admin.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	taintKeys := func(node string) []string {
		t.Helper()
		n, err := admin.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var keys []string
		for _, x := range n.Spec.Taints {
			keys = append(keys, x.Key+":"+string(x.Effect))
		}
		return keys
	}

	t.Run("agent's token: another node and its pods", func(t *testing.T) {
		_, err := agent.CoreV1().Nodes().Patch(ctx, other, types.MergePatchType, labelPatch, metav1.PatchOptions{})
		refused(t, "label Node "+other, err, "may change only Node "+c.NodeName+", not Node "+other)
		_, err = kube.RemoveTaint(ctx, agent, other, taint)
		refused(t, "remove the readiness taint of Node "+other, err, "may change only Node "+c.NodeName)
		if !slices.Contains(taintKeys(other), taint+":NoSchedule") {
			t.Errorf("Node %s lost its readiness taint: %v", other, taintKeys(other))
		}
		refused(t, "annotate pod plain/elsewhere (bound to "+other+")", mergeStatus(agent, elsewhere, redirection("enabled")),
			"may change only pods bound to it; pod plain/elsewhere is bound to "+other)
		// Events say where they come from; another node is not this one.
		_, err = agent.CoreV1().Events(metav1.NamespaceDefault).Create(ctx, testEvent(metav1.NamespaceDefault, nodeRef(other), c.NodeName), metav1.CreateOptions{})
		refused(t, "an Event about Node "+other, err, "may record Events only from that node")
		_, err = agent.CoreV1().Events("plain").Create(ctx, testEvent("plain", podRef(here), other), metav1.CreateOptions{})
		refused(t, "an Event from "+other, err, "may record Events only from that node")
		// The API itself refuses an Event about a pod of another
		// namespace; one that names no namespace for its pod is the
		// policy's.
		unplaced := podRef(here)
		unplaced.Namespace = ""
		_, err = agent.CoreV1().Events(metav1.NamespaceDefault).Create(ctx, testEvent(metav1.NamespaceDefault, unplaced, c.NodeName), metav1.CreateOptions{})
		refused(t, "an Event about pod here of no namespace", err, "may record Events only from that node")
		ev, err := agent.CoreV1().Events("plain").Create(ctx, testEvent("plain", podRef(here), c.NodeName), metav1.CreateOptions{})
		allowed(t, "an Event about pod plain/here from "+c.NodeName, err)
		// client-go's recorder counts a repeat with a patch.
		if err == nil {
			_, err = agent.CoreV1().Events("plain").Patch(ctx, ev.Name, types.StrategicMergePatchType, []byte(`{"count":2,"message":"again"}`), metav1.PatchOptions{})
			allowed(t, "counting a repeat of that Event", err)
			_, err = agent.CoreV1().Events("plain").Patch(ctx, ev.Name, types.StrategicMergePatchType, []byte(fmt.Sprintf(`{"source":{"host":%q}}`, other)), metav1.PatchOptions{})
			refused(t, "moving that Event to "+other, err, "may record Events only from that node")
		}
		_, err = agent.CoreV1().Events(metav1.NamespaceDefault).Create(ctx, testEvent(metav1.NamespaceDefault, nodeRef(c.NodeName), c.NodeName), metav1.CreateOptions{})
		allowed(t, "an Event about Node "+c.NodeName+" from it", err)
	})

	t.Run("agent's token: its own node's pods, the redirection annotation only", func(t *testing.T) {
		// As kube/annotate.go patches it, with the pod's UID as a
		// precondition, which the policy sees unchanged.
		withUID := func(value string) string {
			v := "null"
			if value != "" {
				v = fmt.Sprintf("%q", value)
			}
			return fmt.Sprintf(`{"metadata":{"uid":%q,"annotations":{%q:%s}}}`, here.UID, kube.RedirectionAnnotation, v)
		}
		allowed(t, "set plain/here's redirection annotation (uid precondition)", mergeStatus(agent, here, withUID(redirectionPending)))
		allowed(t, "remove it", mergeStatus(agent, here, withUID("")))
		allowed(t, "set it without the uid", mergeStatus(agent, here, redirection(redirectionEnabled)))
		allowed(t, "remove it without the uid", mergeStatus(agent, here, fmt.Sprintf(`{"metadata":{"annotations":{%q:null}}}`, kube.RedirectionAnnotation)))
		only := "the agent may change only the ambient.istio.io/redirection annotation"
		refused(t, "another annotation", mergeStatus(agent, here, `{"metadata":{"annotations":{"example.com/x":"y"}}}`), only)
		refused(t, "the redirection annotation and another", mergeStatus(agent, here,
			fmt.Sprintf(`{"metadata":{"annotations":{%q:"enabled","sidecar.istio.io/status":"{}"}}}`, kube.RedirectionAnnotation)), only)
		refused(t, "a label", mergeStatus(agent, here, `{"metadata":{"labels":{"istio.io/dataplane-mode":"ambient"}}}`), only)
		refused(t, "the status", mergeStatus(agent, here, `{"status":{"message":"changed"}}`), only)
		p, err := admin.CoreV1().Pods("plain").Get(ctx, "here", metav1.GetOptions{})
		if err != nil || len(p.Annotations) != 0 || len(p.Labels) != 0 || p.Status.Message != "" {
			t.Errorf("plain/here after the refused writes: %v annotations %v labels %v message %q", err, p.Annotations, p.Labels, p.Status.Message)
		}
	})

	t.Run("agent's token: its own Node, the readiness taint's removal only", func(t *testing.T) {
		addTaint("example.com/other")
		addTaint(taint)
		keys := taintKeys(c.NodeName)
		i := slices.Index(keys, "example.com/other:NoSchedule")
		only := "the agent may only remove the readiness taint " + taint + ":NoSchedule"
		refused(t, "remove another taint", jsonNode(agent, c.NodeName, fmt.Sprintf(`[{"op":"remove","path":"/spec/taints/%d"}]`, i)), only)
		refused(t, "add a taint", jsonNode(agent, c.NodeName, `[{"op":"add","path":"/spec/taints/-","value":{"key":"example.com/new","effect":"NoExecute"}}]`), only)
		refused(t, "cordon", jsonNode(agent, c.NodeName, `[{"op":"add","path":"/spec/unschedulable","value":true}]`), only)
		refused(t, "a label", jsonNode(agent, c.NodeName, `[{"op":"add","path":"/metadata/labels/example.com~1x","value":"y"}]`), only)
		refused(t, "an annotation", jsonNode(agent, c.NodeName, `[{"op":"add","path":"/metadata/annotations","value":{"example.com/x":"y"}}]`), only)
		refused(t, "the readiness taint's removal and a label at once", jsonNode(agent, c.NodeName, fmt.Sprintf(
			`[{"op":"remove","path":"/spec/taints/%d"},{"op":"add","path":"/metadata/labels/example.com~1x","value":"y"}]`, slices.Index(keys, taint+":NoSchedule"))), only)
		n, err := kube.RemoveTaint(ctx, agent, c.NodeName, taint)
		allowed(t, "remove the readiness taint as the daemon does", err)
		if got := taintKeys(c.NodeName); n != 1 || slices.Contains(got, taint+":NoSchedule") || !slices.Contains(got, "example.com/other:NoSchedule") {
			t.Errorf("removed %d; taints now %v; want the readiness taint gone and example.com/other kept", n, got)
		}
		nd, err := admin.CoreV1().Nodes().Get(ctx, c.NodeName, metav1.GetOptions{})
		if err != nil || nd.Spec.Unschedulable || nd.Labels["example.com/x"] != "" || nd.Annotations["example.com/x"] != "" {
			t.Fatalf("node after the refused writes: %v unschedulable %v labels %v annotations %v", err, nd.Spec.Unschedulable, nd.Labels, nd.Annotations)
		}
		nd.Spec.Taints = slices.DeleteFunc(nd.Spec.Taints, func(x corev1.Taint) bool { return x.Key == "example.com/other" })
		if _, err := admin.CoreV1().Nodes().Update(ctx, nd, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("agent's token: only the plugin's read-only token, for an hour", func(t *testing.T) {
		req := func(life *int64) *authenticationv1.TokenRequest {
			return &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: life}}
		}
		_, err := agent.CoreV1().ServiceAccounts(dsNamespace).CreateToken(ctx, readerAccount, req(ptr.To[int64](600)), metav1.CreateOptions{})
		allowed(t, readerAccount+"'s token for 10 minutes", err)
		_, err = agent.CoreV1().ServiceAccounts(dsNamespace).CreateToken(ctx, readerAccount, req(nil), metav1.CreateOptions{})
		allowed(t, readerAccount+"'s token for the API's default life", err)
		_, err = agent.CoreV1().ServiceAccounts(dsNamespace).CreateToken(ctx, readerAccount, req(ptr.To[int64](48*3600)), metav1.CreateOptions{})
		refused(t, readerAccount+"'s token for two days", err, "may request only tokens of "+dsNamespace+"/"+readerAccount+" living an hour at most")
	})

	t.Run("a token of the agent's account bound to no pod writes nothing", func(t *testing.T) {
		addTaint(taint)
		unbound := asToken(t, c, c.ServiceAccountToken(t, dsNamespace, "nftredir"))
		if me := whoami(t, unbound); len(me.Extra["authentication.kubernetes.io/node-name"]) != 0 {
			t.Fatalf("a TokenRequest token with no bound object names a node: %v", me.Extra)
		}
		if _, err := unbound.CoreV1().Nodes().Get(ctx, c.NodeName, metav1.GetOptions{}); err != nil {
			t.Errorf("reads are not the policy's: %v", err)
		}
		noNode := "this token names no node"
		_, err := kube.RemoveTaint(ctx, unbound, c.NodeName, taint)
		refused(t, "remove the readiness taint", err, noNode)
		refused(t, "annotate plain/here", mergeStatus(unbound, here, redirection(redirectionEnabled)), noNode)
		_, err = unbound.CoreV1().Events("plain").Create(ctx, testEvent("plain", podRef(here), c.NodeName), metav1.CreateOptions{})
		refused(t, "an Event", err, noNode)
	})

	// The daemon's own writes under the policy, in force now: a
	// restarted daemon removes the readiness taint put back on its node
	// (the test above left it there), and annotates pods.
	t.Run("the daemon's writes go through", func(t *testing.T) {
		if !slices.Contains(taintKeys(c.NodeName), taint+":NoSchedule") {
			addTaint(taint)
		}
		took := ci.restartPod(t)
		deadline := time.Now().Add(kcluster.DefaultTimeout)
		for slices.Contains(taintKeys(c.NodeName), taint+":NoSchedule") {
			if time.Now().After(deadline) {
				t.Fatalf("the restarted daemon did not remove the readiness taint: %v\n%s", taintKeys(c.NodeName), dsLogs(c))
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Logf("the new daemon pod %s Ready %s after the delete; readiness taint removed", ci.Pod.Name, took.Round(time.Millisecond))
		// One Event from each daemon's removal: at install, and now.
		evs, err := admin.CoreV1().Events(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{FieldSelector: "reason=ReadinessTaintRemoved"})
		if err != nil || len(evs.Items) != 2 {
			t.Errorf("ReadinessTaintRemoved Events: %v %d; want 2, the second from the restarted daemon", err, len(evs.Items))
		}

		m := &meshCluster{Cluster: c, api: ci.API, zds: h.zdsSocket()}
		c.CreateNamespace(t, "mesh", map[string]string{meshLabel: meshEnabled})
		web := m.runPod(t, "mesh", "web")
		m.waitEnrolled(t, web.UID, true)
		m.waitAnnotation(t, web, redirectionPending)
		peer := zdstest.Dial(t, h.zdsSocket())
		start := time.Now()
		peer.Handshake()
		m.waitAnnotation(t, web, redirectionEnabled)
		t.Logf("mesh/web: %s, then %s %s after the proxy acked it", redirectionPending, redirectionEnabled, time.Since(start).Round(time.Millisecond))
		peer.Close()
		m.label(t, "namespace", "", "mesh", "")
		m.waitEnrolled(t, web.UID, false)
		m.waitAnnotation(t, web, "")
		t.Log("mesh/web released: its annotation removed")
	})

	// The plugin's kubeconfig on the host: the read-only account's token,
	// not the agent's.
	kc := filepath.Join(c.CNIConfDir, "nftredir-cni.kubeconfig")
	raw, err := os.ReadFile(kc)
	if err != nil {
		t.Fatal(err)
	}
	var k kubelookup.Kubeconfig
	if err := json.Unmarshal(raw, &k); err != nil || len(k.Users) != 1 {
		t.Fatalf("%s: %v", kc, err)
	}
	readerToken := k.Users[0].User.Token
	reader := asToken(t, c, readerToken)

	t.Run("the host kubeconfig reads and writes nothing", func(t *testing.T) {
		if me := whoami(t, reader); me.Username != "system:serviceaccount:"+dsNamespace+":"+readerAccount {
			t.Fatalf("the host kubeconfig's token is %s; want %s's", me.Username, readerAccount)
		}
		lc, err := kubelookup.Load(kc, kubelookup.WithDialContext(c.DialContext))
		if err != nil {
			t.Fatal(err)
		}
		defer lc.Close()
		if _, err := lc.Pod(ctx, "plain", "here"); err != nil {
			t.Errorf("the plugin's lookup of a pod with the host kubeconfig: %v", err)
		}
		if _, err := lc.NamespaceLabels(ctx, "plain"); err != nil {
			t.Errorf("the plugin's lookup of a namespace with the host kubeconfig: %v", err)
		}
		addTaint(taint)
		writes := map[string]error{}
		writes["remove the readiness taint of its node"] = jsonNode(reader, c.NodeName,
			fmt.Sprintf(`[{"op":"remove","path":"/spec/taints/%d"}]`, slices.Index(taintKeys(c.NodeName), taint+":NoSchedule")))
		writes["label its Node"] = func() error {
			_, err := reader.CoreV1().Nodes().Patch(ctx, c.NodeName, types.MergePatchType, labelPatch, metav1.PatchOptions{})
			return err
		}()
		writes["annotate a pod of its node (pods/status)"] = mergeStatus(reader, here, redirection(redirectionEnabled))
		writes["annotate a pod"] = func() error {
			_, err := reader.CoreV1().Pods("plain").Patch(ctx, "here", types.MergePatchType, []byte(redirection(redirectionEnabled)), metav1.PatchOptions{})
			return err
		}()
		writes["create a pod"] = func() error {
			_, err := reader.CoreV1().Pods("plain").Create(ctx, c.StandinPod(t, "plain", "by-reader", 0, c.NodeName, "app"), metav1.CreateOptions{})
			return err
		}()
		writes["delete a pod"] = reader.CoreV1().Pods("plain").Delete(ctx, "here", metav1.DeleteOptions{})
		writes["create an Event"] = func() error {
			_, err := reader.CoreV1().Events("plain").Create(ctx, testEvent("plain", podRef(here), c.NodeName), metav1.CreateOptions{})
			return err
		}()
		writes["label a namespace"] = func() error {
			_, err := reader.CoreV1().Namespaces().Patch(ctx, "plain", types.MergePatchType, []byte(`{"metadata":{"labels":{"istio.io/dataplane-mode":"ambient"}}}`), metav1.PatchOptions{})
			return err
		}()
		writes["delete a namespace"] = reader.CoreV1().Namespaces().Delete(ctx, "plain", metav1.DeleteOptions{})
		writes["request a token"] = func() error {
			_, err := reader.CoreV1().ServiceAccounts(dsNamespace).CreateToken(ctx, readerAccount, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
			return err
		}()
		for what, err := range writes {
			refused(t, "host kubeconfig: "+what, err, "forbidden")
		}
		if got := taintKeys(c.NodeName); !slices.Contains(got, taint+":NoSchedule") {
			t.Errorf("the readiness taint is gone after the host kubeconfig's refused writes: %v", got)
		}
		// Left for the next daemon to remove, as a node registered with it.
	})

	t.Run("helm uninstall removes the policy and the read-only identity", func(t *testing.T) {
		helm(t, c, "uninstall", dsRelease, "--namespace", dsNamespace, "--wait", "--timeout", "120s")
		if _, err := admin.AdmissionregistrationV1().ValidatingAdmissionPolicies().Get(ctx, nodeScopePolicy, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("policy %s after helm uninstall: %v; want NotFound", nodeScopePolicy, err)
		}
		if _, err := admin.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Get(ctx, nodeScopePolicy, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("binding %s after helm uninstall: %v; want NotFound", nodeScopePolicy, err)
		}
		if _, err := admin.CoreV1().ServiceAccounts(dsNamespace).Get(ctx, readerAccount, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("ServiceAccount %s after helm uninstall: %v; want NotFound", readerAccount, err)
		}
		if _, err := os.Stat(kc); !os.IsNotExist(err) {
			t.Errorf("%s after helm uninstall: %v; want it removed", kc, err)
		}
		// Its account gone, the token the file held is dead too, once
		// the API server's cache of authenticated tokens (10s) forgets it.
		deadline := time.Now().Add(30 * time.Second)
		for {
			_, err := reader.CoreV1().Namespaces().Get(ctx, "plain", metav1.GetOptions{})
			if apierrors.IsUnauthorized(err) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the host kubeconfig's token 30s after helm uninstall: %v; want Unauthorized", err)
			}
			time.Sleep(time.Second)
		}
	})
}

func podRef(p *corev1.Pod) corev1.ObjectReference {
	return corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: p.Namespace, Name: p.Name, UID: p.UID}
}

func nodeRef(name string) corev1.ObjectReference {
	return corev1.ObjectReference{Kind: "Node", APIVersion: "v1", Name: name}
}

// testEvent is an Event in ns about obj, saying it comes from host, as
// the daemon's recorder writes them.
func testEvent(ns string, obj corev1.ObjectReference, host string) *corev1.Event {
	return &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{GenerateName: "nodescope.", Namespace: ns},
		InvolvedObject: obj,
		Reason:         "NodeScopeTest",
		Message:        "written by TestK8sNodeScope",
		Type:           corev1.EventTypeNormal,
		Source:         corev1.EventSource{Component: "nftredird", Host: host},
	}
}
