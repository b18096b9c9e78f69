package e2e

import (
	"debug/elf"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestBinariesStaticAndVersioned checks what a scratch image and a node of
// any libc need: no dynamic loader, no shared libraries; that the binaries
// are linked as the image's; and that every binary names the commit it
// was built from.
func TestBinariesStaticAndVersioned(t *testing.T) {
	bin := binaries(t)
	rev, err := exec.Command("git", "-C", bin.Repo, "rev-parse", "HEAD").Output()
	if err != nil {
		t.Skipf("not a git checkout: %v", err)
	}
	want := strings.TrimSpace(string(rev))
	for _, path := range []string{bin.Daemon, bin.Ctl, bin.CNI, bin.CNIHelper} {
		name := filepath.Base(path)
		t.Run(name, func(t *testing.T) {
			f, err := elf.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			for _, p := range f.Progs {
				if p.Type == elf.PT_INTERP {
					t.Errorf("has a PT_INTERP program header: dynamically linked")
				}
			}
			if libs, err := f.ImportedLibraries(); err != nil || len(libs) > 0 {
				t.Errorf("imports shared libraries %v (%v)", libs, err)
			}
			// The tests and the bench run what the image ships.
			if f.Section(".symtab") != nil || f.Section(".debug_info") != nil {
				t.Errorf("has a symbol table or DWARF: not linked as the image's binaries are (hack/ldflags.sh)")
			}
			out, err := exec.Command(path, "--version").CombinedOutput()
			if err != nil {
				t.Fatalf("--version: %v\n%s", err, out)
			}
			line := strings.TrimSpace(string(out))
			if !strings.HasPrefix(line, name+" ") || !strings.Contains(line, "rev "+want) || !strings.Contains(line, " go1.") {
				t.Errorf("--version printed %q; want %q, the revision %s and the Go version", line, name, want)
			}
		})
	}
}
