package e2e

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/nftredir/nftredir/internal/testkit/nstest"
)

// shownSocket stands for the test's socket path in the transcript, so
// that it reads like a session against an installed daemon.
const shownSocket = "/run/nftredir/nftredir.sock"

// grpcurlStep is one command of the session, as shown and as run.
type grpcurlStep struct {
	title, note string
	shown       string
	output      string
	code        int
}

type grpcurlSession struct {
	t     *testing.T
	bin   string
	sock  string
	steps []grpcurlStep
}

// run runs grpcurl with args, in which shownSocket stands for the real
// socket, and records the step.
func (s *grpcurlSession) run(title, note string, args ...string) grpcurlStep {
	s.t.Helper()
	argv := make([]string, len(args))
	shown := []string{"grpcurl"}
	for i, a := range args {
		argv[i] = strings.ReplaceAll(a, shownSocket, s.sock)
		shown = append(shown, shellQuote(a))
	}
	cmd := exec.Command(s.bin, argv...)
	cmd.Env = cleanEnv()
	out, err := cmd.CombinedOutput()
	st := grpcurlStep{title: title, note: note, shown: strings.Join(shown, " "), output: strings.ReplaceAll(string(out), s.sock, shownSocket)}
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		st.code = ee.ExitCode()
	default:
		s.t.Fatalf("run %s: %v", st.shown, err)
	}
	s.t.Logf("$ %s\n%s(exit %d)", st.shown, st.output, st.code)
	s.steps = append(s.steps, st)
	return st
}

// ok is run that requires success.
func (s *grpcurlSession) ok(title, note string, args ...string) string {
	s.t.Helper()
	st := s.run(title, note, args...)
	if st.code != 0 {
		s.t.Fatalf("%s: exit %d:\n%s", st.shown, st.code, st.output)
	}
	return st.output
}

func shellQuote(a string) string {
	if a != "" && !strings.ContainsAny(a, ` '"{}[]$\*?;&|<>()`) {
		return a
	}
	return "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
}

func (s *grpcurlSession) markdown() string {
	var b strings.Builder
	b.WriteString(`# grpcurl against nftredird

A real session, recorded by ` + "`TestDaemonGrpcurl`" + ` (e2e/daemon_grpcurl_test.go)
with the grpcurl that ` + "`hack/deps.sh`" + ` pins (v1.9.3), against the built
nftredird running as root. The daemon serves server reflection, so grpcurl
needs no .proto file; request and response fields use their JSON names
(` + "`podUid`, `netnsPath`, `podIps`" + `, ...). The test's socket lived in a temporary
directory and is shown here as the default ` + "`" + shownSocket + "`" + `; the
namespace under /run/netns was made by the test. Everything else is verbatim.

Regenerate (as root, from the repository root):

` + "```sh\ngo test -count=1 ./e2e/ -run TestDaemonGrpcurl -args -grpcurl-transcript=$PWD/docs/grpcurl.md\n```" + `

**Unix sockets with grpcurl v1.9.2 and v1.9.3:** the ` + "`-unix`" + ` flag is broken
in these releases (fullstorydev/grpcurl#496 and #546, fixed upstream by
#498 after v1.9.3): grpcurl dials the socket path over TCP and fails with
"missing port in address". Give the socket as a ` + "`unix://`" + ` target
instead, with an absolute path: ` + "`grpcurl -plaintext unix:///run/nftredir/nftredir.sock ...`" + `.
`)
	for _, st := range s.steps {
		fmt.Fprintf(&b, "\n## %s\n\n", st.title)
		if st.note != "" {
			fmt.Fprintf(&b, "%s\n\n", st.note)
		}
		fmt.Fprintf(&b, "```console\n$ %s\n%s", st.shown, st.output)
		if !strings.HasSuffix(st.output, "\n") {
			b.WriteString("\n")
		}
		if st.code != 0 {
			fmt.Fprintf(&b, "$ echo $?\n%d\n", st.code)
		}
		b.WriteString("```\n")
	}
	return b.String()
}

