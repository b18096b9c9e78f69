package state

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/nftredir/nftredir/internal/durable"
)

// A record that cannot be used is moved to the quarantine directory and
// never acted on as a record. Its pod's capture, though, may still be in
// place, and the pod must stay releasable: RemovePod reads what it can of
// the quarantined bytes (the namespace path, its identity, the routing)
// and removes only a table whose rule comments carry the pod's uid. Once
// released, the file is renamed with ReleasedSuffix: kept for a person,
// no longer reported as pending.

// ReleasedSuffix marks a quarantined record whose pod has been released.
const ReleasedSuffix = ".released"

// Quarantined is one quarantined record whose pod was not released yet.
type Quarantined struct {
	// Path is the quarantined file.
	Path string
	// PodUID is the uid it is stored under, "" if not known.
	PodUID string
	// Salvage is what could still be read of it.
	Salvage Salvaged
	// Reason says why it was set aside.
	Reason string
}

// Salvaged is what could still be read of a damaged record.
type Salvaged struct {
	PodUID    string
	NetnsPath string
	NetnsID   string
	Routing   *Routing
}

// salvage reads the record's top-level fields that a release needs, one
// value at a time, so that a record truncated or damaged after them, or
// with another field of the wrong type, still yields them. Nothing read
// here is trusted: a release checks the namespace and its table first.
func salvage(data []byte) Salvaged {
	var sv Salvaged
	dec := json.NewDecoder(bytes.NewReader(data))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return sv
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return sv
		}
		key, _ := tok.(string)
		var dst any
		var str string
		var rt Routing
		switch key {
		case "podUid", "netnsPath", "netnsId":
			dst = &str
		case "routing":
			dst = &rt
		default:
			dst = new(json.RawMessage)
		}
		if err := dec.Decode(dst); err != nil {
			var te *json.UnmarshalTypeError
			if errors.As(err, &te) {
				continue // the value was consumed; it is just not usable
			}
			return sv
		}
		switch key {
		case "podUid":
			sv.PodUID = str
		case "netnsPath":
			sv.NetnsPath = str
		case "netnsId":
			sv.NetnsID = str
		case "routing":
			sv.Routing = &rt
		}
	}
	return sv
}

// QuarantinedFor lists the quarantined records stored under uid's name
// whose pod was not released. An unreadable quarantine directory is an
// error, so a pod that may still be captured is not reported as unknown.
func (s *Store) QuarantinedFor(uid string) ([]Quarantined, error) {
	return s.listQuarantined(fileName(uid)+".", uid)
}

// QuarantinedAll lists every quarantined record not released.
func (s *Store) QuarantinedAll() ([]Quarantined, error) {
	return s.listQuarantined("", "")
}

func (s *Store) listQuarantined(prefix, uid string) ([]Quarantined, error) {
	qdir := filepath.Join(s.dir, QuarantineDir)
	files, err := durable.ReadDir(qdir, func(name string) bool {
		return strings.HasPrefix(name, prefix) && !strings.HasSuffix(name, ReleasedSuffix)
	})
	if err != nil {
		return nil, fmt.Errorf("read quarantine dir: %w", err)
	}
	var out []Quarantined
	for _, f := range files {
		// The file is the record's name plus the time it was set aside.
		recName, _, ok := parseMoved(f.Name)
		if !ok {
			continue
		}
		path := filepath.Join(qdir, f.Name)
		q := Quarantined{Path: path, PodUID: uid, Salvage: salvage(f.Data)}
		if q.PodUID == "" && fileName(q.Salvage.PodUID) == recName {
			q.PodUID = q.Salvage.PodUID
		}
		if _, err := decodeRecord(path, recName, f.Data); err != nil {
			q.Reason = err.Error()
		} else {
			q.Reason = "the record reads well now; it was set aside when it did not"
		}
		out = append(out, q)
	}
	return out, nil
}

// MarkReleased renames a quarantined record once its pod is released.
func (s *Store) MarkReleased(path string) error {
	if err := durable.Move(path, path+ReleasedSuffix); err != nil {
		return fmt.Errorf("mark quarantined record released: %w", err)
	}
	return nil
}
