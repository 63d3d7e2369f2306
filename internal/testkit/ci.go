package testkit

import (
	"os"
	"testing"
)

// OnCI reports whether the tests run under CI (CI=true), where a test must
// run rather than skip: .ci/run installs what every test needs.
func OnCI() bool { return os.Getenv("CI") == "true" }

// SkipOrFail skips t for want of something the machine lacks, or fails it
// under CI, so that a CI run never passes without having run it.
func SkipOrFail(t testing.TB, reason string) {
	t.Helper()
	if OnCI() {
		t.Fatalf("%s (CI=true: this test must run here)", reason)
	}
	t.Skip(reason)
}
