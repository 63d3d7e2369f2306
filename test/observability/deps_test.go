package observability_test

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestProductionBinariesDoNotLinkPrometheus: the Prometheus server module
// this suite uses (rulefmt, PromQL, TSDB) is not a dependency of meshid or
// meshid-agent, as `go list -deps` of the main module reports.
func TestProductionBinariesDoNotLinkPrometheus(t *testing.T) {
	cmd := exec.Command("go", "list", "-deps", "./cmd/meshid", "./cmd/meshid-agent")
	cmd.Dir = filepath.Join("..", "..")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 100 {
		t.Fatalf("go list -deps listed %d packages: not the binaries' dependencies", len(deps))
	}
	for _, p := range deps {
		if strings.HasPrefix(p, "github.com/prometheus/prometheus/") {
			t.Errorf("the production binaries depend on %s", p)
		}
	}
}
