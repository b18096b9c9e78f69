package kube

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	listerscorev1 "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"

	"github.com/nftredir/nftredir/capture"
	"github.com/nftredir/nftredir/internal/calltrace"
	"github.com/nftredir/nftredir/lifecycle"
	"github.com/nftredir/nftredir/netns"
	"github.com/nftredir/nftredir/netns/pins"
	nftredirv1 "github.com/nftredir/nftredir/proto/nftredir/v1"
)

// Enroller is what the agent needs of the daemon's lifecycle engine: enrol and
// release without the readiness gate, and read what is enrolled.
// *lifecycle.Manager is one.
type Enroller interface {
	AddPod(ctx context.Context, req *nftredirv1.AddPodRequest) (*nftredirv1.AddPodResponse, error)
	Release(ctx context.Context, uid string) (bool, error)
	Enrolled(uid string) (*nftredirv1.Pod, error)
	EnrolledUIDs() ([]string, error)
}

// Config is everything New needs. Zero values take the defaults where one
// exists.
type Config struct {
	// Client talks to the Kubernetes API. Required.
	Client kubernetes.Interface
	// NodeName is this node's name: only its pods are watched. Required.
	NodeName string
	// Selector is the enrolment policy. Zero: DefaultSelector().
	Selector Selector
	// Dir keeps the namespaces of pods seen through AddPod and the marks
	// of the annotations the agent wrote: state.AgentDir of the daemon's
	// state directory, so that one directory holds everything the daemon
	// keeps. Required, absolute.
	Dir string
	// Logger is the agent's logger.
	Logger hclog.Logger
	// Resync is the informers' resync period. Zero: 5m.
	Resync time.Duration
	// Sweep is how often every enrolled or seen pod is checked against
	// the API, besides the watch. Zero: 30s.
	Sweep time.Duration
	// LookupTimeout bounds a direct GET of a pod or namespace the cache
	// has not seen yet. Zero: 5s.
	LookupTimeout time.Duration
	// Pins finds the namespaces of running pods the agent never saw a
	// sandbox of (see discover.go). Nil: such pods wait for their next
	// sandbox.
	Pins *pins.Scanner
}

// Agent is the Kubernetes side of the daemon. It is the server's Policy,
// and runs a controller that keeps running pods in line with the policy.
type Agent struct {
	client   kubernetes.Interface
	node     string
	sel      Selector
	seen     *sightings
	marks    *marks
	log      hclog.Logger
	sweep    time.Duration
	lookup   time.Duration
	events   record.EventRecorder
	eventsB  record.EventBroadcaster
	pods     informers.SharedInformerFactory
	nss      informers.SharedInformerFactory
	podIndex cache.Indexer
	podList  listerscorev1.PodLister
	nsList   listerscorev1.NamespaceLister
	synced   []cache.InformerSynced
	queue    workqueue.TypedRateLimitingInterface[string]

	pins *pins.Scanner
	disc discovery

	enr   Enroller // set by Start
	ready atomic.Bool
	// own holds the pods the agent is enrolling itself (sync): their
	// Added must not queue them again, or every sync of a captured pod
	// would queue the next, re-applying its table without end.
	own sync.Map
	// applied holds, per captured pod, the option annotations the agent
	// last enrolled it with: a sync that finds them unchanged leaves the
	// pod alone (the server's reconcile keeps the kernel true to it).
	applied sync.Map
	// admitted holds the runtime's AddPods in flight (an *admission),
	// from Admit until Added. The pod's informer events come in while
	// the runtime starts its sandbox; a sync then must not enrol the pod
	// itself (a second table apply beside the sandbox), and once the
	// runtime's AddPod captured the pod its option annotations are
	// applied.
	admitted sync.Map
}

// admission is a runtime's AddPod in flight.
type admission struct {
	at time.Time
	// options are the pod's option annotations, once the policy wants
	// the pod captured.
	options *string
}

// inFlight reports whether a runtime's AddPod of uid is being admitted.
// One older than opTimeout is not believed: its Added never came.
func (a *Agent) inFlight(uid string) bool {
	v, ok := a.admitted.Load(uid)
	return ok && time.Since(v.(*admission).at) < opTimeout
}

