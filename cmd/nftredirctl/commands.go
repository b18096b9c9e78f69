package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/nftredir/nftredir/client"
	"github.com/nftredir/nftredir/cmd/internal/selftest"
	nftredirv1 "github.com/nftredir/nftredir/proto/nftredir/v1"
)

var addCmd = &command{
	name:    "add",
	summary: "enrol a pod: capture its traffic (or re-apply changed options)",
	args:    "--pod-uid UID --netns PATH [flags]",
	help: `
Installs the capture rules in the pod's network namespace and records the pod,
so the daemon keeps the rules in place across its own restarts. Running the
same add again changes nothing; running it with different flags replaces the
pod's rules. Options you leave out take the daemon's defaults; the reply shows
the effective values.

--pod-uid and --netns are required. List flags (--ip, --exclude-*) may be
repeated or given as comma-separated lists.

Examples:
  # Enrol a pod whose namespace the CNI runtime created:
  nftredirctl add --pod-uid 0b5c8f3e-4c1d --name web-1 --namespace default \
      --netns /var/run/netns/cni-1234 --ip 10.244.1.7 --ip fd00:10:244:1::7

  # Leave the health-check port and the metadata server alone, no DNS capture:
  nftredirctl add --pod-uid 0b5c8f3e-4c1d --netns /proc/4242/ns/net \
      --exclude-inbound-port 15021,8080 --exclude-outbound-cidr 169.254.169.254 \
      --dns-capture=false

  # Capture only the pod's outbound traffic:
  nftredirctl add --pod-uid 0b5c8f3e-4c1d --netns /proc/4242/ns/net --inbound-capture=false
`,
	flags: func(a *app, fs *flag.FlagSet) func(context.Context, *client.Client, []string) error {
		req := &nftredirv1.AddPodRequest{Options: &nftredirv1.RedirectOptions{}}
		o := req.Options
		fs.StringVar(&req.PodUid, "pod-uid", "", "the pod's Kubernetes `UID`, the key of its record (required)")
		fs.StringVar(&req.PodName, "name", "", "the pod's `NAME`, for people and logs")
		fs.StringVar(&req.PodNamespace, "namespace", "", "the pod's Kubernetes `NAMESPACE`, for people and logs")
		fs.StringVar(&req.NetnsPath, "netns", "", "absolute `PATH` of the pod's network namespace, e.g. /var/run/netns/cni-1234 or /proc/PID/ns/net (required)")
		fs.Var(listFlag{&req.PodIps}, "ip", "a pod IP `ADDRESS`, v4 or v6")
		fs.Var(modeFlag{&o.CaptureMode}, "mode", "capture `MODE`: tproxy or redirect (default: the daemon's)")
		fs.Var(portsFlag{&o.ExcludeInboundPorts}, "exclude-inbound-port", "an inbound `PORT` that reaches the pod directly, uncaptured")
		fs.Var(portsFlag{&o.ExcludeOutboundPorts}, "exclude-outbound-port", "an outbound `PORT` the pod reaches directly, uncaptured")
		fs.Var(listFlag{&o.ExcludeOutboundCidrs}, "exclude-outbound-cidr", "an outbound `CIDR` or address the pod reaches directly, uncaptured")
		fs.Var(optBoolFlag{&o.DnsCapture}, "dns-capture", "capture DNS (port 53); =false to leave it alone (default: the daemon's)")
		fs.Var(optBoolFlag{&o.Ipv6}, "ipv6", "capture IPv6 too; =false for IPv4 only (default: on)")
		fs.Var(optBoolFlag{&o.InboundCapture}, "inbound-capture", "capture inbound connections; =false captures outbound only (default: on)")
		fs.Var(listFlag{&o.RerouteVirtualInterfaces}, "reroute-interface", "an `INTERFACE` of the pod whose incoming TCP is the pod's outbound (a VM's, nested containers'): redirected to the outbound port")
		fs.Var(optStringFlag{&req.ServiceAccount}, "service-account", "the pod's Kubernetes service account `NAME`, recorded for node proxies")
		out := outputFlag(fs)
		return func(ctx context.Context, c *client.Client, args []string) error {
			if len(args) > 0 {
				return usagef("unexpected argument %q (add takes flags only)", args[0])
			}
			if req.PodUid == "" || req.NetnsPath == "" {
				return usagef("--pod-uid and --netns are required")
			}
			resp, err := c.AddPodResponse(ctx, req)
			if err != nil {
				return err
			}
			if *out == "json" {
				return printJSON(a.stdout, resp)
			}
			if why := resp.GetNotCapturedReason(); why != "" {
				fmt.Fprintf(a.stdout, "Not captured: %s.\n", why)
				return nil
			}
			pod := resp.GetPod()
			fmt.Fprintf(a.stdout, "Enrolled %s.\n\n", podName(pod))
			t := newTable(a.stdout)
			a.printPod(t, pod)
			return t.Flush()
		}
	},
}

