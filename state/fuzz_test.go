package state

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nftredir/nftredir/netns"
	"github.com/nftredir/nftredir/nft"
)

// FuzzRecordDecode writes arbitrary bytes as a pod's record file and
// reads it back as the daemon does at start. A record is refused (and
// would be quarantined) or is one the daemon can act on: its ruleset
// builds, its namespace id and routing parse, and writing it out again
// reads back as the same intent.
func FuzzRecordDecode(f *testing.F) {
	spec := nft.DefaultSpec("pod-a")
	spec.ExcludeInboundPorts = []uint16{8080}
	rec := &Record{
		Version: Version, PodUID: "pod-a", PodName: "web-0", PodNamespace: "shop",
		NetnsPath: "/run/netns/p", NetnsID: "4:4026532000:8193", PodIPs: []string{"10.0.0.7"},
		Spec: SpecOf(spec), Routing: RoutingOf(netns.DefaultRouting()),
		EnrolledAt: time.Unix(1700000000, 0).UTC(), UpdatedAt: time.Unix(1700000001, 0).UTC(),
	}
	b, err := json.Marshal(rec)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(b)
	rec.Leaving = &Leaving{NetnsPath: "/run/netns/old", NetnsID: "4:4026531999", Routing: rec.Routing}
	if b, err = json.Marshal(rec); err != nil {
		f.Fatal(err)
	}
	f.Add(b)
	st, err := Open(f.TempDir(), nil)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		// Stored under the name of the uid it claims, so that the
		// fuzzer can reach records the daemon accepts.
		var head struct {
			PodUID string `json:"podUid"`
		}
		json.Unmarshal(data, &head)
		name := fileName(head.PodUID)
		path := filepath.Join(st.dir, name)
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		defer os.Remove(path)
		r, err := decodeRecord(path, name, data)
		if err != nil {
			return
		}
		if _, err := r.Ruleset(); err != nil {
			t.Fatalf("accepted record builds no ruleset: %v", err)
		}
		if id, err := r.NamespaceID(); err != nil || id.IsZero() {
			t.Fatalf("accepted record's namespace id %q: %v", r.NetnsID, err)
		}
		if err := r.Routing.Netns().Validate(); err != nil {
			t.Fatalf("accepted record's routing: %v", err)
		}
		out, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, out, 0o600); err != nil {
			t.Fatal(err)
		}
		r2, err := decodeRecord(path, name, out)
		if err != nil {
			t.Fatalf("a record written back from an accepted one is refused: %v\n%s", err, out)
		}
		if !SameIntent(r, r2) {
			t.Fatalf("round trip changed the record:\n%s\n%+v", out, r2)
		}
	})
}
