// Package syncbuf is a bytes buffer that one goroutine (a logger, a
// server under test) writes while another reads it: tests capture logs
// with it.
package syncbuf

import (
	"bytes"
	"sync"
)

// Buffer is safe for concurrent Write and String.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *Buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String returns everything written so far.
func (s *Buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
