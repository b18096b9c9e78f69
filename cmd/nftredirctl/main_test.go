package main

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nftredir/nftredir/internal/testkit/syncbuf"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/nftredir/nftredir/client"
	"github.com/nftredir/nftredir/client/clienttest"
	"github.com/nftredir/nftredir/internal/defaults"
	"github.com/nftredir/nftredir/internal/testkit/nstest"
	nftredirv1 "github.com/nftredir/nftredir/proto/nftredir/v1"
)

var now = time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)

type env struct {
	fake   *clienttest.Fake
	socket string
}

func newEnv(t *testing.T) *env {
	t.Helper()
	f := clienttest.New()
	f.Now = func() time.Time { return now.Add(-5 * time.Minute) }
	return &env{fake: f, socket: clienttest.Start(t, f).Socket}
}

// run runs the CLI with the socket in the environment, as an operator's
// shell would have it.
func (e *env) run(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	return e.runCtx(t.Context(), args...)
}

func (e *env) runCtx(ctx context.Context, args ...string) (stdout, stderr string, code int) {
	var out, errOut syncbuf.Buffer
	a := &app{
		stdout: &out,
		stderr: &errOut,
		getenv: func(k string) string {
			if k == "NFTREDIR_SOCKET" {
				return e.socket
			}
			return ""
		},
		now: func() time.Time { return now },
	}
	code = a.run(ctx, args)
	return out.String(), errOut.String(), code
}

func (e *env) mustRun(t *testing.T, args ...string) string {
	t.Helper()
	out, errOut, code := e.run(t, args...)
	if code != exitOK {
		t.Fatalf("nftredirctl %s: exit %d\nstderr: %s", strings.Join(args, " "), code, errOut)
	}
	return out
}

func TestAddFlags(t *testing.T) {
	e := newEnv(t)
	e.mustRun(t, "add",
		"--pod-uid", "u1", "--name", "web-1", "--namespace", "shop",
		"--netns", "/var/run/netns/cni-1",
		"--ip", "10.244.1.7", "--ip=fd00::7",
		"--mode", "REDIRECT",
		"--exclude-inbound-port", "15021,8080", "--exclude-inbound-port", "9090",
		"--exclude-outbound-port", "25",
		"--exclude-outbound-cidr", "169.254.169.254, 10.0.0.0/8",
		"--dns-capture=false",
		"--inbound-capture",
		"--reroute-interface", "k6t-eth0",
		"--service-account", "web",
	)
	e.mustRun(t, "add", "--pod-uid", "u2", "--netns", "/var/run/netns/cni-2")

	want := []proto.Message{
		&nftredirv1.AddPodRequest{
			PodUid:       "u1",
			PodName:      "web-1",
			PodNamespace: "shop",
			NetnsPath:    "/var/run/netns/cni-1",
			PodIps:       []string{"10.244.1.7", "fd00::7"},
			Options: &nftredirv1.RedirectOptions{
				CaptureMode:              nftredirv1.CaptureMode_CAPTURE_MODE_REDIRECT,
				ExcludeInboundPorts:      []uint32{15021, 8080, 9090},
				ExcludeOutboundPorts:     []uint32{25},
				ExcludeOutboundCidrs:     []string{"169.254.169.254", "10.0.0.0/8"},
				DnsCapture:               proto.Bool(false),
				InboundCapture:           proto.Bool(true),
				RerouteVirtualInterfaces: []string{"k6t-eth0"},
				// Ipv6 not given: must stay unset, so the daemon's
				// default applies.
			},
			ServiceAccount: proto.String("web"),
		},
		// Nothing given: every option left to the daemon.
		&nftredirv1.AddPodRequest{
			PodUid:    "u2",
			NetnsPath: "/var/run/netns/cni-2",
			Options:   &nftredirv1.RedirectOptions{},
		},
	}
	got := e.fake.Requests()
	if len(got) != len(want) {
		t.Fatalf("server got %d requests, want %d: %v", len(got), len(want), got)
	}
	for i := range want {
		if !proto.Equal(got[i], want[i]) {
			t.Errorf("request %d:\n got %v\nwant %v", i, got[i], want[i])
		}
	}
}