var _ lifecycle.Policy = (*Agent)(nil)

const uidIndex = "uid"

// New builds the agent; nothing talks to the API until Start, except
// Admit's direct lookups.
func New(cfg Config) (*Agent, error) {
	if cfg.Client == nil {
		return nil, errors.New("kube config: Client is required")
	}
	if cfg.NodeName == "" {
		return nil, errors.New("kube config: the node name is required (--node-name or NODE_NAME)")
	}
	sel := cfg.Selector
	if sel == (Selector{}) {
		sel = DefaultSelector()
	}
	if err := sel.Validate(); err != nil {
		return nil, fmt.Errorf("kube config: %w", err)
	}
	log := cfg.Logger
	if log == nil {
		log = hclog.NewNullLogger()
	}
	seen, err := openSightings(cfg.Dir, log.Named("store"))
	if err != nil {
		return nil, fmt.Errorf("kube config: %w", err)
	}
	marks, err := openMarks(filepath.Join(cfg.Dir, marksDir), log.Named("store"))
	if err != nil {
		return nil, fmt.Errorf("kube config: %w", err)
	}
	resync := cmpOr(cfg.Resync, 5*time.Minute)
	a := &Agent{
		client: cfg.Client,
		node:   cfg.NodeName,
		sel:    sel,
		seen:   seen,
		marks:  marks,
		log:    log,
		sweep:  cmpOr(cfg.Sweep, 30*time.Second),
		lookup: cmpOr(cfg.LookupTimeout, 5*time.Second),
		pins:   cfg.Pins,
		disc:   discovery{unproven: map[string]*unproven{}, outcomes: map[string]uint64{}},
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "pods"}),
	}
	a.pods = informers.NewSharedInformerFactoryWithOptions(cfg.Client, resync,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.FieldSelector = "spec.nodeName=" + cfg.NodeName }),
		informers.WithTransform(stripManagedFields))
	a.nss = informers.NewSharedInformerFactoryWithOptions(cfg.Client, resync, informers.WithTransform(stripManagedFields))
	podInf := a.pods.Core().V1().Pods()
	nsInf := a.nss.Core().V1().Namespaces()
	if err := podInf.Informer().AddIndexers(cache.Indexers{uidIndex: podUIDIndex}); err != nil {
		return nil, err
	}
	a.podIndex = podInf.Informer().GetIndexer()
	a.podList = podInf.Lister()
	a.nsList = nsInf.Lister()
	a.synced = []cache.InformerSynced{podInf.Informer().HasSynced, nsInf.Informer().HasSynced}
	if _, err := podInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    a.podChanged,
		UpdateFunc: func(_, obj any) { a.podChanged(obj) },
		DeleteFunc: a.podChanged,
	}); err != nil {
		return nil, err
	}
	if _, err := nsInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    a.namespaceChanged,
		UpdateFunc: func(old, obj any) { a.namespaceUpdated(old, obj) },
	}); err != nil {
		return nil, err
	}
	a.eventsB = record.NewBroadcaster()
	a.events = a.eventsB.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "nftredird", Host: cfg.NodeName})
	return a, nil
}

func cmpOr(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}

// stripManagedFields keeps the caches small: the agent never reads them.
func stripManagedFields(obj any) (any, error) {
	if m, ok := obj.(metav1.ObjectMetaAccessor); ok {
		m.GetObjectMeta().SetManagedFields(nil)
	}
	return obj, nil
}

func podUIDIndex(obj any) ([]string, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return nil, nil
	}
	return []string{string(pod.UID)}, nil
}

func (a *Agent) podChanged(obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	if pod, ok := obj.(*corev1.Pod); ok {
		a.queue.Add(string(pod.UID))
	}
}

func (a *Agent) namespaceChanged(obj any) {
	ns, ok := obj.(*corev1.Namespace)
	if !ok {
		return
	}
	pods, err := a.podIndex.ByIndex(cache.NamespaceIndex, ns.Name)
	if err != nil {
		return
	}
	for _, p := range pods {
		a.podChanged(p)
	}
}

