// Package plugin is nftredir-cni: a chained CNI plugin that enrols each new
// pod with nftredird, so that no pod starts without its traffic captured.
//
// It is a thin client. Every capture decision (ports, modes, what a
// namespace path may be) is the daemon's; the plugin turns CNI calls into
// API calls, passes the previous plugin's result through unchanged, and
// maps the daemon's answers to CNI error codes (see errors.go).
//
// One decision is the plugin's own, and only when the daemon cannot
// answer: in Kubernetes mode (the entry's "kubernetes" key) it reads the
// pod and its namespace from the API, through nftredir-cni-helper, and
// lets a pod the enrolment policy would not capture start without the
// daemon (kubernetes.go, docs/blast-radius.md).
package plugin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
	"github.com/hashicorp/go-hclog"

	"github.com/nftredir/nftredir/cmd/nftredir-cni/internal/rpc"
)

// Versions are the CNI spec versions the plugin speaks. 0.3.0 is the
// first with chaining and a prevResult, which ADD needs; the default
// networks of Flannel, Calico, Cilium and kindnet are 0.3.1. Commands a
// version lacks never reach the plugin: pkg/skel refuses CHECK below 0.4.0
// and STATUS and GC below 1.1.0 with code 2 (incompatible version), as the
// spec asks.
var Versions = version.PluginSupports("0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0")

// Plugin runs one CNI command. The binary uses os.Stdout and os.Stderr;
// tests use buffers.
type Plugin struct {
	// Stdout receives the result, and nothing else.
	Stdout io.Writer
	// Stderr receives the log unless the config names a logFile.
	Stderr io.Writer
	// Helper is nftredir-cni-helper, which reads the API when the daemon
	// cannot answer; empty is the one beside the running executable.
	Helper string
	// SweepInterval is how often ADD looks for attachment records of
	// sandboxes that are gone (see attachments.go). Zero means
	// DefaultSweepInterval; a negative value sweeps on every ADD.
	SweepInterval time.Duration
}

// DefaultSweepInterval bounds the records a node keeps to its live
// attachments plus those whose sandboxes vanished without a DEL in the
// last few minutes, at the cost of reading every record once per interval.
const DefaultSweepInterval = 5 * time.Minute

// New returns the plugin as the binary runs it.
func New() *Plugin {
	return &Plugin{Stdout: os.Stdout, Stderr: os.Stderr}
}

// Funcs is what skel.PluginMainFuncs dispatches to.
func (p *Plugin) Funcs() skel.CNIFuncs {
	return skel.CNIFuncs{Add: p.Add, Del: p.Del, Check: p.Check, Status: p.Status, GC: p.GC}
}

// run is one command's context: its config, log, daemon client and
// attachment records.
type run struct {
	conf   *Conf
	log    hclog.Logger
	ctx    context.Context
	cl     *rpc.Client
	atts   attachments
	closer func()
}

func (p *Plugin) begin(cmd string, args *skel.CmdArgs, withOptions bool, opts ...rpc.Option) (*run, error) {
	conf, unknown, err := ParseConf(args.StdinData, withOptions)
	if err != nil {
		return nil, err
	}
	log, closeLog := newLogger(conf, p.Stderr)
	log = log.With("cmd", cmd, "network", conf.Name)
	if args.ContainerID != "" {
		log = log.With("container", args.ContainerID, "ifname", args.IfName)
	}
	if len(unknown) > 0 {
		log.Warn("ignoring unknown config keys (misspelt?)", "keys", strings.Join(unknown, ","))
	}
	cl, err := rpc.New(conf.Socket, append([]rpc.Option{rpc.WithTimeout(conf.Timeout)}, opts...)...)
	if err != nil {
		closeLog()
		return nil, types.NewError(ErrInternal, fmt.Sprintf("connect to nftredird at %s", conf.Socket), err.Error())
	}
	ctx, cancel := context.WithTimeout(context.Background(), conf.Timeout)
	return &run{
		conf: conf,
		log:  log,
		ctx:  ctx,
		cl:   cl,
		atts: attachments{dir: conf.DataDir},
		closer: func() {
			cl.Close()
			cancel()
			closeLog()
		},
	}, nil
}

func (r *run) end() { r.closer() }