func TestAddOutput(t *testing.T) {
	e := newEnv(t)
	out := e.mustRun(t, "add", "--pod-uid", "u1", "--name", "web-1", "--namespace", "shop",
		"--netns", "/var/run/netns/cni-1", "--ip", "10.244.1.7", "--exclude-inbound-port", "15021", "--ipv6=false")
	if !strings.HasPrefix(out, "Enrolled shop/web-1.\n\n") {
		t.Errorf("add output does not start by saying what it did:\n%s", out)
	}
	fields := parseFields(t, strings.TrimPrefix(out, "Enrolled shop/web-1.\n\n"))
	for k, want := range map[string]string{
		"Pod":                     "shop/web-1",
		"Capture mode":            "tproxy", // the daemon's default, as recorded
		"IPv6 capture":            "off",
		"DNS capture":             onOff(proto.Bool(defaults.CaptureDNS)), // the daemon's default
		"Excluded inbound ports":  "15021",
		"Excluded outbound CIDRs": "-",
		"Enrolled":                "2026-03-04T05:01:07Z (5m ago)",
	} {
		if fields[k] != want {
			t.Errorf("add output: %s = %q, want %q\n%s", k, fields[k], want, out)
		}
	}

	out = e.mustRun(t, "add", "--pod-uid", "u1", "--netns", "/var/run/netns/cni-1", "-o", "json")
	var resp nftredirv1.AddPodResponse
	if err := protojson.Unmarshal([]byte(out), &resp); err != nil {
		t.Fatalf("add -o json is not an AddPodResponse: %v\n%s", err, out)
	}
	if !proto.Equal(resp.GetPod(), e.fake.Pod("u1")) {
		t.Errorf("add -o json = %v, want %v", resp.GetPod(), e.fake.Pod("u1"))
	}
}

// parseFields reads "Field: value" lines, checking that the values are
// aligned in one column as an operator expects.
func parseFields(t *testing.T, out string) map[string]string {
	t.Helper()
	fields := map[string]string{}
	col := -1
	for line := range strings.SplitSeq(strings.TrimRight(out, "\n"), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			t.Fatalf("line %q is not a field", line)
		}
		trimmed := strings.TrimLeft(v, " ")
		at := len(line) - len(trimmed)
		if col == -1 {
			col = at
		} else if at != col {
			t.Errorf("value of %q starts at column %d, others at %d:\n%s", k, at, col, out)
		}
		fields[k] = trimmed
	}
	return fields
}

func TestUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"add", "--netns", "/x"}, "--pod-uid and --netns are required"},
		{[]string{"add", "--pod-uid", "u"}, "--pod-uid and --netns are required"},
		{[]string{"add", "--pod-uid", "u", "--netns", "/x", "--exclude-inbound-port", "80,0"}, `"0" is not a port number`},
		{[]string{"add", "--pod-uid", "u", "--netns", "/x", "--exclude-outbound-port", "http"}, `"http" is not a port number`},
		{[]string{"add", "--pod-uid", "u", "--netns", "/x", "--mode", "nat"}, `"nat" is not a capture mode`},
		{[]string{"add", "--pod-uid", "u", "--netns", "/x", "--dns-capture=maybe"}, "is not true or false"},
		{[]string{"add", "--pod-uid", "u", "--netns", "/x", "extra"}, `unexpected argument "extra"`},
		{[]string{"add", "--bogus"}, "flag provided but not defined"},
		{[]string{"get"}, "a POD-UID is required"},
		{[]string{"get", "a", "b"}, "too many arguments"},
		{[]string{"get", "a", "--pod-uid", "b"}, "two different pod UIDs"},
		{[]string{"remove"}, "a POD-UID is required"},
		{[]string{"remove", "u", "--netns", ""}, "--netns needs a PATH"},
		{[]string{"list", "-o", "yaml"}, `"yaml" is not one of text, json`},
		{[]string{"list", "pods"}, `unexpected argument "pods"`},
		{[]string{"--timeout", "soon", "list"}, "invalid value"},
		{[]string{"frobnicate"}, `unknown command "frobnicate"`},
		{[]string{}, "Usage:"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			e := newEnv(t)
			out, errOut, code := e.run(t, tc.args...)
			if code != exitUsage {
				t.Errorf("exit %d, want %d", code, exitUsage)
			}
			if !strings.Contains(errOut, tc.want) {
				t.Errorf("stderr lacks %q:\n%s", tc.want, errOut)
			}
			if out != "" {
				t.Errorf("stdout not empty on a usage error:\n%s", out)
			}
			if n := len(e.fake.Requests()); n != 0 {
				t.Errorf("a usage error reached the daemon with %d requests", n)
			}
		})
	}
}

