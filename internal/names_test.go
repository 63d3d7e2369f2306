package internal_test

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// sameNameAllowed lists the meshid packages that may share their last path
// element with another meshid package, each with its reason. Every one is
// a test suite (a doc.go and _test.go files) of the test/kube module: Go
// never links them into anything, and TestOneNameOneMeaning checks that no
// file imports them, so no file can see both names.
var sameNameAllowed = map[string]string{
	"test/kube/e2e":     "the real-cluster suite, beside test/e2e (the binaries' suite); imported by nothing",
	"test/kube/chart":   "the Helm chart's suite, beside bench/chart (the benchmark plots); imported by nothing",
	"test/kube/podcert": "the kubelet's pod certificates suite, beside ca/kube/podcert (the signer it tests); imported by nothing",
}

// sameNameAsDependency lists the meshid packages that may share their name
// with a package of another module that a file imports beside them (the
// file aliases that one), each with the other module's packages and the
// reason.
var sameNameAsDependency = map[string]struct{ other, reason string }{
	"ca/kubeclient/fake": {"k8s.io/client-go/", "client-go's convention, which the package follows: every fake clientset is package fake (kubernetes/fake, metadata/fake, dynamic/fake), and tests alias client-go's"},
	"ca/keystore/pkcs11": {"github.com/miekg/pkcs11", "the PKCS#11 signer is named for the standard; only its own tests import the binding it wraps beside it (as miekg)"},
}

// goFile is what TestOneNameOneMeaning reads of one .go file.
type goFile struct {
	path    string // relative to the repository's root
	pkg     string // its package clause
	test    bool
	imports []goImport
}

type goImport struct {
	path, name string // name: "" when the import has none
	line       int
}

// TestOneNameOneMeaning is issue 34's rule, go-spiffe's: one name, one
// meaning, so that no import of a meshid package needs an alias. It reads
// every .go file of the repository (every module: test/kube, test/spire,
// test/observability and the tools ones too) and fails when
//   - a file imports a meshid package under another name (a blank import,
//     for side effects, is allowed);
//   - a package's clause is not its directory's name (package main and
//     the _test packages aside);
//   - two meshid packages (not package main) share their last path element
//     (sameNameAllowed lists the exceptions, with their reason);
//   - a file imports a meshid package and another package of the same
//     name (as sds/workloadapi and go-spiffe's workloadapi were).
func TestOneNameOneMeaning(t *testing.T) {
	files := readGoFiles(t, "..")
	if len(files) < 500 {
		t.Fatalf("read %d .go files from the repository's root: is the test running from internal/?", len(files))
	}
	byDir := map[string][]goFile{}
	for _, f := range files {
		byDir[path.Dir(f.path)] = append(byDir[path.Dir(f.path)], f)
	}
	meshidPkgs := map[string]string{} // directory -> package name, importable ones
	for dir, fs := range byDir {
		for _, f := range fs {
			name := strings.TrimSuffix(f.pkg, "_test")
			if name == "main" || dir == "." {
				continue
			}
			if name != path.Base(dir) {
				t.Errorf("%s: package %s in directory %s: a package is named as its directory", f.path, f.pkg, dir)
			}
			if !f.test {
				meshidPkgs[dir] = f.pkg
			}
		}
	}

	// Shared last path elements.
	byName := map[string][]string{}
	for dir := range meshidPkgs {
		byName[path.Base(dir)] = append(byName[path.Base(dir)], dir)
	}
	for name, dirs := range byName {
		sort.Strings(dirs)
		var clash []string
		for _, d := range dirs {
			if _, ok := sameNameAllowed[d]; !ok {
				clash = append(clash, d)
			}
		}
		if len(clash) > 1 {
			t.Errorf("packages %s share the name %q: rename one (go-spiffe's rule, docs/architecture.md) or, for a test suite nothing imports, list it in sameNameAllowed with the reason", strings.Join(dirs, ", "), name)
		}
	}
	for dir := range sameNameAllowed {
		if _, ok := meshidPkgs[dir]; !ok {
			t.Errorf("sameNameAllowed lists %s, which is no longer a package: drop it", dir)
		}
	}

	for _, f := range files {
		names := map[string]string{} // package name -> import path, for this file
		for _, im := range f.imports {
			rel, meshid := meshidPath(im.path)
			if meshid {
				if _, ok := sameNameAllowed[rel]; ok {
					t.Errorf("%s:%d imports %s, which sameNameAllowed exempts because nothing imports it", f.path, im.line, im.path)
				}
				if im.name != "" && im.name != "_" {
					t.Errorf("%s:%d imports %s as %s: a meshid package is imported without an alias (rename the package, or the identifier it collides with)", f.path, im.line, im.path, im.name)
				}
			}
			name := im.name
			if name == "" {
				name = defaultName(im.path)
				if n, ok := meshidPkgs[rel]; meshid && ok {
					name = n
				}
			}
			if name == "_" || name == "." {
				continue
			}
			if other, ok := names[name]; ok {
				_, otherMeshid := meshidPath(other)
				if meshid || otherMeshid {
					t.Errorf("%s:%d imports %s and %s, both named %s: a meshid package's name must not be another's the same file uses", f.path, im.line, other, im.path, name)
				}
			}
			names[name] = im.path
			if meshid && im.name == "" && defaultName(im.path) != name {
				t.Errorf("%s:%d imports %s, whose package is %s", f.path, im.line, im.path, name)
			}
		}
		// A package of the same name as a meshid one the file imports
		// needs an alias, whatever it is called; and an alias that takes a
		// meshid package's name hides that package.
		meshidNames := map[string]string{}
		for _, im := range f.imports {
			if rel, meshid := meshidPath(im.path); meshid {
				meshidNames[cmpName(meshidPkgs[rel], im.path)] = im.path
			}
		}
		for _, im := range f.imports {
			if _, meshid := meshidPath(im.path); meshid {
				continue
			}
			if other, ok := meshidNames[defaultName(im.path)]; ok && !dependencyAllowed(other, im.path) {
				t.Errorf("%s:%d imports %s beside %s: the two have the same name, so one needs an alias (rename the meshid package)", f.path, im.line, im.path, other)
			}
			for dir, n := range meshidPkgs {
				if im.name != "" && n == im.name && !strings.HasPrefix(dir, "test/") {
					t.Errorf("%s:%d imports %s as %s, the name of the meshid package %s", f.path, im.line, im.path, im.name, dir)
				}
			}
		}
	}
}