// namespaceUpdated re-checks the namespace's pods only when the policy
// label changed: namespaces are updated for many other reasons.
func (a *Agent) namespaceUpdated(old, obj any) {
	o, ok1 := old.(*corev1.Namespace)
	n, ok2 := obj.(*corev1.Namespace)
	if ok1 && ok2 && o.Labels[a.sel.Label] == n.Labels[a.sel.Label] {
		return
	}
	a.namespaceChanged(obj)
}

// Ready reports whether the caches have synced and every known pod was
// brought in line once.
func (a *Agent) Ready() bool { return a.ready.Load() }

// Start starts the watches, waits for them to sync, brings every pod the
// daemon knows of in line with the policy, then keeps doing so in the
// background until ctx ends. It returns once the first pass is done, so
// the daemon calls it before reporting SERVING. Without the API it waits
// (and says so), because serving on a guess could leave a mesh pod
// uncaptured.
func (a *Agent) Start(ctx context.Context, enr Enroller) error {
	a.enr = enr
	a.eventsB.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: a.client.CoreV1().Events("")})
	a.pods.Start(ctx.Done())
	a.nss.Start(ctx.Done())
	start := time.Now()
	for !cache.WaitForCacheSync(timeoutDone(ctx, 10*time.Second), a.synced...) {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		a.log.Warn("still waiting for the Kubernetes API to list this node's pods and the namespaces", "node", a.node, "waited", time.Since(start).Round(time.Second))
	}
	uids, err := a.knownUIDs(true)
	if err != nil {
		return err
	}
	for _, uid := range uids {
		if err := a.sync(ctx, uid); err != nil {
			a.log.Warn("could not bring the pod in line; retrying in the background", "pod", uid, "error", err)
			a.queue.AddRateLimited(uid)
		}
	}
	a.log.Info("pods in line with the Kubernetes API", "node", a.node, "pods", len(uids), "took", time.Since(start).Round(time.Millisecond))
	a.ready.Store(true)
	go a.work(ctx)
	go a.work(ctx)
	go a.sweepLoop(ctx)
	go func() {
		<-ctx.Done()
		a.queue.ShutDown()
		a.eventsB.Shutdown()
	}()
	return nil
}

// Close writes to disk what the agent still holds in memory only (the
// sightings of the last AddPods). The daemon calls it once the API has
// stopped serving, so that a clean stop loses nothing.
func (a *Agent) Close() { a.seen.close() }

// timeoutDone is a channel closed when ctx ends or d passes.
func timeoutDone(ctx context.Context, d time.Duration) <-chan struct{} {
	c, cancel := context.WithTimeout(ctx, d)
	go func() { <-c.Done(); cancel() }()
	return c.Done()
}

// knownUIDs is every pod the agent must look at: enrolled, seen, annotated
// by it, and (with cached) every pod of the node in the cache.
func (a *Agent) knownUIDs(cached bool) ([]string, error) {
	uids, err := a.enr.EnrolledUIDs()
	if err != nil {
		return nil, fmt.Errorf("list enrolled pods: %w", err)
	}
	uids = append(uids, a.seen.uids()...)
	uids = append(uids, a.marks.uids()...)
	if cached {
		for _, p := range a.podIndex.List() {
			if pod, ok := p.(*corev1.Pod); ok {
				uids = append(uids, string(pod.UID))
			}
		}
	}
	slices.Sort(uids)
	return slices.Compact(uids), nil
}

func (a *Agent) sweepLoop(ctx context.Context) {
	t := time.NewTicker(a.sweep)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		uids, err := a.knownUIDs(false)
		if err != nil {
			a.log.Warn("sweep", "error", err)
			continue
		}
		for _, uid := range uids {
			a.queue.Add(uid)
		}
	}
}

func (a *Agent) work(ctx context.Context) {
	for {
		uid, quit := a.queue.Get()
		if quit {
			return
		}
		err := a.sync(ctx, uid)
		switch {
		case err == nil:
			a.queue.Forget(uid)
		case isFinal(err):
			// The pod must change before another try can succeed; its
			// update event queues it again. The Event says why.
			a.log.Info("pod not enrolled until it changes", "pod", uid, "error", err)
			a.queue.Forget(uid)
		default:
			a.log.Warn("sync failed; retrying", "pod", uid, "error", err, "retries", a.queue.NumRequeues(uid))
			a.queue.AddRateLimited(uid)
		}
		a.queue.Done(uid)
	}
}

