package plugin

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	nftredirv1 "github.com/nftredir/nftredir/proto/nftredir/v1"
)

// records lists the attachment record files under the data dir.
func (e *env) records(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(e.dataDir, "*", "*:*"))
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// fakeNetns makes a file standing in for a namespace path: the sweep only
// asks whether the path still exists.
func fakeNetns(t *testing.T, dir, name string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// Every DEL that succeeds removes the attachment's record, whatever it
// found; a DEL that fails keeps it for the runtime's retry.
func TestCNIDelRemovesRecordOnEveryPath(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, e *env)
		// delNetns is the namespace DEL names ("" as in a runtime's
		// second DEL).
		delNetns string
		fail     bool
	}{
		{name: "released", delNetns: "/run/netns/pod1"},
		{name: "empty netns", delNetns: ""},
		{name: "not enrolled", delNetns: "/run/netns/pod1", setup: func(t *testing.T, e *env) {
			if _, err := e.fake.RemovePod(t.Context(), &nftredirv1.RemovePodRequest{PodUid: "uid-1"}); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "daemon down", delNetns: "/run/netns/pod1", setup: func(t *testing.T, e *env) { e.stop(t) }},
		{name: "daemon refuses", delNetns: "/run/netns/pod1", setup: func(t *testing.T, e *env) {
			e.fake.Fail("RemovePod", status.Error(codes.PermissionDenied, "no"))
		}},
		{name: "newer sandbox", delNetns: "/run/netns/pod1", setup: func(t *testing.T, e *env) {
			// The pod's next sandbox enrolled it with another namespace.
			conf := e.conf(t, "1.0.0", prevResults["1.0.0"], nil)
			e.add(t, args(conf, "ctr2", "/run/netns/pod2", k8sArgs1))
		}},
		{name: "daemon fault", delNetns: "/run/netns/pod1", fail: true, setup: func(t *testing.T, e *env) {
			e.fake.Fail("RemovePod", slices.Repeat([]error{status.Error(codes.Internal, "boom")}, 10)...)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			conf := e.conf(t, "1.0.0", prevResults["1.0.0"], nil)
			e.add(t, args(conf, "ctr1", "/run/netns/pod1", k8sArgs1))
			if tc.setup != nil {
				tc.setup(t, e)
			}
			err := e.p.Del(args(conf, "ctr1", tc.delNetns, k8sArgs1))
			if (err != nil) != tc.fail {
				t.Fatalf("DEL error = %v, want failure %v", err, tc.fail)
			}
			att, _ := attachments{e.dataDir}.Get("net", "ctr1", "eth0")
			if (att != nil) != tc.fail {
				t.Errorf("record kept = %v after DEL (error %v); want kept only when DEL fails", att != nil, err)
			}
		})
	}
}

// containerd deletes a sandbox twice, the second time with an empty
// namespace. By then the first DEL removed the record; if a newer sandbox
// of the same pod has enrolled it meanwhile, the second DEL of the old one
// must leave it alone.
func TestCNISecondDelWithoutNetnsLeavesNewerSandbox(t *testing.T) {
	e := newEnv(t)
	conf := e.conf(t, "1.0.0", prevResults["1.0.0"], nil)
	e.add(t, args(conf, "ctr1", "/run/netns/old", k8sArgs1))
	e.add(t, args(conf, "ctr2", "/run/netns/new", k8sArgs1))
	for i, netns := range []string{"/run/netns/old", ""} {
		if err := e.p.Del(args(conf, "ctr1", netns, k8sArgs1)); err != nil {
			t.Fatalf("DEL #%d: %v", i+1, err)
		}
		if p := e.fake.Pod("uid-1"); p == nil || p.NetnsPath != "/run/netns/new" {
			t.Fatalf("DEL #%d of the old sandbox released the new one: %v", i+1, p)
		}
	}
	if err := e.p.Del(args(conf, "ctr2", "/run/netns/new", k8sArgs1)); err != nil {
		t.Fatal(err)
	}
	if e.fake.Pod("uid-1") != nil {
		t.Fatal("DEL of the current sandbox left the pod enrolled")
	}
	if files := e.records(t); len(files) != 0 {
		t.Errorf("records left: %v", files)
	}
}

