package metricsref

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// Metric is one metric family a component registers.
type Metric struct {
	Name    string
	Type    string // counter, gauge or histogram
	Help    string
	Labels  []string // variable and constant label names, sorted
	Package string   // the defining package's directory, e.g. ca/certservice
	// Field is set when the name comes from a Config field (its default
	// being Name): every `Field: "<name>"` in the module is the same
	// metric under another name.
	Field string
}

// Scan returns the metrics defined in the non-test Go files of the module
// at root, sorted by name. Directories named testdata, hidden ones, the
// module's test directory and internal/metric (the helpers) are skipped. A definition whose name or help cannot be read is an
// error, so that a new way of defining metrics is noticed here.
func Scan(root string) ([]Metric, error) {
	pkgs := map[string][]*ast.File{}
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			base := d.Name()
			// internal/metric is the helpers themselves, names as parameters.
			if rel != "." && (strings.HasPrefix(base, ".") || base == "testdata" || rel == "test" || rel == "internal/metric") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if !strings.Contains(string(src), "prometheus") && !strings.Contains(string(src), "metric.") &&
			!strings.Contains(string(src), "Metric") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, src, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		dir := filepath.ToSlash(filepath.Dir(rel))
		pkgs[dir] = append(pkgs[dir], f)
		return nil
	})
	if err != nil {
		return nil, err
	}
	var (
		out      []Metric
		byField  = map[string]Metric{}
		fieldUse []fieldValue
	)
	dirs := make([]string, 0, len(pkgs))
	for d := range pkgs {
		dirs = append(dirs, d)
	}
	slices.Sort(dirs)
	for _, dir := range dirs {
		p := &pkgScan{dir: dir, fset: fset, consts: consts(pkgs[dir]), descs: map[string]*Metric{}}
		for _, f := range pkgs[dir] {
			ast.Inspect(f, p.visit)
		}
		if p.err != nil {
			return nil, p.err
		}
		for _, m := range p.descs {
			if m.Type == "" {
				return nil, fmt.Errorf("%s: descriptor of %s is never collected with a value type", dir, m.Name)
			}
			p.found = append(p.found, *m)
		}
		for _, m := range p.found {
			if m.Field != "" {
				byField[m.Field] = m
			}
		}
		out = append(out, p.found...)
		fieldUse = append(fieldUse, p.fields...)
	}
	for _, u := range fieldUse {
		m, ok := byField[u.field]
		if !ok || !strings.HasPrefix(u.value, "meshid_") {
			continue
		}
		m.Name, m.Package, m.Field = u.value, u.dir, ""
		out = append(out, m)
	}
	slices.SortFunc(out, func(a, b Metric) int { return strings.Compare(a.Name, b.Name) })
	for i := 1; i < len(out); i++ {
		if out[i].Name == out[i-1].Name {
			return nil, fmt.Errorf("metric %s is defined twice (%s, %s)", out[i].Name, out[i-1].Package, out[i].Package)
		}
	}
	return out, nil
}

type fieldValue struct{ field, value, dir string }

type pkgScan struct {
	dir    string
	fset   *token.FileSet
	consts map[string]string
	descs  map[string]*Metric // NewDesc results by variable name
	found  []Metric
	fields []fieldValue
	err    error
}

// The helpers of internal/metric and the constructors of client_golang,
// by the type of metric they make.
var (
	helperTypes = map[string]string{
		"Counter": "counter", "CounterVec": "counter", "Gauge": "gauge", "GaugeFunc": "gauge", "Histogram": "histogram",
	}
	ctorTypes = map[string]string{
		"NewCounter": "counter", "NewCounterVec": "counter", "NewCounterFunc": "counter",
		"NewGauge": "gauge", "NewGaugeVec": "gauge", "NewGaugeFunc": "gauge",
		"NewHistogram": "histogram", "NewHistogramVec": "histogram",
		"NewSummary": "summary", "NewSummaryVec": "summary",
	}
	valueTypes = map[string]string{"CounterValue": "counter", "GaugeValue": "gauge", "UntypedValue": "untyped"}
)

