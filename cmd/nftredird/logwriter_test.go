package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

// gate is an output that blocks until opened, as a pipe whose reader
// stopped reading does.
type gate struct {
	open chan struct{}
	mu   sync.Mutex
	buf  bytes.Buffer
}

func (g *gate) Write(p []byte) (int, error) {
	<-g.open
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.buf.Write(p)
}

func TestLogWriterNeverBlocksAndCountsDrops(t *testing.T) {
	g := &gate{open: make(chan struct{})}
	w := newLogWriter(g, 100, droppedNote(true))
	start := time.Now()
	for i := range 1000 {
		fmt.Fprintf(w, "line %03d\n", i)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("1000 writes to a blocked output took %s", d)
	}
	close(g.open)
	w.Close(5 * time.Second)
	out := g.buf.String()
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	// In order (with gaps where lines were dropped), and every dropped
	// line counted in a note.
	kept, last, dropped := 0, -1, 0
	for _, l := range lines {
		if strings.HasPrefix(l, "{") {
			var note struct{ Dropped int }
			if err := json.Unmarshal([]byte(l), &note); err != nil {
				t.Errorf("note is not JSON: %q: %v", l, err)
			}
			dropped += note.Dropped
			continue
		}
		var n int
		if _, err := fmt.Sscanf(l, "line %d", &n); err != nil || n <= last {
			t.Fatalf("line %q after line %d: order lost", l, last)
		}
		last = n
		kept++
	}
	if kept == 0 || kept+dropped != 1000 {
		t.Errorf("%d lines kept, %d reported dropped; want all 1000 accounted for:\n%s", kept, dropped, out)
	}
	// After Close, writes are dropped, not panics.
	fmt.Fprintln(w, "late")
}

func TestLogWriterCloseDoesNotWaitForever(t *testing.T) {
	g := &gate{open: make(chan struct{})}
	defer close(g.open)
	w := newLogWriter(g, 1<<20, droppedNote(false))
	fmt.Fprintln(w, "stuck")
	start := time.Now()
	w.Close(100 * time.Millisecond)
	if d := time.Since(start); d > time.Second {
		t.Errorf("Close with a reader that never reads took %s", d)
	}
}
