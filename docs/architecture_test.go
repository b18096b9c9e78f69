// Package docs holds the project's prose; its test keeps architecture.md
// true to the code.
package docs

import (
	"bufio"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
)

const module = "github.com/nftredir/nftredir"

// rigsLayer stands for the table's "rigs" row: the rigs may import
// anything, and only rigs may import them.
const rigsLayer = -1

// layerTable reads the Layers table of architecture.md: each package
// pattern (a path, or a path ending in "/..." for a whole tree) with its
// layer.
func layerTable(t *testing.T, doc string) map[string]int {
	t.Helper()
	table := map[string]int{}
	inTable := false
	sc := bufio.NewScanner(strings.NewReader(doc))
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "| layer |") {
			inTable = true
			continue
		}
		if !inTable || strings.HasPrefix(line, "|---") {
			continue
		}
		if !strings.HasPrefix(line, "|") {
			if len(table) > 0 {
				break
			}
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		if len(cells) != 3 {
			t.Fatalf("layer row %q: want 3 cells", line)
		}
		layer := rigsLayer
		if name := strings.TrimSpace(cells[0]); name != "rigs" {
			n, err := strconv.Atoi(name)
			if err != nil {
				t.Fatalf("layer row %q: layer %q is neither a number nor rigs", line, name)
			}
			layer = n
		}
		for _, p := range backquoted(cells[2]) {
			if prev, dup := table[p]; dup {
				t.Fatalf("%s is in layers %d and %d", p, prev, layer)
			}
			table[p] = layer
		}
	}
	if len(table) == 0 {
		t.Fatal("architecture.md has no Layers table")
	}
	return table
}

var backquote = regexp.MustCompile("`([^`]+)`")

func backquoted(s string) []string {
	var out []string
	for _, m := range backquote.FindAllStringSubmatch(s, -1) {
		out = append(out, m[1])
	}
	return out
}

// layerOf finds a package's layer: an exact row first, else the longest
// "/..." tree holding it.
func layerOf(table map[string]int, pkg string) (int, bool) {
	if l, ok := table[pkg]; ok {
		return l, true
	}
	best, layer := "", 0
	for p, l := range table {
		root, ok := strings.CutSuffix(p, "/...")
		if ok && (pkg == root || strings.HasPrefix(pkg, root+"/")) && len(root) > len(best) {
			best, layer = root, l
		}
	}
	return layer, best != ""
}

type goPackage struct {
	ImportPath string
	Imports    []string
}

var listed struct {
	once sync.Once
	out  []byte
	err  error
}

// modulePackages lists every package of the module with its non-test
// imports of the module, paths relative to the module.
func modulePackages(t *testing.T) []goPackage {
	t.Helper()
	listed.once.Do(func() {
		cmd := exec.Command("go", "list", "-json", "./...")
		cmd.Dir = ".."
		cmd.Stderr = os.Stderr
		listed.out, listed.err = cmd.Output()
	})
	out, err := listed.out, listed.err
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	var pkgs []goPackage
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for {
		var p goPackage
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("go list output: %v", err)
		}
		rel := func(path string) (string, bool) {
			if path == module {
				return ".", true
			}
			return strings.CutPrefix(path, module+"/")
		}
		p.ImportPath, _ = rel(p.ImportPath)
		var own []string
		for _, imp := range p.Imports {
			if r, ok := rel(imp); ok {
				own = append(own, r)
			}
		}
		p.Imports = own
		pkgs = append(pkgs, p)
	}
	return pkgs
}

func readDoc(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("architecture.md")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// The doc's own package: docs holds only prose and this test.
const self = "docs"

func TestEveryPackageHasOneLayerAndImportsOnlyDownward(t *testing.T) {
	table := layerTable(t, readDoc(t))
	for _, p := range modulePackages(t) {
		if p.ImportPath == self {
			continue
		}
		layer, ok := layerOf(table, p.ImportPath)
		if !ok {
			t.Errorf("%s is in no layer of architecture.md's table: add it to the layer it belongs to", p.ImportPath)
			continue
		}
		for _, imp := range p.Imports {
			il, ok := layerOf(table, imp)
			switch {
			case !ok:
				// Reported as a package of its own above.
			case il == rigsLayer && layer != rigsLayer:
				t.Errorf("%s (layer %d) imports the test rig %s", p.ImportPath, layer, imp)
			case layer != rigsLayer && il > layer:
				t.Errorf("%s (layer %d) imports %s from layer %d, above it", p.ImportPath, layer, imp, il)
			}
		}
	}
}

// TestCitedPathsExist: every backquoted path in architecture.md that
// looks like a package or file of the repository names one that exists.
func TestCitedPathsExist(t *testing.T) {
	doc := readDoc(t)
	roots := map[string]bool{}
	entries, err := os.ReadDir("..")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.IsDir() && !strings.HasPrefix(e.Name(), ".") {
			roots[e.Name()] = true
		}
	}
	cited := 0
	for _, s := range backquoted(doc) {
		path := strings.TrimSuffix(s, "/...")
		first, _, _ := strings.Cut(path, "/")
		if strings.ContainsAny(path, " =:") || !roots[first] {
			continue
		}
		cited++
		if _, err := os.Stat(filepath.Join("..", path)); err != nil {
			t.Errorf("architecture.md cites %s, which does not exist", s)
		}
	}
	if cited < 20 {
		t.Fatalf("only %d repository paths recognised in architecture.md: the check is not reading it", cited)
	}
}

// The layer rule must catch what it promises: a table with a package
// placed below one of its imports fails.
func TestLayerRuleCatchesAnUpwardImport(t *testing.T) {
	doc := readDoc(t)
	table := layerTable(t, doc)
	if l, _ := layerOf(table, "lifecycle"); l <= 2 {
		t.Fatalf("lifecycle at layer %d: the fixture assumes it sits above capture", l)
	}
	table["capture"] = 5
	var upward []string
	for _, p := range modulePackages(t) {
		layer, ok := layerOf(table, p.ImportPath)
		if !ok || layer == rigsLayer {
			continue
		}
		for _, imp := range p.Imports {
			if il, ok := layerOf(table, imp); ok && il > layer {
				upward = append(upward, p.ImportPath+" -> "+imp)
			}
		}
	}
	if !slices.Contains(upward, "lifecycle -> capture") {
		t.Fatalf("moving capture above lifecycle was not caught; upward imports found: %v", upward)
	}
}
