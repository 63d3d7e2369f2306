package observability_test

import (
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

var compatFile = filepath.Join("..", "..", "deploy", "observability", "citadel-compat-rules.yaml")

// TestCitadelCompatRules: Istio's citadel_server_* names, recorded from
// meshid's metrics, parse with rulefmt, each yields a series on a real CA's
// scrape, and the counts and expiry are the CA's own.
func TestCitadelCompatRules(t *testing.T) {
	rgs := parseRules(t, compatFile)
	rules := map[string]string{}
	for _, g := range rgs.Groups {
		for _, r := range g.Rules {
			if r.Record == "" || !strings.HasPrefix(r.Record, "citadel_server_") {
				t.Errorf("rule %q%q: want only citadel_server_* recording rules", r.Record, r.Alert)
			}
			rules[r.Record] = r.Expr
		}
	}
	healthy, rootNotAfter := healthyTimeline(t)
	now := time.Now()
	ev := newEvaluator(t, healthy.shifted(now))
	for name, expr := range rules {
		if got := ev.firing(expr); len(got) == 0 {
			t.Errorf("%s (%s) yields nothing on the CA's metrics", name, expr)
		}
	}
	// healthyTimeline: the agent's certificate and 20 more, all accepted.
	for name, want := range map[string]float64{
		"citadel_server_success_cert_issuance_count":  21,
		"citadel_server_csr_count":                    21,
		"citadel_server_authentication_failure_count": 0,
		"citadel_server_root_cert_expiry_timestamp":   float64(rootNotAfter.Unix()),
	} {
		if got := valueOf(t, ev.firing(rules[name])); got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	if got, want := valueOf(t, ev.firing(rules["citadel_server_root_cert_expiry_seconds"])), rootNotAfter.Sub(now).Seconds(); got < want-1 || got > want+1 {
		t.Errorf("citadel_server_root_cert_expiry_seconds = %v, want %v", got, want)
	}
}

// valueOf is the value of the one series printed as {labels}=value.
func valueOf(t *testing.T, series []string) float64 {
	t.Helper()
	if len(series) != 1 {
		t.Fatalf("%d series %q, want 1", len(series), series)
	}
	i := strings.LastIndex(series[0], "=")
	v, err := strconv.ParseFloat(series[0][i+1:], 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}