func TestHelp(t *testing.T) {
	e := newEnv(t)
	cases := [][]string{{"--help"}, {"-h"}, {"help"}}
	for _, c := range commands {
		cases = append(cases, []string{c.name, "--help"}, []string{"help", c.name})
	}
	for _, args := range cases {
		out, errOut, code := e.run(t, args...)
		if code != exitOK || errOut != "" {
			t.Errorf("%v: exit %d, stderr %q", args, code, errOut)
		}
		if !strings.Contains(out, "Examples:") || !strings.Contains(out, "nftredirctl") {
			t.Errorf("%v: help without examples:\n%s", args, out)
		}
		name := strings.TrimPrefix(strings.TrimPrefix(strings.Join(args, " "), "help "), "-")
		name, _, _ = strings.Cut(name, " ")
		if lookup(name) != nil && !strings.Contains(out, "Usage:\n  nftredirctl "+name) {
			t.Errorf("%v: help does not show the command's usage line:\n%s", args, out)
		}
	}
	out, _, _ := e.run(t, "add", "--help")
	for _, flag := range []string{"--pod-uid UID", "--netns PATH", "--ip ADDRESS", "--mode MODE", "--exclude-inbound-port PORT",
		"--exclude-outbound-port PORT", "--exclude-outbound-cidr CIDR", "--dns-capture", "--ipv6", "--inbound-capture",
		"--service-account NAME", "--socket PATH", "--timeout DURATION", "-o, --output FORMAT"} {
		if !strings.Contains(out, "\n  "+flag) {
			t.Errorf("add --help does not list %s", flag)
		}
	}
}

func TestList(t *testing.T) {
	e := newEnv(t)
	if out := e.mustRun(t, "list"); out != "No pods enrolled.\n" {
		t.Errorf("empty list = %q", out)
	}
	e.mustRun(t, "add", "--pod-uid", "0b5c8f3e", "--name", "web-1", "--namespace", "shop",
		"--netns", "/var/run/netns/cni-1", "--ip", "10.244.1.7,fd00::7")
	e.mustRun(t, "add", "--pod-uid", "77aa", "--name", "db", "--namespace", "data",
		"--netns", "/proc/4242/ns/net", "--mode", "redirect")
	e.mustRun(t, "add", "--pod-uid", "ffff", "--netns", "/proc/1234/ns/net")

	want := "" +
		"NAMESPACE  NAME   POD UID   NETNS                 IPS                 MODE      AGE\n" +
		"-          -      ffff      /proc/1234/ns/net     -                   tproxy    5m\n" +
		"data       db     77aa      /proc/4242/ns/net     -                   redirect  5m\n" +
		"shop       web-1  0b5c8f3e  /var/run/netns/cni-1  10.244.1.7,fd00::7  tproxy    5m\n"
	if got := e.mustRun(t, "list"); got != want {
		t.Errorf("list:\n got:\n%s\nwant:\n%s", got, want)
	}
}