// isFinal: errors no retry of the same request can fix.
func isFinal(err error) bool {
	if err == nil {
		return false
	}
	switch lifecycle.Classify(err).Kind {
	case lifecycle.KindInvalid, lifecycle.KindPrecondition:
		return true
	}
	return false
}

// opTimeout bounds one enrolment or release the agent starts itself.
const opTimeout = 30 * time.Second

// sync brings one pod in line: captured if the policy wants it and its
// namespace is known, released if not, released and forgotten if it is
// gone from the API; and the annotation says which, for pods nftredir
// captured (annotate.go).
func (a *Agent) sync(ctx context.Context, uid string) error {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	log := a.log.With("pod", uid)
	defer a.settleDiscovery(uid, time.Now())
	// The sighting is read before the in-flight check and the record
	// after it: a sighting that a runtime's AddPod just wrote then comes
	// with that AddPod's record, or the pod is left to its Added, which
	// queues it again. Either way the agent does not enrol the pod beside
	// the runtime.
	seen := a.seen.get(uid)
	if a.inFlight(uid) {
		return nil
	}
	rec, err := a.enr.Enrolled(uid)
	if err != nil {
		return err
	}
	pod := a.cachedPodByUID(uid)
	if pod == nil {
		mark, marked := a.marks.get(uid)
		if rec == nil && seen == nil && !marked {
			return nil
		}
		ns, name := mark.Namespace, mark.Name
		if rec != nil {
			ns, name = rec.GetPodNamespace(), rec.GetPodName()
		}
		if seen != nil {
			ns, name = seen.Namespace, seen.Name
		}
		pod, err = a.getPod(ctx, ns, name, uid)
		if err != nil {
			return err
		}
		if pod == nil {
			if rec != nil {
				if _, err := a.enr.Release(ctx, uid); err != nil {
					return fmt.Errorf("release a pod gone from the API: %w", err)
				}
				log.Info("pod released: it is gone from the Kubernetes API", "namespace", ns, "name", name)
			}
			a.applied.Delete(uid)
			if err := a.marks.forget(uid); err != nil {
				return err
			}
			return a.seen.forget(uid)
		}
	}
	log = log.With("namespace", pod.Namespace, "name", pod.Name)
	ns, err := a.getNamespace(ctx, pod.Namespace)
	if err != nil {
		return err
	}
	want, why := a.sel.Captured(pod, ns)
	switch {
	case want && (rec == nil || seen != nil && seen.NetnsPath == rec.GetNetnsPath()):
		// A re-enrolment of a captured pod follows changed annotations;
		// when nothing changed it is a no-op in the kernel.
		if seen == nil {
			if seen, err = a.discover(ctx, log, pod); seen == nil {
				if err != nil {
					return err
				}
				return a.showNotCaptured(ctx, pod)
			}
		}
		if pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
			return nil
		}
		fp := optionAnnotations(pod.Annotations)
		if last, ok := a.applied.Load(uid); ok && rec != nil && last == fp {
			return a.showCaptured(ctx, pod, rec)
		}
		resp, err := a.enrolSeen(ctx, seen)
		if err != nil && rec == nil && pathUnusable(err) {
			// The remembered path no longer leads to the pod's namespace
			// (its sandbox was made again, the node restarted): forget it,
			// and look for the namespace among the runtime's pins now, as
			// for a running pod never seen. Left to its next event, the
			// pod would run uncaptured, listed nowhere, until the resync.
			if ferr := a.seen.forget(uid); ferr != nil {
				return ferr
			}
			log.Info("pod's remembered namespace is not its namespace any more; looking for it among the runtime's pins", "netns", seen.NetnsPath, "error", err)
			found, derr := a.discover(ctx, log, pod)
			if found == nil {
				if derr != nil {
					return derr
				}
				return a.showNotCaptured(ctx, pod)
			}
			if resp, err = a.enrolSeen(ctx, found); err != nil && pathUnusable(err) {
				_ = a.seen.forget(uid)
				a.refuse(log, pod, DiscoveryNotFound, ReasonNamespaceNotFound, err)
				return a.showNotCaptured(ctx, pod)
			}
		}
		if err != nil {
			if aerr := a.showIfCaptured(ctx, pod); aerr != nil {
				log.Warn("cannot annotate the pod", "error", aerr)
			}
			return err
		}
		if resp.GetNotCapturedReason() == "" {
			a.applied.Store(uid, fp)
			if rec == nil {
				log.Info("running pod enrolled: it matches the policy")
			}
		}
		if resp.GetNotCapturedReason() != "" {
			return a.showNotCaptured(ctx, pod)
		}
		return a.showCaptured(ctx, pod, resp.GetPod())
	case want:
		return a.showCaptured(ctx, pod, rec)
	case rec != nil:
		a.applied.Delete(uid)
		// Marked before the release: should the annotation's removal
		// fail, the retry must still know the annotation is ours.
		if err := a.marks.put(uid, podRef{pod.Namespace, pod.Name}); err != nil {
			return err
		}
		if _, err := a.enr.Release(ctx, uid); err != nil {
			return err
		}
		log.Info("pod released: the enrolment policy leaves it uncaptured", "reason", why)
		return a.showNotCaptured(ctx, pod)
	default:
		return a.showNotCaptured(ctx, pod)
	}
}

