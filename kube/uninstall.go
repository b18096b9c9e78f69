package kube

import (
	"context"
	"errors"
	"fmt"
)

// ReleaseAll releases every pod enr has enrolled and takes the redirection
// annotation off each, so istiod stops sending it HBONE: the daemon's part
// of an uninstall that releases captured pods. The agent's watches must be
// stopped (Start's context ended), or they could enrol pods again. It
// goes on past a pod that fails and returns every failure.
func (a *Agent) ReleaseAll(ctx context.Context, enr Enroller) (released int, err error) {
	uids, err := enr.EnrolledUIDs()
	if err != nil {
		return 0, fmt.Errorf("list enrolled pods: %w", err)
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
		if rec == nil {
			continue
		}
		log := a.log.With("pod", uid, "namespace", rec.GetPodNamespace(), "name", rec.GetPodName())
		pod := a.cachedPodByUID(uid)
		if pod == nil && rec.GetPodNamespace() != "" && rec.GetPodName() != "" {
			if pod, err = a.getPod(ctx, rec.GetPodNamespace(), rec.GetPodName(), uid); err != nil {
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
