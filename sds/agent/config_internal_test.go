package agent

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshid/meshid/internal/fieldlines"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden with the current values")

// TestDefaultsGolden pins every default of the agent's Config: the zero
// Config after withDefaults and withMetrics, one "Field.Path=value" line
// per field, is testdata/defaults.golden. A changed default fails here
// until the golden file is regenerated (go test ./sds/agent -run
// TestDefaultsGolden -update) and the change is reviewed in its diff.
func TestDefaultsGolden(t *testing.T) {
	cfg, err := Config{}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if cfg, err = cfg.withMetrics(); err != nil {
		t.Fatal(err)
	}
	header := "# The agent's Config after withDefaults (sds/agent TestDefaultsGolden, -update rewrites it).\n" +
		"# A zero value left here takes the default of the package the field configures.\n"
	got := header + strings.Join(fieldlines.Lines(cfg), "\n") + "\n"
	path := filepath.Join("testdata", "defaults.golden")
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to write it)", err)
	}
	if got != string(want) {
		t.Errorf("the defaults are not %s (a default changed? review, then run with -update):\ngot:\n%s", path, got)
	}
}

// TestEveryInvalidFieldReported: withDefaults names every invalid field in
// one error.
func TestEveryInvalidFieldReported(t *testing.T) {
	_, err := Config{CertTTL: -time.Hour, MaxCARoots: -1, KeyType: "dsa-1024"}.withDefaults()
	if err == nil {
		t.Fatal("withDefaults accepted three invalid fields")
	}
	for _, field := range []string{"CertTTL", "MaxCARoots", "KeyType"} {
		if !strings.Contains(err.Error(), field) {
			t.Errorf("the error does not name %s:\n%v", field, err)
		}
	}
}