// enrolSeen enrols a pod through its sighting, as the agent's own
// enrolment (its Added does not queue the pod again).
func (a *Agent) enrolSeen(ctx context.Context, seen *sighting) (*nftredirv1.AddPodResponse, error) {
	a.own.Store(seen.PodUID, struct{}{})
	defer a.own.Delete(seen.PodUID)
	return a.enr.AddPod(withAgent(ctx), seen.request())
}

// optionAnnotations is the pod's option annotations (nftredir.io/ and
// Istio's) as one comparable string.
func optionAnnotations(annotations map[string]string) string {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(annotations)) {
		if strings.HasPrefix(k, annotationPrefix) || slices.Contains(istioAnnotations, k) {
			fmt.Fprintf(&b, "%q=%q;", k, annotations[k])
		}
	}
	return b.String()
}

func (s *sighting) request() *nftredirv1.AddPodRequest {
	req := &nftredirv1.AddPodRequest{
		PodUid:       s.PodUID,
		PodName:      s.Name,
		PodNamespace: s.Namespace,
		NetnsPath:    s.NetnsPath,
		PodIps:       s.PodIPs,
	}
	if len(s.Options) > 0 {
		o := &nftredirv1.RedirectOptions{}
		if proto.Unmarshal(s.Options, o) == nil {
			req.Options = o
		}
	}
	return req
}

func (a *Agent) cachedPodByUID(uid string) *corev1.Pod {
	objs, err := a.podIndex.ByIndex(uidIndex, uid)
	if err != nil || len(objs) == 0 {
		return nil
	}
	pod, _ := objs[0].(*corev1.Pod)
	return pod
}

// getPod reads the pod ns/name from the API directly, for what the cache
// has not seen yet. It returns nil when there is no such pod, or when the
// pod of that name is another one (not uid, nor uid's mirror).
func (a *Agent) getPod(ctx context.Context, ns, name, uid string) (*corev1.Pod, error) {
	if ns == "" || name == "" {
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(ctx, a.lookup)
	defer cancel()
	pod, err := a.client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, lifecycle.Errorf(lifecycle.KindUnavailable, "look up pod %s/%s in the Kubernetes API: %v; retry", ns, name, err)
	case !samePod(pod, uid) || pod.Spec.NodeName != a.node:
		return nil, nil
	}
	return pod, nil
}

// mirrorAnnotation carries, on a static pod's mirror in the API, the UID
// the kubelet gives the pod itself (and its sandboxes).
const mirrorAnnotation = "kubernetes.io/config.mirror"

