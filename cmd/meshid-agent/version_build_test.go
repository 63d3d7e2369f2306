package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// TestVersionFromGit builds the binary as `make build` does (commit from
// git through -ldflags -X) and checks `version` prints that commit and the
// Go version.
func TestVersionFromGit(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	rev, err := exec.Command("git", "rev-parse", "HEAD").Output()
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI runs in a git clone, but git rev-parse HEAD failed: %v", err)
		}
		t.Skipf("not in a git checkout: %v", err)
	}
	commit := strings.TrimSpace(string(rev))
	bin := filepath.Join(t.TempDir(), "meshid-agent")
	ld := "-X github.com/meshid/meshid/internal/buildinfo.commit=" + commit
	if out, err := exec.Command("go", "build", "-ldflags", ld, "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "version").Output()
	if err != nil {
		t.Fatal(err)
	}
	if s := string(out); !strings.Contains(s, "commit "+commit) || !strings.Contains(s, runtime.Version()) {
		t.Fatalf("version: %q", s)
	}
}