var removeCmd = &command{
	name:    "remove",
	summary: "release a pod: delete its capture rules and its record",
	args:    "POD-UID [--netns PATH]",
	help: `
Deletes the pod's capture rules from its network namespace and forgets the
pod. Removing a pod that is not enrolled, or whose namespace is already gone,
succeeds: the output says whether there was anything to remove.

With --netns, the pod is removed only if it is enrolled with that namespace;
if it is enrolled with another one (a newer sandbox of the pod), nothing
changes and remove fails with FailedPrecondition.

The rules are deleted before remove returns. (A CNI DEL instead tells the
daemon that the runtime deletes the namespace next and leaves the rules to go
with it; remove has no such flag, because a person removing a pod wants its
capture gone now, not when the namespace is.)

Examples:
  nftredirctl remove 0b5c8f3e-4c1d
  nftredirctl remove --pod-uid 0b5c8f3e-4c1d
  nftredirctl remove 0b5c8f3e-4c1d --netns /var/run/netns/cni-1234
`,
	flags: func(a *app, fs *flag.FlagSet) func(context.Context, *client.Client, []string) error {
		uid := fs.String("pod-uid", "", "the pod's `UID` (or give it as the argument)")
		netns := fs.String("netns", "", "remove the pod only if it is enrolled with the namespace at `PATH`")
		return func(ctx context.Context, c *client.Client, args []string) error {
			u, err := podUID(*uid, args)
			if err != nil {
				return err
			}
			var opts []client.RemoveOption
			if *netns != "" {
				opts = append(opts, client.IfNetns(*netns))
			} else if flagGiven(fs, "netns") {
				// Empty would quietly drop the condition asked for.
				return usagef("--netns needs a PATH")
			}
			existed, err := c.RemovePod(ctx, u, opts...)
			if err != nil {
				return err
			}
			if existed {
				fmt.Fprintf(a.stdout, "Removed pod %s.\n", u)
			} else {
				fmt.Fprintf(a.stdout, "Pod %s was not enrolled; nothing to remove.\n", u)
			}
			return nil
		}
	},
}

var getCmd = &command{
	name:    "get",
	summary: "show one pod: its record, whether its rules are intact, and the live ruleset",
	args:    "POD-UID",
	help: `
Shows the daemon's record of the pod, then checks the pod's namespace: "in
sync" means the live rules are exactly what the record asks for; "drifted" or
"absent" mean someone changed or deleted them (the daemon repairs that at its
next reconcile, or run add again); "netns gone" means the pod's namespace no
longer exists. Last comes the daemon's nftables table as the kernel has it.

Examples:
  nftredirctl get 0b5c8f3e-4c1d
  nftredirctl get 0b5c8f3e-4c1d -o json | jq -r .liveRuleset
`,
	flags: func(a *app, fs *flag.FlagSet) func(context.Context, *client.Client, []string) error {
		uid := fs.String("pod-uid", "", "the pod's `UID` (or give it as the argument)")
		out := outputFlag(fs)
		return func(ctx context.Context, c *client.Client, args []string) error {
			u, err := podUID(*uid, args)
			if err != nil {
				return err
			}
			resp, err := c.GetPod(ctx, u)
			if err != nil {
				return err
			}
			if *out == "json" {
				return printJSON(a.stdout, resp)
			}
			t := newTable(a.stdout)
			a.printPod(t, resp.GetPod())
			fmt.Fprintf(t, "Sync status:\t%s\n", syncName(resp.GetSyncStatus()))
			if resp.GetDetail() != "" {
				fmt.Fprintf(t, "Detail:\t%s\n", resp.GetDetail())
			}
			if err := t.Flush(); err != nil {
				return err
			}
			if rs := strings.TrimRight(resp.GetLiveRuleset(), "\n"); rs != "" {
				fmt.Fprintf(a.stdout, "Live ruleset:\n  %s\n", strings.ReplaceAll(rs, "\n", "\n  "))
			} else {
				fmt.Fprintln(a.stdout, "Live ruleset: (none)")
			}
			return nil
		}
	},
}

