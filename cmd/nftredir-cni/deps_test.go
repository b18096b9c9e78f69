package main

import (
	"os/exec"
	"strings"
	"testing"
)

// The runtime execs the plugin for every pod: packages with heavy
// initialisation stay out of it. Its API client is internal/rpc, not
// grpc-go; its Kubernetes lookup and its installer run in
// nftredir-cni-helper, so neither an HTTPS client nor a file watcher is
// linked in (about 0.6 ms of every pod's start, BENCHMARKS.md).
func TestPluginStaysLight(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command")
	}
	out, err := exec.Command(goBin, "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	var heavy []string
	for _, pkg := range strings.Fields(string(out)) {
		for _, prefix := range []string{"k8s.io/", "sigs.k8s.io/", "google.golang.org/grpc", "google.golang.org/protobuf", "net/http", "crypto/tls", "github.com/fsnotify/"} {
			if strings.HasPrefix(pkg, prefix) {
				heavy = append(heavy, pkg)
			}
		}
	}
	if len(heavy) > 0 {
		t.Errorf("nftredir-cni links %s", strings.Join(heavy, ", "))
	}
}
