package state

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"
	"time"

	"github.com/nftredir/nftredir/internal/durable"
)

// Every file the daemon keeps is a record of one Kind, keyed by a pod
// uid: a JSON object whose "kind" and "version" fields say how to read
// the rest. One rule writes them (write: the kind and its version
// stamped, atomic, fsynced), one reads them (decode: an older version
// is upgraded, a newer one left alone for the daemon that wrote it), one
// names them (the uid's SHA-256, so no uid names a path outside the
// directory), and one lister finds them (durable.ReadDir).

// Kind is what a record describes.
type Kind string

const (
	// KindPod is an enrolled pod's intent (Record); the same file, moved,
	// is a leftover (TeardownDir) or a quarantined record (QuarantineDir).
	KindPod Kind = "pod"
	// KindSighting is a pod sandbox the Kubernetes agent was told about,
	// captured or not (Sighting).
	KindSighting Kind = "sighting"
	// KindAnnotated says a pod's redirection annotation is nftredir's (Annotated).
	KindAnnotated Kind = "annotated"
)

// kindSpec is how a kind is read.
type kindSpec struct {
	// version is the version written; older ones go through upgrade.
	version int
	// upgrade returns the bytes of a record of version from (0: written
	// before the kind's files had a version) in the current version's
	// form. legacyUID is the uid a legacy file name carried, "" when the
	// file has a hashed name.
	upgrade func(from int, data []byte, legacyUID string) ([]byte, error)
	// disposable kinds are hints: a damaged one is removed, where a
	// record of any other kind is set aside in the quarantine.
	disposable bool
}

var kinds = map[Kind]kindSpec{
	// Version 1 records (every one written so far) lack the kind field;
	// it is implied by where they are, and adding it changes nothing an
	// older daemon reads, so it needs no new version.
	KindPod:       {version: Version},
	KindSighting:  {version: sightingVersion, upgrade: upgradeSighting, disposable: true},
	KindAnnotated: {version: annotatedVersion, upgrade: upgradeAnnotated},
}

// record is what every kind's Go type is.
type record interface {
	// stamp sets the kind and, when unset, the version the record is
	// written with.
	stamp()
}

const (
	recordSuffix = ".json"
	// QuarantineDir is the subdirectory of records set aside as unusable.
	QuarantineDir = "quarantine"
	// stampLayout is the time in the name of a record moved to the
	// teardown or quarantine directory: the record's own name, a dot,
	// this.
	stampLayout = "20060102T150405.000000000Z"
)

// fileName derives a record's file name from its pod's uid by hashing, so
// no uid, however odd, can name a path outside the directory or collide
// with the temp and quarantine names.
func fileName(podUID string) string {
	sum := sha256.Sum256([]byte(podUID))
	return hex.EncodeToString(sum[:]) + recordSuffix
}

func isRecordName(name string) bool {
	base, ok := strings.CutSuffix(name, recordSuffix)
	if !ok || len(base) != sha256.Size*2 {
		return false
	}
	_, err := hex.DecodeString(base)
	return err == nil && strings.ToLower(base) == base
}

// movedName is the name of a record moved aside at at.
func movedName(name string, at time.Time) string {
	return name + "." + at.UTC().Format(stampLayout)
}

// parseMoved splits a moved record's name into the record's name and
// what follows it.
func parseMoved(name string) (recName, rest string, ok bool) {
	base, rest, ok := strings.Cut(name, recordSuffix+".")
	if !ok || !isRecordName(base+recordSuffix) {
		return "", "", false
	}
	return base + recordSuffix, rest, true
}

// NewerError marks a record of a newer format than this daemon reads.
type NewerError struct {
	file    string
	kind    Kind
	version int
}

func (e *NewerError) Error() string {
	return fmt.Sprintf("%s record %s has format version %d; this nftredird reads up to %d: upgrade it", e.kind, e.file, e.version, kinds[e.kind].version)
}

// corruptError marks a record that exists but cannot be used.
type corruptError struct {
	file string
	err  error
}

func (e *corruptError) Error() string { return fmt.Sprintf("corrupt record %s: %v", e.file, e.err) }
func (e *corruptError) Unwrap() error { return e.err }

// decode reads data, the content of the file path, as a record of kind k
// into v. A record of an older version is upgraded first (upgraded says
// so: it should be written back); one of a newer version is a
// *NewerError; anything else that does not read is a *corruptError.
func decode(k Kind, path string, data []byte, legacyUID string, v any) (upgraded bool, err error) {
	spec := kinds[k]
	var h struct {
		Kind    Kind `json:"kind"`
		Version int  `json:"version"`
	}
	if err := json.Unmarshal(data, &h); err != nil {
		if spec.upgrade == nil {
			return false, &corruptError{file: path, err: err}
		}
		// Not JSON, or not with a usable header: only a version 0 file
		// can be that, and its upgrade says whether it is.
		h.Kind, h.Version = "", 0
	}
	if h.Kind != "" && h.Kind != k {
		return false, &corruptError{file: path, err: fmt.Errorf("a %s record where a %s record belongs", h.Kind, k)}
	}
	if h.Version > spec.version {
		// Written by a newer daemon (after a rollback): valid, just not
		// ours to read. Left in place for that daemon to find again.
		return false, &NewerError{file: path, kind: k, version: h.Version}
	}
	if h.Version < spec.version {
		if spec.upgrade == nil {
			return false, &corruptError{file: path, err: fmt.Errorf("%s record version %d is not supported (this daemon reads 1..%d)", k, h.Version, spec.version)}
		}
		if data, err = spec.upgrade(h.Version, data, legacyUID); err != nil {
			return false, &corruptError{file: path, err: fmt.Errorf("version %d: %w", h.Version, err)}
		}
		upgraded = true
	}
	if err := json.Unmarshal(data, v); err != nil {
		return false, &corruptError{file: path, err: err}
	}
	return upgraded, nil
}

// write replaces path with r, stamped, atomically and durably.
func write(path string, r record) error {
	r.stamp()
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return durable.WriteFile(path, append(data, '\n'))
}

// setAside moves the unusable record at path to the quarantine directory
// under dir, named after its record name and the time: kept for a person
// to inspect, never acted on as a record. It returns the new path, ""
// when another caller moved the file first.
func setAside(dir, path, recName string, at time.Time) (string, error) {
	dst := filepath.Join(dir, QuarantineDir, movedName(recName, at))
	err := durable.Move(path, dst)
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("quarantine %s: %w", path, err)
	}
	return dst, nil
}

func equalJSON(a, b any) bool {
	x, err1 := json.Marshal(a)
	y, err2 := json.Marshal(b)
	return err1 == nil && err2 == nil && bytes.Equal(x, y)
}
