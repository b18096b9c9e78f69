package podowner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"
)

// Watcher follows the pod's DaemonSet from the start, so that the stop
// knows of its deletion even when the API no longer answers this pod by
// then: an uninstall (helm uninstall, kubectl delete -k) deletes the
// ServiceAccount and the RBAC bindings right after the DaemonSet, often
// before the pod is told to stop, and a GET at that moment is refused. A
// watch authorised while the permissions were there keeps delivering.
type Watcher struct {
	c         *Client
	namespace string
	pod       string
	log       func(msg string, kv ...any)

	mu    sync.Mutex
	owner *ownerRef // the pod's DaemonSet, once read
	seen  Verdict   // what the watch has seen of it
	why   string
}

// Watch starts following the DaemonSet of pod namespace/name until ctx
// ends. log, if not nil, gets a line when the watch cannot be kept.
func (c *Client) Watch(ctx context.Context, namespace, name string, log func(msg string, kv ...any)) *Watcher {
	if log == nil {
		log = func(string, ...any) {}
	}
	w := &Watcher{c: c, namespace: namespace, pod: name, log: log}
	go w.run(ctx)
	return w
}

// settleWait is how long Verdict waits for the watch when the GET at the
// stop is refused: the DaemonSet's deletion event may be on its way.
const settleWait = 2 * time.Second

// Verdict is the answer at the stop: Deleted if the watch saw the
// DaemonSet go, else what a GET says now. A GET refused while the watch
// says nothing gets settleWait for the watch to catch up.
func (w *Watcher) Verdict(ctx context.Context) (Verdict, string, error) {
	if v, why := w.seenVerdict(); v == Deleted {
		return v, why + " (watched)", nil
	}
	v, why, err := w.c.Check(ctx, w.namespace, w.pod)
	if err == nil && v != Unknown {
		return v, why, nil
	}
	deadline := time.Now().Add(settleWait)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if sv, swhy := w.seenVerdict(); sv == Deleted {
			return sv, swhy + " (watched)", nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return v, why, err
}

func (w *Watcher) seenVerdict() (Verdict, string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.seen, w.why
}

func (w *Watcher) set(v Verdict, why string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.seen == Deleted {
		return // final
	}
	w.seen, w.why = v, why
}

// watchRetry spaces the watch's restarts after a failure.
const watchRetry = 5 * time.Second

func (w *Watcher) run(ctx context.Context) {
	for ctx.Err() == nil {
		if err := w.once(ctx); err != nil && ctx.Err() == nil {
			w.log("watching the DaemonSet failed; retrying", "error", err, "retry_in", watchRetry)
		}
		if v, _ := w.seenVerdict(); v == Deleted {
			return
		}
		select {
		case <-ctx.Done():
		case <-time.After(watchRetry):
		}
	}
}

// once reads the owner (first time), the DaemonSet, and watches it from
// the version read until the stream ends.
func (w *Watcher) once(ctx context.Context) error {
	w.mu.Lock()
	owner := w.owner
	w.mu.Unlock()
	if owner == nil {
		pod, err := w.c.get(ctx, "/api/v1/namespaces/"+url.PathEscape(w.namespace)+"/pods/"+url.PathEscape(w.pod))
		if err != nil {
			return fmt.Errorf("read pod %s/%s: %w", w.namespace, w.pod, err)
		}
		if owner = daemonSetOwner(pod); owner == nil {
			v, why := decide(pod, nil, nil)
			w.set(v, why)
			return errors.New(why)
		}
		w.mu.Lock()
		w.owner = owner
		w.mu.Unlock()
	}
	base := "/apis/apps/v1/namespaces/" + url.PathEscape(w.namespace) + "/daemonsets"
	ds, rv, err := w.c.getRV(ctx, base+"/"+url.PathEscape(owner.Name))
	if err != nil {
		return err
	}
	w.set(decide(&object{}, owner, ds))
	if ds == nil {
		return nil
	}
	q := url.Values{
		"watch":               {"1"},
		"fieldSelector":       {"metadata.name=" + owner.Name},
		"resourceVersion":     {rv},
		"allowWatchBookmarks": {"true"},
		"timeoutSeconds":      {"600"},
	}
	return w.c.stream(ctx, base+"?"+q.Encode(), func(typ string, o *object) bool {
		switch typ {
		case "DELETED":
			if o.Metadata.UID == owner.UID {
				w.set(Deleted, fmt.Sprintf("DaemonSet %s was deleted", owner.Name))
				return false
			}
		case "ADDED", "MODIFIED":
			w.set(decide(&object{}, owner, o))
		}
		v, _ := w.seenVerdict()
		return v != Deleted
	})
}

// getRV is get plus the object's resourceVersion, where a watch starts.
func (c *Client) getRV(ctx context.Context, path string) (*object, string, error) {
	var raw struct {
		Metadata struct {
			ResourceVersion string `json:"resourceVersion"`
		} `json:"metadata"`
	}
	o, err := c.getInto(ctx, path, &raw)
	return o, raw.Metadata.ResourceVersion, err
}

// watchEvent is one line of a watch stream.
type watchEvent struct {
	Type   string          `json:"type"`
	Object json.RawMessage `json:"object"`
}

// stream runs a watch request and hands each event to f until f returns
// false, the stream ends, or ctx does. An ERROR event (the version is too
// old, 410) ends it; the caller reads the object again.
func (c *Client) stream(ctx context.Context, pathQuery string, f func(typ string, o *object) bool) error {
	req, err := c.request(ctx, pathQuery)
	if err != nil {
		return err
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("watch %s: %s", pathQuery, resp.Status)
	}
	dec := json.NewDecoder(resp.Body)
	for {
		var ev watchEvent
		if err := dec.Decode(&ev); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("watch stream: %w", err)
		}
		switch ev.Type {
		case "ERROR":
			return fmt.Errorf("watch: %s", strings.TrimSpace(string(ev.Object)))
		case "BOOKMARK":
			continue
		}
		var o object
		if err := json.Unmarshal(ev.Object, &o); err != nil {
			return fmt.Errorf("watch event: %w", err)
		}
		if !f(ev.Type, &o) {
			return nil
		}
	}
}