func TestListJSON(t *testing.T) {
	e := newEnv(t)
	out := e.mustRun(t, "list", "-o", "json")
	var empty map[string]any
	if err := json.Unmarshal([]byte(out), &empty); err != nil {
		t.Fatalf("empty list -o json: %v\n%s", err, out)
	}
	if pods, ok := empty["pods"].([]any); !ok || len(pods) != 0 {
		t.Errorf("empty list -o json should show an empty pods array for scripts:\n%s", out)
	}
	e.mustRun(t, "add", "--pod-uid", "a", "--netns", "/proc/1/ns/net2", "--service-account", "sa")
	e.mustRun(t, "add", "--pod-uid", "b", "--netns", "/proc/2/ns/net")

	// Flags after the command work, as with --output.
	out = e.mustRun(t, "list", "--output=json")
	var got nftredirv1.ListPodsResponse
	if err := protojson.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("list -o json is not a ListPodsResponse: %v\n%s", err, out)
	}
	want := &nftredirv1.ListPodsResponse{Pods: []*nftredirv1.Pod{e.fake.Pod("a"), e.fake.Pod("b")}}
	if !proto.Equal(&got, want) {
		t.Errorf("list -o json:\n got %v\nwant %v", &got, want)
	}
	for _, name := range []string{`"podUid"`, `"netnsPath"`, `"enrolledAt"`, `"serviceAccount"`} {
		if !strings.Contains(out, name) {
			t.Errorf("list -o json does not use the API's JSON name %s:\n%s", name, out)
		}
	}
}

func TestGet(t *testing.T) {
	e := newEnv(t)
	e.mustRun(t, "add", "--pod-uid", "u1", "--name", "web-1", "--namespace", "shop", "--netns", "/var/run/netns/cni-1")
	e.fake.SetSync("u1", nftredirv1.SyncStatus_SYNC_STATUS_DRIFTED, "chain inbound: rule 2 differs",
		"table inet nftredir {\n\tchain inbound {\n\t}\n}\n")

	out := e.mustRun(t, "get", "u1")
	head, ruleset, ok := strings.Cut(out, "Live ruleset:\n")
	if !ok {
		t.Fatalf("get output has no live ruleset:\n%s", out)
	}
	fields := parseFields(t, head)
	for k, want := range map[string]string{
		"Pod":         "shop/web-1",
		"Sync status": "drifted (the live rules differ from the record)",
		"Detail":      "chain inbound: rule 2 differs",
	} {
		if fields[k] != want {
			t.Errorf("get output: %s = %q, want %q\n%s", k, fields[k], want, out)
		}
	}
	if want := "  table inet nftredir {\n  \tchain inbound {\n  \t}\n  }\n"; ruleset != want {
		t.Errorf("live ruleset printed as %q, want it indented: %q", ruleset, want)
	}
	if got := e.mustRun(t, "get", "--pod-uid", "u1"); got != out {
		t.Errorf("get --pod-uid differs from get with an argument:\n%s", got)
	}

	out = e.mustRun(t, "get", "u1", "-o", "json")
	var resp nftredirv1.GetPodResponse
	if err := protojson.Unmarshal([]byte(out), &resp); err != nil {
		t.Fatalf("get -o json: %v\n%s", err, out)
	}
	if resp.GetSyncStatus() != nftredirv1.SyncStatus_SYNC_STATUS_DRIFTED || resp.GetPod().GetPodUid() != "u1" {
		t.Errorf("get -o json = %v", &resp)
	}
}