var listCmd = &command{
	name:    "list",
	summary: "list enrolled pods",
	help: `
Lists every pod the daemon has enrolled, from its records (it does not check
the namespaces; use get for that), then any record set aside as corrupt
whose pod was not released: its capture may remain until RemovePod of its
uid (nftredirctl remove). -o json prints the API's
ListPodsResponse, as grpcurl would.

Examples:
  nftredirctl list
  nftredirctl list -o json | jq -r '.pods[].podUid'
`,
	flags: func(a *app, fs *flag.FlagSet) func(context.Context, *client.Client, []string) error {
		out := outputFlag(fs)
		return func(ctx context.Context, c *client.Client, args []string) error {
			if len(args) > 0 {
				return usagef("unexpected argument %q (list takes no arguments)", args[0])
			}
			resp, err := c.List(ctx)
			if err != nil {
				return err
			}
			if *out == "json" {
				return printJSON(a.stdout, &nftredirv1.ListPodsResponse{Pods: resp.GetPods(), Quarantined: resp.GetQuarantined()})
			}
			if len(resp.GetPods()) == 0 {
				fmt.Fprintln(a.stdout, "No pods enrolled.")
			} else if err := a.printTable(a.stdout, resp.GetPods()); err != nil {
				return err
			}
			return printQuarantined(a.stdout, resp.GetQuarantined())
		}
	},
}

var watchCmd = &command{
	name:    "watch",
	summary: "print pods as they are enrolled and released, until interrupted",
	help: `
Prints every enrolled pod (ADDED), a SNAPSHOT_DONE line when that initial set
is complete, then every change as it happens: ADDED for an enrolment or a
re-apply with new options, REMOVED for a release. Stop it with Ctrl-C.
--timeout applies only to opening the watch. -o json prints one
WatchPodsResponse per line.

Examples:
  nftredirctl watch
  nftredirctl watch -o json | jq -c 'select(.event == "EVENT_TYPE_REMOVED")'
`,
	flags: func(a *app, fs *flag.FlagSet) func(context.Context, *client.Client, []string) error {
		out := outputFlag(fs)
		return func(ctx context.Context, c *client.Client, args []string) error {
			if len(args) > 0 {
				return usagef("unexpected argument %q (watch takes no arguments)", args[0])
			}
			w, err := c.WatchPods(ctx)
			if err != nil {
				return err
			}
			defer w.Close()
			for {
				ev, err := w.Recv()
				switch {
				case errors.Is(err, io.EOF):
					return nil
				case err != nil && ctx.Err() != nil:
					// Interrupted by the operator: the normal way to stop.
					return nil
				case err != nil:
					return err
				}
				if *out == "json" {
					b, err := protojson.Marshal(ev)
					if err != nil {
						return fmt.Errorf("encode event: %w", err)
					}
					fmt.Fprintf(a.stdout, "%s\n", b)
					continue
				}
				a.printEvent(a.stdout, ev)
			}
		}
	},
}

