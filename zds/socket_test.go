package zds_test

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/nftredir/nftredir/capture/capturetest"
	"github.com/nftredir/nftredir/zds"
)

func newServer(t *testing.T) *zds.Server {
	t.Helper()
	s, err := zds.NewServer(zds.Config{Pods: &source{}, Opener: capturetest.NewFake(), SocketGroup: os.Getegid()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestListenCreatesPrivateDirAndSocket(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "run", "ztunnel")
	path := filepath.Join(dir, "ztunnel.sock")
	if err := newServer(t).Listen(path); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]os.FileMode{dir: 0o750, path: 0o660} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != want {
			t.Errorf("%s has mode %v, want %v", p, fi.Mode().Perm(), want)
		}
	}
}

func TestListenReplacesOnlyDeadSockets(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "ztunnel.sock")

	// A socket left behind by a crashed daemon: nothing answers.
	l, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	l.SetUnlinkOnClose(false)
	l.Close()
	first := newServer(t)
	if err := first.Listen(path); err != nil {
		t.Fatalf("stale socket not replaced: %v", err)
	}
	// A live one is somebody's: refused.
	if err := newServer(t).Listen(path); !errors.Is(err, zds.ErrInUse) {
		t.Errorf("Listen over a live socket = %v, want ErrInUse", err)
	}
	// Whatever is not a socket is left alone.
	file := filepath.Join(dir, "not-a-socket")
	if err := os.WriteFile(file, []byte("keep me"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := newServer(t).Listen(file); err == nil {
		t.Error("Listen replaced a regular file")
	}
	if b, _ := os.ReadFile(file); string(b) != "keep me" {
		t.Error("the regular file was changed")
	}
}

func TestListenRefusesUnsafePaths(t *testing.T) {
	open := filepath.Join(t.TempDir(), "open")
	if err := os.Mkdir(open, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(open, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := newServer(t).Listen(filepath.Join(open, "ztunnel.sock")); err == nil {
		t.Error("Listen accepted a world-writable directory, where others could swap the socket")
	}
	if err := newServer(t).Listen("relative/ztunnel.sock"); err == nil {
		t.Error("Listen accepted a relative path")
	}
}