func samePod(pod *corev1.Pod, uid string) bool {
	return string(pod.UID) == uid || pod.Annotations[mirrorAnnotation] == uid
}

func (a *Agent) getNamespace(ctx context.Context, name string) (*corev1.Namespace, error) {
	if ns, err := a.nsList.Get(name); err == nil {
		return ns, nil
	}
	ctx, cancel := context.WithTimeout(ctx, a.lookup)
	defer cancel()
	ns, err := a.client.CoreV1().Namespaces().Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, lifecycle.Errorf(lifecycle.KindUnavailable, "look up namespace %s in the Kubernetes API: %v; retry", name, err)
	}
	return ns, nil
}

type agentKey struct{}

// withAgent marks the agent's own enrolments: their path comes from a
// sighting, which must still name the same namespace.
func withAgent(ctx context.Context) context.Context { return context.WithValue(ctx, agentKey{}, true) }

func fromAgent(ctx context.Context) bool { v, _ := ctx.Value(agentKey{}).(bool); return v }

// Admit is the policy for one AddPod (lifecycle.Policy).
func (a *Agent) Admit(ctx context.Context, req *nftredirv1.AddPodRequest, id netns.ID) (lifecycle.Admission, error) {
	uid := req.GetPodUid()
	if !fromAgent(ctx) {
		a.admitted.Store(uid, &admission{at: time.Now()})
	}
	pod, err := a.podFor(ctx, req)
	calltrace.Mark(ctx, "pod_lookup")
	if err != nil {
		return lifecycle.Admission{}, err
	}
	if pod == nil {
		return lifecycle.Admission{NotCaptured: fmt.Sprintf("pod %s/%s (uid %s) is not on node %s in the Kubernetes API", req.GetPodNamespace(), req.GetPodName(), uid, a.node)}, nil
	}
	if fromAgent(ctx) {
		if s := a.seen.get(uid); s == nil || s.NetnsID != id.String() {
			return lifecycle.Admission{}, lifecycle.Errorf(lifecycle.KindPrecondition, "pod %s/%s: %s now names another namespace than the pod's sandbox; its next sandbox enrols it", pod.Namespace, pod.Name, req.GetNetnsPath())
		}
	} else {
		v := sighting{PodUID: uid, Namespace: pod.Namespace, Name: pod.Name, NetnsPath: req.GetNetnsPath(), NetnsID: id.String(), PodIPs: req.GetPodIps(), SeenAt: time.Now().UTC()}
		if req.GetOptions() != nil {
			v.Options, _ = proto.Marshal(req.GetOptions())
		}
		// Written after the answer: the agent reads it from memory at
		// once, and a crash before the write leaves the pod to discovery.
		a.seen.putLater(v)
	}
	calltrace.Mark(ctx, "sighting")
	ns, err := a.getNamespace(ctx, pod.Namespace)
	calltrace.Mark(ctx, "namespace_lookup")
	if err != nil {
		return lifecycle.Admission{}, err
	}
	if want, why := a.sel.Captured(pod, ns); !want {
		return lifecycle.Admission{NotCaptured: why}, nil
	}
	opts, err := Options(pod.Annotations, req.GetOptions())
	if err != nil {
		return lifecycle.Admission{}, lifecycle.Errorf(lifecycle.KindInvalid, "pod %s/%s: %v", pod.Namespace, pod.Name, err)
	}
	a.warnIgnored(pod)
	if !fromAgent(ctx) {
		fp := optionAnnotations(pod.Annotations)
		if v, ok := a.admitted.Load(uid); ok {
			v.(*admission).options = &fp
		}
	}
	out := proto.Clone(req).(*nftredirv1.AddPodRequest)
	out.PodName, out.PodNamespace, out.Options = pod.Name, pod.Namespace, opts
	sa := pod.Spec.ServiceAccountName
	if sa == "" {
		sa = "default" // what the API server's admission fills in
	}
	out.ServiceAccount = &sa
	if len(out.PodIps) == 0 {
		for _, ip := range pod.Status.PodIPs {
			out.PodIps = append(out.PodIps, ip.IP)
		}
	}
	if len(out.PodIps) == 0 && a.enr != nil {
		// The API can show no IPs for a moment (istio#60471). A pod
		// enrolled in this same namespace still has the addresses it was
		// enrolled with; dropping them would take them out of the node
		// probe set, and the kubelet's probes would be captured.
		if rec, err := a.enr.Enrolled(uid); err == nil && rec.GetNetnsId() == id.String() {
			out.PodIps = rec.GetPodIps()
		}
	}
	return lifecycle.Admission{Request: out}, nil
}

