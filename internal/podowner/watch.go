package podowner

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"
)

// Watcher follows the pod's DaemonSet from the start, so that the stop
// knows of its deletion even when the API no longer answers this pod by
// then: an uninstall (helm uninstall) deletes the
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
	// seen is the last news of each followed object (the DaemonSet, the
	// namespace); none is final: a DaemonSet deleted and created again
	// under its name is a replacement, not an uninstall.
	seen map[string]news
}

type news struct {
	v   Verdict
	why string
}

// Watch starts following the DaemonSet of pod namespace/name until ctx
// ends. log, if not nil, gets a line when the watch cannot be kept.
func (c *Client) Watch(ctx context.Context, namespace, name string, log func(msg string, kv ...any)) *Watcher {
	if log == nil {
		log = func(string, ...any) {}
	}
	w := &Watcher{c: c, namespace: namespace, pod: name, log: log, seen: map[string]news{}}
	go w.run(ctx)
	return w
}

// settleWait is how long Verdict waits for the watch when the GET at the
// stop is refused: the DaemonSet's deletion event may be on its way.
const settleWait = 2 * time.Second

// Verdict is the answer at the stop: what a GET says now, when the API
// answers this pod; else what the watch saw last, with settleWait for a
// deletion event that may be on its way.
func (w *Watcher) Verdict(ctx context.Context) (Verdict, string, error) {
	v, why, err := w.c.Check(ctx, w.namespace, w.pod)
	if err == nil && v != Unknown {
		return v, why, nil
	}
	deadline := time.Now().Add(settleWait)
	for {
		if sv, swhy := w.seenVerdict(); sv == Deleted || time.Now().After(deadline) || ctx.Err() != nil {
			if sv != Unknown {
				return sv, swhy + " (watched)", nil
			}
			return v, why, err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// seenVerdict combines the news: any deletion is an uninstall, else a
// DaemonSet there (or replaced) is not.
func (w *Watcher) seenVerdict() (Verdict, string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := news{v: Unknown}
	for _, n := range w.seen {
		if n.v == Deleted || (n.v == Lives && out.v == Unknown) {
			out = n
		}
	}
	return out.v, out.why
}

func (w *Watcher) set(key string, v Verdict, why string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.seen[key] = news{v, why}
}

// watchRetry spaces the watch's restarts after a failure.
const watchRetry = 5 * time.Second

// target is one object the watcher follows: its collection's path, its
// name, and what an event of it means (judge returns Unknown for "no
// news"; o is nil when a read found the object gone).
type target struct {
	collection, name string
	judge            func(typ string, o *object) (Verdict, string)
}

func (w *Watcher) run(ctx context.Context) {
	var owner *ownerRef
	for owner == nil {
		pod, err := w.c.get(ctx, "/api/v1/namespaces/"+url.PathEscape(w.namespace)+"/pods/"+url.PathEscape(w.pod))
		switch {
		case err != nil:
			w.log("cannot read this pod to find its DaemonSet; retrying", "error", err, "retry_in", watchRetry)
		default:
			if owner = daemonSetOwner(pod); owner == nil {
				_, why := decide(pod, nil, nil)
				w.log("not following a DaemonSet", "why", why)
				return
			}
		}
		if owner == nil && !sleep(ctx, watchRetry) {
			return
		}
	}
	w.mu.Lock()
	w.owner = owner
	w.mu.Unlock()
	// The namespace too: deleting it (kubectl delete namespace) deletes
	// the pods, maybe before the DaemonSet.
	ns := target{collection: "/api/v1/namespaces", name: w.namespace, judge: func(typ string, o *object) (Verdict, string) {
		if o == nil || typ == "DELETED" || o.Metadata.DeletionTimestamp != nil {
			return Deleted, fmt.Sprintf("namespace %s is being deleted", w.namespace)
		}
		return Unknown, ""
	}}
	ds := target{collection: "/apis/apps/v1/namespaces/" + url.PathEscape(w.namespace) + "/daemonsets", name: owner.Name, judge: func(typ string, o *object) (Verdict, string) {
		if o == nil {
			return Deleted, fmt.Sprintf("DaemonSet %s is gone", owner.Name)
		}
		if typ == "DELETED" {
			if o.Metadata.UID == owner.UID {
				return Deleted, fmt.Sprintf("DaemonSet %s was deleted", owner.Name)
			}
			return Unknown, ""
		}
		return decide(&object{}, owner, o)
	}}
	go w.follow(ctx, ns)
	w.follow(ctx, ds)
}

// sleep waits d or until ctx ends; false if it ended.
func sleep(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}

// follow watches t until ctx ends, reading it again whenever the stream
// ends.
func (w *Watcher) follow(ctx context.Context, t target) {
	for ctx.Err() == nil {
		if err := w.once(ctx, t); err != nil && ctx.Err() == nil {
			w.log("watching failed; retrying", "object", t.collection+"/"+t.name, "error", err, "retry_in", watchRetry)
			if !sleep(ctx, watchRetry) {
				return
			}
		}
	}
}

// once reads t and watches it from the version read until the stream
// ends (the server closes it after timeoutSeconds).
func (w *Watcher) once(ctx context.Context, t target) error {
	o, rv, err := w.c.getRV(ctx, t.collection+"/"+url.PathEscape(t.name))
	if err != nil {
		return err
	}
	key := t.collection + "/" + t.name
	judged := func(v Verdict, why string) {
		if v != Unknown {
			w.set(key, v, why)
		}
	}
	if o == nil {
		judged(t.judge("DELETED", nil))
		// Nothing to watch from; look again in a while.
		if !sleep(ctx, watchRetry) {
			return nil
		}
		return nil
	}
	judged(t.judge("ADDED", o))
	q := url.Values{
		"watch":               {"1"},
		"fieldSelector":       {"metadata.name=" + t.name},
		"resourceVersion":     {rv},
		"allowWatchBookmarks": {"true"},
		"timeoutSeconds":      {"600"},
	}
	return w.c.stream(ctx, t.collection+"?"+q.Encode(), func(typ string, o *object) bool {
		judged(t.judge(typ, o))
		return true
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