// meshidPath returns the directory of a meshid import path, relative to the
// repository's root, and whether it is one.
func meshidPath(p string) (string, bool) {
	const root = "github.com/meshid/meshid"
	if p == root {
		return ".", true
	}
	rel, ok := strings.CutPrefix(p, root+"/")
	return rel, ok
}

// dependencyAllowed reports whether sameNameAsDependency lets the meshid
// package meshidImport share its name with the package dep.
func dependencyAllowed(meshidImport, dep string) bool {
	rel, _ := meshidPath(meshidImport)
	a, ok := sameNameAsDependency[rel]
	return ok && strings.HasPrefix(dep, a.other)
}

// cmpName is name, or the default name of path when name is "".
func cmpName(name, path string) string {
	if name == "" {
		return defaultName(path)
	}
	return name
}

// defaultName is the name an import without one gets, by the convention
// (last element; a major-version suffix /vN or .vN is not part of it).
func defaultName(p string) string {
	base := path.Base(p)
	if len(base) > 1 && base[0] == 'v' {
		if _, err := strconv.Atoi(base[1:]); err == nil {
			base = path.Base(path.Dir(p))
		}
	}
	if i := strings.Index(base, ".v"); i > 0 {
		base = base[:i]
	}
	return strings.ReplaceAll(base, "-", "")
}

// readGoFiles parses the package clause and imports of every .go file
// under root, skipping testdata, hidden and underscore directories (which
// the go command ignores too).
func readGoFiles(t *testing.T, root string) []goFile {
	t.Helper()
	var out []goFile
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if p != root && (name == "testdata" || name == "vendor" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(name, ".go") {
			return nil
		}
		src, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		af, err := parser.ParseFile(fset, p, src, parser.ImportsOnly)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		f := goFile{path: filepath.ToSlash(rel), pkg: af.Name.Name, test: strings.HasSuffix(name, "_test.go")}
		for _, is := range af.Imports {
			ip, err := strconv.Unquote(is.Path.Value)
			if err != nil {
				return err
			}
			im := goImport{path: ip, line: fset.Position(is.Pos()).Line}
			if is.Name != nil {
				im.name = is.Name.Name
			}
			f.imports = append(f.imports, im)
		}
		out = append(out, f)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}
