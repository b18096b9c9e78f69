package main

import (
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"
)

// logWriter puts the daemon's log lines on a bounded queue that one
// goroutine writes out, so that logging never blocks a request and never
// fails one: a log reader that stalls (journald under load) fills the
// queue and later lines are dropped and counted; one that is gone (a log
// shim restarting) makes writes fail, which are dropped the same way. The
// daemon keeps serving either way. Order is kept: one goroutine writes.
type logWriter struct {
	out  io.Writer
	note func(dropped uint64) []byte
	max  int64

	ch      chan []byte
	queued  atomic.Int64 // bytes on ch
	dropped atomic.Uint64
	done    chan struct{}

	closeOnce sync.Once
	mu        sync.RWMutex
	// protects the following field; held for reading by Write so that
	// Close never closes ch under a sender
	closed bool
}

// logQueueBytes bounds what the queue holds: lines of a few hundred
// bytes, a few seconds' worth under a busy daemon.
const logQueueBytes = 4 << 20

// newLogWriter starts the writing goroutine. note formats the line that
// reports dropped lines, in the log's own format.
func newLogWriter(out io.Writer, maxBytes int64, note func(dropped uint64) []byte) *logWriter {
	w := &logWriter{out: out, note: note, max: maxBytes, ch: make(chan []byte, 1<<14), done: make(chan struct{})}
	go w.run()
	return w
}

// Write queues a copy of p; it never blocks and never fails.
func (w *logWriter) Write(p []byte) (int, error) {
	n := int64(len(p))
	w.mu.RLock()
	defer w.mu.RUnlock()
	if w.closed {
		w.dropped.Add(1)
		return len(p), nil
	}
	if w.queued.Add(n) > w.max {
		w.queued.Add(-n)
		w.dropped.Add(1)
		return len(p), nil
	}
	select {
	case w.ch <- append([]byte(nil), p...):
	default:
		w.queued.Add(-n)
		w.dropped.Add(1)
	}
	return len(p), nil
}

func (w *logWriter) run() {
	defer close(w.done)
	for b := range w.ch {
		w.queued.Add(-int64(len(b)))
		if n := w.dropped.Swap(0); n > 0 {
			w.out.Write(w.note(n))
		}
		// A failed write has nowhere to be reported; the line is lost
		// and the next one is tried.
		w.out.Write(b)
	}
	if n := w.dropped.Swap(0); n > 0 {
		w.out.Write(w.note(n))
	}
}

// Close writes out what is queued, waiting at most timeout (a reader that
// never reads must not keep the daemon from exiting). Later writes are
// dropped.
func (w *logWriter) Close(timeout time.Duration) {
	w.closeOnce.Do(func() {
		w.mu.Lock()
		w.closed = true
		close(w.ch)
		w.mu.Unlock()
	})
	select {
	case <-w.done:
	case <-time.After(timeout):
	}
}

// droppedNote formats the report of dropped lines like hclog's own
// lines, so that a JSON log stays JSON.
func droppedNote(jsonFormat bool) func(uint64) []byte {
	const msg = "log lines dropped: the log reader was gone or too slow"
	return func(n uint64) []byte {
		now := time.Now().Format(time.RFC3339Nano)
		if jsonFormat {
			return fmt.Appendf(nil, "{\"@level\":\"warn\",\"@message\":%q,\"@module\":\"nftredird\",\"@timestamp\":%q,\"dropped\":%d}\n", msg, now, n)
		}
		return fmt.Appendf(nil, "%s [WARN]  nftredird: %s: dropped=%d\n", now, msg, n)
	}
}