func TestFailures(t *testing.T) {
	e := newEnv(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"get", "nope"}, "nftredirctl: get failed: NotFound: pod nope is not enrolled\n"},
		{[]string{"add", "--pod-uid", "u", "--netns", "/proc/1/ns/net"},
			"nftredirctl: add failed: FailedPrecondition: netns_path /proc/1/ns/net is the node's own network namespace; pods on the host network cannot be enrolled\n"},
		{[]string{"add", "--pod-uid", "u", "--netns", "relative/path"},
			`nftredirctl: add failed: InvalidArgument: invalid request: netns_path "relative/path" is relative; give the absolute path of the pod's network namespace` + "\n"},
	} {
		out, errOut, code := e.run(t, tc.args...)
		if code != exitFailed || errOut != tc.want || out != "" {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want exit 1, stderr %q", tc.args, code, out, errOut, tc.want)
		}
	}
}

// remove --netns removes the pod only from that namespace; the daemon's
// refusal of another is reported and changes nothing.
func TestRemoveNetns(t *testing.T) {
	e := newEnv(t)
	e.mustRun(t, "add", "--pod-uid", "u1", "--netns", "/var/run/netns/cni-1")
	out, errOut, code := e.run(t, "remove", "u1", "--netns", "/var/run/netns/cni-0")
	if code != exitFailed || out != "" || !strings.Contains(errOut, "remove failed: FailedPrecondition") || !strings.Contains(errOut, "/var/run/netns/cni-1") {
		t.Errorf("remove with another namespace: exit %d, stdout %q, stderr %q; want exit 1 and the daemon's refusal", code, out, errOut)
	}
	if e.fake.Pod("u1") == nil {
		t.Fatal("a refused remove released the pod")
	}
	if out := e.mustRun(t, "remove", "--netns", "/var/run/netns/cni-1", "u1"); out != "Removed pod u1.\n" {
		t.Errorf("remove with the pod's namespace = %q", out)
	}
	if out := e.mustRun(t, "remove", "u1", "--netns", "/var/run/netns/cni-1"); out != "Pod u1 was not enrolled; nothing to remove.\n" {
		t.Errorf("second remove = %q", out)
	}
	var sent []*nftredirv1.RemovePodRequest
	for _, r := range e.fake.Requests() {
		if rm, ok := r.(*nftredirv1.RemovePodRequest); ok {
			sent = append(sent, rm)
			if rm.GetNetnsPath() == "" || rm.GetNamespaceTeardown() {
				t.Errorf("remove --netns sent %v; want netns_path and never namespace_teardown", rm)
			}
		}
	}
	if len(sent) != 3 {
		t.Errorf("daemon got %d RemovePod requests, want 3", len(sent))
	}
	help, _, _ := e.run(t, "remove", "--help")
	if !strings.Contains(help, "--netns PATH") || !strings.Contains(help, "wants its\ncapture gone now") {
		t.Errorf("remove --help lacks --netns or why there is no teardown flag:\n%s", help)
	}
}

func TestRemove(t *testing.T) {
	e := newEnv(t)
	e.mustRun(t, "add", "--pod-uid", "u1", "--netns", "/var/run/netns/cni-1")
	if out := e.mustRun(t, "remove", "u1"); out != "Removed pod u1.\n" {
		t.Errorf("remove = %q", out)
	}
	if out := e.mustRun(t, "remove", "--pod-uid", "u1"); out != "Pod u1 was not enrolled; nothing to remove.\n" {
		t.Errorf("second remove = %q", out)
	}
	if e.fake.Pod("u1") != nil {
		t.Error("pod still recorded")
	}
}

func TestSocketAndTimeoutFlags(t *testing.T) {
	e := newEnv(t)
	real := e.socket
	e.socket = "/nonexistent/nftredir.sock"
	_, errOut, code := e.run(t, "--timeout", "300ms", "list")
	if code != exitFailed || !strings.Contains(errOut, "list failed: Unavailable") || !strings.Contains(errOut, "hint: is nftredird running") {
		t.Errorf("list against no daemon: exit %d, stderr %q", code, errOut)
	}
	// --socket overrides the environment, before or after the command.
	e.mustRun(t, "--socket", real, "list")
	e.mustRun(t, "list", "--socket", real)

	e.fake.Delay("ListPods", 10*time.Second)
	began := time.Now()
	_, errOut, code = e.run(t, "list", "--socket", real, "--timeout", "100ms")
	if code != exitFailed || !strings.Contains(errOut, "list failed: DeadlineExceeded") {
		t.Errorf("slow list: exit %d, stderr %q", code, errOut)
	}
	if d := time.Since(began); d > 3*time.Second {
		t.Errorf("--timeout 100ms took %v", d)
	}
}

