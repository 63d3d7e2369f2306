// Package internal_test checks the rule of the ground floor: internal/
// holds only what every floor may use (clock, logs, unixsock, connlimit,
// metric, buildinfo, ...), so no package under it may import, directly or
// through another package, the CA (ca/...) or the agent (sds/...).
package internal_test

import (
	"errors"
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/meshid/meshid/"

func TestGroundFloorImportsNothingAbove(t *testing.T) {
	// Each internal package, its dependencies (transitive), and its tests'
	// own imports: "<package>|<dep> <dep> ...|<test import> ...". Tests may
	// use the test helpers (testkit), never the CA or the agent directly.
	out, err := exec.Command("go", "list", "-f",
		`{{.ImportPath}}|{{join .Deps " "}}|{{join .TestImports " "}} {{join .XTestImports " "}}`,
		module+"internal/...").Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("go list: %v\n%s", err, ee.Stderr)
		}
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) < 5 {
		t.Fatalf("go list found %d internal packages:\n%s", len(lines), out)
	}
	for _, line := range lines {
		f := strings.Split(line, "|")
		pkg := f[0]
		check := func(deps string, above []string, what string) {
			for _, dep := range strings.Fields(deps) {
				for _, a := range above {
					if dep == module+a || strings.HasPrefix(dep, module+a+"/") {
						t.Errorf("%s%s imports %s: internal/ is the ground floor and imports nothing above it (docs/architecture.md, \"The import rule\")", pkg, what, dep)
					}
				}
			}
		}
		check(f[1], []string{"ca", "sds", "testkit", "devstack", "inspect", "cmd", "bench"}, "")
		check(f[2], []string{"ca", "sds"}, "'s tests")
	}
}