func (p *pkgScan) fail(n ast.Node, format string, args ...any) {
	if p.err == nil {
		p.err = fmt.Errorf("%s: %s", p.fset.Position(n.Pos()), fmt.Sprintf(format, args...))
	}
}

func (p *pkgScan) visit(n ast.Node) bool {
	if p.err != nil {
		return false
	}
	switch n := n.(type) {
	case *ast.ValueSpec:
		// var fooDesc = prometheus.NewDesc(...)
		for i, v := range n.Values {
			if call, ok := v.(*ast.CallExpr); ok && isCall(call, "prometheus", "NewDesc") && i < len(n.Names) {
				m := p.desc(call)
				p.descs[n.Names[i].Name] = &m
			}
		}
	case *ast.KeyValueExpr:
		if k, ok := n.Key.(*ast.Ident); ok {
			if v, ok := p.str(n.Value); ok {
				p.fields = append(p.fields, fieldValue{field: k.Name, value: v, dir: p.dir})
			}
		}
	case *ast.CallExpr:
		p.call(n)
	}
	return true
}

func (p *pkgScan) call(c *ast.CallExpr) {
	sel, ok := c.Fun.(*ast.SelectorExpr)
	if !ok {
		return
	}
	x, ok := sel.X.(*ast.Ident)
	if !ok {
		return
	}
	switch {
	case x.Name == "metric" && helperTypes[sel.Sel.Name] != "":
		if len(c.Args) < 2 {
			p.fail(c, "metric.%s with %d arguments", sel.Sel.Name, len(c.Args))
			return
		}
		m := Metric{Type: helperTypes[sel.Sel.Name], Package: p.dir}
		m.Name = p.mustStr(c.Args[0], "name")
		m.Help = p.mustStr(c.Args[1], "help")
		if sel.Sel.Name == "CounterVec" && len(c.Args) > 2 {
			m.Labels = []string{p.mustStr(c.Args[2], "label")}
		}
		p.found = append(p.found, m)
	case x.Name == "prometheus" && ctorTypes[sel.Sel.Name] != "":
		if len(c.Args) == 0 {
			return
		}
		lit, ok := unparen(c.Args[0]).(*ast.CompositeLit)
		if !ok {
			p.fail(c, "prometheus.%s without a literal Opts", sel.Sel.Name)
			return
		}
		m := Metric{Type: ctorTypes[sel.Sel.Name], Package: p.dir}
		for _, e := range lit.Elts {
			kv, ok := e.(*ast.KeyValueExpr)
			if !ok {
				continue
			}
			switch kv.Key.(*ast.Ident).Name {
			case "Name":
				m.Name, m.Field = p.name(kv.Value)
			case "Help":
				m.Help = p.template(kv.Value)
			case "ConstLabels":
				if cl, ok := kv.Value.(*ast.CompositeLit); ok {
					for _, e := range cl.Elts {
						m.Labels = append(m.Labels, p.mustStr(e.(*ast.KeyValueExpr).Key, "constant label"))
					}
				}
			}
		}
		if strings.HasSuffix(sel.Sel.Name, "Vec") && len(c.Args) > 1 {
			m.Labels = append(m.Labels, p.strs(c.Args[1])...)
		}
		if m.Name == "" || m.Help == "" {
			p.fail(c, "prometheus.%s without a readable Name and Help", sel.Sel.Name)
		}
		slices.Sort(m.Labels)
		p.found = append(p.found, m)
	case x.Name == "prometheus" && (sel.Sel.Name == "MustNewConstMetric" || sel.Sel.Name == "NewConstMetric"):
		if len(c.Args) < 2 {
			return
		}
		d, ok := c.Args[0].(*ast.Ident)
		vt, ok2 := c.Args[1].(*ast.SelectorExpr)
		if !ok || !ok2 || p.descs[d.Name] == nil {
			p.fail(c, "%s of a descriptor this scan does not know", sel.Sel.Name)
			return
		}
		p.descs[d.Name].Type = valueTypes[vt.Sel.Name]
	case x.Name == "prometheus" && sel.Sel.Name == "MustNewConstHistogram":
		if d, ok := c.Args[0].(*ast.Ident); ok && p.descs[d.Name] != nil {
			p.descs[d.Name].Type = "histogram"
		}
	}
}