// do runs one command with its run and logs its failure, which the
// runtime may only show as a one-line message.
func (p *Plugin) do(cmd string, args *skel.CmdArgs, withOptions bool, f func(*run, *skel.CmdArgs) error, opts ...rpc.Option) error {
	r, err := p.begin(cmd, args, withOptions, opts...)
	if err != nil {
		return err
	}
	defer r.end()
	if err := f(r, args); err != nil {
		r.log.Error("failed", "error", err)
		return err
	}
	return nil
}

// Add enrols the pod and passes the previous result through.
func (p *Plugin) Add(args *skel.CmdArgs) error { return p.do("ADD", args, true, p.add) }

// Del releases the pod. It succeeds whenever there is nothing left to
// release: the pod is not enrolled, its namespace is gone, or the daemon
// cannot be reached (the daemon drops records of vanished namespaces by
// itself). A successful DEL removes the attachment's record.
func (p *Plugin) Del(args *skel.CmdArgs) error { return p.do("DEL", args, false, p.del) }

// Check fails unless the daemon has the pod enrolled, with this namespace
// and these IPs, and its rules are in place as recorded.
func (p *Plugin) Check(args *skel.CmdArgs) error { return p.do("CHECK", args, false, p.check) }

// Status reports whether the daemon can take ADDs. It asks once, without
// retrying: the runtime asks again, and a prompt answer is worth more.
func (p *Plugin) Status(args *skel.CmdArgs) error {
	return p.do("STATUS", args, false, p.status, rpc.WithRetry(1, 0))
}

// GC releases the pods this plugin enrolled, on this network, through an
// attachment the runtime no longer lists. Pods enrolled by anyone else
// (another network, a node proxy, an operator) have no attachment record
// here and are never touched.
func (p *Plugin) GC(args *skel.CmdArgs) error { return p.do("GC", args, false, p.gc) }

// started is about when the runtime's exec of the plugin reached Go code.
var started = time.Now()

// msSince is the time since t in milliseconds, to the microsecond.
func msSince(t time.Time) float64 { return float64(time.Since(t).Microseconds()) / 1000 }

func (p *Plugin) add(r *run, args *skel.CmdArgs) error {
	prev, err := r.conf.ParsePrevResult()
	if err != nil {
		return err
	}
	if prev == nil {
		return types.NewError(types.ErrInvalidNetworkConfig,
			"nftredir-cni must be chained after a plugin that assigns IPs: it got no prevResult",
			"list it after the primary plugin (e.g. bridge with host-local) in the network's plugins")
	}
	id, err := ParseIdentity(args.Args, args.ContainerID)
	if err != nil {
		return err
	}
	log := r.log.With("pod", id.Key, "k8s_namespace", id.Namespace, "k8s_name", id.Name)
	if r.conf.Excluded(id.Namespace) {
		log.Info("namespace excluded from capture; not enrolling")
		return p.print(prev, r.conf.CNIVersion)
	}
	ips, err := podIPs(prev)
	if err != nil {
		return err
	}
	if len(ips) == 0 {
		log.Warn("prevResult has no IP addresses for the pod; enrolling without pod IPs")
	}

	att := Attachment{
		Network:      r.conf.Name,
		ContainerID:  args.ContainerID,
		IfName:       args.IfName,
		PodUID:       id.Key,
		KeySource:    id.Source,
		PodNamespace: id.Namespace,
		PodName:      id.Name,
		Netns:        args.Netns,
	}
	before, err := r.atts.Get(att.Network, att.ContainerID, att.IfName)
	if err != nil {
		log.Warn("unreadable attachment record; replacing it", "error", err)
	}
	// Written before AddPod, so that a record the daemon keeps always has
	// a file naming it as ours (see attachments.go).
	if err := r.atts.Put(att); err != nil {
		return types.NewError(types.ErrIOFailure, fmt.Sprintf("record attachment in %s", r.conf.DataDir), err.Error())
	}
	req := &rpc.AddPodRequest{
		PodUID:       id.Key,
		PodName:      id.Name,
		PodNamespace: id.Namespace,
		NetnsPath:    args.Netns,
		PodIPs:       ips,
		Options:      r.conf.Options,
	}
	called := time.Now()
	resp, err := r.cl.AddPod(r.ctx, req)
	// How long the daemon's answer took, as the plugin saw it, and the
	// plugin's run so far (from its package's initialisation): the
	// benchmark of pod start reads them.
	timing := []any{"call_ms", msSince(called), "run_ms", msSince(started)}
	if err != nil {
		// The daemon changes nothing on a failed AddPod, except perhaps
		// when the deadline cut it short; only then must the file stay
		// for DEL or GC to find.
		if before == nil && !mayHaveApplied(err) {
			if derr := r.atts.Delete(att.Network, att.ContainerID, att.IfName); derr != nil {
				log.Warn("could not remove attachment record", "error", derr)
			}
		}
		if r.conf.Kube != nil && cannotAnswer(err) {
			return p.withoutDaemon(r, id, prev, err, log)
		}
		return daemonError(err, fmt.Sprintf("enrol pod %s", id.Key), r.conf.Socket)
	}
	if why := resp.NotCapturedReason; why != "" || resp.Pod == nil {
		log.Info("pod not captured: the daemon's enrolment policy leaves it alone", append([]any{"reason", why, "netns", args.Netns}, timing...)...)
	} else {
		log.Info("pod enrolled", append([]any{"netns", args.Netns, "ips", strings.Join(ips, ","), "netns_id", resp.Pod.NetnsID,
			"mode", resp.Pod.CaptureMode.String()}, timing...)...)
	}
	p.sweep(r, att)
	return p.print(prev, r.conf.CNIVersion)
}