// TestDaemonGrpcurl drives the daemon with grpcurl through reflection:
// list, describe, health, AddPod, ListPods, GetPod, a refused AddPod and
// RemovePod, checking the JSON names a grpcurl user types and reads.
func TestDaemonGrpcurl(t *testing.T) {
	nstest.RequirePrivileged(t)
	bin := binaries(t).Grpcurl
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("grpcurl is missing: %v; run hack/deps.sh (or make deps), which installs the pinned grpcurl into bin/", err)
	}
	d := startDaemon(t, daemonOpts{})
	ns := nstest.NewNetns(t)
	s := &grpcurlSession{t: t, bin: bin, sock: d.socket}
	target := "unix://" + shownSocket
	const uid = "0b5c8f3e-4c1d-4d6e-9a53-7f2e0c1d2b3a"

	// The form most grpcurl docs show.
	if st := s.run("The -unix flag (broken in v1.9.3)", "The usual `-unix PATH` form fails with this grpcurl release:",
		"-plaintext", "-unix", shownSocket, "list"); st.code == 0 {
		t.Logf("grpcurl -unix works again with this grpcurl; the note about it in the transcript is stale")
		s.steps = s.steps[:len(s.steps)-1]
	} else if !strings.Contains(st.output, "missing port in address") {
		t.Errorf("grpcurl -unix failed other than by the known v1.9.2/v1.9.3 bug:\n%s", st.output)
	}

	out := s.ok("List the services", "", "-plaintext", target, "list")
	for _, want := range []string{"nftredir.v1.RedirectService", "grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection"} {
		if !strings.Contains(out, want+"\n") {
			t.Errorf("grpcurl list does not show %s:\n%s", want, out)
		}
	}
	out = s.ok("List the methods", "", "-plaintext", target, "list", "nftredir.v1.RedirectService")
	for _, m := range []string{"AddPod", "RemovePod", "GetPod", "ListPods", "WatchPods"} {
		if !strings.Contains(out, "nftredir.v1.RedirectService."+m+"\n") {
			t.Errorf("grpcurl list nftredir.v1.RedirectService does not show %s:\n%s", m, out)
		}
	}
	out = s.ok("Describe a request", "Field names are shown in proto form; in JSON they are camelCase (`pod_uid` is `podUid`). "+
		"Reflection serves the API with its comments, so describe shows the documentation too.",
		"-plaintext", target, "describe", "nftredir.v1.AddPodRequest")
	// The comment lines prove reflection serves the documented descriptors,
	// not the comment-free ones compiled into the Go code.
	for _, want := range []string{"message AddPodRequest", "string pod_uid", "string netns_path", "repeated string pod_ips", "RedirectOptions options", "// "} {
		if !strings.Contains(out, want) {
			t.Errorf("grpcurl describe nftredir.v1.AddPodRequest lacks %q:\n%s", want, out)
		}
	}
	out = s.ok("Health", "Health needs no allowlist entry, for probes.",
		"-plaintext", "-d", `{"service":"nftredir.v1.RedirectService"}`, target, "grpc.health.v1.Health/Check")
	if !strings.Contains(out, `"SERVING"`) {
		t.Errorf("health check: %s; want SERVING", out)
	}

	add := fmt.Sprintf(`{"podUid":%q,"podName":"web-1","podNamespace":"default","netnsPath":%q,"podIps":["10.99.0.2","fd00:99::2"]}`, uid, ns.Path)
	out = s.ok("Enrol a pod", "", "-plaintext", "-d", add, target, "nftredir.v1.RedirectService/AddPod")
	var added struct {
		Pod struct {
			PodUID    string   `json:"podUid"`
			NetnsPath string   `json:"netnsPath"`
			PodIPs    []string `json:"podIps"`
		} `json:"pod"`
	}
	if err := json.Unmarshal([]byte(out), &added); err != nil || added.Pod.PodUID != uid || added.Pod.NetnsPath != ns.Path || len(added.Pod.PodIPs) != 2 {
		t.Errorf("AddPod reply (%v): %s; want pod.podUid %s, pod.netnsPath %s and both podIps", err, out, uid, ns.Path)
	}
	wantInSync(t, d.client(t), uid, ns)

	out = s.ok("List the enrolled pods", "", "-plaintext", target, "nftredir.v1.RedirectService/ListPods")
	var listed struct {
		Pods []map[string]any `json:"pods"`
	}
	if err := json.Unmarshal([]byte(out), &listed); err != nil || len(listed.Pods) != 1 ||
		listed.Pods[0]["podUid"] != uid || listed.Pods[0]["netnsPath"] != ns.Path {
		t.Errorf("ListPods (%v): %s; want one pod with podUid %s and netnsPath %s", err, out, uid, ns.Path)
	}

	out = s.ok("Check one pod against the kernel", "`syncStatus` compares the live table and routing with the record; `liveRuleset` is the table as the kernel has it.",
		"-plaintext", "-d", fmt.Sprintf(`{"podUid":%q}`, uid), target, "nftredir.v1.RedirectService/GetPod")
	if !strings.Contains(out, `"syncStatus": "SYNC_STATUS_IN_SYNC"`) || !strings.Contains(out, `"liveRuleset"`) {
		t.Errorf("GetPod: %s; want syncStatus SYNC_STATUS_IN_SYNC and a liveRuleset", out)
	}

	st := s.run("A refused request", "The node's own namespace is never programmed; the error says why, and grpcurl exits with 64 + the gRPC code.",
		"-plaintext", "-d", `{"podUid":"host-pod","netnsPath":"/proc/self/ns/net"}`, target, "nftredir.v1.RedirectService/AddPod")
	if st.code == 0 || !strings.Contains(st.output, "Code: FailedPrecondition") || !strings.Contains(st.output, "node's own network namespace") {
		t.Errorf("AddPod of /proc/self/ns/net through grpcurl: exit %d:\n%s\nwant a FailedPrecondition naming the node's namespace", st.code, st.output)
	}

	out = s.ok("Release the pod", "", "-plaintext", "-d", fmt.Sprintf(`{"podUid":%q}`, uid), target, "nftredir.v1.RedirectService/RemovePod")
	if !strings.Contains(out, `"existed": true`) {
		t.Errorf("RemovePod: %s; want existed true", out)
	}
	out = s.ok("Nothing is enrolled any more", "", "-plaintext", target, "nftredir.v1.RedirectService/ListPods")
	if strings.Contains(out, "podUid") {
		t.Errorf("ListPods after RemovePod: %s; want no pods", out)
	}
	if st := observePod(t, ns); !st.absent() {
		t.Errorf("after RemovePod %s shows %s; want nothing of ours", ns.Name, st)
	}

	if *grpcurlTranscript != "" && !t.Failed() {
		if err := os.WriteFile(*grpcurlTranscript, []byte(s.markdown()), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("transcript written to %s", *grpcurlTranscript)
	}
}
