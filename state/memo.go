package state

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/nftredir/nftredir/internal/durable"
)

// Memo is a directory of one kind's records, one per pod, with a copy in
// memory: for the kinds the Kubernetes agent keeps (Sighting, Mark),
// read on every event and written when they change. The records are the
// store's (file.go): same names, same write path, same version rule.
type Memo[T any, P memoRecord[T]] struct {
	dir  string
	kind Kind
	// same says two records need no rewrite.
	same func(a, b *T) bool

	mu    sync.Mutex // protects byUID
	byUID map[string]*T
}

// memoRecord is what a Memo's records are.
type memoRecord[T any] interface {
	*T
	record
	// uid is the pod the record is keyed by.
	uid() string
	// check rejects a record that must not be acted on.
	check() error
}

// openMemo reads dir (creating it if needed, clearing the temp files of
// interrupted writes) into memory, bringing every
// file to the current version and name: a legacy file (one named after
// its uid plus legacySuffix, as written before the kinds) is rewritten
// under its hashed name and then removed, so a crash in between leaves
// the same record under both names, which the next open resolves the
// same way. A damaged record is removed if its kind is disposable,
// quarantined otherwise; one of a newer version is left in place.
func openMemo[T any, P memoRecord[T]](dir string, kind Kind, legacySuffix string, same func(a, b *T) bool, log hclog.Logger) (*Memo[T, P], error) {
	if !filepath.IsAbs(dir) {
		return nil, fmt.Errorf("%s directory %q is not absolute", kind, dir)
	}
	if log == nil {
		log = hclog.NewNullLogger()
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("%s directory: %w", kind, err)
	}
	// Only this daemon writes here, and it is starting: a temp file is a
	// write that never completed.
	if _, err := durable.RemoveTemps(dir, 0, time.Now()); err != nil {
		return nil, err
	}
	legacyUID := func(name string) string {
		if isRecordName(name) {
			return ""
		}
		uid, _ := strings.CutSuffix(name, legacySuffix)
		if uid == name {
			return ""
		}
		return uid
	}
	files, err := durable.ReadDir(dir, func(name string) bool { return isRecordName(name) || legacyUID(name) != "" })
	if err != nil {
		return nil, fmt.Errorf("%s directory: %w", kind, err)
	}
	m := &Memo[T, P]{dir: dir, kind: kind, same: same, byUID: map[string]*T{}}
	for _, f := range files {
		path := filepath.Join(dir, f.Name)
		legacy := legacyUID(f.Name)
		v := new(T)
		upgraded, err := decode(kind, path, f.Data, legacy, P(v))
		if err == nil {
			err = P(v).check()
			switch uid := P(v).uid(); {
			case err != nil:
				err = &corruptError{file: path, err: err}
			case legacy == "" && fileName(uid) != f.Name, legacy != "" && legacy != uid:
				err = &corruptError{file: path, err: fmt.Errorf("%s record of pod %q is stored under the wrong name", kind, uid)}
			}
		}
		var ne *NewerError
		switch {
		case errors.As(err, &ne):
			log.Warn("skipping a record this daemon cannot read", "error", err)
			continue
		case err != nil && kinds[kind].disposable:
			if rerr := durable.Remove(path); rerr != nil {
				return nil, fmt.Errorf("remove unusable %s record: %w", kind, rerr)
			}
			log.Warn("unusable record removed", "kind", kind, "error", err)
			continue
		case err != nil:
			dst, qerr := setAside(dir, path, f.Name, time.Now())
			if qerr != nil {
				return nil, qerr
			}
			log.Error("corrupt record moved to quarantine", "kind", kind, "file", dst, "cause", err)
			continue
		}
		uid := P(v).uid()
		if upgraded || legacy != "" {
			if err := write(filepath.Join(dir, fileName(uid)), P(v)); err != nil {
				return nil, fmt.Errorf("migrate %s: %w", path, err)
			}
			if legacy != "" {
				if err := durable.Remove(path); err != nil {
					return nil, fmt.Errorf("migrate %s: %w", path, err)
				}
			}
			log.Info("record migrated to the current format", "kind", kind, "pod", uid)
		}
		m.byUID[uid] = v
	}
	return m, nil
}

// Put records v durably; one the same as the record kept is not
// rewritten.
func (m *Memo[T, P]) Put(v T) error {
	p := P(&v)
	if err := p.check(); err != nil {
		return fmt.Errorf("%s record: %w", m.kind, err)
	}
	uid := p.uid()
	m.mu.Lock()
	defer m.mu.Unlock()
	if old := m.byUID[uid]; old != nil && m.same(old, &v) {
		return nil
	}
	if err := write(filepath.Join(m.dir, fileName(uid)), p); err != nil {
		return fmt.Errorf("write %s record of pod %s: %w", m.kind, uid, err)
	}
	m.byUID[uid] = &v
	return nil
}

// Get returns a copy of the pod's record, nil if there is none.
func (m *Memo[T, P]) Get(uid string) *T {
	m.mu.Lock()
	defer m.mu.Unlock()
	if v := m.byUID[uid]; v != nil {
		c := *v
		return &c
	}
	return nil
}

// Forget removes the pod's record durably; none is fine.
func (m *Memo[T, P]) Forget(uid string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.byUID[uid]; !ok {
		return nil
	}
	if err := durable.Remove(filepath.Join(m.dir, fileName(uid))); err != nil {
		return fmt.Errorf("forget %s record of pod %s: %w", m.kind, uid, err)
	}
	delete(m.byUID, uid)
	return nil
}

// UIDs lists the pods that have a record.
func (m *Memo[T, P]) UIDs() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]string, 0, len(m.byUID))
	for uid := range m.byUID {
		out = append(out, uid)
	}
	return out
}
