package zds

import "github.com/nftredir/nftredir/state"

// PodOf is what the node proxy is told about the pod a record enrols.
func PodOf(r *state.Record) Pod {
	id, _ := r.NamespaceID() // records are checked when read
	p := Pod{
		UID:       r.PodUID,
		Name:      r.PodName,
		Namespace: r.PodNamespace,
		NetnsPath: r.NetnsPath,
		NetnsID:   id,
	}
	if r.ServiceAccount != nil {
		p.ServiceAccount = *r.ServiceAccount
	}
	return p
}

// StorePods is the enrolled set as the state store holds it: the daemon's
// PodSource. Errors are returned, never an empty list: a proxy that gets
// an empty snapshot drops every pod it serves.
type StorePods struct{ Store *state.Store }

// Pods lists every record as a Pod.
func (s StorePods) Pods() ([]Pod, error) {
	records, err := s.Store.List()
	if err != nil {
		return nil, err
	}
	pods := make([]Pod, len(records))
	for i, r := range records {
		pods[i] = PodOf(r)
	}
	return pods, nil
}
