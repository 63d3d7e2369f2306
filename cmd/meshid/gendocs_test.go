package main

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// regenerate is the command that brings the checked-in reference up to date.
const regenerate = "go run ./cmd/meshid gendocs " + CLIReferenceDir

// TestCLIReference: the checked-in CLI reference is what the command tree
// generates, page for page: a flag added, renamed or re-described without
// regenerating it fails here.
func TestCLIReference(t *testing.T) {
	clearServerEnv(t)
	got := t.TempDir()
	if _, errOut, code := meshidRun(t, nil, "gendocs", got); code != 0 {
		t.Fatalf("gendocs: exit %d: %s", code, errOut)
	}
	want := filepath.Join("..", "..", filepath.FromSlash(CLIReferenceDir))
	gotFiles, wantFiles := pages(t, got), pages(t, want)
	for name, g := range gotFiles {
		w, ok := wantFiles[name]
		switch {
		case !ok:
			t.Errorf("%s/%s is missing: run `%s`", CLIReferenceDir, name, regenerate)
		case !bytes.Equal(g, w):
			t.Errorf("%s/%s differs from what the code generates (first difference: %s): run `%s`", CLIReferenceDir, name, firstDiff(w, g), regenerate)
		}
	}
	for name := range wantFiles {
		if _, ok := gotFiles[name]; !ok {
			t.Errorf("%s/%s documents a command that no longer exists: run `rm -r %s && %s`", CLIReferenceDir, name, CLIReferenceDir, regenerate)
		}
	}
	if len(gotFiles) < 10 {
		t.Fatalf("gendocs wrote %d pages", len(gotFiles))
	}
}

// The hidden generator is not part of the reference, and takes one DIR.
func TestGendocsHidden(t *testing.T) {
	out := meshidOK(t, "--help")
	if strings.Contains(out, "gendocs") {
		t.Errorf("meshid --help lists gendocs:\n%s", out)
	}
	if _, _, code := meshidRun(t, nil, "gendocs"); code != 2 {
		t.Errorf("gendocs without DIR: exit %d, want 2", code)
	}
}

func pages(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatalf("%v: run `%s`", err, regenerate)
	}
	out := map[string][]byte{}
	for _, e := range entries {
		f, err := os.Open(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		out[e.Name()] = b
	}
	return out
}

// firstDiff is the first line where the checked-in page (want) and the
// generated one (got) differ.
func firstDiff(want, got []byte) string {
	w, g := strings.Split(string(want), "\n"), strings.Split(string(got), "\n")
	for i := range max(len(w), len(g)) {
		var wl, gl string
		if i < len(w) {
			wl = w[i]
		}
		if i < len(g) {
			gl = g[i]
		}
		if wl != gl {
			return fmt.Sprintf("line %d: checked in %q, generated %q", i+1, wl, gl)
		}
	}
	return "none"
}
