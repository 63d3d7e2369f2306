package observability_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/prometheus/promql/parser"
)

var dashboardFile = filepath.Join("..", "..", "deploy", "observability", "meshid-dashboard.json")

type dashboard struct {
	UID    string `json:"uid"`
	Panels []struct {
		Type    string `json:"type"`
		Title   string `json:"title"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
	} `json:"panels"`
}

// grafanaVars are the Grafana macros the expressions use, replaced as
// Grafana does before it sends the query.
var grafanaVars = strings.NewReplacer("$__rate_interval", "5m")

// TestDashboard: every query of the Grafana dashboard parses with
// Prometheus's own parser, names only metrics that a real CA and agent
// export (scraped from them, healthy and in trouble), evaluates without
// error, and the panels the issue asks for are there.
func TestDashboard(t *testing.T) {
	data, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatal(err)
	}
	healthy, _ := healthyTimeline(t)
	trouble := troubleTimeline(t)
	exported := map[string]bool{}
	for _, tl := range []timeline{healthy, trouble} {
		for _, sc := range tl.sc {
			for n := range sc.names() {
				exported[n] = true
			}
		}
	}
	ev := newEvaluator(t, trouble)
	p := parser.NewParser(parser.Options{})
	var titles []string
	queries := 0
	for _, panel := range d.Panels {
		titles = append(titles, panel.Title)
		for _, tg := range panel.Targets {
			queries++
			expr := grafanaVars.Replace(tg.Expr)
			ast, err := p.ParseExpr(expr)
			if err != nil {
				t.Errorf("panel %q: %s: %v", panel.Title, tg.Expr, err)
				continue
			}
			for _, name := range metricNames(ast) {
				if !exported[name] {
					t.Errorf("panel %q queries %s, which neither the CA nor the agent exports", panel.Title, name)
				}
			}
			ev.firing(expr) // fails the test on an evaluation error
		}
	}
	if queries < 15 {
		t.Errorf("%d queries, want the whole dashboard", queries)
	}
	for _, want := range []string{"Certificates issued", "Issuance latency", "Failures by reason", "Rate limiting",
		"TokenReview calls", "TokenReview cache hit ratio", "Root expires in", "CA certificate expires in",
		"agent certificate expiry", "SDS streams", "Rotations"} {
		if !slices.ContainsFunc(titles, func(s string) bool { return strings.Contains(strings.ToLower(s), strings.ToLower(want)) }) {
			t.Errorf("no panel %q in %q", want, titles)
		}
	}
	if d.UID == "" {
		t.Error("the dashboard has no uid (imports would duplicate it)")
	}
}

// metricNames are the metric names an expression selects.
func metricNames(n parser.Node) []string {
	var out []string
	parser.Inspect(n, func(node parser.Node, _ []parser.Node) error {
		if vs, ok := node.(*parser.VectorSelector); ok && vs.Name != "" {
			out = append(out, vs.Name)
		}
		return nil
	})
	return out
}
