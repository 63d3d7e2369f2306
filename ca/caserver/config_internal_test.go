package caserver

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshid/meshid/internal/fieldlines"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden with the current values")

// TestDefaultsGolden pins every default of the CA's Config: the zero
// Config after withDefaults, one "Field.Path=value" line per field, is
// testdata/defaults.golden. A changed default fails here until the golden
// file is regenerated (go test ./ca/caserver -run TestDefaultsGolden
// -update) and the change is reviewed in its diff.
func TestDefaultsGolden(t *testing.T) {
	cfg, err := Config{}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	// The pod name is the hostname and a random suffix
	// (TestPodNameUnique): pin its shape, not its value.
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	suffix, ok := strings.CutPrefix(cfg.Kube.PodName, host+"_")
	if !ok || len(suffix) != 12 {
		t.Fatalf("default pod name %q, want %s_ and 12 random characters", cfg.Kube.PodName, host)
	}
	cfg.Kube.PodName = "<hostname>_<12 random characters>"
	header := "# The CA's Config after withDefaults (ca/caserver TestDefaultsGolden, -update rewrites it).\n" +
		"# A zero value left here takes the default of the package the field configures.\n"
	checkGolden(t, filepath.Join("testdata", "defaults.golden"), header+strings.Join(fieldlines.Lines(cfg), "\n")+"\n")
}

func checkGolden(t *testing.T, path, got string) {
	t.Helper()
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
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
		t.Errorf("the defaults are not %s (a default changed? review, then run with -update):\n%s", path, lineDiff(string(want), got))
	}
}

// lineDiff lists the lines only in want (-) and only in got (+).
func lineDiff(want, got string) string {
	in := func(s string) map[string]bool {
		m := map[string]bool{}
		for _, l := range strings.Split(s, "\n") {
			m[l] = true
		}
		return m
	}
	w, g := in(want), in(got)
	var b strings.Builder
	for _, l := range strings.Split(want, "\n") {
		if !g[l] {
			b.WriteString("- " + l + "\n")
		}
	}
	for _, l := range strings.Split(got, "\n") {
		if !w[l] {
			b.WriteString("+ " + l + "\n")
		}
	}
	return b.String()
}
