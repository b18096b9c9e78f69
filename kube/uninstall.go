package kube

import (
	"context"
	"errors"
	"fmt"
)

// Releaser is what an uninstall needs of the lifecycle engine:
// *lifecycle.Manager is one.
type Releaser interface {
	Enroller
	// HeldUIDs lists every pod whose capture may remain: enrolled, of a
	// quarantined record, or of a namespace left for its teardown.
	HeldUIDs() ([]string, error)
}

// ReleaseAll releases every pod whose capture enr may hold (enrolled, of
// a quarantined record, of a namespace left for teardown) and takes the
// redirection annotation off each that nftredir wrote, so istiod stops
// sending it HBONE: the daemon's part of an uninstall that releases
// captured pods. The agent's watches must be stopped (Start's context
// ended), or they could enrol pods again. It goes on past a pod that
// fails and returns every failure.
func (a *Agent) ReleaseAll(ctx context.Context, enr Releaser) (released int, err error) {
	uids, err := enr.HeldUIDs()
	if err != nil {
		return 0, fmt.Errorf("list the pods nftredir may hold: %w", err)
	}
	var errs []error
	for _, uid := range uids {
		rec, err := enr.Enrolled(uid)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if _, err := enr.Release(ctx, uid); err != nil {
			errs = append(errs, fmt.Errorf("release pod %s: %w", uid, err))
			continue
		}
		released++
		a.applied.Delete(uid)
		ns, name := rec.GetPodNamespace(), rec.GetPodName()
		if rec == nil {
			// A pod of a quarantined record or of a namespace left for
			// teardown: the mark of its annotation, if nftredir wrote
			// one, still names it.
			mark, ok := a.marks.get(uid)
			if !ok {
				continue
			}
			ns, name = mark.Namespace, mark.Name
		}
		log := a.log.With("pod", uid, "namespace", ns, "name", name)
		pod := a.cachedPodByUID(uid)
		if pod == nil && ns != "" && name != "" {
			if pod, err = a.getPod(ctx, ns, name, uid); err != nil {
				log.Warn("pod released; cannot read it to clear its annotation", "error", err)
				continue
			}
		}
		if pod != nil {
			if err := a.showNotCaptured(ctx, pod); err != nil {
				log.Warn("pod released; its annotation stays", "error", err)
			}
		}
		log.Info("pod released: nftredir is being uninstalled")
	}
	return released, errors.Join(errs...)
}