// sweep removes the records of sandboxes that vanished without a DEL. It
// never fails the ADD: a record left behind costs a little disk, not a pod.
func (p *Plugin) sweep(r *run, self Attachment) {
	interval := p.SweepInterval
	if interval == 0 {
		interval = DefaultSweepInterval
	}
	n, ran, err := r.atts.Sweep(time.Now(), interval, self)
	if err != nil {
		r.log.Warn("sweeping attachment records", "error", err)
	}
	if ran {
		r.log.Debug("swept attachment records of vanished sandboxes", "removed", n)
	}
}

func mayHaveApplied(err error) bool {
	c := rpc.CodeOf(err)
	return c == rpc.DeadlineExceeded || c == rpc.Canceled || c == rpc.Unknown
}

// print writes the previous result in the config's version, which is
// what types.PrintResult does, to p.Stdout.
func (p *Plugin) print(prev types.Result, cniVersion string) error {
	res, err := prev.GetAsVersion(cniVersion)
	if err != nil {
		return types.NewError(types.ErrIncompatibleCNIVersion, fmt.Sprintf("convert prevResult to cniVersion %s", cniVersion), err.Error())
	}
	if err := res.PrintTo(p.Stdout); err != nil {
		return types.NewError(types.ErrIOFailure, "print result", err.Error())
	}
	return nil
}

// podIPs returns the addresses the previous plugins gave the pod: those on
// interfaces inside the sandbox, or not tied to an interface. Addresses of
// host-side interfaces (a bridge's gateway) are not the pod's.
func podIPs(prev types.Result) ([]string, error) {
	res, err := current.NewResultFromResult(prev)
	if err != nil {
		return nil, types.NewError(types.ErrDecodingFailure, "read prevResult", err.Error())
	}
	var ips []string
	for _, ipc := range res.IPs {
		if i := ipc.Interface; i != nil && *i >= 0 && *i < len(res.Interfaces) && res.Interfaces[*i].Sandbox == "" {
			continue
		}
		a, ok := netip.AddrFromSlice(ipc.Address.IP)
		if !ok {
			continue
		}
		if s := a.Unmap().String(); !slices.Contains(ips, s) {
			ips = append(ips, s)
		}
	}
	return ips, nil
}

// target is the pod a DEL or CHECK is about: from the attachment record
// when ADD wrote one, else from CNI_ARGS as ADD would have derived it.
type target struct {
	key   string
	netns string
	att   *Attachment
	// skip: the namespace is excluded and ADD enrolled nothing.
	skip bool
}