func (p *pkgScan) desc(c *ast.CallExpr) Metric {
	m := Metric{Package: p.dir}
	if len(c.Args) != 4 {
		p.fail(c, "prometheus.NewDesc with %d arguments", len(c.Args))
		return m
	}
	m.Name = p.mustStr(c.Args[0], "name")
	m.Help = p.mustStr(c.Args[1], "help")
	m.Labels = p.strs(c.Args[2])
	slices.Sort(m.Labels)
	return m
}

// name reads a metric's name: a constant, or cmp.Or(cfg.Field, Default)
// for a name a Config may change.
func (p *pkgScan) name(e ast.Expr) (name, field string) {
	if s, ok := p.str(e); ok {
		return s, ""
	}
	if c, ok := e.(*ast.CallExpr); ok && isCall(c, "cmp", "Or") && len(c.Args) == 2 {
		if f, ok := c.Args[0].(*ast.SelectorExpr); ok {
			return p.mustStr(c.Args[1], "default name"), f.Sel.Name
		}
	}
	p.fail(e, "metric name is not a constant")
	return "", ""
}

func (p *pkgScan) mustStr(e ast.Expr, what string) string {
	s, ok := p.str(e)
	if !ok {
		p.fail(e, "metric %s is not a constant string", what)
	}
	return s
}

// str evaluates a constant string expression: literals, the package's
// constants, and their concatenations.
func (p *pkgScan) str(e ast.Expr) (string, bool) {
	switch e := unparen(e).(type) {
	case *ast.BasicLit:
		if e.Kind != token.STRING {
			return "", false
		}
		s, err := strconv.Unquote(e.Value)
		return s, err == nil
	case *ast.Ident:
		s, ok := p.consts[e.Name]
		return s, ok
	case *ast.BinaryExpr:
		if e.Op != token.ADD {
			return "", false
		}
		a, ok1 := p.str(e.X)
		b, ok2 := p.str(e.Y)
		return a + b, ok1 && ok2
	}
	return "", false
}

// template is str with each non-constant operand shown as <Name>.
func (p *pkgScan) template(e ast.Expr) string {
	if s, ok := p.str(e); ok {
		return s
	}
	switch e := unparen(e).(type) {
	case *ast.BinaryExpr:
		return p.template(e.X) + p.template(e.Y)
	case *ast.SelectorExpr:
		return "<" + e.Sel.Name + ">"
	case *ast.Ident:
		return "<" + e.Name + ">"
	}
	p.fail(e, "metric help is not a string")
	return ""
}

func (p *pkgScan) strs(e ast.Expr) []string {
	lit, ok := unparen(e).(*ast.CompositeLit)
	if !ok {
		if id, ok := e.(*ast.Ident); ok && id.Name == "nil" {
			return nil
		}
		p.fail(e, "label names are not a literal []string")
		return nil
	}
	var out []string
	for _, el := range lit.Elts {
		out = append(out, p.mustStr(el, "label name"))
	}
	return out
}

func isCall(c *ast.CallExpr, pkg, fn string) bool {
	sel, ok := c.Fun.(*ast.SelectorExpr)
	if !ok {
		return false
	}
	x, ok := sel.X.(*ast.Ident)
	return ok && x.Name == pkg && sel.Sel.Name == fn
}

func unparen(e ast.Expr) ast.Expr {
	for {
		switch x := e.(type) {
		case *ast.ParenExpr:
			e = x.X
		case *ast.UnaryExpr:
			e = x.X
		default:
			return e
		}
	}
}

// consts returns the package-level string constants of files whose value
// is a literal or a concatenation of literals.
func consts(files []*ast.File) map[string]string {
	out := map[string]string{}
	p := &pkgScan{consts: out}
	for _, f := range files {
		for _, d := range f.Decls {
			g, ok := d.(*ast.GenDecl)
			if !ok || g.Tok != token.CONST {
				continue
			}
			for _, s := range g.Specs {
				vs := s.(*ast.ValueSpec)
				for i, v := range vs.Values {
					if str, ok := p.str(v); ok && i < len(vs.Names) {
						out[vs.Names[i].Name] = str
					}
				}
			}
		}
	}
	return out
}
