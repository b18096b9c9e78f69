package install

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/fsnotify/fsnotify"
)

// settle is how long the watcher waits after an event before it syncs, so
// that a primary CNI writing its file in several steps is read once done.
const settle = 100 * time.Millisecond

// retryAfterError is the pause before a failed sync is tried again
// without an event (a file half-written, a directory not there yet).
const retryAfterError = time.Second

// Run syncs, then keeps the installation in place until ctx ends: it
// watches the configuration directory and the bin dirs and syncs again
// after every change to a network file or to the plugin binary, and every
// resync interval in case an event was missed. It returns only when ctx
// ends, or when the directories cannot be watched.
func (in *Installer) Run(ctx context.Context, resync time.Duration) error {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return err
	}
	defer w.Close()
	// The configuration directory is created if missing, so a node whose
	// primary CNI has not started yet is watched from the first moment.
	if err := os.MkdirAll(in.cfg.ConfDir, 0o755); err != nil {
		return err
	}
	if err := w.Add(in.cfg.ConfDir); err != nil {
		return fmt.Errorf("watch %s: %w", in.cfg.ConfDir, err)
	}
	dirs, _ := existingBinDirs(in.cfg.BinDirs)
	if g := in.cfg.NRIGateFile; g != "" {
		// The daemon writes it in a directory it creates, shared with
		// this container.
		if err := os.MkdirAll(filepath.Dir(g), 0o755); err != nil {
			return err
		}
		dirs = append(dirs, filepath.Dir(g))
	}
	for _, d := range dirs {
		if err := w.Add(d); err != nil {
			return fmt.Errorf("watch %s: %w", d, err)
		}
	}

	timer := time.NewTimer(0) // the first sync, at once
	defer timer.Stop()
	// A failure is retried every second (a node whose primary CNI has
	// not written its file yet); it is logged when it changes, not each
	// time.
	lastErr := ""
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-w.Events:
			if !ok {
				return nil
			}
			if in.relevant(ev) {
				timer.Reset(settle)
			}
		case err, ok := <-w.Errors:
			if !ok {
				return nil
			}
			// An overflow loses events; a sync finds whatever they were.
			in.log.Warn("watching the CNI directories", "error", err)
			timer.Reset(settle)
		case <-timer.C:
			next := resync
			err := in.Sync()
			switch {
			case err != nil && err.Error() != lastErr:
				in.log.Error("plugin not installed; retrying", "error", err)
				lastErr = err.Error()
			case err != nil:
				in.log.Debug("plugin still not installed", "error", err)
			case lastErr != "":
				in.log.Info("plugin installed")
				lastErr = ""
			}
			if err != nil {
				next = min(resync, retryAfterError)
			}
			timer.Reset(next)
		}
	}
}

// relevant says whether an event may have changed what is installed: a
// network file in the configuration directory, or the plugin binary.
// Temporary files (ours among them) are not.
func (in *Installer) relevant(ev fsnotify.Event) bool {
	dir, name := filepath.Split(ev.Name)
	dir = filepath.Clean(dir)
	if dir == filepath.Clean(in.cfg.ConfDir) {
		return slices.Contains(confExtensions, filepath.Ext(name))
	}
	if in.cfg.NRIGateFile != "" && filepath.Clean(ev.Name) == filepath.Clean(in.cfg.NRIGateFile) {
		return true
	}
	return name == PluginType
}