func (r *run) target(args *skel.CmdArgs) (target, error) {
	att, err := r.atts.Get(r.conf.Name, args.ContainerID, args.IfName)
	if err != nil {
		r.log.Warn("unreadable attachment record; deriving the pod from CNI_ARGS", "error", err)
	}
	if att != nil {
		return target{key: att.PodUID, netns: att.Netns, att: att}, nil
	}
	id, err := ParseIdentity(args.Args, args.ContainerID)
	if err != nil {
		return target{}, err
	}
	return target{key: id.Key, netns: args.Netns, skip: r.conf.Excluded(id.Namespace)}, nil
}

func (p *Plugin) del(r *run, args *skel.CmdArgs) error {
	t, err := r.target(args)
	if err != nil {
		return err
	}
	if t.skip {
		r.log.Debug("namespace excluded from capture; nothing to release")
		return nil
	}
	log := r.log.With("pod", t.key)
	if err := p.release(r, args, t, log); err != nil {
		return err
	}
	// The runtime forgets an attachment whose DEL succeeded, and no
	// runtime in use calls GC: a record kept now would stay forever.
	if err := r.atts.Delete(r.conf.Name, args.ContainerID, args.IfName); err != nil {
		log.Warn("could not remove attachment record", "error", err)
	}
	return nil
}

// release releases the pod of a DEL unless it is not this attachment's to
// release. A nil error is DEL's success.
//
// It is one RemovePod, with two fields that make a check and a wait
// unnecessary. netns_path is the namespace this attachment enrolled the
// pod with: if a newer sandbox of the pod enrolled it since, the daemon
// refuses with FailedPrecondition and changes nothing, without a window
// between looking and releasing. namespace_teardown says the runtime
// deletes the namespace right after DEL, so the daemon leaves the pod's
// table and routing to go with it instead of deleting them first, which
// would make the runtime's next step (the veth's deletion) wait for the
// kernel to free them.
func (p *Plugin) release(r *run, args *skel.CmdArgs, t target, log hclog.Logger) error {
	netns := args.Netns
	if netns == "" && t.att != nil {
		// A runtime's repeated DEL after removing the namespace: the
		// record still names the one this attachment enrolled.
		netns = t.att.Netns
	}
	if netns == "" {
		// Without its record and its namespace nothing tells this
		// attachment's pod from a newer sandbox of the same pod (a
		// runtime's second DEL after removing the namespace). Its own
		// capture went with the namespace; the daemon drops the record.
		log.Info("no attachment record and no namespace; nothing of ours to release")
		return nil
	}
	if holder := r.otherHolder(t.key, netns, args.ContainerID, args.IfName); holder != "" {
		log.Info("pod still enrolled through another attachment; leaving it", "attachment", holder)
		return nil
	}
	existed, err := r.cl.RemovePod(r.ctx, &rpc.RemovePodRequest{PodUID: t.key, NetnsPath: netns, NamespaceTeardown: true})
	switch {
	case isGone(err):
		log.Warn("nftredird unreachable; treating the pod as released", "socket", r.conf.Socket, "error", err)
		return nil
	case rpc.CodeOf(err) == rpc.FailedPrecondition:
		// A newer sandbox of the same pod enrolled it since; its capture
		// is not this attachment's to remove.
		log.Info("pod enrolled with another namespace since; leaving it", "ours", netns, "daemon", rpc.MessageOf(err))
		return nil
	case err != nil:
		return r.delError(log, t, err)
	case !existed:
		log.Info("pod not enrolled; nothing to release")
	default:
		log.Info("pod released", "netns", netns)
	}
	return nil
}

// delError decides whether a daemon error fails DEL. Only a fault the
// daemon could not classify does, because retrying may then help; a
// request it refuses would be refused again, and failing DEL for it would
// only leave the sandbox undeletable.
func (r *run) delError(log hclog.Logger, t target, err error) error {
	switch rpc.CodeOf(err) {
	case rpc.Internal, rpc.Unknown:
		return daemonError(err, fmt.Sprintf("release pod %s", t.key), r.conf.Socket)
	}
	log.Warn("nftredird refused the release; nothing of ours to remove", "error", err)
	return nil
}

