package logs_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// notYet are the packages whose keys are still literals: other branches
// edit them while this check lands; convert them and empty the list.
var notYet = map[string]bool{}

// TestKeysAreConstants: no non-test Go file of the module writes a log
// key as a string literal; keys are internal/logs's Key constants.
func TestKeysAreConstants(t *testing.T) {
	root := filepath.Join("..", "..")
	n := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if rel != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || rel == "test" || notYet[rel]) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") || rel == "internal/logs/keys.go" {
			return nil
		}
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		calls, lits := logKeys(f)
		n += calls
		for _, l := range lits {
			k, _ := strconv.Unquote(l.Value)
			t.Errorf("%s: log key %q is a string literal: use (or add) its constant in internal/logs/keys.go", fset.Position(l.Pos()), k)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n < 150 {
		t.Fatalf("found %d log calls, fewer than meshid makes: the check does not see them", n)
	}
}

func TestLogKeysFindsLiterals(t *testing.T) {
	src := `package x
func f() {
	s.log.Info("msg", "error", err, slog.String("spiffe_id", id), logs.KeyCode, c)
	log.With("component", "x").Warn("m")
	cfg.Logger.Log(ctx, slog.LevelInfo, "m", "k", 1)
	t.Error("not a logger", "x")
}`
	f, err := parser.ParseFile(token.NewFileSet(), "x.go", src, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, lits := logKeys(f)
	var got []string
	for _, l := range lits {
		got = append(got, l.Value)
	}
	if want := `"error" "spiffe_id" "component" "k"`; strings.Join(got, " ") != want {
		t.Fatalf("literal keys %s, want %s", strings.Join(got, " "), want)
	}
}

func TestKeysOneNameOneMeaning(t *testing.T) {
	src, err := os.ReadFile("keys.go")
	if err != nil {
		t.Fatal(err)
	}
	f, err := parser.ParseFile(token.NewFileSet(), "keys.go", src, 0)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]string{}
	ast.Inspect(f, func(n ast.Node) bool {
		vs, ok := n.(*ast.ValueSpec)
		if !ok {
			return true
		}
		v, _ := strconv.Unquote(vs.Values[0].(*ast.BasicLit).Value)
		if prev, dup := seen[v]; dup {
			t.Errorf("%s and %s are both %q", prev, vs.Names[0].Name, v)
		}
		seen[v] = vs.Names[0].Name
		if v == "err" {
			t.Errorf("%s is \"err\": an error is logged as \"error\"", vs.Names[0].Name)
		}
		return true
	})
}

// logMethods are the methods of *slog.Logger that take key-value pairs,
// by the number of arguments before the pairs.
var logMethods = map[string]int{
	"Debug": 1, "Info": 1, "Warn": 1, "Error": 1,
	"DebugContext": 2, "InfoContext": 2, "WarnContext": 2, "ErrorContext": 2,
	"Log": 3, "With": 0,
}

// attrFuncs are slog's Attr constructors: their first argument is a key.
var attrFuncs = map[string]bool{
	"String": true, "Int": true, "Int64": true, "Uint64": true, "Float64": true, "Bool": true,
	"Time": true, "Duration": true, "Any": true, "Group": true,
}

// logKeys returns the number of log calls in f and the string literals
// they use as keys. A log call is a method of logMethods on an expression
// whose last name has "log" in it (log, s.log, cfg.Logger, x.Logger()),
// or one of slog's Attr constructors.
func logKeys(f *ast.File) (calls int, lits []*ast.BasicLit) {
	ast.Inspect(f, func(n ast.Node) bool {
		c, ok := n.(*ast.CallExpr)
		if !ok {
			return true
		}
		sel, ok := c.Fun.(*ast.SelectorExpr)
		if !ok {
			return true
		}
		if x, ok := sel.X.(*ast.Ident); ok && x.Name == "slog" && attrFuncs[sel.Sel.Name] {
			calls++
			if len(c.Args) > 0 {
				if lit, ok := c.Args[0].(*ast.BasicLit); ok && lit.Kind == token.STRING {
					lits = append(lits, lit)
				}
			}
			return true
		}
		skip, ok := logMethods[sel.Sel.Name]
		if !ok || !isLogger(sel.X) {
			return true
		}
		calls++
		for i := skip; i < len(c.Args); {
			if lit, ok := c.Args[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
				lits = append(lits, lit)
				i += 2
				continue
			}
			// A constant key and its value, or an Attr: either way the
			// next literal found at a key position is a key.
			if isKeyConst(c.Args[i]) {
				i += 2
			} else {
				i++
			}
		}
		return true
	})
	return calls, lits
}

func isKeyConst(e ast.Expr) bool {
	switch e := e.(type) {
	case *ast.SelectorExpr:
		return strings.HasPrefix(e.Sel.Name, "Key")
	case *ast.Ident:
		return strings.HasPrefix(e.Name, "Key")
	}
	return false
}

func isLogger(x ast.Expr) bool {
	switch x := x.(type) {
	case *ast.Ident:
		return strings.Contains(strings.ToLower(x.Name), "log") && x.Name != "slog"
	case *ast.SelectorExpr:
		return strings.Contains(strings.ToLower(x.Sel.Name), "log")
	case *ast.CallExpr:
		return isLogger(x.Fun)
	}
	return false
}