// podFor finds the request's pod: by namespace and name (what CNI_ARGS
// carry) in the cache or, if the cache has not seen it yet, in the API;
// by UID alone in the cache otherwise.
func (a *Agent) podFor(ctx context.Context, req *nftredirv1.AddPodRequest) (*corev1.Pod, error) {
	uid, ns, name := req.GetPodUid(), req.GetPodNamespace(), req.GetPodName()
	if ns == "" || name == "" {
		if pod := a.cachedPodByUID(uid); pod != nil {
			return pod, nil
		}
		return nil, lifecycle.Errorf(lifecycle.KindPrecondition, "pod_uid %s is not a pod on node %s; in Kubernetes mode give pod_namespace and pod_name too", uid, a.node)
	}
	if pod, err := a.podList.Pods(ns).Get(name); err == nil && samePod(pod, uid) {
		return pod, nil
	}
	pod, err := a.getPod(ctx, ns, name, uid)
	if err != nil || pod != nil {
		return pod, err
	}
	return nil, nil
}

// pathUnusable says whether an AddPod failed for its namespace path: the
// node refused it (gone, not a namespace, the host's, another pod's).
// Another agent's capture inside the namespace is not such a failure:
// the path is still the pod's, and the pod is enrolled through it once
// the namespace is clean.
func pathUnusable(err error) bool {
	return lifecycle.Classify(err).Kind == lifecycle.KindPrecondition && !errors.Is(err, capture.ErrForeignCapture)
}

// Added shows a failed enrolment on the pod and queues the pod so that
// its annotation follows the outcome (lifecycle.Policy).
func (a *Agent) Added(req *nftredirv1.AddPodRequest, captured bool, err error) {
	if err != nil && req.GetPodNamespace() != "" && req.GetPodName() != "" {
		reason := "CaptureFailed"
		if isFinal(err) {
			reason = "CaptureRefused"
		}
		ref := &corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: req.GetPodNamespace(), Name: req.GetPodName(), UID: types.UID(req.GetPodUid())}
		a.events.Eventf(ref, corev1.EventTypeWarning, reason, "nftredir cannot capture the pod's traffic: %s", lifecycle.Classify(err).Error())
	}
	// After an AddPod of the runtime's, sync annotates the pod; the
	// agent's own enrolments are already inside a sync that does.
	uid := req.GetPodUid()
	_, own := a.own.Load(uid)
	if v, ok := a.admitted.LoadAndDelete(uid); ok && captured && err == nil && !own {
		if fp := v.(*admission).options; fp != nil {
			a.applied.Store(uid, *fp)
		}
	}
	if a.ready.Load() && !own {
		a.queue.AddAfter(uid, afterSandbox)
	}
}

// afterSandbox is how long the agent waits, after a runtime's AddPod or a
// proxy's ack, before it brings the pod in line (its annotation patch
// among that work, and the API server's and istiod's work that follows).
// The runtime is still making the pod's sandbox then, after nftredir-cni
// returned, on the same cores: measured, that work was as much CPU as
// the AddPod itself inside the sandbox's RunPodSandbox. Nothing waits for
// it: the pod's containers start after the sandbox, its annotation only
// tells istiod that the pod is captured.
const afterSandbox = 100 * time.Millisecond

// Removed forgets the pod's namespace: its sandbox is going away
// (lifecycle.Policy).
func (a *Agent) Removed(uid string) {
	a.applied.Delete(uid)
	if err := a.seen.forget(uid); err != nil {
		a.log.Warn("cannot forget the pod's namespace", "pod", uid, "error", err)
	}
	if a.ready.Load() {
		a.queue.Add(uid)
	}
}
