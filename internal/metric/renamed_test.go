package metric_test

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/meshid/meshid/internal/metric"
)

// An alert written for an old name sees the same series as the new name.
func TestWithRenamesServesOldNames(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	v := metric.CounterVec("meshid_agent_rotation_failures_total", "Failed rotations.", "code", "Unavailable")
	v.WithLabelValues("Unavailable").Add(3)
	if err := metric.Register(reg, v, metric.Counter("meshid_unrelated_total", "Unrelated.")); err != nil {
		t.Fatal(err)
	}
	want := `
# HELP meshid_agent_ca_failures_total Deprecated: renamed meshid_agent_rotation_failures_total, which has the same series; this name is removed in 0.2.0.
# TYPE meshid_agent_ca_failures_total counter
meshid_agent_ca_failures_total{code="Unavailable"} 3
# HELP meshid_agent_rotation_failures_total Failed rotations.
# TYPE meshid_agent_rotation_failures_total counter
meshid_agent_rotation_failures_total{code="Unavailable"} 3
`
	g := metric.WithRenames(reg)
	if err := testutil.GatherAndCompare(g, strings.NewReader(want),
		"meshid_agent_ca_failures_total", "meshid_agent_rotation_failures_total"); err != nil {
		t.Fatal(err)
	}
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i < len(mfs); i++ {
		if mfs[i-1].GetName() >= mfs[i].GetName() {
			t.Fatalf("families not sorted: %s before %s", mfs[i-1].GetName(), mfs[i].GetName())
		}
	}
	if len(mfs) != 3 {
		t.Fatalf("gathered %d families, want 3 (the unrelated one not duplicated)", len(mfs))
	}
}

// Each rename keeps the component prefix rule and no old name is reused.
func TestRenamesAreConsistent(t *testing.T) {
	seen := map[string]bool{}
	for _, r := range metric.Renames {
		if !strings.HasPrefix(r.New, "meshid_ca_") && !strings.HasPrefix(r.New, "meshid_agent_") {
			t.Errorf("%s: new name %s has no meshid_ca_ or meshid_agent_ prefix", r.Old, r.New)
		}
		if r.Old == r.New || seen[r.Old] || seen[r.New] {
			t.Errorf("rename %s -> %s repeats a name", r.Old, r.New)
		}
		seen[r.Old], seen[r.New] = true, true
	}
}