func TestHealth(t *testing.T) {
	e := newEnv(t)
	out := e.mustRun(t, "health")
	if want := "server:                       SERVING\nnftredir.v1.RedirectService:  SERVING\n"; out != want {
		t.Errorf("health = %q, want %q", out, want)
	}
	e.fake.Health.SetServingStatus(client.ServiceName, healthpb.HealthCheckResponse_NOT_SERVING)
	out, errOut, code := e.run(t, "health")
	if code != exitFailed || !strings.Contains(out, "NOT_SERVING") || !strings.Contains(errOut, "not serving") {
		t.Errorf("health while not serving: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
}

func TestWatch(t *testing.T) {
	e := newEnv(t)
	e.mustRun(t, "add", "--pod-uid", "u1", "--name", "web-1", "--namespace", "shop", "--netns", "/var/run/netns/cni-1")

	for _, format := range []string{"text", "json"} {
		t.Run(format, func(t *testing.T) {
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			var out, errOut syncbuf.Buffer
			a := &app{stdout: &out, stderr: &errOut, getenv: func(string) string { return e.socket }, now: func() time.Time { return now }}
			done := make(chan int, 1)
			go func() { done <- a.run(ctx, []string{"watch", "-o", format}) }()

			waitFor := func(s string) {
				t.Helper()
				deadline := time.Now().Add(5 * time.Second)
				for !strings.Contains(out.String(), s) {
					if time.Now().After(deadline) {
						t.Fatalf("watch output never showed %q:\n%s\nstderr: %s", s, out.String(), errOut.String())
					}
					time.Sleep(10 * time.Millisecond)
				}
			}
			if format == "text" {
				waitFor("05:06:07 SNAPSHOT_DONE")
				e.mustRun(t, "add", "--pod-uid", "u2", "--netns", "/var/run/netns/cni-2", "--ip", "10.0.0.2")
				e.mustRun(t, "remove", "u2")
				waitFor("05:06:07 REMOVED")
				want := "" +
					"05:06:07 ADDED         shop/web-1 uid=u1 netns=/var/run/netns/cni-1 ips=-\n" +
					"05:06:07 SNAPSHOT_DONE (the pods above are all the enrolled pods; changes follow)\n" +
					"05:06:07 ADDED         u2 uid=u2 netns=/var/run/netns/cni-2 ips=10.0.0.2\n" +
					"05:06:07 REMOVED       u2 uid=u2 netns=/var/run/netns/cni-2 ips=10.0.0.2\n"
				if got := out.String(); got != want {
					t.Errorf("watch:\n got:\n%s\nwant:\n%s", got, want)
				}
			} else {
				waitFor("EVENT_TYPE_SNAPSHOT_DONE")
				e.mustRun(t, "remove", "u1")
				waitFor("EVENT_TYPE_REMOVED")
				lines := strings.Split(strings.TrimSpace(out.String()), "\n")
				wantEvents := []nftredirv1.EventType{
					nftredirv1.EventType_EVENT_TYPE_ADDED,
					nftredirv1.EventType_EVENT_TYPE_SNAPSHOT_DONE,
					nftredirv1.EventType_EVENT_TYPE_REMOVED,
				}
				if len(lines) != len(wantEvents) {
					t.Fatalf("watch -o json printed %d lines, want %d:\n%s", len(lines), len(wantEvents), out.String())
				}
				for i, line := range lines {
					var ev nftredirv1.WatchPodsResponse
					if err := protojson.Unmarshal([]byte(line), &ev); err != nil {
						t.Fatalf("line %d is not a WatchPodsResponse: %v: %s", i, err, line)
					}
					if ev.GetEvent() != wantEvents[i] {
						t.Errorf("line %d: event %v, want %v", i, ev.GetEvent(), wantEvents[i])
					}
				}
			}

			// Ctrl-C is the normal end of a watch.
			cancel()
			select {
			case code := <-done:
				if code != exitOK {
					t.Errorf("interrupted watch exited %d, stderr %q", code, errOut.String())
				}
			case <-time.After(5 * time.Second):
				t.Fatal("watch did not stop when interrupted")
			}
		})
	}
}

func TestWatchDaemonGone(t *testing.T) {
	f := clienttest.New()
	srv := clienttest.Start(t, f)
	e := &env{fake: f, socket: srv.Socket}
	var out, errOut syncbuf.Buffer
	a := &app{stdout: &out, stderr: &errOut, getenv: func(string) string { return e.socket }, now: time.Now}
	done := make(chan int, 1)
	go func() { done <- a.run(t.Context(), []string{"watch"}) }()
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(out.String(), "SNAPSHOT_DONE") && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	srv.Stop()
	select {
	case code := <-done:
		if code != exitFailed || !strings.Contains(errOut.String(), "watch failed: Unavailable") {
			t.Errorf("watch when the daemon stops: exit %d, stderr %q", code, errOut.String())
		}
	case <-time.After(5 * time.Second):
		t.Fatal("watch did not end when the daemon stopped")
	}
}

func TestListShowsQuarantined(t *testing.T) {
	e := newEnv(t)
	q := &nftredirv1.QuarantinedRecord{File: "/run/nftredir/pods/quarantine/ab.json.20261201T000000.000000000Z", PodUid: "u9",
		NetnsPath: "/var/run/netns/cni-9", NetnsId: "4:4026532999", Reason: "corrupt record: unexpected end of JSON input"}
	e.fake.SetQuarantined(q)
	out := e.mustRun(t, "list")
	for _, want := range []string{"No pods enrolled.", "1 quarantined record(s)", "u9", "/var/run/netns/cni-9", q.File, q.Reason} {
		if !strings.Contains(out, want) {
			t.Errorf("list does not show %q:\n%s", want, out)
		}
	}
	var got nftredirv1.ListPodsResponse
	if err := protojson.Unmarshal([]byte(e.mustRun(t, "list", "-o", "json")), &got); err != nil || len(got.Quarantined) != 1 || !proto.Equal(got.Quarantined[0], q) {
		t.Errorf("list -o json = %v, %v; want the quarantined record", &got, err)
	}
}

func TestDoctor(t *testing.T) {
	nstest.RequirePrivileged(t)
	// A socket nobody serves on: doctor must not need the daemon.
	e := &env{socket: filepath.Join(t.TempDir(), "none.sock")}
	out, errOut, code := e.run(t, "doctor")
	if code != exitOK {
		t.Fatalf("doctor: exit %d\n%s%s", code, out, errOut)
	}
	for _, want := range []string{"ok  tproxy", "ok  socket", "ok  redirect", "ok  policy routing", "ok  pod table (TPROXY mode)", "ok  node probe table"} {
		if !strings.Contains(out, want) {
			t.Errorf("doctor output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "FAIL") {
		t.Errorf("a check failed:\n%s", out)
	}
	if _, _, code := e.run(t, "doctor", "extra"); code != exitUsage {
		t.Errorf("doctor with an argument: exit %d, want %d", code, exitUsage)
	}
}

func TestVersion(t *testing.T) {
	e := &env{socket: "/nonexistent.sock"}
	out, _, code := e.run(t, "--version")
	if code != exitOK || !strings.HasPrefix(out, "nftredirctl ") || !strings.Contains(out, " go1.") {
		t.Errorf("--version: exit %d, %q", code, out)
	}
}