// A runtime that never calls GC still leaves no more records than it has
// live attachments: DEL removes its own, and ADD sweeps those of
// sandboxes that vanished without a DEL.
func TestCNIRecordsStayBoundedWithoutGC(t *testing.T) {
	e := newEnv(t)
	e.p.SweepInterval = -1 // sweep on every ADD; the interval has its own test
	conf := e.conf(t, "1.0.0", prevResults["1.0.0"], nil)
	nsDir := t.TempDir()
	const cycles, orphans = 200, 50

	for i := range cycles {
		netns := fakeNetns(t, nsDir, fmt.Sprint("cycle", i))
		a := args(conf, fmt.Sprint("cyc", i), netns, fmt.Sprintf("IgnoreUnknown=1;K8S_POD_UID=uid-cyc%d", i))
		e.add(t, a)
		if err := e.p.Del(a); err != nil {
			t.Fatal(err)
		}
		// containerd's second DEL, with the namespace gone.
		os.Remove(netns)
		a.Netns = ""
		if err := e.p.Del(a); err != nil {
			t.Fatal(err)
		}
	}
	if files := e.records(t); len(files) != 0 {
		t.Fatalf("%d ADD/DEL cycles left %d records: %v", cycles, len(files), files)
	}

	// Sandboxes whose DEL never comes: their namespaces vanish (a crash,
	// a runtime that lost them).
	var lost []string
	for i := range orphans {
		netns := fakeNetns(t, nsDir, fmt.Sprint("orphan", i))
		e.add(t, args(conf, fmt.Sprint("orph", i), netns, fmt.Sprintf("IgnoreUnknown=1;K8S_POD_UID=uid-orph%d", i)))
		lost = append(lost, netns)
	}
	if n := len(e.records(t)); n != orphans {
		t.Fatalf("%d records for %d live attachments", n, orphans)
	}
	for _, p := range lost {
		os.Remove(p)
	}
	live := args(conf, "live", fakeNetns(t, nsDir, "live"), "IgnoreUnknown=1;K8S_POD_UID=uid-live")
	e.add(t, live)
	files := e.records(t)
	if len(files) != 1 || !strings.HasSuffix(files[0], "live:eth0") {
		t.Fatalf("after the namespaces of %d undeleted sandboxes vanished, records left: %v", orphans, files)
	}
	// What remains is only the live pod's, and the pod still deletes.
	if err := e.p.Del(live); err != nil {
		t.Fatal(err)
	}
	if e.fake.Pod("uid-live") != nil || len(e.records(t)) != 0 {
		t.Fatal("live pod's DEL did not release it and its record")
	}
}

// The sweep reads every record, so ADD runs it once per interval; a live
// namespace's record is never swept, however old.
func TestCNISweepInterval(t *testing.T) {
	e := newEnv(t)
	conf := e.conf(t, "1.0.0", prevResults["1.0.0"], nil)
	nsDir := t.TempDir()
	gone := fakeNetns(t, nsDir, "gone")
	kept := fakeNetns(t, nsDir, "kept")
	e.add(t, args(conf, "gone", gone, "IgnoreUnknown=1;K8S_POD_UID=uid-gone"))
	e.add(t, args(conf, "kept", kept, "IgnoreUnknown=1;K8S_POD_UID=uid-kept"))
	os.Remove(gone)
	third := args(conf, "third", fakeNetns(t, nsDir, "third"), "IgnoreUnknown=1;K8S_POD_UID=uid-third")
	e.add(t, third)
	if n := len(e.records(t)); n != 3 {
		t.Fatalf("%d records; want 3: the first ADD swept, and the interval has not passed since", n)
	}
	// The interval passes.
	old := time.Now().Add(-DefaultSweepInterval - time.Second)
	if err := os.Chtimes(filepath.Join(e.dataDir, sweepMarker), old, old); err != nil {
		t.Fatal(err)
	}
	if err := e.p.Del(third); err != nil {
		t.Fatal(err)
	}
	e.add(t, third)
	files := e.records(t)
	slices.Sort(files)
	want := []string{filepath.Join(e.dataDir, "net", "kept:eth0"), filepath.Join(e.dataDir, "net", "third:eth0")}
	if !slices.Equal(files, want) {
		t.Fatalf("records after the interval: %v, want %v", files, want)
	}
}
