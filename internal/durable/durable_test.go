package durable

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

func TestWriteAndReplaceLeaveOneFile(t *testing.T) {
	dir := t.TempDir()
	for i, write := range []func(string, []byte) error{WriteFile, Replace} {
		path := filepath.Join(dir, "f")
		for _, body := range []string{"one", "two"} {
			if err := write(path, []byte(body)); err != nil {
				t.Fatal(i, err)
			}
		}
		if b, err := os.ReadFile(path); err != nil || string(b) != "two" {
			t.Errorf("writer %d: %q, %v", i, b, err)
		}
		if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o600 {
			t.Errorf("writer %d: mode %#o", i, fi.Mode().Perm())
		}
		if names, _ := os.ReadDir(dir); len(names) != 1 {
			t.Errorf("writer %d left %d files", i, len(names))
		}
	}
	if err := WriteFile(filepath.Join(dir, "missing", "f"), nil); err == nil {
		t.Error("write into a missing directory succeeded")
	}
}

func TestMoveCreatesItsDirectory(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "a")
	if err := WriteFile(src, []byte("x")); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(dir, "sub", "b")
	if err := Move(src, dst); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(dst); err != nil || string(b) != "x" {
		t.Errorf("moved file: %q, %v", b, err)
	}
	if _, err := os.Stat(src); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("source still there: %v", err)
	}
	if err := Move(src, dst+"2"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("moving a missing file: %v, want ErrNotExist", err)
	}
	if err := Move(dst, filepath.Join(dir, "sub", "c")); err != nil {
		t.Errorf("a move within one directory: %v", err)
	}
}

func TestReadDirSkipsWhatIsNotARecord(t *testing.T) {
	dir := t.TempDir()
	for name, body := range map[string]string{"a.json": "A", "b.json": "B", "c.txt": "C", TempPrefix + "a.json-1": "half"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "d.json"), 0o700); err != nil {
		t.Fatal(err)
	}
	files, err := ReadDir(dir, func(name string) bool { return filepath.Ext(name) == ".json" })
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, f := range files {
		got = append(got, f.Name+"="+string(f.Data))
	}
	if !slices.Equal(got, []string{"a.json=A", "b.json=B"}) {
		t.Errorf("ReadDir = %v", got)
	}
	if names, err := Names(dir, nil); err != nil || len(names) != 3 {
		t.Errorf("Names(nil) = %v, %v; want the three regular files that are not temporary", names, err)
	}
	if files, err := ReadDir(filepath.Join(dir, "none"), nil); err != nil || len(files) != 0 {
		t.Errorf("a missing directory: %v, %v; want empty", files, err)
	}
	if _, err := ReadDir(filepath.Join(dir, "a.json"), nil); err == nil {
		t.Error("a file read as a directory")
	}
}

func TestRemoveTempsSparesYoungOnes(t *testing.T) {
	dir := t.TempDir()
	now := time.Now()
	for name, age := range map[string]time.Duration{TempPrefix + "old": time.Hour, TempPrefix + "young": time.Second, "keep": time.Hour} {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(p, now.Add(-age), now.Add(-age)); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := RemoveTemps(dir, time.Minute, now); n != 1 || err != nil {
		t.Errorf("RemoveTemps(1m) = %d, %v; want the old one", n, err)
	}
	if n, err := RemoveTemps(dir, 0, now); n != 1 || err != nil {
		t.Errorf("RemoveTemps(0) = %d, %v; want the young one", n, err)
	}
	if names, _ := Names(dir, nil); !slices.Equal(names, []string{"keep"}) {
		t.Errorf("left %v", names)
	}
}
