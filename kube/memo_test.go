package kube

import (
	"os"
	"path/filepath"
	"testing"
)

func TestSightingsSurviveReopenAndSkipJunk(t *testing.T) {
	dir := t.TempDir()
	s, err := openSightings(dir)
	if err != nil {
		t.Fatal(err)
	}
	v := sighting{PodUID: "u1", Namespace: "shop", Name: "web", NetnsPath: "/var/run/netns/cni-1", NetnsID: "4:4026532000:77", PodIPs: []string{"10.0.0.5"}}
	if err := s.put(v); err != nil {
		t.Fatal(err)
	}
	// What a crash or another program could leave in the directory.
	for name, body := range map[string]string{
		"u2.json":         "{not json",
		"u3.json":         `{"pod_uid":"other","netns_id":"4:1:1"}`,
		"u4.json":         `{"pod_uid":"u4","netns_id":"garbage"}`,
		".tmp-u1.json-99": "{}",
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	s2, err := openSightings(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got := s2.uids(); len(got) != 1 || got[0] != "u1" {
		t.Fatalf("reopened sightings %v, want [u1]", got)
	}
	if g := s2.get("u1"); g == nil || g.NetnsPath != v.NetnsPath || g.NetnsID != v.NetnsID {
		t.Fatalf("reopened sighting %+v", g)
	}
	for _, name := range []string{"u2.json", "u3.json", "u4.json"} {
		if _, err := os.Stat(filepath.Join(dir, name)); !os.IsNotExist(err) {
			t.Errorf("unusable %s kept", name)
		}
	}
	if err := s2.forget("u1"); err != nil {
		t.Fatal(err)
	}
	if err := s2.forget("u1"); err != nil {
		t.Fatalf("second forget: %v", err)
	}
	s3, err := openSightings(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got := s3.uids(); len(got) != 0 {
		t.Errorf("forgotten sighting came back: %v", got)
	}
}

func TestSightingsRefuseRelativeDir(t *testing.T) {
	if _, err := openSightings("relative/dir"); err == nil {
		t.Error("relative directory accepted")
	}
}
