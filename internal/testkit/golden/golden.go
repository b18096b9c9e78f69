// Package golden compares test output with files under testdata/, and
// rewrites them when a test binary runs with -update.
package golden

import (
	"flag"
	"os"
	"path/filepath"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden from the current output")

// Check compares got with testdata/<name>.golden, or writes it there when
// the test runs with -update.
func Check(t testing.TB, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (rerun the test with -update to create it)", err)
	}
	if got != string(want) {
		t.Errorf("%s changed; if intended, rerun the test with -update\n--- got\n%s\n--- want\n%s", path, got, want)
	}
}