// otherHolder names another attachment of this pod in the namespace this
// DEL releases, if any: a pod attached through several networks must stay
// enrolled until the last attachment goes. Attachments of other
// namespaces (an older sandbox never DELeted) do not count: the release
// is of this namespace's enrolment only. The attachments of one sandbox
// share its container id, so only that container's records are read.
func (r *run) otherHolder(key, netns, containerID, ifname string) string {
	all, err := r.atts.OfContainer(containerID)
	if err != nil {
		r.log.Warn("could not read every attachment record", "error", err)
	}
	for _, a := range all {
		self := a.Network == r.conf.Name && a.ContainerID == containerID && a.IfName == ifname
		if !self && a.PodUID == key && a.Netns == netns {
			return a.Network + "/" + a.ContainerID + "/" + a.IfName
		}
	}
	return ""
}

func (p *Plugin) check(r *run, args *skel.CmdArgs) error {
	prev, err := r.conf.ParsePrevResult()
	if err != nil {
		return err
	}
	t, err := r.target(args)
	if err != nil {
		return err
	}
	if t.skip {
		return nil
	}
	got, err := r.cl.GetPod(r.ctx, t.key)
	if rpc.CodeOf(err) == rpc.NotFound {
		return types.NewError(ErrNotCaptured, fmt.Sprintf("pod %s is not enrolled in nftredird", t.key),
			"ADD did not enrol it, or the daemon lost its state directory; delete and re-create the sandbox")
	}
	if err != nil {
		return daemonError(err, fmt.Sprintf("check pod %s", t.key), r.conf.Socket)
	}
	pod := got.Pod
	if pod == nil {
		pod = &rpc.Pod{}
	}
	if pod.NetnsPath != args.Netns {
		return types.NewError(ErrNotCaptured, fmt.Sprintf("pod %s is enrolled with network namespace %s, not %s", t.key, pod.NetnsPath, args.Netns), "")
	}
	if prev != nil {
		want, err := podIPs(prev)
		if err != nil {
			return err
		}
		if !sameAddrs(want, pod.PodIPs) {
			return types.NewError(ErrNotCaptured, fmt.Sprintf("pod %s is enrolled with IPs [%s], but the network gave it [%s]",
				t.key, strings.Join(pod.PodIPs, " "), strings.Join(want, " ")), "")
		}
	}
	if st := got.SyncStatus; st != rpc.SyncInSync {
		detail := got.Detail
		if detail == "" {
			detail = "no detail from the daemon"
		}
		return types.NewError(ErrNotCaptured, fmt.Sprintf("traffic capture of pod %s is %s: %s", t.key, describeSync(st), detail),
			"the daemon repairs it on its next reconcile; nftredirctl shows the live rules")
	}
	r.log.Debug("pod in sync", "pod", t.key)
	return nil
}

func describeSync(st rpc.SyncStatus) string {
	switch st {
	case rpc.SyncDrifted:
		return "drifted (its rules were changed)"
	case rpc.SyncAbsent:
		return "absent (its rules are missing)"
	case rpc.SyncNetnsGone:
		return "gone (its network namespace no longer exists)"
	}
	return "unknown (" + st.String() + ")"
}

func sameAddrs(a, b []string) bool {
	norm := func(in []string) []netip.Addr {
		out := make([]netip.Addr, 0, len(in))
		for _, s := range in {
			if x, err := netip.ParseAddr(s); err == nil && !slices.Contains(out, x.Unmap()) {
				out = append(out, x.Unmap())
			}
		}
		slices.SortFunc(out, netip.Addr.Compare)
		return out
	}
	return slices.Equal(norm(a), norm(b))
}

func (p *Plugin) status(r *run, _ *skel.CmdArgs) error {
	h, err := r.cl.Health(r.ctx)
	if err != nil {
		return types.NewError(ErrPluginNotAvailable, unreachable(r.conf.Socket, rpc.MessageOf(err)),
			fmt.Sprintf("grpc code %s from %s", rpc.CodeOf(err), r.conf.Socket))
	}
	if !h.Serving() {
		return types.NewError(ErrPluginNotAvailable,
			fmt.Sprintf("nftredird at %s is not serving (server %s, %s %s): it is starting up or shutting down",
				r.conf.Socket, h.Server, rpc.ServiceName, h.Service), "")
	}
	return nil
}

