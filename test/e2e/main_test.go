package e2e_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// guard bounds every wait, so that a bug fails a test instead of hanging it.
const guard = 30 * time.Second

// meshidBin is the meshid binary built for this run by TestMain.
var meshidBin string

func TestMain(m *testing.M) { os.Exit(runMain(m)) }

func runMain(m *testing.M) int {
	dir, err := os.MkdirTemp("", "e2e-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	meshidBin = filepath.Join(dir, "meshid")
	// The binary is built without -race even under `go test -race`: the
	// in-process tests run the same components under the race detector,
	// and a race-instrumented binary makes every CLI call several times
	// slower.
	build := exec.Command("go", "build", "-o", meshidBin, "github.com/meshid/meshid/cmd/meshid")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "e2e: building meshid:", err)
		return 1
	}
	return m.Run()
}
