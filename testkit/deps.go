package testkit

import (
	"errors"
	"os/exec"
	"strings"
	"testing"
)

// Deps returns the packages pkgs link, as `go list -deps` reports them (run
// in the test's directory, so relative patterns are the test package's).
// It fails the test if go list fails or lists implausibly few packages.
func Deps(t testing.TB, pkgs ...string) []string {
	t.Helper()
	out, err := exec.Command("go", append([]string{"list", "-deps"}, pkgs...)...).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("go list -deps %v: %v\n%s", pkgs, err, ee.Stderr)
		}
		t.Fatalf("go list -deps %v: %v", pkgs, err)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 10 {
		t.Fatalf("go list -deps %v listed %d packages", pkgs, len(deps))
	}
	return deps
}