var healthCmd = &command{
	name:    "health",
	summary: "check that the daemon is up and serving",
	help: `
Asks the daemon's gRPC health service about the server and the
RedirectService. The daemon reports NOT_SERVING while it reconciles its pods
at startup and while it stops. Exits 0 only when both are SERVING, so it
works as a readiness probe:

Examples:
  nftredirctl health
  nftredirctl --timeout 2s health   # in an exec readiness probe
`,
	flags: func(a *app, fs *flag.FlagSet) func(context.Context, *client.Client, []string) error {
		return func(ctx context.Context, c *client.Client, args []string) error {
			if len(args) > 0 {
				return usagef("unexpected argument %q (health takes no arguments)", args[0])
			}
			h, err := c.Health(ctx)
			if err != nil {
				return err
			}
			w := newTable(a.stdout)
			fmt.Fprintf(w, "server:\t%s\n", h.Server)
			fmt.Fprintf(w, "%s:\t%s\n", client.ServiceName, h.Service)
			if err := w.Flush(); err != nil {
				return err
			}
			if !h.Serving() {
				return errors.New("the daemon answers but is not serving: it is starting up (reconciling pods) or stopping")
			}
			return nil
		}
	},
}

// podUID takes the pod UID from --pod-uid or the one argument.
func podUID(flagValue string, args []string) (string, error) {
	switch {
	case len(args) > 1:
		return "", usagef("too many arguments: want one POD-UID")
	case len(args) == 1 && flagValue != "" && args[0] != flagValue:
		return "", usagef("two different pod UIDs given: %q and --pod-uid %q", args[0], flagValue)
	case len(args) == 1:
		return args[0], nil
	case flagValue != "":
		return flagValue, nil
	}
	return "", usagef("a POD-UID is required")
}

// flagGiven reports whether the command line set the flag, even to "".
func flagGiven(fs *flag.FlagSet, name string) bool {
	given := false
	fs.Visit(func(f *flag.Flag) { given = given || f.Name == name })
	return given
}

// outputFlag registers -o / --output.
func outputFlag(fs *flag.FlagSet) *string {
	v := "text"
	fs.Var(choiceFlag{&v, []string{"text", "json"}}, "o", "output `FORMAT`: text or json")
	fs.Var(choiceFlag{&v, []string{"text", "json"}}, "output", "same as -o")
	return &v
}

func printJSON(w io.Writer, m proto.Message) error {
	b, err := protojson.MarshalOptions{Multiline: true, Indent: "  ", EmitUnpopulated: true}.Marshal(m)
	if err != nil {
		return fmt.Errorf("encode reply: %w", err)
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

var doctorCmd = &command{
	name:    "doctor",
	summary: "check that this node's kernel has what nftredir needs",
	local:   true,
	help: `
Runs the kernel self-test that nftredird runs before it serves: in a scratch
network namespace of its own (made and thrown away, nothing else is
touched) it programs each feature nftredir's rules use (nf_tables, NAT
chains, conntrack, socket, tproxy, redirect, policy routing), then the
complete pod tables of both capture modes and the node probe table, with
nftredir's default settings. A failed check names the kernel module to
load. It does not talk to the daemon, and needs root (CAP_SYS_ADMIN and
CAP_NET_ADMIN). Exits 0 only when every check passes.

Examples:
  sudo nftredirctl doctor
`,
	flags: func(a *app, fs *flag.FlagSet) func(context.Context, *client.Client, []string) error {
		return func(ctx context.Context, _ *client.Client, args []string) error {
			if len(args) > 0 {
				return usagef("unexpected argument %q (doctor takes no arguments)", args[0])
			}
			checks, err := selftest.Checks(selftest.DefaultConfig())
			if err != nil {
				return err
			}
			results, err := selftest.Run(ctx, checks)
			if len(results) == 0 && err != nil {
				if errors.Is(err, unix.EPERM) {
					return fmt.Errorf("%w (doctor needs root)", err)
				}
				return err
			}
			w := newTable(a.stdout)
			for _, r := range results {
				if r.Err == nil {
					fmt.Fprintf(w, "ok\t%s\n", r.Name)
				} else {
					fmt.Fprintf(w, "FAIL\t%s\t%v; %s\n", r.Name, r.Err, r.Hint())
				}
			}
			if err := w.Flush(); err != nil {
				return err
			}
			var serr *selftest.Error
			if errors.As(err, &serr) {
				return fmt.Errorf("%d of %d kernel checks failed; nftredird would refuse to start", len(serr.Failed), len(results))
			}
			return err
		}
	},
}