func (p *Plugin) gc(r *run, _ *skel.CmdArgs) error {
	all, err := r.atts.List("")
	if err != nil {
		// A record that cannot be read might be the one that keeps a pod
		// alive; removing anything now could remove a live pod's capture.
		return types.NewError(types.ErrIOFailure, "read attachment records; nothing removed", err.Error())
	}
	isValid := func(a Attachment) bool {
		return a.Network != r.conf.Name || slices.Contains(r.conf.ValidAttachments, types.GCAttachment{ContainerID: a.ContainerID, IfName: a.IfName})
	}
	var stale []Attachment
	for _, a := range all {
		if !isValid(a) {
			stale = append(stale, a)
		}
	}
	if len(stale) == 0 {
		r.log.Debug("no stale attachments")
		return nil
	}
	pods, err := r.cl.ListPods(r.ctx)
	if err != nil {
		return daemonError(err, "list pods for GC", r.conf.Socket)
	}
	enrolled := map[string]*rpc.Pod{}
	for _, pod := range pods {
		enrolled[pod.PodUID] = pod
	}
	var errs []error
	var firstErr *types.Error
	for _, a := range stale {
		log := r.log.With("pod", a.PodUID, "container", a.ContainerID, "ifname", a.IfName)
		forget := func() {
			if err := r.atts.Delete(a.Network, a.ContainerID, a.IfName); err != nil {
				errs = append(errs, err)
			}
		}
		pod := enrolled[a.PodUID]
		if pod == nil {
			log.Debug("stale attachment; pod not enrolled")
			forget()
			continue
		}
		live := slices.ContainsFunc(all, func(b Attachment) bool {
			return b != a && b.PodUID == a.PodUID && b.Netns == pod.NetnsPath && isValid(b)
		})
		switch {
		case pod.NetnsPath != a.Netns:
			log.Info("stale attachment; pod enrolled with another namespace since, leaving it", "netns", pod.NetnsPath)
			forget()
		case live:
			log.Info("stale attachment; pod still enrolled through a valid one, leaving it")
			forget()
		default:
			// The precondition covers the pod moving since ListPods; no
			// teardown, because a stale sandbox's namespace may survive,
			// and then its capture must go now.
			_, err := r.cl.RemovePod(r.ctx, &rpc.RemovePodRequest{PodUID: a.PodUID, NetnsPath: a.Netns})
			if rpc.CodeOf(err) == rpc.FailedPrecondition {
				log.Info("stale attachment; pod enrolled with another namespace since, leaving it", "daemon", rpc.MessageOf(err))
				forget()
				continue
			}
			if err != nil {
				log.Error("GC could not release pod", "error", err)
				if firstErr == nil {
					firstErr = daemonError(err, fmt.Sprintf("release stale pod %s", a.PodUID), r.conf.Socket)
				}
				errs = append(errs, fmt.Errorf("release %s: %w", a.PodUID, err))
				continue
			}
			log.Info("released pod of a stale attachment", "netns", a.Netns)
			forget()
		}
	}
	if len(errs) == 0 {
		return nil
	}
	if firstErr == nil {
		firstErr = types.NewError(types.ErrIOFailure, "GC could not remove every stale attachment record", "")
	}
	firstErr.Details = errors.Join(errs...).Error()
	return firstErr
}

// newLogger logs to the config's logFile, or to stderr; stdout carries the
// result. A log file that cannot be opened must not fail the pod, so the
// log then goes to stderr with a warning.
func newLogger(conf *Conf, stderr io.Writer) (hclog.Logger, func()) {
	out := stderr
	closeFn := func() {}
	var openErr error
	if conf.LogFile != "" {
		if err := os.MkdirAll(filepath.Dir(conf.LogFile), 0o750); err != nil {
			openErr = err
		} else if f, err := os.OpenFile(conf.LogFile, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o640); err != nil {
			openErr = err
		} else {
			out = f
			closeFn = func() { f.Close() }
		}
	}
	log := hclog.New(&hclog.LoggerOptions{
		Name:   "nftredir-cni",
		Level:  conf.LogLevel,
		Output: out,
	}).With("pid", os.Getpid())
	if openErr != nil {
		log.Warn("cannot open logFile; logging to stderr", "logFile", conf.LogFile, "error", openErr)
	}
	return log, closeFn
}
